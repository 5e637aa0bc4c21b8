"""Standard-decode ring cursors: the per-forward gather and advance as one small kernel each.

A decode forward reads every row's cursor ``write_pos[slot]`` once, before its first mamba
layer, and moves it once, after its last (``patches/_cursor.py`` decides when).  Written as
PyTorch ops these were nine launches per forward (clamp, index_select; clamp, compare, where,
fill, add, where, index_put), a visible share of a batch-1 decode step (``eval/results/e2e-h200/
decode-nemotron-h-8b-profile``).  Here each is one launch of fixed shape that never reads a device
value on the host, so it replays inside a captured CUDA graph.  Pure math: no SGLang import.

Rules (``L`` the ring's buffer length, ``null_slot`` 0: SGLang's dummy / capture slot)

* gather:  ``rows[i] = write_pos[max(slot[i], 0)]`` (padding rows, slot -1, read slot 0);
* advance: for live rows (``slot[i] > null_slot``), with ``w = clamp(rows[i], 0, L-1)`` as the
  kernels clamp it, ``write_pos[slot[i]] = 0 if w == L-1 else w + 1``; other rows store nothing.
* advance with ``carry`` (a GDN ring whose flush rows append their token at position L-1, launch
  option ``carry`` of ``gdn_replay``; L >= 2): a live row with ``w == L-1`` gets ``write_pos = 1``
  and its ring entry L-1 is copied to position 0 in every layer of every ``carry`` tensor
  (``[layers, slots, heads, L, ...]``); :func:`carry_entries` is that copy alone (also for a
  track slot that received a copy of such a ring).

Live slots in one call must be distinct (not checked on device).  ``write_pos`` must be
contiguous; ``slots`` may be any 1-D view.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import check_index_vectors, next_pow2

__all__ = ["gather_cursors", "advance_cursors", "carry_entries", "gather_cursors_ref", "advance_cursors_ref",
           "carry_entries_ref"]


@triton.jit
def _decode_cursor_kernel(slot_ptr, wp_ptr, rows_ptr, n, L, null_slot, s_slot, after_flush,
                          ADVANCE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    slot = tl.load(slot_ptr + offs * s_slot, mask=inb, other=-1).to(tl.int64)
    if ADVANCE:
        live = inb & (slot > null_slot)
        w = tl.load(rows_ptr + offs, mask=live, other=0).to(tl.int32)
        w = tl.minimum(tl.maximum(w, 0), L - 1)
        nxt = tl.where(w == L - 1, after_flush, w + 1)
        tl.store(wp_ptr + tl.where(live, slot, 0), nxt.to(wp_ptr.dtype.element_ty), mask=live)
    else:
        w = tl.load(wp_ptr + tl.maximum(slot, 0), mask=inb, other=0)
        tl.store(rows_ptr + offs, w, mask=inb)


def _check(fn, write_pos, slots, rows=None):
    check_index_vectors(fn, {"write_pos": write_pos, "slots": slots, **({"rows": rows} if rows is not None else {})},
                        contiguous=("write_pos",))
    if rows is not None and (tuple(rows.shape) != tuple(slots.shape) or not rows.is_contiguous()):
        raise ValueError(f"{fn}: rows must be contiguous with the shape of slots {tuple(slots.shape)}, "
                         f"got {tuple(rows.shape)} strides {tuple(rows.stride())}")


def _launch(slots, write_pos, rows, buffer_len, null_slot, advance, after_flush=0):
    n = slots.shape[0]
    if n == 0:
        return
    BLOCK = min(1024, max(16, next_pow2(n)))
    _decode_cursor_kernel[(triton.cdiv(n, BLOCK),)](
        slots, write_pos, rows, n, int(buffer_len), int(null_slot), slots.stride(0), int(after_flush),
        ADVANCE=advance, BLOCK=BLOCK, num_warps=1)


@triton.jit
def _carry_copy(t_ptr, slot, layer, s_layer, s_slot, s_head, s_pos, s_col, L, n_col,
                N: tl.constexpr, BLOCK: tl.constexpr):
    """t[layer, slot, :, 0, :] = t[layer, slot, :, L-1, :] for one tensor (N = heads x columns elements)."""
    base = t_ptr + layer * s_layer + slot * s_slot
    for e0 in tl.range(0, N, BLOCK):
        e = e0 + tl.arange(0, BLOCK)
        m = e < N
        off = (e // n_col) * s_head + (e % n_col) * s_col
        tl.store(base + off, tl.load(base + (L - 1) * s_pos + off, mask=m), mask=m)


@triton.jit
def _carry_kernel(slot_ptr, rows_ptr, L, null_slot, s_slot_idx,
                  t0, a0, b0, c0, d0, e0, n0, t1, a1, b1, c1, d1, e1, n1, t2, a2, b2, c2, d2, e2, n2,
                  N0: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr, NT: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row, layer): a live row whose step flushed (w == L-1) copies ring entry L-1 to 0 in up to
    three tensors (strides a..e: layer, slot, head, position, column; n: columns)."""
    i = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + i * s_slot_idx).to(tl.int64)
    w = tl.load(rows_ptr + i).to(tl.int32)
    w = tl.minimum(tl.maximum(w, 0), L - 1)
    if (slot > null_slot) & (w == L - 1):
        _carry_copy(t0, slot, layer, a0, b0, c0, d0, e0, L, n0, N0, BLOCK)
        if NT > 1:
            _carry_copy(t1, slot, layer, a1, b1, c1, d1, e1, L, n1, N1, BLOCK)
        if NT > 2:
            _carry_copy(t2, slot, layer, a2, b2, c2, d2, e2, L, n2, N2, BLOCK)


