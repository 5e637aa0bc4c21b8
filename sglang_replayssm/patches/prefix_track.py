"""Seam: SGLang's ``extra_buffer`` decode track copy -> a materialised state (no math; the
fold is ``kernels.materialize`` through :func:`lifecycle.fold_slots`).

What SGLang does (0.5.17; read, not run; ``docs/prefix-caching.md`` has the whole flow)
----------------------------------------------------------------------------------------
With ``--mamba-radix-cache-strategy extra_buffer`` every request holds, besides its live
mamba slot, a ping-pong pair of *track* slots.  ``ScheduleBatch.prepare_for_decode`` sets
``mamba_track_mask = seq_lens % mamba_track_interval == 0`` (seq_lens already counting the
token this forward decodes) and ``mamba_track_indices`` = the request's
``mamba_ping_pong_track_buffer[mamba_next_track_idx]``.  Inside the decode forward, after
the SSM update, SGLang copies conv + ``temporal`` of the live slot into the track slot of
every masked row: per layer for Mamba2 (``Mamba2AttnBackend.forward`` ->
``track_mamba_states_if_needed``), once for all layers at the last GDN layer
(``MambaAttnBackendBase._track_mamba_state_decode`` -> ``track_mamba_states_all_layers``,
or the per-layer fallback).  Both are module globals of ``hybrid_linear_attn_backend``.
The result processor then swaps ``mamba_next_track_idx`` and records
``mamba_last_track_seqlen``; the radix tree later receives that track slot
(``donate_mamba_ping_pong_slot`` / ``cache_finished_req``'s keep slot), keyed by
``mamba_last_track_seqlen`` tokens.

Why it needs a seam: with the replay ring, the live slot's ``temporal`` lags the request by
the ring's pending entries, so the copied checkpoint is not the state at the track length.

Hooks (AROUND both module globals; no propagation: only ``hybrid_linear_attn_backend``
calls them by these names)
* Outside a replay decode context (no ring, prefill, draft workers): SGLang's copy, untouched.
* Inside one (``mamba2_decode`` / ``gdn_decode`` layer context, i.e. *before* the forward's
  cursor advance): SGLang's copy runs first (conv windows + checkpoint).  At the LAST mamba
  layer (the GDN all-layers call comes only there) :func:`materialize_track` then
  1. copies the live slot's ring rows (all layers) into the track slot with SGLang's own
     masked row copier (``track_mamba_states_all_layers``, unpatched; 0.5.15: the per-layer one
     in a loop): only masked rows move data, the others exit at once, as for SGLang's state copy;
  2. sets the track slot's cursor to the entries pending *after* this step: ``0`` when this
     step flushed (``w == L-1``: the kernel wrote the new state to ``temporal``), else
     ``w + 1`` (``w = write_pos[live]``, not yet advanced);
  3. folds the track slot (``lifecycle.fold_slots``: all layers, then ``write_pos[track] = 0``;
     slot -1 for unmasked rows, which the fold kernels skip).
  The live slot is not touched, so its cursor advance and ring cycle go on as before.  All
  device ops with fixed shapes, no host sync: captured with the rest of the decode graph.
* AFTER ``MambaAttnBackendBase._track_mamba_state_extend`` (prefill tracking, 0.5.15-0.5.23):
  the track slots that received a chunk-boundary state get cursor 0 (their prefill state is
  exact: an extend starts from a slot whose ring is empty, see ``docs/prefix-caching.md``).
* BEFORE ``MambaMixer2.forward``: under a Mamba2 ring context, publish
  the mixer's ``A`` for the layer (``lifecycle.register_layer_params``), so that the fold at
  the last layer has every layer's ``A`` already on the first forward (the decode seam
  registers it only after the layer returns).

Speculative rings: SGLang tracks verify states at the commit, not in the forward; the commit seams
(``spec_commit``, ``spec_tree``) call :func:`spec_track_commit` after their cursor move.  A plain decode
forward with a track mask on a spec ring is refused (:func:`check_tracked_forward`).

Wiring: served with the replay-ring seams. The decode seams (``mamba2_decode._plan``,
``gdn_decode._plan``) take a decode forward that carries ``mamba_track_mask`` only on a
standard-decode ring and only while these hooks are applied (:func:`hooks_applied`); the launcher
accepts ``extra_buffer`` unless ``--replayssm-extra-buffer false`` (``patches/server_args.py``).  Without
extra_buffer SGLang never calls the track copies, so the hooks cost nothing.
"""

from __future__ import annotations

import logging
import weakref
from typing import List, Tuple

import torch

from ._cursor import NULL_SLOT, ReplayDecodeError
from .registry import Patch

logger = logging.getLogger("sglang_replayssm.patches")

