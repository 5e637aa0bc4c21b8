"""Per-forward replay cursor bookkeeping shared by the decode seams (no math).

Both decode seams (``mamba2_decode``, ``gdn_decode``) advance the ring cursor the same
way: at the FIRST mamba layer of a decode forward (pool index ``min(mamba_map)``) the
per-row cursors ``write_pos[slot]`` are gathered once and shared by every layer of that
forward; after the LAST mamba layer (pool index ``max(mamba_map)``)
:func:`advance_cursors` stores the next cursor of every live row.  Both device ops have
fixed shapes and fixed addresses and never read a device value on the host, so they
replay inside a captured CUDA graph.  The host-side order check (layers must run
first..last, each once) runs at capture / eager time only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

NULL_SLOT = 0               # MambaSlotAllocator never hands out slot 0 (dummy / capture rows)
RING_ATTR = "rssm_ring"     # on HybridReqToTokenPool.mamba_pool: the ReplayRing (patches/pool.py), or None
STEP_ATTR = "_rssm_step"    # the backend attribute holding the forward in progress


class ReplayDecodeError(RuntimeError):
    """A decode seam met a call it cannot serve exactly."""


# --------------------------------------------------------------------------------------
# device ops (fixed shapes, no host sync; one launch each: kernels/decode_cursor.py)
# --------------------------------------------------------------------------------------


def gather_cursors(write_pos, slots):
    """Per-row cursors ``write_pos[slot]``; rows with a negative slot read slot 0."""
    from ..kernels.decode_cursor import gather_cursors as gather

    return gather(write_pos, slots)


def advance_cursors(write_pos, slots, wp_rows, buffer_len: int) -> None:
    """After a decode step: ``write_pos[slot] = 0 if w == L-1 else w + 1`` for live rows.

    ``w`` is ``wp_rows`` clamped to [0, L-1] (as the kernels clamp it).  Rows with
    slot <= NULL_SLOT (padding -1, dummy 0) store nothing.  In place, fixed shapes, no host sync.
    """
    from ..kernels.decode_cursor import advance_cursors as advance

    advance(write_pos, slots, wp_rows, int(buffer_len), null_slot=NULL_SLOT)


# --------------------------------------------------------------------------------------
# host bookkeeping of one decode forward
# --------------------------------------------------------------------------------------


@dataclass
class ForwardStep:
    """One decode forward of one backend (host bookkeeping + the gathered cursors)."""

    metadata: Any              # the forward metadata object this forward runs with
    slots: Any                 # decode-row slots (a view of the metadata's mamba_cache_indices)
    wp_rows: Any               # cursors gathered at the first mamba layer
    order: Tuple[int, ...]     # pool layer indices, in the order they must run
    pos: int = 0               # index into ``order`` of the next expected layer


def layer_order(mamba_map) -> Tuple[int, ...]:
    """Pool layer indices of a forward, first..last (``mamba_map``: layer_id -> pool index)."""
    return tuple(sorted(set(mamba_map.values())))


def open_layer(backend, ring, metadata, order: Tuple[int, ...], pool_idx: int, layer_id: int,
               slots_of: Callable[[], Any], label: str) -> ForwardStep:
    """The forward step a layer call belongs to.

    At the first layer (``pool_idx == order[0]``) a new step starts: ``slots_of()`` gives
    the decode-row slot tensor and the cursors are gathered.  Any other layer must be the
    next one of the step in progress, on the same metadata; otherwise this raises.
    """
    step = getattr(backend, STEP_ATTR, None)
    if pool_idx == order[0]:
        slots = slots_of()
        step = ForwardStep(metadata, slots, gather_cursors(ring.write_pos, slots), order)
        setattr(backend, STEP_ATTR, step)
        return step
    if step is None or step.metadata is not metadata or step.pos >= len(step.order) \
            or step.order[step.pos] != pool_idx:
        expected = None if step is None or step.pos >= len(step.order) else step.order[step.pos]
        raise ReplayDecodeError(
            f"{label} decode visited pool layer {pool_idx} (layer_id {layer_id}) out of order "
            f"(expected {expected}); the replay cursor is per forward and needs layers first..last")
    return step


def close_layer(backend, ring, step: ForwardStep) -> None:
    """A layer of ``step`` finished; after the last one the cursors advance (on device).

    A spec ring (``ring.spec_window`` set) runs plain decode rows as verifies of one
    token, so its cursors take the spec commit of one token per live row instead."""
    step.pos += 1
    if step.pos == len(step.order):
        if ring.spec_window is not None:
            from ..kernels.spec_cursor import spec_commit

            spec_commit(*ring.verify_cursors, step.slots, None, window=ring.spec_window,
                        ring_len=ring.ring_len, null_slot=NULL_SLOT)
        else:
            advance_cursors(ring.write_pos, step.slots, step.wp_rows, ring.buffer_len)
        setattr(backend, STEP_ATTR, None)


def drop_step(backend) -> None:
    """Forget the step in progress (after an error: the next forward must start afresh)."""
    setattr(backend, STEP_ATTR, None)


@dataclass
class LayerContext:
    """What a decode seam's kernel dispatcher needs for the layer being run (one per thread)."""

    ring_views: Dict[str, Any]
    slots: Any
    wp_rows: Any
    state_ptr: int
    num_slots: int
    pool_idx: int
    layer_id: int
    geom: Any = None              # GDN: the layer's head geometry
    calls: int = 0
    # "decode": standard-decode ring (per-row cursors wp_rows); "decode_spec": a decode row on
    # a spec ring (a verify of one token); "verify": a target-verify window on a spec ring
    mode: str = "decode"
    spec: Any = None              # spec rings: (write_pos, origin, flush) per-slot cursor tensors


class ContextHolder:
    """Thread-local slot for the active LayerContext of one seam."""

    def __init__(self):
        self._tls = threading.local()

    def current(self) -> Optional[LayerContext]:
        return getattr(self._tls, "ctx", None)

    def set(self, ctx: Optional[LayerContext]) -> None:
        self._tls.ctx = ctx
