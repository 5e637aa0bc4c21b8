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

Live slots in one call must be distinct (not checked on device).  ``write_pos`` must be
contiguous; ``slots`` may be any 1-D view.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import check_index_vectors, next_pow2

__all__ = ["gather_cursors", "advance_cursors", "gather_cursors_ref", "advance_cursors_ref"]


@triton.jit
def _decode_cursor_kernel(slot_ptr, wp_ptr, rows_ptr, n, L, null_slot, s_slot,
                          ADVANCE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    slot = tl.load(slot_ptr + offs * s_slot, mask=inb, other=-1).to(tl.int64)
    if ADVANCE:
        live = inb & (slot > null_slot)
        w = tl.load(rows_ptr + offs, mask=live, other=0).to(tl.int32)
        w = tl.minimum(tl.maximum(w, 0), L - 1)
        nxt = tl.where(w == L - 1, 0, w + 1)
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


def _launch(slots, write_pos, rows, buffer_len, null_slot, advance):
    n = slots.shape[0]
    if n == 0:
        return
    BLOCK = min(1024, max(16, next_pow2(n)))
    _decode_cursor_kernel[(triton.cdiv(n, BLOCK),)](
        slots, write_pos, rows, n, int(buffer_len), int(null_slot), slots.stride(0),
        ADVANCE=advance, BLOCK=BLOCK, num_warps=1)


def gather_cursors(write_pos, slots):
    """Per-row cursors ``write_pos[max(slot, 0)]`` (a new tensor of write_pos's dtype): one launch."""
    _check("gather_cursors", write_pos, slots)
    rows = torch.empty(slots.shape, dtype=write_pos.dtype, device=write_pos.device)
    _launch(slots, write_pos, rows, 1, 0, advance=False)
    return rows


def advance_cursors(write_pos, slots, rows, buffer_len: int, null_slot: int = 0) -> None:
    """After a decode step: ``write_pos[slot] = 0 if w == L-1 else w + 1`` for live rows (``w`` the
    gathered ``rows`` clamped to [0, L-1]); rows with ``slot <= null_slot`` store nothing.  In place,
    one launch, no host sync."""
    _check("advance_cursors", write_pos, slots, rows)
    if not isinstance(buffer_len, int) or buffer_len < 1:
        raise ValueError(f"advance_cursors: buffer_len must be an int >= 1, got {buffer_len!r}")
    _launch(slots, write_pos, rows, buffer_len, null_slot, advance=True)


# ------------------------------------------------------------------------------------
# references (plain PyTorch, the same rules as tensor ops)
# ------------------------------------------------------------------------------------
def gather_cursors_ref(write_pos, slots):
    return torch.index_select(write_pos, 0, slots.clamp(min=0).long())


def advance_cursors_ref(write_pos, slots, rows, buffer_len: int, null_slot: int = 0) -> None:
    live = slots.long() > null_slot
    w = rows.long().clamp(0, buffer_len - 1)
    nxt = torch.where(w == buffer_len - 1, torch.zeros_like(w), w + 1)
    write_pos[slots.long()[live]] = nxt[live].to(write_pos.dtype)