def _carry_views(tensors, buffer_len: int):
    """Each carry tensor as a 5-D view [layers, slots, heads, L, columns] (a 4-D one gets one column)."""
    views = []
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.ndim not in (4, 5):
            raise ValueError("carry tensors must be [layers, slots, heads, L] or [layers, slots, heads, L, cols], "
                             f"got {getattr(t, 'shape', type(t).__name__)}")
        v = t.unsqueeze(-1) if t.ndim == 4 else t
        if v.shape[3] != buffer_len:
            raise ValueError(f"carry tensor has {v.shape[3]} ring positions, expected L = {buffer_len}")
        views.append(v)
    if not 1 <= len(views) <= 3:
        raise ValueError(f"carry takes 1 to 3 ring tensors, got {len(views)}")
    if len({(v.shape[0], v.shape[1], v.device) for v in views}) != 1:
        raise ValueError("carry tensors must share their layer and slot counts and device")
    return views


def carry_entries(tensors, slots, rows, buffer_len: int, null_slot: int = 0) -> None:
    """For live rows (``slot > null_slot``) whose step flushed (``clamp(rows, 0, L-1) == L-1``): ring entry
    L-1 -> position 0 in every layer of each tensor (``[layers, slots, heads, L(, cols)]``, up to three).
    One launch of (rows x layers) programs; fixed shapes, no host sync."""
    check_index_vectors("carry_entries", {"slots": slots, "rows": rows})
    if tuple(rows.shape) != tuple(slots.shape):
        raise ValueError(f"carry_entries: rows must have the shape of slots {tuple(slots.shape)}, got "
                         f"{tuple(rows.shape)}")
    if not isinstance(buffer_len, int) or buffer_len < 2:
        raise ValueError(f"carry_entries: buffer_len must be an int >= 2, got {buffer_len!r}")
    views = _carry_views(list(tensors), buffer_len)
    if views[0].device != slots.device:
        raise ValueError(f"carry_entries: the ring tensors are on {views[0].device}, slots on {slots.device}")
    n = slots.shape[0]
    if n == 0 or views[0].shape[0] == 0:
        return
    args, sizes = [], []
    for i in range(3):
        v = views[min(i, len(views) - 1)]
        args += [v, *v.stride(), v.shape[4]]
        sizes.append(v.shape[2] * v.shape[4])
    big = max(sizes)
    _carry_kernel[(n, views[0].shape[0])](
        slots, rows.contiguous(), int(buffer_len), int(null_slot), slots.stride(0), *args,
        N0=sizes[0], N1=sizes[1], N2=sizes[2], NT=len(views), BLOCK=min(1024, max(32, next_pow2(big))),
        num_warps=4)


def gather_cursors(write_pos, slots):
    """Per-row cursors ``write_pos[max(slot, 0)]`` (a new tensor of write_pos's dtype): one launch."""
    _check("gather_cursors", write_pos, slots)
    rows = torch.empty(slots.shape, dtype=write_pos.dtype, device=write_pos.device)
    _launch(slots, write_pos, rows, 1, 0, advance=False)
    return rows


def advance_cursors(write_pos, slots, rows, buffer_len: int, null_slot: int = 0, carry=()) -> None:
    """After a decode step: ``write_pos[slot] = 0 if w == L-1 else w + 1`` for live rows (``w`` the
    gathered ``rows`` clamped to [0, L-1]); rows with ``slot <= null_slot`` store nothing.  In place,
    one launch, no host sync.  ``carry`` (ring tensors of a carrying GDN ring, L >= 2): a flushed row
    gets 1 instead of 0 and its entry L-1 moves to 0 (:func:`carry_entries`, a second launch)."""
    _check("advance_cursors", write_pos, slots, rows)
    if not isinstance(buffer_len, int) or buffer_len < 1:
        raise ValueError(f"advance_cursors: buffer_len must be an int >= 1, got {buffer_len!r}")
    carry = tuple(carry or ())
    if carry:
        carry_entries(carry, slots, rows, buffer_len, null_slot)
    _launch(slots, write_pos, rows, buffer_len, null_slot, advance=True, after_flush=1 if carry else 0)


# ------------------------------------------------------------------------------------
# references (plain PyTorch, the same rules as tensor ops)
# ------------------------------------------------------------------------------------
def gather_cursors_ref(write_pos, slots):
    return torch.index_select(write_pos, 0, slots.clamp(min=0).long())


def advance_cursors_ref(write_pos, slots, rows, buffer_len: int, null_slot: int = 0, carry=()) -> None:
    carry = tuple(carry or ())
    if carry:
        carry_entries_ref(carry, slots, rows, buffer_len, null_slot)
    live = slots.long() > null_slot
    w = rows.long().clamp(0, buffer_len - 1)
    nxt = torch.where(w == buffer_len - 1, torch.full_like(w, 1 if carry else 0), w + 1)
    write_pos[slots.long()[live]] = nxt[live].to(write_pos.dtype)


def carry_entries_ref(tensors, slots, rows, buffer_len: int, null_slot: int = 0) -> None:
    w = rows.long().clamp(0, buffer_len - 1)
    moved = slots.long()[(slots.long() > null_slot) & (w == buffer_len - 1)]
    for t in tensors:
        t[:, moved, :, 0] = t[:, moved, :, buffer_len - 1]
