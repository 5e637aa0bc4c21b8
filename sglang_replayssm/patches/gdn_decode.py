"""Seam: Gated DeltaNet (Qwen3-Next / Qwen3.5) standard decode -> the ReplaySSM ring
(no math; the kernel is ``kernels.gdn_replay.gdn_replay_decode``).

A replay-ring seam: listed by :func:`sglang_replayssm.patches.replay_ring_patches`, applied by
the launcher unless ``--replayssm-replay-ring false`` (run end to end on an H200).

How SGLang runs GDN decode (0.5.17; the same calls in 0.5.15 and 0.5.23)
-----------------------------------------------------------------------
* ``Qwen3GatedDeltaNet`` / ``Qwen3_5GatedDeltaNet`` call ``RadixLinearAttention.forward``
  -> ``HybridLinearAttnBackend.forward``, which on a DECODE forward calls
  ``HybridLinearAttnBackend.forward_decode`` -> ``GDNAttnBackend.forward_decode(q=None,
  k=None, v=None, layer=..., forward_batch=..., save_kv_cache=..., mixed_qkv=..., a=...,
  b=...)`` (all keywords; ``srt/layers/attention/linear/gdn_backend.py:379``).  MIXED and
  TARGET_VERIFY forwards go to ``forward_extend`` instead; IDLE returns early.
* ``forward_decode`` takes ``layer_cache = mamba2_layer_cache(layer.layer_id)`` (pool
  layer ``mamba_map[layer_id]``), runs ``causal_conv1d_update`` on the conv state
  (written every step; untouched here) and, when ``kernel_dispatcher.
  supports_packed_decode`` (the Triton decode kernel on CUDA), calls::

      self.kernel_dispatcher.packed_decode(mixed_qkv=[B, 2*Hk*K + HV*V], a=[B, HV],
          b=[B, HV], A_log=layer.A_log, dt_bias=layer.dt_bias, scale=K**-0.5,
          ssm_states=layer_cache.temporal [S, HV, V, K], cache_indices=
          forward_metadata.mamba_cache_indices [B], num_v_heads=HV, head_v_dim=V,
          replayssm_d/k/g=layer_cache.replayssm_* , replayssm_write_pos=...,
          replayssm_force_flush=...)          # upstream ring: all None unless its flag

  ``GDNKernelDispatcher.packed_decode`` (``gdn_backend.py:207``) forwards to
  ``TritonGDNKernel.packed_decode`` -> ``fused_recurrent_gated_delta_rule_packed_decode``
  (state updated in place, padded rows (slot < 0) get a zero output) and returns the
  output as ``[1, B, HV, V]``.  Then ``_track_mamba_state_decode`` (extra_buffer track
  copy).  ``cache_indices`` covers every row of the batch (decode forwards have no
  prefill rows): -1 for padded rows, slot 0 for graph-capture dummy rows, and under CUDA
  graphs it is the static buffer ``state_indices_list[bs-1]``.
* 0.5.23's ``forward_decode`` adds fused projection+conv fast paths before that call;
  the call itself and the dispatcher are unchanged, which is why the body is not
  replaced here.

Hook design (the same style as ``mamba2_decode``)
-------------------------------------------------
1. AROUND ``GDNAttnBackend.forward_decode`` (:func:`forward_decode_around`).  When the
   pool carries a GDN ring (``mamba_pool.rssm_ring``, attached by ``patches/pool.py``)
   and the backend is the target worker (``not is_draft_worker``), it checks the
   configuration (no upstream ring, extra_buffer tracking only with ``prefix_track``, a packed-decode kernel,
   ring geometry == the layer's heads), joins the forward's cursor step
   (``_cursor.open_layer``: gathered at the first GDN layer, checked order) and sets a
   thread-local layer context for the duration of the original call: ring views of pool
   layer ``mamba_map[layer_id]``, per-row cursors, the metadata's slot tensor and the
   address of the layer's ``temporal``.  After the call it requires exactly one routed
   kernel call and closes the layer (``_cursor.close_layer``: cursor advance after the
   last GDN layer, on device, inside the forward, so inside a captured graph).  It also
   publishes the layer's ``use_qk_l2norm`` to ``lifecycle.register_layer_params`` (what the
   finish fold replays the ring with).
   No ring / draft worker: SGLang's code, untouched.
2. AROUND ``GDNKernelDispatcher.packed_decode`` (:func:`packed_decode_around`).  With no
   context it calls the original with the same arguments.  With one, the call must be the
   backend's standard call: ``ssm_states`` is the layer's ``temporal``, ``cache_indices``
   is exactly the context's slot tensor (same data pointer and shape), the upstream ring
   arguments are all None, and the heads match the ring; it then allocates the output
   like SGLang (``[B, 1, HV, V]``, zero-filled so padded rows read 0 exactly as SGLang's
   kernel leaves them) and runs ``gdn_replay_decode`` with the ring views and per-row
   cursors (null slot 0: dummy capture rows touch neither state nor ring), returning
   ``out.transpose(0, 1)`` (``[1, B, HV, V]``, SGLang's layout).  Anything unexpected
   under a context raises :class:`ReplayDecodeError` instead of computing from a stale
   checkpoint.  The dispatcher (not ``TritonGDNKernel.packed_decode``) is hooked because
   it is the exact call ``forward_decode`` makes, with the same keyword layout in all
   three releases, independent of which packed-capable kernel class was picked.
3. AROUND ``GDNAttnBackend.forward_extend`` (:func:`forward_extend_around`): only a guard.
   A MIXED forward (``--enable-mixed-chunk``) sends running decode rows through the
   prefill path, which reads ``temporal`` without the ring: it raises when a GDN ring is
   attached.  EXTEND, TARGET_VERIFY and draft extends call the original untouched.

Refused under a ring (raise, with the flag to change)
* SGLang's own ring (``--enable-linear-replayssm`` / ``--enable-linear-replayssm-spec``:
  ``mamba_pool.enable_linear_replayssm*`` or a ``replayssm_write_pos`` in the metadata);
* extra_buffer tracking (``forward_batch.mamba_track_mask``) on a speculative ring, or without
  ``patches/prefix_track.py`` applied (SGLang's track copy alone reads a ``temporal`` that lags the ring);
* a decode kernel without packed decode (``--linear-attn-decode-backend`` other than
  triton: ``forward_decode`` would call ``dispatcher.decode`` with the split q/k/v);
* a ring that is not a GDN ring, or whose heads differ from the layer's.

Not done here: target verify / spec decoding (passes through: exact only while rings are
empty, which holds when spec is on, as the target then runs no plain DECODE forwards);
extend rows on a slot with ring entries (the slot-lifecycle patches flush those).
"""

