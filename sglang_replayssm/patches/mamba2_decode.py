"""Seam: Mamba2 standard decode -> the ReplaySSM ring (no math; the kernel is
``kernels.mamba2_replay.mamba2_replay_decode``).

A replay-ring seam: listed by :func:`sglang_replayssm.patches.replay_ring_patches`, applied by
the launcher unless ``--replayssm-replay-ring false`` (run end to end on an H200).

How SGLang runs Mamba2 decode (0.5.17; the same in 0.5.15 and 0.5.23)
---------------------------------------------------------------------
* The models (``nemotron_h.py:548``, also via its piecewise-graph split op :1240;
  ``falcon_h1.py:341``; ``granitemoehybrid.py:147``) call
  ``Mamba2AttnBackend.forward(mixer, hidden_states, output, layer_id, forward_batch,
  ...)`` (``srt/layers/attention/hybrid_linear_attn_backend.py:885``) for every Mamba2
  layer.  It takes ``layer_cache = req_to_token_pool.mamba2_layer_cache(layer_id)``
  (pool layer index ``mamba_map[layer_id]``), calls ``MambaMixer2.forward(...,
  metadata=self.forward_metadata)`` (``srt/layers/attention/mamba/mamba.py:440``), then
  does the extra_buffer track copy (``:922``).
* The metadata (``Mamba2Metadata``) is built once per forward:
  ``init_forward_metadata`` (``:877``, eager: ``_forward_metadata`` + ``prepare_mixed``)
  or ``init_forward_metadata_out_graph`` (``:847``, CUDA-graph capture/replay:
  ``_replay_metadata`` + ``prepare_decode``).  ``mamba_cache_indices`` holds one mamba
  slot per request row: -1 for padded rows (``_replay_metadata`` :580, eager
  ``_forward_metadata`` :111), slot 0 (the pool's reserved dummy slot,
  ``mem_cache/allocator/mamba.py:94``) for the dummy rows of graph capture.  Under CUDA
  graphs it is the static buffer ``state_indices_list[bs-1]``.
* ``MambaMixer2.forward`` splits rows into prefills (first ``num_prefills``) and
  decodes (``mamba.py:529``: ``state_indices_tensor_d = mamba_cache_indices[
  num_prefills:num_prefills+num_decodes]``).  For decode rows: ``causal_conv1d_update``
  on the conv state (``:678``; conv state is written every step, untouched here), split
  x/B/C, expand ``A_d [H,P,N]``, ``dt_d [b,H,P]``, ``dt_bias [H,P]``, ``D_d [H,P]`` (all
  stride-0 ties, ``:691-701``), then the per-token SSM update
  (``mamba.py:739``)::

      selective_state_update(ssm_state,            # layer_cache.temporal [S,H,P,N]
          hidden_states_d [b,H,P], dt_d, A_d, B_d [b,G,N], C_d [b,G,N], D_d, z=None,
          dt_bias=dt_bias, dt_softplus=True, state_batch_indices=state_indices_tensor_d,
          out=preallocated_ssm_out_d.view(num_decodes, -1, head_dim))

  Target verify (``:704``) calls the same name with [b,T,...] views plus
  ``disable_state_update=True``, ``intermediate_states_buffer``, ``cache_steps``,
  ``retrieve_parent_token``, ``intermediate_state_indices``.  Prefill never calls it.
* ``selective_state_update`` is a module global of ``mamba.py`` imported from
  ``sglang.kernels.ops.mamba.triton_ops`` (``mamba.py:7``; 0.5.15:
  ``sglang.srt.layers.attention.mamba.ops``), i.e. the dispatcher
  ``triton_ops/ssu_dispatch.py:235``, which forwards to the backend chosen by
  ``--mamba-backend`` (Triton ``mamba_ssm.py:351`` or FlashInfer).  Only
  ``MambaMixer2`` reads that global, and it resolves it at call time.
* Mixed batches: ``ScheduleBatch.mix_with_running`` (``schedule_batch.py:2667``) turns
  the running decode rows into extend rows of length 1, so a MIXED forward has
  ``num_decodes == 0`` (``mamba2_metadata.py:243``) and those rows go through the
  chunked-scan *prefill* path, which reads ``ssm_state[slot]`` as the initial state and
  overwrites it.  With a non-empty ring that state is stale, so MIXED forwards
  (``--enable-mixed-chunk``) are refused here (see below).

Hook design
-----------
1. AROUND ``Mamba2AttnBackend.forward`` (:func:`backend_forward_around`).  On a
   forward that has decode rows (``forward_metadata.num_decodes > 0``), is not target
   verify, runs on the target worker (``not is_draft_worker``), and whose pool carries
   a Mamba2 ring (``mamba_pool.rssm_ring``, attached by ``patches/pool.py``), it sets a
   layer context for the duration of the original call: the ring views of pool layer
   ``mamba_map[layer_id]``, the per-row cursors, the decode-row slot tensor and the
   address of the layer's ``temporal`` tensor.  Anything else runs SGLang's code with
   no context.
2. AROUND the module global ``mamba.selective_state_update``
   (:func:`selective_state_update_around`; no propagation, so ``ssu_dispatch`` and
   ``triton_ops`` keep the original name).  With no context it returns the original
   call untouched (prefill/verify/draft/other users).  With a context, the call must be
   the standard decode call (single token, no ``intermediate_states_buffer``, no
   ``disable_state_update``), on the layer's ``temporal`` and on exactly the context's
   slot tensor (same data pointer); it is then routed to ``mamba2_replay_decode``
   (null slot 0).  Anything else under a
   context raises instead of computing silently from a stale checkpoint.  Rows the
   kernel skips (slot -1 / 0) keep whatever ``out`` held: SGLang's own padded decode
   rows are not defined either (its conv update leaves padded rows of its output
   unwritten, and the SSM output there is ``D·x`` of that), every later op is row-local,
   and those rows are dropped before sampling.
3. Cursor, once per forward, on device, inside the forward (so inside a captured CUDA
   graph): at the FIRST mamba layer of the forward (pool index ``min(mamba_map)``) the
   per-row cursors are gathered, ``wp_rows = ring.write_pos[clamp(slots_d, min=0)]``,
   and shared by every layer of the forward; after the LAST mamba layer (pool index
   ``max(mamba_map)``, the same rule as SGLang's ``_track_pools`` :733)
   :func:`advance_cursors` stores ``write_pos[slot] = 0 if w == L-1 else w+1`` (``w`` =
   ``wp_rows`` clamped to [0, L-1] exactly as the kernel clamps it) for live rows
   (slot > 0); padded (-1) and dummy (0) rows store nothing.
   Both are one fixed-shape kernel launch each (``kernels/decode_cursor.py``) on fixed addresses (``write_pos`` belongs to the
   pool; the slot tensor is SGLang's static ``state_indices_list`` buffer under graphs):
   no host sync, no data-dependent shape, and one captured graph serves every cursor
   phase.  Why not in ``init_forward_metadata*``: those run outside the graph (and, for
   verify, on SGLang's plan stream), so a snapshot there would need static per-bs
   buffers and stream ordering against the forward; in-forward it is ordered with the
   kernels by construction.  Host-side bookkeeping (run at capture/eager time only)
   checks the layer order: a forward must visit the mamba layers first..last in order,
   each layer must reach the dispatcher exactly once, otherwise this raises.
4. The layer context is thread-local and set only around the original call.

What this seam deliberately does not do (see the issue for the owners)
* Target verify / speculative decoding: passes through to SGLang's path, which reads
  ``temporal`` directly.  That is exact only while the rings are empty, which holds
  when spec is on (the target then never runs plain DECODE forwards).  The spec ring
  verifier and commit replace it later.
* MIXED forwards raise :class:`ReplayDecodeError` (reject ``--enable-mixed-chunk`` at
  launch); extend rows on a slot with ring entries (retract / radix donation of an
  un-flushed slot) must be flushed by the slot-lifecycle patches, not here.
* ``--mamba-track-interval`` tracking (extra_buffer): SGLang's track copy alone would read a
  ``temporal`` that lags the ring; ``patches/prefix_track.py`` materialises the tracked state.
  A tracked forward raises on a speculative ring, or when that seam is not applied.
* torch.compile of the decode forward is untested (the hook does host-side checks).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Dict, List, Optional

from ._cursor import (  # noqa: F401  (gather/advance re-exported: tests and tools use them)
    RING_ATTR, ContextHolder, LayerContext,
    NULL_SLOT, ReplayDecodeError, advance_cursors, close_layer, drop_step, gather_cursors, layer_order,
    open_layer)
from . import prefix_track
from .registry import Patch

logger = logging.getLogger("sglang_replayssm.patches")

MIXER_MODULE = "sglang.srt.layers.attention.mamba.mamba"
SSU_TARGET = MIXER_MODULE + ".selective_state_update"
BACKEND_FORWARD_TARGET = "sglang.srt.layers.attention.hybrid_linear_attn_backend.Mamba2AttnBackend.forward"


# --------------------------------------------------------------------------------------
# per-layer state (the per-forward cursor bookkeeping lives in ``_cursor``)
# --------------------------------------------------------------------------------------


_LayerContext = LayerContext
_CTX = ContextHolder()


def current_context() -> Optional[LayerContext]:
    return _CTX.current()


def _ring_of(backend):
    pool = getattr(getattr(backend, "req_to_token_pool", None), "mamba_pool", None)
    return getattr(pool, RING_ATTR, None)


def _check_ring(ring, backend, order) -> None:
    from ..ring import Mamba2RingGeometry

    if not isinstance(ring.geom, Mamba2RingGeometry):
        raise ReplayDecodeError(f"mamba_pool.{RING_ATTR} holds a {type(ring.geom).__name__} ring; "
                                "Mamba2AttnBackend needs a Mamba2RingGeometry ring")
    if order and (order[0] < 0 or order[-1] >= ring.num_layers):
        raise ReplayDecodeError(f"mamba_map pool indices {order[0]}..{order[-1]} do not fit the ring's "
                                f"{ring.num_layers} layers")


def _plan(backend, layer_id, forward_batch):
    """(ring, step, pool_idx) when this layer call runs on the ring, else None."""
    ring = _ring_of(backend)
    if ring is None or getattr(backend, "is_draft_worker", False):
        return None
    md = backend.forward_metadata
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is not None and mode.is_mixed():
        raise ReplayDecodeError(
            "MIXED forward (--enable-mixed-chunk): SGLang runs the running decode rows through the prefill "
            "scan, which reads the checkpoint state without the replay ring; disable --enable-mixed-chunk")
    spec = ring.spec_window is not None
    if md.num_decodes == 0 or (md.is_target_verify and not spec):
        return None  # no decode rows; or SGLang's verify on a standard ring (exact while the rings are empty)
    if getattr(forward_batch, "mamba_track_mask", None) is not None:
        prefix_track.check_tracked_forward(spec)
    mamba_map = backend.req_to_token_pool.mamba_map
    pool_idx = mamba_map[layer_id]
    order = layer_order(mamba_map)
    if pool_idx == order[0]:
        _check_ring(ring, backend, order)
        if not getattr(backend, "_rssm_logged", False):
            backend._rssm_logged = True
            logger.info("sglang_replayssm: Mamba2 %s on the replay ring (L=%d, %d layers)",
                        f"verify (window {ring.spec_window})" if spec else "decode", ring.buffer_len, len(order))
    start = md.num_prefills
    if md.is_target_verify:  # cursors are read per slot in the kernel and move only at the commit
        return ring, None, pool_idx, "verify"
    step = open_layer(backend, ring, md, order, pool_idx, layer_id,
                      lambda: md.mamba_cache_indices[start:start + md.num_decodes], "Mamba2")
    return ring, step, pool_idx, "decode_spec" if spec else "decode"


def backend_forward_around(original, self, mixer, hidden_states, output, layer_id, forward_batch,
                           *args, **kwargs):
    """AROUND ``Mamba2AttnBackend.forward``: ring context for decode rows + cursor advance."""
    plan = _plan(self, layer_id, forward_batch)
    if plan is None:
        return original(self, mixer, hidden_states, output, layer_id, forward_batch, *args, **kwargs)
    ring, step, pool_idx, mode = plan
    temporal = self.req_to_token_pool.mamba_pool.mamba_cache.temporal
    if step is None:  # verify: the decode-row slots straight from the metadata
        md = self.forward_metadata
        slots, wp_rows = md.mamba_cache_indices[md.num_prefills:md.num_prefills + md.num_decodes], None
    else:
        slots, wp_rows = step.slots, step.wp_rows
    ctx = _LayerContext(
        ring_views=ring.layer(pool_idx), slots=slots, wp_rows=wp_rows,
        state_ptr=temporal[pool_idx].data_ptr(), num_slots=ring.num_slots,
        pool_idx=pool_idx, layer_id=layer_id, mode=mode,
        spec=ring.verify_cursors)
    if current_context() is not None:
        raise ReplayDecodeError("nested Mamba2AttnBackend.forward calls under a replay context")
    _CTX.set(ctx)
    try:
        result = original(self, mixer, hidden_states, output, layer_id, forward_batch, *args, **kwargs)
    finally:
        _CTX.set(None)
    if ctx.calls != 1:
        drop_step(self)
        raise ReplayDecodeError(
            f"layer_id {layer_id}: the mixer made {ctx.calls} {ctx.mode} selective_state_update call(s) through "
            f"{SSU_TARGET} (expected exactly 1); this mixer is not supported by the replay seam")
    A = getattr(mixer, "A", None)
    if A is None:
        drop_step(self)
        raise ReplayDecodeError(f"layer_id {layer_id}: the mixer has no A parameter; the slot-lifecycle fold "
                                "of this layer's ring could not replay it")
    from . import lifecycle  # finish folds of this layer's pending ring need the mixer's A

    lifecycle.register_layer_params(ring, pool_idx, A=A)
    if step is not None:
        close_layer(self, ring, step)
    return result


# --------------------------------------------------------------------------------------
# the SSM-update dispatcher
# --------------------------------------------------------------------------------------

_SIG_CACHE: Dict[Any, inspect.Signature] = {}


def _bind(original, args, kwargs) -> Dict[str, Any]:
    sig = _SIG_CACHE.get(original)
    if sig is None:
        sig = inspect.signature(inspect.unwrap(original))
        _SIG_CACHE[original] = sig
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


_VERIFY_ONLY = ("intermediate_states_buffer", "cache_steps", "retrieve_parent_token", "intermediate_state_indices")


def _not_plain_decode(a: Dict[str, Any], ctx: _LayerContext) -> Optional[str]:
    if a.get("disable_state_update"):
        return "disable_state_update=True (a verify call)"
    for name in _VERIFY_ONLY:
        if a.get(name) is not None:
            return f"{name} is set (a verify call)"
    if a["x"].dim() != 3:
        return f"x has shape {tuple(a['x'].shape)}, expected [batch, H, P]"
    return _not_this_layer(a, ctx)


def _not_chain_verify(a: Dict[str, Any], ctx: _LayerContext) -> Optional[str]:
    if not a.get("disable_state_update"):
        return "disable_state_update is not set (not SGLang's target-verify call)"
    x = a["x"]
    if x.dim() != 4:
        return f"x has shape {tuple(x.shape)}, expected [batch, draft_tokens, H, P]"
    steps = a.get("cache_steps")
    if steps is not None and int(steps) != x.shape[1]:
        return f"cache_steps={steps} differs from the window {x.shape[1]}"
    return _not_this_layer(a, ctx)


def _not_this_layer(a: Dict[str, Any], ctx: _LayerContext) -> Optional[str]:
    state, idx, out = a["state"], a.get("state_batch_indices"), a.get("out")
    if state.dim() != 4 or state.data_ptr() != ctx.state_ptr or state.shape[0] != ctx.num_slots:
        return "state is not this layer's temporal cache"
    if idx is None or idx.data_ptr() != ctx.slots.data_ptr() or tuple(idx.shape) != tuple(ctx.slots.shape):
        return "state_batch_indices are not the forward metadata's decode-row slots"
    if out is None:
        return "out is None"
    if a.get("pad_slot_id", -1) >= 0:
        return f"pad_slot_id={a.get('pad_slot_id')} (expected negative)"
    return None


def selective_state_update_around(original, *args, **kwargs):
    """AROUND ``mamba.selective_state_update``: decode calls under a context go to the ring."""
    ctx = current_context()
    if ctx is None:
        return original(*args, **kwargs)
    a = _bind(original, args, kwargs)
    if ctx.mode == "verify" and a.get("retrieve_parent_token") is not None:  # a tree (EAGLE topk > 1)
        from .spec_tree import mamba2_tree_verify_call

        return mamba2_tree_verify_call(a, ctx)
    why = _not_chain_verify(a, ctx) if ctx.mode == "verify" else _not_plain_decode(a, ctx)
    if why is not None:
        raise ReplayDecodeError(f"layer_id {ctx.layer_id}: unexpected selective_state_update call during a "
                                f"replay {ctx.mode} forward: {why}")
    rv = ctx.ring_views
    common = dict(D=a.get("D"), z=a.get("z"), dt_bias=a.get("dt_bias"), dt_softplus=bool(a.get("dt_softplus")),
                  null_slot=NULL_SLOT)
    if ctx.mode == "decode":
        from ..kernels.mamba2_replay import mamba2_replay_decode

        mamba2_replay_decode(a["state"], rv["x"], rv["B"], rv["dt"], a["x"], a["dt"], a["A"], a["B"], a["C"],
                             a["state_batch_indices"], ctx.wp_rows, out=a["out"], **common)
    else:
        from ..kernels.mamba2_verify import mamba2_verify

        win = (lambda t: t) if ctx.mode == "verify" else (lambda t: None if t is None else t.unsqueeze(1))
        if ctx.mode == "decode_spec":
            common["z"] = win(common["z"])
        # the per-draft snapshot buffer (intermediate_states_buffer) is neither read nor written
        mamba2_verify(a["state"], rv["x"], rv["B"], rv["dt"], win(a["x"]), win(a["dt"]), a["A"], win(a["B"]),
                      win(a["C"]), a["state_batch_indices"], *ctx.spec, out=win(a["out"]), **common)
    ctx.calls += 1
    return None


SSU_PARAMS = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus", "state_batch_indices",
              "pad_slot_id", "out", "disable_state_update", "intermediate_states_buffer", "cache_steps",
              "retrieve_parent_token", "intermediate_state_indices")

PATCHES: List[Patch] = [
    Patch(SSU_TARGET, "around", selective_state_update_around, params=SSU_PARAMS,
          description="Mamba2 decode SSM update -> mamba2_replay_decode under a replay layer context"),
    Patch(BACKEND_FORWARD_TARGET, "around", backend_forward_around,
          params=("self", "mixer", "hidden_states", "output", "layer_id", "forward_batch"),
          description="Mamba2 layer context (ring views, cursors) + once-per-forward cursor advance"),
]
