"""Speculative-verify ring cursors: commit and reset as device kernels, plus references.

The verify kernels (``mamba2_verify``, ``gdn_verify``) read a slot's checkpoint plus
its committed history from a *circular* ring and never write a cursor; the cursors
move only here, between forwards, so that a captured verify graph is valid at every
cursor phase.  Pure math: no SGLang import.

Ring and cursors (per mamba slot; the ring tensors have the same layouts as the
standard-decode ring, ``ring.py``, with ring length ``R``)

* ``R = B + T``: ``B`` the history block (``--replayssm-buffer-len``), ``T`` the largest
  verify window (``1 + number of draft tokens``).  ``B >= T`` is required.
* ``wp[slot]`` (int32): committed history entries after the checkpoint, logical
  positions ``0 .. wp-1``.
* ``origin[slot]`` (int32): physical ring index of logical position 0; logical ``j``
  lives at physical ``(origin + j) % R``.
* ``flush[slot]`` (int32, 0/1): the next verify of this slot first folds its history
  into the checkpoint (decided by the previous commit).

A verify of a window of ``t <= T`` tokens writes the window's inputs at logical
``wp .. wp+t-1`` and, when ``flush`` is set, stores the checkpoint folded over
logical ``0 .. wp-1`` (history only: never a draft).  Then, with ``a`` the number of
window tokens committed (SGLang's ``accept_lens``: accepted drafts + the bonus input,
``1 <= a <= t``):

    commit:  if flush:  origin <- (origin + wp) % R ;  wp <- a
             else:      wp <- wp + a
             flush <- (wp + 2T > R)            (strict)
    reset:   wp <- 0 ; origin <- 0 ; flush <- (2T > R)   (= 0 when B >= T)

``a <= 0`` commits no token: ``wp`` does not grow, but a row whose verify flushed still
moves its origin past the folded history (``wp <- 0``), because that verify already
stored the folded checkpoint: keeping the history would fold it a second time.
Padded rows carry null slots and are skipped entirely.

Invariant (why the rule is strict and the window is never truncated): every verify
has ``wp + T <= R``.  A commit after a non-flush verify starts from ``wp + 2T <= R``
and adds at most ``T``; a commit after a flush leaves ``wp = a <= T <= R - T``.  So
the largest history ever folded is ``R - T = B`` and a verify never overwrites a
committed entry.  Rejected drafts sit at logical ``>= wp`` after the commit: they are
masked out and overwritten by the next verify.  Rollback is this cursor move only.

Slots are physical ids (any 1-D view, e.g. column 0 of a [bs, k] index tensor);
``slot < 0`` or ``== null_slot`` rows are skipped; live slots in one call must be
distinct (not checked on device: no host sync).  The cursor tensors must be contiguous.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import INDEX_DTYPES as _INT_DTYPES
from .common import check_index_vectors, next_pow2

__all__ = ["spec_commit", "spec_reset", "spec_commit_ref", "spec_reset_ref", "spec_ring_len",
           "check_spec_cursors"]


def spec_ring_len(buffer_len: int, window: int) -> int:
    """Ring length ``R = B + T`` for history block ``B`` and largest window ``T`` (B >= T >= 1)."""
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"spec ring: window T must be an int >= 1, got {window!r}")
    if not isinstance(buffer_len, int) or buffer_len < window:
        raise ValueError(f"spec ring: buffer length B={buffer_len!r} must be an int >= the verify window "
                         f"T={window} (1 + draft tokens)")
    return buffer_len + window


@triton.jit
def _spec_commit_kernel(slot_ptr, acc_ptr, wp_ptr, org_ptr, fl_ptr, n, null_slot, T, R, s_slot, s_acc,
                        HAS_ACC: tl.constexpr, RESET: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    slot = tl.load(slot_ptr + offs * s_slot, mask=inb, other=-1).to(tl.int64)
    live = inb & (slot >= 0) & (slot != null_slot)
    safe = tl.where(live, slot, 0)
    if RESET:
        wp = tl.zeros([BLOCK], dtype=tl.int32)
        org = tl.zeros([BLOCK], dtype=tl.int32)
    else:
        wp = tl.load(wp_ptr + safe, mask=live, other=0).to(tl.int32)
        org = tl.load(org_ptr + safe, mask=live, other=0).to(tl.int32)
        fl = tl.load(fl_ptr + safe, mask=live, other=0).to(tl.int32)
        if HAS_ACC:
            a = tl.load(acc_ptr + offs * s_acc, mask=inb, other=0).to(tl.int32)
        else:
            a = tl.full([BLOCK], 1, tl.int32)
        adv = tl.maximum(a, 0)
        folded = fl != 0  # the verify stored the folded checkpoint whatever was accepted
        org = tl.where(folded, (org + wp) % R, org)
        wp = tl.where(folded, adv, wp + adv)
    flag = (wp + 2 * T > R).to(tl.int32)
    tl.store(wp_ptr + safe, wp.to(wp_ptr.dtype.element_ty), mask=live)
    tl.store(org_ptr + safe, org.to(org_ptr.dtype.element_ty), mask=live)
    tl.store(fl_ptr + safe, flag.to(fl_ptr.dtype.element_ty), mask=live)


def _err(fn, msg):
    raise ValueError(f"{fn}: {msg}")


def _check(fn, wp, origin, flush, slots, T, R):
    check_index_vectors(fn, {"wp": wp, "origin": origin, "flush": flush, "slots": slots},
                        contiguous=("wp", "origin", "flush"))
    if origin.shape != wp.shape or flush.shape != wp.shape:
        _err(fn, f"wp, origin and flush must have one shape, got {tuple(wp.shape)}, {tuple(origin.shape)}, "
                 f"{tuple(flush.shape)}")
    if not isinstance(T, int) or T < 1:
        _err(fn, f"window T must be an int >= 1, got {T!r}")
    if not isinstance(R, int) or R < 2 * T:
        _err(fn, f"ring length R={R!r} must be an int >= 2T = {2 * T} (history block B = R - T >= T)")


def _launch(fn, wp, origin, flush, slots, accepted, T, R, null_slot, reset):
    _check(fn, wp, origin, flush, slots, T, R)
    n = slots.shape[0]
    if accepted is not None:
        if not isinstance(accepted, torch.Tensor) or accepted.dtype not in _INT_DTYPES:
            _err(fn, "accepted must be an int32/int64 tensor")
        if tuple(accepted.shape) != (n,):
            _err(fn, f"accepted must have shape ({n},) like slots, got {tuple(accepted.shape)}")
        if accepted.device != wp.device:
            _err(fn, f"accepted is on {accepted.device} but wp is on {wp.device}")
    if n == 0:
        return
    BLOCK = min(1024, max(16, next_pow2(n)))
    _spec_commit_kernel[(triton.cdiv(n, BLOCK),)](
        slots, accepted if accepted is not None else slots, wp, origin, flush, n,
        -1 if null_slot is None else int(null_slot), T, R,
        slots.stride(0), accepted.stride(0) if accepted is not None else 0,
        HAS_ACC=accepted is not None, RESET=reset, BLOCK=BLOCK, num_warps=1,
    )


def spec_commit(wp, origin, flush, slots, accepted, *, window: int, ring_len: int,
                null_slot: Optional[int] = 0) -> None:
    """Apply one verify's acceptance to the cursors of ``slots`` (see the module docstring).

    ``accepted[i]``: window tokens committed for row i (accepted drafts + 1; <= 0: none).
    ``accepted=None`` commits one token per row (a standard decode step on the spec ring).
    One launch, no host sync; cursors are updated in place.
    """
    _launch("spec_commit", wp, origin, flush, slots, accepted, window, ring_len, null_slot, reset=False)


def spec_reset(wp, origin, flush, slots, *, window: int, ring_len: int, null_slot: Optional[int] = 0) -> None:
    """Empty the rings of ``slots`` (first decode after a prefill, slot reuse): wp = origin = 0."""
    _launch("spec_reset", wp, origin, flush, slots, None, window, ring_len, null_slot, reset=True)


def check_spec_cursors(wp, origin, flush, *, window: int, ring_len: int, slots=None) -> None:
    """Host-side invariant check (syncs; for tests and debugging): raise if any slot (of
    ``slots``, default all) could make the next verify overflow its ring or has a flag
    that disagrees with the commit rule."""
    wpc, orc, flc = wp.cpu().long(), origin.cpu().long(), flush.cpu().long()
    bad = (wpc < 0) | (wpc + window > ring_len) | (orc < 0) | (orc >= ring_len) | \
        (flc != (wpc + 2 * window > ring_len).long())
    if slots is not None:
        keep = torch.zeros_like(bad)
        keep[torch.as_tensor(slots, dtype=torch.long).cpu()] = True
        bad &= keep
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise AssertionError(f"spec cursors broken at slot {i}: wp={int(wpc[i])} origin={int(orc[i])} "
                             f"flush={int(flc[i])} (T={window}, R={ring_len})")


# ------------------------------------------------------------------------------------
# references (plain PyTorch, host loop)
# ------------------------------------------------------------------------------------
def _live(slot, null_slot):
    return slot >= 0 and (null_slot is None or slot != null_slot)


def spec_commit_ref(wp, origin, flush, slots, accepted, *, window, ring_len, null_slot=0):
    T, R = window, ring_len
    acc = [1] * len(slots) if accepted is None else [int(a) for a in accepted.tolist()]
    for s, a in zip(slots.tolist(), acc):
        if not _live(s, null_slot):
            continue
        w, o, f = int(wp[s]), int(origin[s]), int(flush[s])
        a = max(a, 0)
        if f:
            o, w = (o + w) % R, a
        else:
            w = w + a
        wp[s], origin[s], flush[s] = w, o, int(w + 2 * T > R)


def spec_reset_ref(wp, origin, flush, slots, *, window, ring_len, null_slot=0):
    for s in slots.tolist():
        if _live(s, null_slot):
            wp[s], origin[s], flush[s] = 0, 0, int(2 * window > ring_len)