from __future__ import annotations

import logging
from typing import List, Optional

import torch

from ._cursor import (RING_ATTR, ContextHolder, LayerContext, NULL_SLOT, ReplayDecodeError, close_layer, drop_step,
                      layer_order, open_layer)
from . import prefix_track
from .registry import Patch

logger = logging.getLogger("sglang_replayssm.patches")

BACKEND_MODULE = "sglang.srt.layers.attention.linear.gdn_backend"
FORWARD_DECODE_TARGET = BACKEND_MODULE + ".GDNAttnBackend.forward_decode"
FORWARD_EXTEND_TARGET = BACKEND_MODULE + ".GDNAttnBackend.forward_extend"
PACKED_DECODE_TARGET = BACKEND_MODULE + ".GDNKernelDispatcher.packed_decode"
TARGET_VERIFY_TARGET = BACKEND_MODULE + ".GDNKernelDispatcher.target_verify"
USE_QK_L2NORM = True       # TritonGDNKernel.packed_decode passes use_qk_l2norm_in_kernel=True
UPSTREAM_RING_KWARGS = ("replayssm_d", "replayssm_k", "replayssm_g", "replayssm_write_pos",
                        "replayssm_force_flush")

__all__ = ["ReplayDecodeError", "PATCHES", "current_context", "forward_decode_around", "packed_decode_around",
           "forward_extend_around", "target_verify_around"]