BACKEND_MODULE = "sglang.srt.layers.attention.hybrid_linear_attn_backend"
TRACK_TARGET = BACKEND_MODULE + ".track_mamba_states_if_needed"
TRACK_ALL_TARGET = BACKEND_MODULE + ".track_mamba_states_all_layers"
TRACK_EXTEND_TARGET = BACKEND_MODULE + ".MambaAttnBackendBase._track_mamba_state_extend"
MIXER_TARGET = "sglang.srt.layers.attention.mamba.mamba.MambaMixer2.forward"
TRACK_PARAMS = ("conv_states", "ssm_states", "cache_indices", "mamba_track_mask", "mamba_track_indices",
                "batch_size")
TRACK_ALL_PARAMS = ("conv_states_pool", "ssm_states_pool", "cache_indices", "mamba_track_mask",
                    "mamba_track_indices", "batch_size")


def _active_context():
    """The replay layer context of the decode seam running now, or None."""
    from . import gdn_decode, mamba2_decode

    return mamba2_decode.current_context() or gdn_decode.current_context()


_OWNER_CACHE: dict = {}   # (pool layer, data pointers of its ring views) -> weak (ring, mamba_pool)


def ring_of_context(ctx) -> Tuple[object, object]:
    """(ring, mamba_pool) whose pool layer ``ctx.pool_idx`` views are ``ctx.ring_views``."""
    from .pool import registered_rings

    want = tuple(sorted((k, v.data_ptr()) for k, v in ctx.ring_views.items()))
    key = (ctx.pool_idx, want)
    hit = _OWNER_CACHE.get(key)
    if hit is not None:
        ring, mamba_pool = hit[0](), hit[1]()   # weak: a live ring's views cannot move
        if ring is not None and mamba_pool is not None:
            return ring, mamba_pool
    for ring, mamba_pool in registered_rings():
        if 0 <= ctx.pool_idx < ring.num_layers and \
                tuple(sorted((k, v.data_ptr()) for k, v in ring.layer(ctx.pool_idx).items())) == want:
            _OWNER_CACHE[key] = (weakref.ref(ring), weakref.ref(mamba_pool))
            return ring, mamba_pool
    raise ReplayDecodeError(f"extra_buffer track copy: no registered replay ring owns the layer context of "
                            f"pool layer {ctx.pool_idx}")


def _per_layer(copy_rows):
    """A per-layer masked row copier (``track_mamba_states_if_needed``) applied to every layer of
    ``[layers, S, ...]`` ring tensors."""
    def copy_all(a, b, src, rows, dst, bs):
        for i in range(a.shape[0]):
            copy_rows(a[i], b[i], src, rows, dst, bs)
    return copy_all


def default_row_copier():
    """SGLang's own masked row copier (unpatched), all layers per call: the all-layers kernel where
    the release has it (0.5.17+), else the per-layer one in a loop."""
    import sys

    mod = sys.modules.get(BACKEND_MODULE) or __import__(BACKEND_MODULE, fromlist=["_"])
    fn = getattr(mod, "track_mamba_states_all_layers", None)
    if fn is not None:
        return getattr(fn, "__wrapped__", fn)
    fn = mod.track_mamba_states_if_needed
    return _per_layer(getattr(fn, "__wrapped__", fn))


def _track_rows(ring, live: torch.Tensor, track: torch.Tensor, keep: torch.Tensor):
    """``(rows, src, dst, track)`` of a masked live -> track copy: rows kept by ``keep`` whose live and track
    slots are real; ``src`` / ``dst`` the slots (0, the dummy, for the other rows, which move no data)."""
    live = live.reshape(-1).to(ring.device, torch.long)
    track = track.reshape(-1).to(ring.device, torch.long)
    rows = keep & (live > NULL_SLOT) & (track > NULL_SLOT)
    return rows, torch.where(rows, live, torch.zeros_like(live)), torch.where(rows, track, torch.zeros_like(track)), \
        track


