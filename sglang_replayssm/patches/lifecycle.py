"""Seam: slot lifecycle -- fold a request's ring into its checkpoint before SGLang keeps the state.

A replay-ring seam: listed by :func:`sglang_replayssm.patches.replay_ring_patches`, applied by
the launcher unless ``--replayssm-replay-ring false`` (run end to end on an H200).
No math here: the fold is ``kernels.materialize.materialize_ring``.

Why
---
With ReplaySSM a live slot's ``temporal`` lags the request by ``w = write_pos[slot]``
tokens (their SSM inputs sit in the ring).  Anything in SGLang that keys a slot's
``temporal`` by the request's full length must first see those tokens folded in.

Where SGLang keeps a request's mamba state (0.5.17; read, not run)
------------------------------------------------------------------
(The 0.5.23 notes below are also run: ``make test-sglang-0.5.23`` drives 0.5.23's own
``release_kv_cache`` through tests/patches/test_lifecycle.py.)
* Finish under a mamba radix tree: ``sglang.srt.mem_cache.common.release_kv_cache``
  (``common.py:132``) calls ``tree_cache.cache_finished_req(req, is_insert=...,
  kv_len_to_handle=...)`` (``:149``), which *donates the live slot id* to the tree
  (``MambaRadixCache.cache_finished_req`` ``mamba_radix_cache.py:541``; unified
  ``MambaComponent.prepare_for_caching_req`` ``unified_cache/components/
  mamba_component.py:509``, ``active_value = req.mamba_pool_idx``).  Callers of
  ``release_kv_cache`` with ``is_insert`` true: ``batch_result_processor.py:108, 275,
  354, 1058`` (finished requests, prefill or decode results), ``scheduler.py:4350``.
  0.5.15: ``common.py:635``, same signature.  0.5.23: ``common.py:400``
  ``release_kv_cache(req, tree_cache, *, checkpoint)`` -> ``tree_cache.checkpoint(req,
  up_to=...)``, slot in ``req.kv.mamba_pool_idx``.
* Retract: ``ScheduleBatch.retract_decode`` -> ``release_req`` (``schedule_batch.py
  :1834``) -> ``release_kv_cache(req, tree_cache, is_insert=False)`` (``:1855``; 0.5.15
  ``:1606``; 0.5.23 ``:2389`` ``checkpoint=False``): nothing is cached, the slot is
  freed, the request is recomputed from scratch (``reset_for_retract``).
* Unfinished (chunked prefill, prefill results): ``maybe_cache_unfinished_req`` ->
  ``cache_unfinished_req`` (``mamba_radix_cache.py:666``; unified ``:581``) *copies*
  the live slot into a new tree slot with ``MambaPool.copy_from``.

Hook: BEFORE ``release_kv_cache`` (propagated to the modules that imported it by name)
-------------------------------------------------------------------------------------
:func:`release_kv_cache_before` folds the request's slot (all layers, then
``write_pos[slot] = 0``; device only, no host sync) exactly when the tree will keep
the state: the pool carries a ring, the request holds KV and a mamba slot, the tree
manages mamba state (``tree_cache.supports_mamba()`` and not ``disable``), and the
call inserts (``is_insert`` / ``checkpoint`` true, ``req.skip_radix_cache_insert``
false).  The slot id is translated virtual -> physical with the pool's
``translate_mamba_indices`` where it exists (identity for the static pool).
The donated slot then holds the exact state at ``len(origin_input_ids +
output_ids)`` (the key length SGLang uses), so no truncation of ``cache_len`` is
needed (upstream's ReplaySSM truncates and syncs instead).

Deliberately NOT folded
* Retract / abort (``is_insert=False`` / ``checkpoint=False``): the state is
  discarded; the slot's next owner passes ``clear_slots`` (fresh) or ``copy_from``
  (COW), whose AFTER hooks (``patches/pool.py``) reset the cursor.  Folding would be
  wasted work and, with the overlap scheduler, would race with the forward still in
  flight for the retracted request (launched on the forward stream).
* ChunkCache / radix disabled: same (the slot is freed).
* ``extra_buffer`` trees (``tree_cache.enable_mamba_extra_buffer``): the finish caches the
  request's *track* slot at ``mamba_last_track_seqlen`` (materialised when it was tracked,
  ``patches/prefix_track.py``) and frees the live slot; folding the live slot would be
  wasted work racing the overlap scheduler's forward in flight.
* ``cache_unfinished_req``: it follows an extend, whose chunked scan left ``temporal``
  exact and the cursor at 0.  Under the overlap scheduler the next forward may already
  have appended the request's first decode token to the live ring when this runs, and
  that token is not part of the cached prefix: folding here would be wrong, so the
  copy takes ``temporal`` alone (``copy_from``'s AFTER hook resets the destination
  cursor; with ``SGLANG_DEBUG_MEMORY_POOL`` it asserts the source is flushed).

Overlap: a finish fold runs on the scheduler thread's current stream.  It is exact only
when no forward that appends to this slot is in flight, i.e. with the overlap scheduler
off -- which SGLang forces for ``no_buffer`` (``arg_groups/overrides.py`` resolves
``auto`` to ``no_buffer`` + ``disable_overlap_schedule``); ``extra_buffer`` finishes do
not fold (above).  When a published ``ServerArgs`` says overlap is on and a fold is due, the
hook raises :class:`LifecycleError` instead of caching a possibly inexact state.

Per-layer parameters (the hook the decode seams must call)
----------------------------------------------------------
The Mamba2 fold needs each layer's ``A`` (= ``MambaMixer2.A``, ``-exp(A_log)``, [H/tp]
fp32); the release path sees only the request and the tree.  The decode seams publish
it with::

    from sglang_replayssm.patches import lifecycle
    lifecycle.register_layer_params(ring, pool_layer, A=mixer.A)          # Mamba2
    lifecycle.register_layer_params(ring, pool_layer, use_qk_l2norm=...)  # GDN (optional)

once per layer, before the first ring append of that layer (idempotent, a dict store of
a tensor reference; ``pool_layer = req_to_token_pool.mamba_map[layer_id]``).  For
``patches/mamba2_decode.py`` the natural place is ``_plan`` / ``backend_forward_around``
(``mixer`` is an argument there).  GDN needs nothing (default ``use_qk_l2norm=True``,
what Qwen3-Next/Qwen3.5 run).  Rules at fold time (Mamba2): no layer registered -> the
decode seam never appended to this ring, nothing to fold (checked with a sync only under
``SGLANG_DEBUG_MEMORY_POOL``); some but not all layers registered -> :class:`LifecycleError`.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch

from ._cursor import RING_ATTR
from .registry import Patch

logger = logging.getLogger("sglang_replayssm.patches")

RELEASE_TARGET = "sglang.srt.mem_cache.common.release_kv_cache"
NULL_SLOT = 0               # SGLang's dummy slot: never folded


class LifecycleError(RuntimeError):
    """A request's state cannot be made exact before SGLang keeps it."""