_LayerContext = LayerContext
_CTX = ContextHolder()


def current_context() -> Optional[LayerContext]:
    return _CTX.current()


def _pool_of(backend):
    return getattr(getattr(backend, "req_to_token_pool", None), "mamba_pool", None)


def _upstream_ring_on(pool, md) -> bool:
    return bool(getattr(pool, "enable_linear_replayssm", False)
                or getattr(pool, "enable_linear_replayssm_spec", False)
                or getattr(md, "replayssm_write_pos", None) is not None)


_UPSTREAM_MSG = ("SGLang's own GDN replay ring (--enable-linear-replayssm / --enable-linear-replayssm-spec) "
                 "is on together with sglang_replayssm's ring; drop those flags or use --replayssm-disable")


def _check_ring(ring, layer, order) -> None:
    from ..ring import GDNRingGeometry

    g = ring.geom
    if not isinstance(g, GDNRingGeometry):
        raise ReplayDecodeError(f"mamba_pool.{RING_ATTR} holds a {type(g).__name__} ring (kind "
                                f"{ring.kind!r}); GDNAttnBackend needs a GDNRingGeometry ring")
    if order and (order[0] < 0 or order[-1] >= ring.num_layers):
        raise ReplayDecodeError(f"mamba_map pool indices {order[0]}..{order[-1]} do not fit the ring's "
                                f"{ring.num_layers} layers")
    want = (g.num_k_heads, g.num_v_heads, g.head_k_dim, g.head_v_dim)
    have = (layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim)
    if want != have:
        raise ReplayDecodeError(f"layer_id {layer.layer_id}: ring geometry (Hk, HV, K, V) = {want} differs "
                                f"from the layer's {have}")


def _plan(backend, layer, forward_batch):
    """(ring, step, pool_idx) when this decode layer call runs on the ring, else None."""
    pool = _pool_of(backend)
    ring = getattr(pool, RING_ATTR, None)
    if ring is None or getattr(backend, "is_draft_worker", False):
        return None
    md = backend.forward_metadata
    if _upstream_ring_on(pool, md):
        raise ReplayDecodeError(_UPSTREAM_MSG)
    if getattr(md, "is_target_verify", False):
        raise ReplayDecodeError("GDNAttnBackend.forward_decode called with target-verify metadata")
    if getattr(forward_batch, "mamba_track_mask", None) is not None:
        prefix_track.check_tracked_forward(ring.spec_window is not None)
    if not getattr(backend.kernel_dispatcher, "supports_packed_decode", False):
        raise ReplayDecodeError(
            f"the GDN decode kernel {type(getattr(backend.kernel_dispatcher, 'decode_kernel', None)).__name__} "
            "has no packed decode; the replay ring needs --linear-attn-decode-backend triton")
    mamba_map = backend.req_to_token_pool.mamba_map
    pool_idx = mamba_map[layer.layer_id]
    order = layer_order(mamba_map)
    _check_ring(ring, layer, order)
    if pool_idx == order[0] and not getattr(backend, "_rssm_logged", False):
        backend._rssm_logged = True
        logger.info("sglang_replayssm: GDN decode on the replay ring (L=%d, %d layers)",
                    ring.buffer_len, len(order))
    step = open_layer(backend, ring, md, order, pool_idx, layer.layer_id,
                      lambda: md.mamba_cache_indices, "GDN")
    from . import lifecycle  # finish folds replay this layer's ring with the same key normalisation

    lifecycle.register_layer_params(ring, pool_idx, use_qk_l2norm=USE_QK_L2NORM)
    return ring, step, pool_idx