def materialize_track(ring, mamba_pool, live: torch.Tensor, mask: torch.Tensor, track: torch.Tensor,
                      copy_rows=None) -> None:
    """Make the track slots of the masked rows the exact state of their live slots after this step.

    Call after SGLang's own copy of conv + ``temporal`` (live -> track) and *before* the
    forward's cursor advance: ``write_pos[live]`` is the cursor the step started from.
    ``live``, ``mask``, ``track``: one entry per row (physical slot ids; padded rows -1).
    ``copy_rows(a, b, src, rows, dst, bs)``: SGLang's masked row copier over ``[layers, S, ...]``
    tensors (:func:`default_row_copier`); only masked rows move data, the others exit at once,
    so the cost is paid on track steps only (the fold kernels skip slot -1 the same way).
    """
    if ring.spec_window is not None:
        raise ReplayDecodeError("extra_buffer state tracking on a speculative replay ring is not supported; use "
                                "--mamba-radix-cache-strategy no_buffer or --replayssm-spec false")
    rows, src, dst, track = _track_rows(ring, live, track, mask.reshape(-1).to(ring.device) != 0)
    # 1. the live slot's ring rows -> the track slot (all layers, masked rows only)
    copy_rows = copy_rows or default_row_copier()
    names = list(ring.tensors)                      # Mamba2 x, B, dt; GDN d, k, g
    bs = int(rows.shape[0])
    copy_rows(ring.tensors[names[0]], ring.tensors[names[1]], src, rows, dst, bs)
    copy_rows(ring.tensors[names[2]], ring.tensors[names[2]], src, rows, dst, bs)
    # 2. the track slot's cursor: the entries pending after this step (a flush step left none)
    L = ring.buffer_len
    w = ring.write_pos[src].to(torch.long).clamp(0, L - 1)
    pending = torch.where(w == L - 1, torch.zeros_like(w), w + 1)
    ring.write_pos[dst] = torch.where(rows, pending, torch.zeros_like(pending)).to(ring.write_pos.dtype)
    # 3. fold the track slot (all layers), cursor -> 0
    from .lifecycle import fold_slots

    fold_slots(mamba_pool, torch.where(rows, track, torch.full_like(track, -1)))


def materialize_spec_track(ring, mamba_pool, live: torch.Tensor, n_accept: torch.Tensor, path_pos: torch.Tensor,
                           track: torch.Tensor, copy_rows=None) -> None:
    """After a speculative commit on a spec ring: make the track slots of the rows that cross a track boundary
    the exact state after window token ``path_pos`` of the accepted path (SGLang's ``mamba_steps_to_track``,
    as a position on the path; -1: no track for that row).

    Call after the commit moved the cursors (``spec_commit`` / ``spec_commit_tree``): the live slot then holds
    ``wp'`` committed entries after its checkpoint, the ``n_accept`` accepted ones last, so the state after path
    position ``p`` is the checkpoint plus the first ``wp' - (n_accept - 1 - p)`` logical entries.  The live slot's
    checkpoint, ring rows (all layers) and origin are copied to the track slot with that count as its ``wp``, and
    the track slot is folded (all its cursors -> 0).  The live slot is not touched.  Only rows with
    ``0 <= p < n_accept`` and live and track slots move data (SGLang's masked row copier; the fold skips slot -1);
    fixed shapes, no host sync.  The conv windows are the caller's: SGLang's own masked scatter, as stock.
    """
    a = n_accept.reshape(-1).to(ring.device, torch.long)
    p = path_pos.reshape(-1).to(ring.device, torch.long)
    rows, src, dst, track = _track_rows(ring, live, track, (p >= 0) & (p < a))
    copy_rows = copy_rows or default_row_copier()
    names = list(ring.tensors)                      # Mamba2 x, B, dt; GDN d, k, g
    bs = int(rows.shape[0])
    copy_rows(ring.tensors[names[0]], mamba_pool.mamba_cache.temporal, src, rows, dst, bs)
    copy_rows(ring.tensors[names[1]], ring.tensors[names[2]], src, rows, dst, bs)
    wp, origin, _ = ring.verify_cursors               # the fold reads wp and origin, and resets all three
    count = (wp[src].to(torch.long) - (a - 1 - p)).clamp(min=0)
    zero = torch.zeros_like(count)
    wp[dst] = torch.where(rows, count, zero).to(wp.dtype)
    origin[dst] = torch.where(rows, origin[src].to(torch.long), zero).to(origin.dtype)
    from .lifecycle import fold_slots

    fold_slots(mamba_pool, torch.where(rows, track, torch.full_like(track, -1)))


def spec_track_commit(ring, mamba_pool, live, n_accept, path_pos, node_steps, track, conv_caches) -> None:
    """The extra_buffer part of a spec commit: the track slots' SSM state (:func:`materialize_spec_track`) and
    their conv windows, SGLang's masked conv scatter from the per-draft windows at the tracked node (the call
    stock's ``scatter_mamba_states_after_mtp_verify`` makes for the track slots)."""
    from .spec_commit import _conv_scatter

    materialize_spec_track(ring, mamba_pool, live, n_accept, path_pos, track)
    scatter = _conv_scatter()
    for conv, window in zip(conv_caches.conv, conv_caches.intermediate_conv_window):
        scatter(conv, window, track, node_steps)


def _after_copy(ctx, original, per_layer: bool, cache_indices, mask, track, batch_size) -> None:
    ring, mamba_pool = ring_of_context(ctx)
    if per_layer and ctx.pool_idx != ring.num_layers - 1:
        return
    bs = int(batch_size)
    # the per-layer call (Mamba2) copies the ring of every layer at once where SGLang has the
    # all-layers copier (0.5.17+: two launches instead of two per layer)
    materialize_track(ring, mamba_pool, cache_indices[:bs], mask[:bs], track[:bs],
                      copy_rows=default_row_copier() if per_layer else original)