# --------------------------------------------------------------------------------------
# per-layer parameter registry (filled by the decode seams)
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerParams:
    A: Optional[torch.Tensor] = None    # Mamba2: the layer's A [H] (or tied [H,P,N]); None for GDN
    use_qk_l2norm: bool = True          # GDN: whether the cached raw k is L2-normalised on read


_PARAMS: "weakref.WeakKeyDictionary[Any, Dict[int, LayerParams]]" = weakref.WeakKeyDictionary()


def register_layer_params(ring, pool_layer: int, *, A: Optional[torch.Tensor] = None,
                          use_qk_l2norm: bool = True) -> None:
    """Publish pool layer ``pool_layer``'s parameters for folds of ``ring`` (see the module docstring)."""
    if not 0 <= int(pool_layer) < ring.num_layers:
        raise IndexError(f"register_layer_params: pool layer {pool_layer} out of range [0, {ring.num_layers})")
    if ring.kind == "mamba2" and A is None:
        raise ValueError("register_layer_params: a Mamba2 layer needs its A")
    table = _PARAMS.get(ring)
    if table is None:
        table = _PARAMS[ring] = {}
    table[int(pool_layer)] = LayerParams(A=A, use_qk_l2norm=bool(use_qk_l2norm))


def layer_params(ring) -> Dict[int, LayerParams]:
    """A copy of what has been registered for ``ring`` (pool layer -> params)."""
    return dict(_PARAMS.get(ring, {}))


def clear_layer_params(ring=None) -> None:
    """Forget the parameters of ``ring`` (all rings when None); for tests and pool teardown."""
    if ring is None:
        _PARAMS.clear()
    else:
        _PARAMS.pop(ring, None)


# --------------------------------------------------------------------------------------
# the fold
# --------------------------------------------------------------------------------------

def ring_of_pool(req_to_token_pool) -> Optional[Any]:
    mamba_pool = getattr(req_to_token_pool, "mamba_pool", None)
    return None if mamba_pool is None else getattr(mamba_pool, RING_ATTR, None)