def forward_decode_around(original, self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
    """AROUND ``GDNAttnBackend.forward_decode``: ring context + once-per-forward cursor advance."""
    plan = _plan(self, layer, forward_batch)
    if plan is None:
        return original(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)
    ring, step, pool_idx = plan
    temporal = self.req_to_token_pool.mamba_pool.mamba_cache.temporal
    ctx = _LayerContext(ring_views=ring.layer(pool_idx), slots=step.slots, wp_rows=step.wp_rows,
                        state_ptr=temporal[pool_idx].data_ptr(), num_slots=ring.num_slots, geom=ring.geom,
                        pool_idx=pool_idx, layer_id=layer.layer_id,
                        mode="decode" if ring.spec_window is None else "decode_spec", spec=ring.verify_cursors)
    if current_context() is not None:
        drop_step(self)
        raise ReplayDecodeError("nested GDNAttnBackend.forward_decode calls under a replay context")
    _CTX.set(ctx)
    try:
        result = original(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)
    except BaseException:
        drop_step(self)
        raise
    finally:
        _CTX.set(None)
    empty = step.slots.shape[0] == 0  # 0.5.23 returns early on HIP for an empty batch
    if ctx.calls != 1 and not (empty and ctx.calls == 0):
        drop_step(self)
        raise ReplayDecodeError(
            f"layer_id {layer.layer_id}: forward_decode made {ctx.calls} packed decode call(s) through "
            f"{PACKED_DECODE_TARGET} (expected exactly 1); this GDN path is not supported by the replay seam")
    close_layer(self, ring, step)
    return result


def _not_plain_decode(ctx: _LayerContext, mixed_qkv, ssm_states, cache_indices, num_v_heads, head_v_dim,
                      kwargs) -> Optional[str]:
    for name in UPSTREAM_RING_KWARGS:
        if kwargs.get(name) is not None:
            return f"{name} is set (SGLang's own replay ring)"
    unknown = sorted(set(kwargs) - set(UPSTREAM_RING_KWARGS))
    if unknown:
        return f"unexpected arguments {unknown}"
    if ssm_states.dim() != 4 or ssm_states.data_ptr() != ctx.state_ptr or ssm_states.shape[0] != ctx.num_slots:
        return "ssm_states is not this layer's temporal cache"
    if cache_indices is None or cache_indices.data_ptr() != ctx.slots.data_ptr() \
            or tuple(cache_indices.shape) != tuple(ctx.slots.shape):
        return "cache_indices are not the forward metadata's mamba_cache_indices"
    if mixed_qkv.dim() != 2:
        return f"mixed_qkv has shape {tuple(mixed_qkv.shape)}, expected [batch, qkv_dim]"
    if (num_v_heads, head_v_dim) != (ctx.geom.num_v_heads, ctx.geom.head_v_dim):
        return f"num_v_heads/head_v_dim {(num_v_heads, head_v_dim)} differ from the ring's"
    return None


def packed_decode_around(original, self, mixed_qkv, a, b, *, A_log, dt_bias, scale, ssm_states, cache_indices,
                         num_v_heads, head_v_dim, **kwargs):
    """AROUND ``GDNKernelDispatcher.packed_decode``: the call under a context goes to the ring."""
    ctx = current_context()
    if ctx is None:
        return original(self, mixed_qkv, a, b, A_log=A_log, dt_bias=dt_bias, scale=scale, ssm_states=ssm_states,
                        cache_indices=cache_indices, num_v_heads=num_v_heads, head_v_dim=head_v_dim, **kwargs)
    why = _not_plain_decode(ctx, mixed_qkv, ssm_states, cache_indices, num_v_heads, head_v_dim, kwargs)
    if why is not None:
        raise ReplayDecodeError(f"layer_id {ctx.layer_id}: unexpected packed decode call during a replay "
                                f"decode forward: {why}")
    rv = ctx.ring_views
    out = mixed_qkv.new_zeros(mixed_qkv.shape[0], 1, num_v_heads, head_v_dim)
    if ctx.mode == "decode":
        from ..kernels.gdn_replay import gdn_replay_decode

        gdn_replay_decode(mixed_qkv, a, b, A_log, dt_bias, ssm_states, rv["d"], rv["k"], rv["g"],
                          cache_indices, ctx.wp_rows, scale=scale, use_qk_l2norm=USE_QK_L2NORM, out=out,
                          null_slot=NULL_SLOT)
    else:  # a decode row on a spec ring: a verify of one token (beta rounded like the packed decode)
        from ..kernels.gdn_verify import gdn_verify

        gdn_verify(mixed_qkv.unsqueeze(1), a.unsqueeze(1), b.unsqueeze(1), A_log, dt_bias, ssm_states,
                   rv["d"], rv["k"], rv["g"], cache_indices, *ctx.spec, scale=scale, use_qk_l2norm=USE_QK_L2NORM,
                   round_beta=True, out=out, null_slot=NULL_SLOT)
    ctx.calls += 1
    return out.transpose(0, 1)


def forward_extend_around(original, self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
    """AROUND ``GDNAttnBackend.forward_extend``: refuse MIXED forwards under a GDN ring; a
    TARGET_VERIFY forward on a spec ring runs with a verify context (see
    :func:`target_verify_around`)."""
    mode = getattr(forward_batch, "forward_mode", None)
    pool = _pool_of(self)
    ring = getattr(pool, RING_ATTR, None)
    if ring is None or getattr(self, "is_draft_worker", False):
        return original(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)
    if mode is not None and mode.is_mixed():
        raise ReplayDecodeError(
            "MIXED forward (--enable-mixed-chunk): SGLang runs the running decode rows through the GDN prefill "
            "path, which reads the checkpoint state without the replay ring; disable --enable-mixed-chunk")
    if mode is None or not mode.is_target_verify() or ring.spec_window is None:
        return original(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)
    md = self.forward_metadata
    if _upstream_ring_on(pool, md):
        raise ReplayDecodeError(_UPSTREAM_MSG)
    if getattr(forward_batch, "mamba_track_mask", None) is not None:
        raise ReplayDecodeError("mamba state tracking (extra_buffer radix strategy) needs per-step states that "
                                "the replay-ring verifier does not keep; use --mamba-radix-cache-strategy no_buffer")
    mamba_map = self.req_to_token_pool.mamba_map
    pool_idx = mamba_map[layer.layer_id]
    _check_ring(ring, layer, layer_order(mamba_map))
    temporal = pool.mamba_cache.temporal
    ctx = _LayerContext(ring_views=ring.layer(pool_idx), slots=md.mamba_cache_indices, wp_rows=None,
                        state_ptr=temporal[pool_idx].data_ptr(), num_slots=ring.num_slots, geom=ring.geom,
                        pool_idx=pool_idx, layer_id=layer.layer_id, mode="verify", spec=ring.verify_cursors)
    if current_context() is not None:
        raise ReplayDecodeError("nested GDN forwards under a replay context")
    _CTX.set(ctx)
    try:
        result = original(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)
    finally:
        _CTX.set(None)
    if ctx.calls != 1:
        raise ReplayDecodeError(
            f"layer_id {layer.layer_id}: the verify forward made {ctx.calls} target_verify call(s) through "
            f"{TARGET_VERIFY_TARGET} (expected exactly 1; SGLang's own replay-ring verify branches must be off)")
    from . import lifecycle

    lifecycle.register_layer_params(ring, pool_idx, use_qk_l2norm=USE_QK_L2NORM)
    return result


def verify_call_problem(ctx, q, k, v, ssm_states, cache_indices, steps) -> Optional[str]:
    """Why a ``target_verify`` call under a verify context is not this layer's window (chain or tree), or None."""
    g = ctx.geom
    if ssm_states.dim() != 4 or ssm_states.data_ptr() != ctx.state_ptr or ssm_states.shape[0] != ctx.num_slots:
        return "ssm_states is not this layer's temporal cache"
    if cache_indices is None or cache_indices.data_ptr() != ctx.slots.data_ptr():
        return "cache_indices are not the forward metadata's mamba_cache_indices"
    if q.dim() != 4 or q.shape[0] != 1 or tuple(q.shape[2:]) != (g.num_k_heads, g.head_k_dim) \
            or tuple(v.shape[2:]) != (g.num_v_heads, g.head_v_dim):
        return f"q/k/v shapes {tuple(q.shape)}/{tuple(k.shape)}/{tuple(v.shape)} do not match the ring's heads"
    if not steps or q.shape[1] % int(steps):
        return f"cache_steps={steps} does not divide the {q.shape[1]} verify tokens"
    return None


def verify_window(q, k, v, g, bs: int, T: int):
    """``(mixed, out)``: one packed q|k|v row per token, the layout the ring kernels read (SGLang split it for its
    kernel), ``[bs, T, -1]``; and a zeroed output ``[bs, T, HV, V]`` (rows the kernel skips read 0)."""
    seq = bs * T
    mixed = torch.cat([q.reshape(seq, -1), k.reshape(seq, -1), v.reshape(seq, -1)], dim=-1).view(bs, T, -1)
    return mixed, q.new_zeros(bs, T, g.num_v_heads, g.head_v_dim)


def target_verify_around(original, self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices,
                         query_start_loc, **kwargs):
    """AROUND ``GDNKernelDispatcher.target_verify``: under a verify context, the chain verify runs
    on the spec ring (``gdn_verify``; the per-draft snapshot buffer is neither read nor written)."""
    ctx = current_context()
    if ctx is None or ctx.mode != "verify":
        return original(self, A_log, dt_bias, q, k, v, a, b, ssm_states=ssm_states, cache_indices=cache_indices,
                        query_start_loc=query_start_loc, **kwargs)
    if kwargs.get("retrieve_parent_token") is not None:  # a tree (EAGLE topk > 1)
        from .spec_tree import gdn_tree_verify_call

        return gdn_tree_verify_call(ctx, A_log, dt_bias, q, k, v, a, b, ssm_states=ssm_states,
                                    cache_indices=cache_indices, cache_steps=kwargs.get("cache_steps"),
                                    retrieve_parent_token=kwargs["retrieve_parent_token"],
                                    scale=ctx.geom.head_k_dim ** -0.5, use_qk_l2norm=USE_QK_L2NORM)
    g = ctx.geom
    steps = kwargs.get("cache_steps")
    why = verify_call_problem(ctx, q, k, v, ssm_states, cache_indices, steps)
    if why is not None:
        raise ReplayDecodeError(f"layer_id {ctx.layer_id}: unexpected target_verify call during a replay verify "
                                f"forward: {why}")
    from ..kernels.gdn_verify import gdn_verify

    T = int(steps)
    bs = q.shape[1] // T
    mixed, out = verify_window(q, k, v, g, bs, T)
    seq, HV, V = q.shape[1], g.num_v_heads, g.head_v_dim
    rv = ctx.ring_views
    gdn_verify(mixed, a.reshape(bs, T, HV), b.reshape(bs, T, HV), A_log, dt_bias, ssm_states, rv["d"], rv["k"],
               rv["g"], cache_indices[:bs], *ctx.spec, scale=g.head_k_dim ** -0.5, use_qk_l2norm=USE_QK_L2NORM,
               round_beta=False, out=out, null_slot=NULL_SLOT)
    ctx.calls += 1
    return out.view(1, seq, HV, V)


BACKEND_PARAMS = ("self", "layer", "forward_batch", "mixed_qkv", "a", "b")
VERIFY_PARAMS = ("self", "A_log", "dt_bias", "q", "k", "v", "a", "b", "ssm_states", "cache_indices",
                 "query_start_loc")
PACKED_PARAMS = ("self", "mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "ssm_states", "cache_indices",
                 "num_v_heads", "head_v_dim")

PATCHES: List[Patch] = [
    Patch(PACKED_DECODE_TARGET, "around", packed_decode_around, params=PACKED_PARAMS,
          description="GDN packed decode -> gdn_replay_decode under a replay layer context"),
    Patch(TARGET_VERIFY_TARGET, "around", target_verify_around, params=VERIFY_PARAMS,
          description="GDN chain target verify -> gdn_verify on the spec ring under a verify context"),
    Patch(FORWARD_DECODE_TARGET, "around", forward_decode_around, params=BACKEND_PARAMS,
          description="GDN layer context (ring views, cursors) + once-per-forward cursor advance"),
    Patch(FORWARD_EXTEND_TARGET, "around", forward_extend_around, params=BACKEND_PARAMS,
          description="refuse MIXED forwards while a GDN replay ring is attached"),
]