def track_if_needed_around(original, conv_states, ssm_states, cache_indices, mamba_track_mask,
                           mamba_track_indices, batch_size, *args, **kwargs):
    """AROUND ``track_mamba_states_if_needed`` (per layer): SGLang's copy, then at the last
    layer the ring fold into the track slots."""
    result = original(conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices, batch_size,
                      *args, **kwargs)
    ctx = _active_context()
    if ctx is not None:
        _after_copy(ctx, original, True, cache_indices, mamba_track_mask, mamba_track_indices, batch_size)
    return result


def track_all_layers_around(original, conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask,
                            mamba_track_indices, batch_size, *args, **kwargs):
    """AROUND ``track_mamba_states_all_layers`` (called once, at the last mamba layer)."""
    result = original(conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask, mamba_track_indices,
                      batch_size, *args, **kwargs)
    ctx = _active_context()
    if ctx is not None:
        _after_copy(ctx, original, False, cache_indices, mamba_track_mask, mamba_track_indices, batch_size)
    return result


def track_extend_after(result, self, forward_batch, h, ssm_states, forward_metadata, *args, **kwargs):
    """AFTER ``MambaAttnBackendBase._track_mamba_state_extend`` (0.5.15-0.5.23): the track slots
    that just received a prefill state hold a checkpoint with no ring entries -> cursor 0
    (they may carry a stale cursor from an earlier owner; a tree slot must read flushed)."""
    mamba_pool = getattr(getattr(self, "req_to_token_pool", None), "mamba_pool", None)
    ring = getattr(mamba_pool, "rssm_ring", None)
    if ring is None or not getattr(forward_metadata, "has_mamba_track_mask", False):
        return None
    for name in ("track_ssm_h_dst", "track_ssm_final_dst", "track_ssm_recompute_dst"):  # the last: 0.5.23
        dst = getattr(forward_metadata, name, None)
        if dst is not None:
            ring.reset_nosync(dst)
    return None


def mixer_forward_before(self, *args, **kwargs):
    """BEFORE ``MambaMixer2.forward``: under a Mamba2 ring context publish the layer's ``A``."""
    from . import lifecycle, mamba2_decode

    ctx = mamba2_decode.current_context()
    A = getattr(self, "A", None)
    if ctx is not None and A is not None:
        try:
            ring, _ = ring_of_context(ctx)
        except ReplayDecodeError:
            return None  # a ring not built by the pool seam: the track hook itself refuses if it is reached
        lifecycle.register_layer_params(ring, ctx.pool_idx, A=A)
    return None


def hooks_applied() -> bool:
    """Whether the decode track copy is hooked in this process (the decode seams refuse a tracked forward
    otherwise: SGLang's copy alone would store a checkpoint that lags the ring)."""
    import importlib

    from .registry import is_patched

    module = importlib.import_module(BACKEND_MODULE)
    fn = getattr(module, TRACK_TARGET.rsplit(".", 1)[1], None)
    return fn is not None and is_patched(fn, TRACK_TARGET)


def check_tracked_forward(spec: bool) -> None:
    """Called by the decode seams on a decode forward with ``mamba_track_mask`` (extra_buffer prefix caching):
    served on a standard-decode ring while these hooks are applied; refused on a speculative ring."""
    if spec:
        raise ReplayDecodeError("mamba state tracking in a plain decode forward on a speculative replay ring (SGLang "
                                "tracks speculative states at the verify commit); use --mamba-radix-cache-strategy "
                                "no_buffer")
    if not hooks_applied():
        raise ReplayDecodeError("mamba state tracking (extra_buffer radix strategy) without the prefix_track seam "
                                "would copy a checkpoint that lags the replay ring; use --mamba-radix-cache-strategy "
                                "no_buffer, or serve with the launcher and --replayssm-extra-buffer true")


PATCHES: List[Patch] = [
    Patch(TRACK_TARGET, "around", track_if_needed_around, params=TRACK_PARAMS,
          description="extra_buffer decode track copy: fold the ring into the track slot (per-layer copy)"),
    Patch(TRACK_ALL_TARGET, "around", track_all_layers_around, versions=">=0.5.17,<0.6", params=TRACK_ALL_PARAMS,
          description="extra_buffer decode track copy: fold the ring into the track slot (all-layers copy)"),
    Patch(TRACK_EXTEND_TARGET, "after", track_extend_after, versions=">=0.5.15,<0.6",
          params=("self", "forward_batch", "h", "ssm_states", "forward_metadata"),
          description="extra_buffer prefill track: the track slots' ring cursors to 0"),
    Patch(MIXER_TARGET, "before", mixer_forward_before, params=("self",),
          description="publish each Mamba2 layer's A before its decode, for track-slot folds"),
]