def fold_slots(mamba_pool, slots: torch.Tensor) -> bool:
    """Fold ``slots`` (physical ids, device tensor) of every layer of ``mamba_pool``'s ring.

    Returns False when there is no ring or (Mamba2) nothing can be pending yet.
    """
    from ..kernels.materialize import materialize_ring

    ring = getattr(mamba_pool, RING_ATTR, None)
    if ring is None:
        return False
    temporal = mamba_pool.mamba_cache.temporal
    params = _PARAMS.get(ring, {})
    if ring.kind == "mamba2":
        if not params:
            if getattr(mamba_pool, "debug_memory_pool", False):
                wp = ring.write_pos[slots.to(ring.device, torch.long).clamp(min=0)]
                if bool((wp != 0).any()):  # debug only: syncs
                    raise LifecycleError(f"slot(s) {slots.tolist()} hold Mamba2 ring entries {wp.tolist()} "
                                         "but no decode seam registered the layers' A")
            return False
        missing = [i for i in range(ring.num_layers) if i not in params]
        if missing:
            raise LifecycleError(f"Mamba2 ring fold: A not registered for pool layer(s) {missing} "
                                 f"(registered: {sorted(params)}); the decode seam must call "
                                 "lifecycle.register_layer_params for every layer")
        A = [params[i].A for i in range(ring.num_layers)]
        materialize_ring(ring, temporal, slots, A=A, null_slot=NULL_SLOT)
    else:
        l2 = {p.use_qk_l2norm for p in params.values()} or {True}
        if len(l2) != 1:
            raise LifecycleError("GDN ring fold: layers registered with different use_qk_l2norm")
        materialize_ring(ring, temporal, slots, use_qk_l2norm=l2.pop(), null_slot=NULL_SLOT)
    return True


def request_slot(req, req_to_token_pool) -> Optional[torch.Tensor]:
    """The request's physical mamba slot as a 1-element device tensor, or None (no host sync)."""
    idx = getattr(req, "mamba_pool_idx", None)  # 0.5.15 / 0.5.17
    if idx is None:
        idx = getattr(getattr(req, "kv", None), "mamba_pool_idx", None)  # 0.5.23
    if idx is None:
        return None
    idx = torch.as_tensor(idx).reshape(1)
    translate = getattr(req_to_token_pool, "translate_mamba_indices", None)
    if translate is not None:
        idx = translate(idx)
    return idx.reshape(-1)


def _holds_kv(req) -> bool:
    kv = getattr(req, "kv", None)
    if kv is not None and hasattr(kv, "holds_kv"):  # 0.5.23
        return bool(kv.holds_kv)
    return getattr(req, "req_pool_idx", None) is not None


def tree_keeps_state(req, tree_cache, insert: bool) -> bool:
    """True when this release hands the request's mamba state to the tree."""
    if not insert or getattr(req, "skip_radix_cache_insert", False):
        return False
    supports = getattr(tree_cache, "supports_mamba", None)
    if supports is None or not supports() or getattr(tree_cache, "disable", False):
        return False
    return _holds_kv(req)


def _check_no_overlap() -> None:
    try:
        from sglang.srt.runtime_context import get_server_args

        server_args = get_server_args()
    except Exception:  # nothing published (unit tests)
        return
    if server_args is not None and not getattr(server_args, "disable_overlap_schedule", True):
        raise LifecycleError(
            "ReplaySSM: a finished request's mamba slot is cached in the radix tree while the overlap "
            "scheduler is on; the ring fold cannot be ordered against the forward in flight. Use "
            "--mamba-radix-cache-strategy no_buffer (which turns overlap off), --disable-overlap-schedule, "
            "or --disable-radix-cache")


def _insert_flag(args, kwargs) -> bool:
    if "is_insert" in kwargs:
        return bool(kwargs["is_insert"])
    if "checkpoint" in kwargs:   # 0.5.23 (keyword-only, required)
        return bool(kwargs["checkpoint"])
    return bool(args[2]) if len(args) > 2 else True


def release_kv_cache_before(*args, **kwargs):
    """BEFORE ``release_kv_cache``: fold the request's ring when the tree is about to keep its state."""
    req = kwargs["req"] if "req" in kwargs else args[0]
    tree_cache = kwargs["tree_cache"] if "tree_cache" in kwargs else args[1]
    pool = getattr(tree_cache, "req_to_token_pool", None)
    if ring_of_pool(pool) is None:
        return None
    if not tree_keeps_state(req, tree_cache, _insert_flag(args, kwargs)):
        return None
    if getattr(tree_cache, "enable_mamba_extra_buffer", False):
        # extra_buffer: the tree keeps the request's tracked ping-pong slot (already materialised by
        # patches/prefix_track.py at the track step), never the live slot, which is freed
        return None
    slot = request_slot(req, pool)
    if slot is None:
        return None
    _check_no_overlap()
    fold_slots(pool.mamba_pool, slot)
    return None


PATCHES = [
    Patch(RELEASE_TARGET, "before", release_kv_cache_before, versions=">=0.5.15,<0.5.23",
          params=("req", "tree_cache", "is_insert"), propagate=True,
          description="fold the request's ReplaySSM ring before the radix tree keeps its mamba slot"),
    Patch(RELEASE_TARGET, "before", release_kv_cache_before, versions=">=0.5.23,<0.6",
          params=("req", "tree_cache", "checkpoint"), propagate=True,
          description="fold the request's ReplaySSM ring before the radix tree keeps its mamba slot"),
]
