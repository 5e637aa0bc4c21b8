"""Materialize: fold a slot's pending ring entries into its checkpoint (Triton + references).

Whenever SGLang hands a request's mamba slot to something that reads ``temporal``
directly (the radix tree caching a finished/unfinished request, a retract, a copy),
the checkpoint must be the EXACT state at the cached length.  The decode kernels keep
the last ``w = write_pos[slot]`` tokens' SSM inputs in the ring instead; this module
folds them in and empties the ring.  Pure math: no SGLang import.

Math (per live slot with ``w > 0``; j = 0..w-1 ring positions; docs/method.md)

Mamba2 (per head h; Δ_j processed step sizes, Λ_j = Σ_{i<=j} Δ_i, Λ = Λ_{w-1})::

    S <- exp(A Λ) S + Σ_j Δ_j exp(A (Λ - Λ_j)) x_j B_jᵀ

GDN (per value head; g_j log-decays, G_j inclusive prefix, G = G_{w-1}; k̂_j the
cached raw k_j L2-normalised with the decode kernels' formula)::

    S <- exp(G) S + Σ_j exp(G - G_j) d_j k̂_jᵀ

This is exactly the decode kernels' flush rebuild without the current token (the
Mamba2 ``_rebuild_state`` with the window ending at w-1, the GDN history weights of
``_history_weights``), so a materialized slot continues bit-for-bit like a slot whose
ring was flushed at that position, up to the summation order of one dot.

Launches
--------
* fold: grid ``(cdiv(P, BLOCK_M), len(slots), H)`` (Mamba2: a [BLOCK_M, N] state tile,
  BLOCK_NC columns at a time, one ``tl.dot`` [BLOCK_M, WIN] x [WIN, BLOCK_NC]) resp.
  ``(cdiv(V, BV), len(slots), HV)`` (GDN: a [BV, K] tile, one ``tl.dot`` [BV, LP] x
  [LP, K]).  Dots are fp32 with ``dot_precision`` "tf32x3" (default) or "ieee";
  plain tf32 is refused.  Ring entries at or past ``w`` are masked loads, never read.
* ``layered=True``: the tensors carry a leading layer dimension and axis 0 of the grid
  runs over (layer, tile) pairs, so every layer of a pool folds in one launch
  (:func:`materialize_ring` does this for SGLang's stacked ``temporal``).
* cursor: a second launch sets ``write_pos[slot] = 0`` (and a spec ring's origin and
  flush) for the live listed slots.  It must be a separate launch (every fold program
  reads ``w`` of its slot), and with ``reset_cursor=False`` it is skipped, so that a
  caller folding layer after layer of one pool can reset the shared cursor once, after
  the last layer (:func:`reset_cursors`, or :func:`materialize_ring`).

Slots: ``slots`` is a 1-D int32/int64 device tensor of *physical* slot ids (a Python
list is accepted too).  Entries ``< 0`` or ``== null_slot`` are skipped (no read, no
write).  Live entries must be distinct (a duplicate would fold its ring twice) and
``< S``; neither is checked on device (no host sync).  ``write_pos`` is read per slot
(``write_pos[slot]``, the ring's own per-slot cursor) and clamped into [0, L-1] for
memory safety, as in the decode kernels.  Slots with ``w == 0`` are untouched
(not even rewritten).  No host sync anywhere: safe on the forward stream and under
CUDA-graph capture (shapes depend on ``len(slots)`` only).

Rounding: every intermediate is fp32; the only rounding is the state store (to the
state dtype, round-to-nearest-even also in Triton's CPU interpreter).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from .common import FLOAT_DTYPES as _FLOAT_DTYPES, INDEX_DTYPES as _INT_DTYPES
from .common import L2NORM_EPS, check_dot_precision, next_pow2, suffix_sum_excl_torch
from .gdn_replay import _cast_rtne, _history_weights, _normalise_rows
from .mamba2_replay import _head_param, _rebuild_state, _window_weights

__all__ = [
    "mamba2_materialize",
    "gdn_materialize",
    "reset_cursors",
    "materialize_ring",
    "mamba2_materialize_ref",
    "gdn_materialize_ref",
]



# --------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------


@triton.jit
def _slot_cursor(slot_ptr, i, wpos_ptr, null_slot, L):
    """(slot int64, clamped w, fold flag) of the i-th listed slot; w is read only for live slots."""
    slot = tl.load(slot_ptr + i).to(tl.int64)
    live = (slot >= 0) & (slot != null_slot)
    w = tl.load(wpos_ptr + tl.where(live, slot, 0), mask=live, other=0).to(tl.int32)
    w = tl.minimum(tl.maximum(w, 0), L - 1)
    return slot, w, live & (w > 0)


@triton.jit
def _phys_positions(org_ptr, slot, offs, L, HAS_ORIGIN: tl.constexpr):
    """Physical ring index (int64) of logical positions ``offs`` of ``slot``."""
    if HAS_ORIGIN:
        org = tl.load(org_ptr + slot).to(tl.int32)
        org = tl.minimum(tl.maximum(org, 0), L - 1)
        return ((org + offs) % L).to(tl.int64)
    else:
        return offs.to(tl.int64)


@triton.jit
def _reset_cursor_kernel(slot_ptr, wpos_ptr, org_ptr, fl_ptr, null_slot, n, BLOCK: tl.constexpr,
                         HAS_SPEC: tl.constexpr):
    """cursor[slot] = 0 for the live listed slots: write_pos, and (HAS_SPEC) a spec ring's origin and flush."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    slot = tl.load(slot_ptr + offs, mask=inb, other=-1).to(tl.int64)
    live = inb & (slot >= 0) & (slot != null_slot)
    at = tl.where(live, slot, 0)
    tl.store(wpos_ptr + at, tl.zeros([BLOCK], dtype=wpos_ptr.dtype.element_ty), mask=live)
    if HAS_SPEC:
        tl.store(org_ptr + at, tl.zeros([BLOCK], dtype=org_ptr.dtype.element_ty), mask=live)
        tl.store(fl_ptr + at, tl.zeros([BLOCK], dtype=fl_ptr.dtype.element_ty), mask=live)


@triton.jit
def _mamba2_materialize_kernel(
    state_ptr, xr_ptr, Br_ptr, dtr_ptr, A_ptr, slot_ptr, wpos_ptr, org_ptr,
    null_slot, P, N, L, heads_per_group, m_tiles,
    s_st_y, s_xr_y, s_Br_y, s_dtr_y, s_A_y,
    s_st_s, s_st_h, s_st_p, s_st_n,
    s_xr_s, s_xr_h, s_xr_l, s_xr_p,
    s_Br_s, s_Br_g, s_Br_l, s_Br_n,
    s_dtr_s, s_dtr_h, s_dtr_l,
    s_A_h,
    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_NC: tl.constexpr, WIN: tl.constexpr,
    HAS_ORIGIN: tl.constexpr,
):
    pid_m = tl.program_id(0) % m_tiles  # axis 0: (layer, row tile); the s_*_y strides step the layers
    layer = (tl.program_id(0) // m_tiles).to(tl.int64)
    i = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    slot, w, fold = _slot_cursor(slot_ptr, i, wpos_ptr, null_slot, L)
    if fold:
        state_ptr += layer * s_st_y
        xr_ptr += layer * s_xr_y
        Br_ptr += layer * s_Br_y
        dtr_ptr += layer * s_dtr_y
        A_ptr += layer * s_A_y
        g = h // heads_per_group
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < P
        offs_w = tl.arange(0, WIN)
        valid = offs_w < w
        # ring entry of logical position j: physical j (linear ring) or (origin + j) % L (spec ring)
        phys = _phys_positions(org_ptr, slot, offs_w, L, HAS_ORIGIN)
        A = tl.load(A_ptr + h * s_A_h).to(tl.float32)
        # window = ring entries 0..w-1 only (no current token)
        delta_win = tl.load(dtr_ptr + slot * s_dtr_s + h * s_dtr_h + phys * s_dtr_l, mask=valid, other=0.0)
        s_w, decay = _window_weights(delta_win.to(tl.float32), A, offs_w, w - 1)
        x_win = tl.load(xr_ptr + slot * s_xr_s + h * s_xr_h + offs_m[:, None] * s_xr_p + phys[None, :] * s_xr_l,
                        mask=mask_m[:, None] & valid[None, :], other=0.0).to(tl.float32)
        st_base = state_ptr + slot * s_st_s + h * s_st_h
        Br_base = Br_ptr + slot * s_Br_s + g * s_Br_g
        for n0 in range(0, N, BLOCK_NC):
            offs_c = n0 + tl.arange(0, BLOCK_NC)
            mask_c = offs_c < N
            st_ptrs = st_base + offs_m[:, None] * s_st_p + offs_c[None, :] * s_st_n
            st_mask = mask_m[:, None] & mask_c[None, :]
            S = tl.load(st_ptrs, mask=st_mask, other=0.0).to(tl.float32)
            B_win = tl.load(Br_base + phys[:, None] * s_Br_l + offs_c[None, :] * s_Br_n,
                            mask=valid[:, None] & mask_c[None, :], other=0.0).to(tl.float32)
            S = _rebuild_state(S, decay, x_win, B_win, s_w, DOT_PRECISION)
            tl.store(st_ptrs, _cast_rtne(S, state_ptr.dtype.element_ty), mask=st_mask)


@triton.jit
def _gdn_materialize_kernel(
    state_ptr, d_ring, k_ring, g_ring, slot_ptr, wpos_ptr, org_ptr,
    null_slot, v_tiles,
    s_st_y, s_d_y, s_k_y, s_g_y,
    s_st_s, s_st_h, s_st_v,
    s_d_s, s_d_h, s_d_l,
    s_k_s, s_k_h, s_k_l,
    s_g_s, s_g_h,
    HV: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr,
    USE_L2NORM: tl.constexpr, EPS: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_ORIGIN: tl.constexpr,
):
    pid_v = tl.program_id(0) % v_tiles  # axis 0: (layer, value tile); the s_*_y strides step the layers
    layer = (tl.program_id(0) // v_tiles).to(tl.int64)
    i = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    slot, w, fold = _slot_cursor(slot_ptr, i, wpos_ptr, null_slot, L)
    if fold:
        state_ptr += layer * s_st_y
        d_ring += layer * s_d_y
        k_ring += layer * s_k_y
        g_ring += layer * s_g_y
        hk = h // (HV // HK)
        o_v = pid_v * BV + tl.arange(0, BV)
        mask_v = o_v < V
        o_k = tl.arange(0, BK)
        mask_k = o_k < K
        o_j = tl.arange(0, LP)
        valid = o_j < w
        phys = _phys_positions(org_ptr, slot, o_j, L, HAS_ORIGIN)
        g_hist = tl.load(g_ring + slot * s_g_s + h * s_g_h + phys, mask=valid, other=0.0)
        k_raw = tl.load(k_ring + slot * s_k_s + hk * s_k_h + phys[:, None] * s_k_l + o_k[None, :],
                        mask=valid[:, None] & mask_k[None, :], other=0)
        d_hist = tl.load(d_ring + slot * s_d_s + h * s_d_h + phys[None, :] * s_d_l + o_v[:, None],
                         mask=mask_v[:, None] & valid[None, :], other=0)
        c, eG = _history_weights(g_hist, w, LP)
        k_hat = _normalise_rows(k_raw, USE_L2NORM, EPS)  # zeros past w stay zero
        st_ptrs = state_ptr + slot * s_st_s + h * s_st_h + o_v[:, None] * s_st_v + o_k[None, :]
        st_mask = mask_v[:, None] & mask_k[None, :]
        S = tl.load(st_ptrs, mask=st_mask, other=0.0).to(tl.float32)
        dc = d_hist.to(tl.float32) * c[None, :]
        S = eG * S + tl.dot(dc, k_hat, input_precision=DOT_PRECISION)
        tl.store(st_ptrs, _cast_rtne(S, state_ptr.dtype.element_ty), mask=st_mask)


# --------------------------------------------------------------------------------------
# wrappers
# --------------------------------------------------------------------------------------


def _err(fn: str, msg: str):
    raise ValueError(f"{fn}: {msg}")


def _as_slots(fn, slots, device) -> torch.Tensor:
    if not isinstance(slots, torch.Tensor):
        slots = torch.as_tensor(list(slots) if not isinstance(slots, int) else [slots], dtype=torch.int64)
    if slots.dtype not in _INT_DTYPES:
        _err(fn, f"slots must be int32/int64, got {slots.dtype}")
    slots = slots.reshape(-1)
    if slots.device != device:
        slots = slots.to(device, non_blocking=True)
    return slots.contiguous()  # no-op for the usual contiguous index tensor


def _layers(fn, layered: bool, **tensors) -> Tuple[int, dict, dict]:
    """``(layers, views, strides)``: with ``layered`` every tensor carries a leading layer dimension (the same
    size for all), ``views`` are their layer-0 views (what the per-layer checks read) and ``strides`` their
    layer strides; without it one layer, the tensors themselves and stride 0."""
    if not layered:
        return 1, tensors, {k: 0 for k in tensors}
    sizes = {k: t.shape[0] if isinstance(t, torch.Tensor) and t.dim() > 0 else None for k, t in tensors.items()}
    if len(set(sizes.values())) != 1 or None in sizes.values() or not next(iter(sizes.values())):
        _err(fn, f"layered: every tensor needs the same leading layer dimension >= 1, got {sizes}")
    return next(iter(sizes.values())), {k: t[0] for k, t in tensors.items()}, \
        {k: t.stride(0) for k, t in tensors.items()}


def _check_common(fn, write_pos, dot_precision, S, device):
    if not isinstance(write_pos, torch.Tensor) or write_pos.dtype not in _INT_DTYPES:
        _err(fn, "write_pos must be an int32/int64 tensor")
    if write_pos.dim() != 1 or write_pos.shape[0] != S:
        _err(fn, f"write_pos must be [S={S}] (one cursor per slot), got {tuple(write_pos.shape)}")
    if not write_pos.is_contiguous():
        _err(fn, "write_pos must be contiguous")
    if write_pos.device != device:
        _err(fn, f"write_pos is on {write_pos.device}, state on {device}")
    check_dot_precision(dot_precision, fn)


def _check_spec_cursors(fn, spec_cursors, write_pos) -> torch.Tensor:
    """The origin tensor of ``spec_cursors=(origin, flush)`` (validated), or a dummy pointer."""
    if spec_cursors is None:
        return write_pos  # never read (HAS_ORIGIN=False)
    if not isinstance(spec_cursors, (tuple, list)) or len(spec_cursors) != 2:
        _err(fn, "spec_cursors must be a tuple (origin, flush) of per-slot int tensors")
    for name, t in zip(("origin", "flush"), spec_cursors):
        if not isinstance(t, torch.Tensor) or t.dtype not in _INT_DTYPES or t.shape != write_pos.shape:
            _err(fn, f"spec_cursors {name} must be an int32/int64 tensor shaped like write_pos {tuple(write_pos.shape)}")
        if t.device != write_pos.device or not t.is_contiguous():
            _err(fn, f"spec_cursors {name} must be contiguous on {write_pos.device}")
    return spec_cursors[0]


def reset_cursors(write_pos: torch.Tensor, slots, *, null_slot: Optional[int] = 0) -> None:
    """``write_pos[slot] = 0`` for every listed slot that is >= 0 and != ``null_slot`` (one launch, no sync)."""
    _reset_all(write_pos, None, slots, null_slot)


def _reset_all(write_pos, spec_cursors, slots, null_slot) -> None:
    """write_pos and, given ``spec_cursors``, a spec ring's origin and flush to 0 (2T <= R always), one launch."""
    slots = _as_slots("reset_cursors", slots, write_pos.device)
    n = slots.numel()
    if n == 0:
        return
    null = -1 if null_slot is None else int(null_slot)
    BLOCK = 128
    org, fl = spec_cursors if spec_cursors is not None else (write_pos, write_pos)
    _reset_cursor_kernel[(triton.cdiv(n, BLOCK),)](slots, write_pos, org, fl, null, n, BLOCK=BLOCK,
                                                   HAS_SPEC=spec_cursors is not None)


def mamba2_materialize(
    state: torch.Tensor,
    x_ring: torch.Tensor,
    B_ring: torch.Tensor,
    dt_ring: torch.Tensor,
    A: torch.Tensor,
    write_pos: torch.Tensor,
    slots,
    *,
    null_slot: Optional[int] = 0,
    reset_cursor: bool = True,
    dot_precision: str = "tf32x3",
    block_m: int = 32,
    block_nc: int = 32,
    spec_cursors: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    layered: bool = False,
) -> None:
    """Fold ring[0:w] of each listed slot into its Mamba2 checkpoint, in place (see module docstring).

    state [S, H, P, N] (fp32/bf16/fp16, any strides); x_ring [S, H, L, P], B_ring
    [S, G, L, N] (activation dtype), dt_ring [S, H, L] fp32 processed Δ (one layer of a
    :class:`~sglang_replayssm.ring.ReplayRing`, strided views fine); A [H] or tied [H, P]
    / [H, P, N] (the layer's A = -exp(A_log), fp32); write_pos [S] the per-slot cursors;
    slots [n] physical slot ids.  ``reset_cursor=False`` leaves ``write_pos`` alone
    (multi-layer callers reset it once after the last layer).  ``spec_cursors=(origin,
    flush)``: the ring is a circular spec ring (``spec_cursor``): logical j is read at
    physical ``(origin[slot] + j) % L``, and the reset also zeroes origin and flush.
    ``layered=True``: state, the three rings and A each carry a leading layer dimension
    (``[layers, S, ...]``: SGLang's ``temporal``, a ReplayRing's ``tensors``, the layers' A
    stacked), folded in one launch; all layers share ``write_pos``.  Returns None.
    """
    fn = "mamba2_materialize"
    layers, v, ly = _layers(fn, layered, state=state, x_ring=x_ring, B_ring=B_ring, dt_ring=dt_ring, A=A)
    state, x_ring, B_ring, dt_ring, A = v["state"], v["x_ring"], v["B_ring"], v["dt_ring"], v["A"]
    for name, t in (("state", state), ("x_ring", x_ring), ("B_ring", B_ring), ("dt_ring", dt_ring), ("A", A)):
        if not isinstance(t, torch.Tensor):
            _err(fn, f"{name} must be a torch.Tensor")
        if t.device != state.device:
            _err(fn, f"{name} is on {t.device}, state on {state.device}")
    if state.dim() != 4 or x_ring.dim() != 4 or B_ring.dim() != 4 or dt_ring.dim() != 3:
        _err(fn, f"expected state [S,H,P,N], x_ring [S,H,L,P], B_ring [S,G,L,N], dt_ring [S,H,L]; got "
                 f"{tuple(state.shape)}, {tuple(x_ring.shape)}, {tuple(B_ring.shape)}, {tuple(dt_ring.shape)}")
    S, H, P, N = state.shape
    L = x_ring.shape[2]
    G = B_ring.shape[1]
    if L < 1 or G < 1 or H % G:
        _err(fn, f"need L >= 1 and H={H} a multiple of G={G}")
    for name, t, shape in (("x_ring", x_ring, (S, H, L, P)), ("B_ring", B_ring, (S, G, L, N)),
                           ("dt_ring", dt_ring, (S, H, L))):
        if tuple(t.shape) != shape:
            _err(fn, f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if dt_ring.dtype != torch.float32:
        _err(fn, f"dt_ring must be float32, got {dt_ring.dtype}")
    for name, t in (("state", state), ("x_ring", x_ring), ("B_ring", B_ring), ("A", A)):
        if t.dtype not in _FLOAT_DTYPES:
            _err(fn, f"{name} must be float32/bfloat16/float16, got {t.dtype}")
    s_A_h, _ = _head_param("A", A, H, P, N)
    _check_common(fn, write_pos, dot_precision, S, state.device)
    origin = _check_spec_cursors(fn, spec_cursors, write_pos)
    for name, v in (("block_m", block_m), ("block_nc", block_nc)):
        if v < 16 or v & (v - 1):
            _err(fn, f"{name} must be a power of two >= 16, got {v}")
    slots = _as_slots(fn, slots, state.device)
    n = slots.numel()
    if n == 0:
        return
    null = -1 if null_slot is None else int(null_slot)
    if L > 1:  # L == 1 keeps no ring: nothing to fold
        BLOCK_M = min(block_m, max(16, next_pow2(P)))
        BLOCK_NC = min(block_nc, max(16, next_pow2(N)))
        WIN = max(16, next_pow2(L))
        m_tiles = triton.cdiv(P, BLOCK_M)
        _mamba2_materialize_kernel[(m_tiles * layers, n, H)](
            state, x_ring, B_ring, dt_ring, A, slots, write_pos, origin,
            null, P, N, L, H // G, m_tiles,
            ly["state"], ly["x_ring"], ly["B_ring"], ly["dt_ring"], ly["A"],
            *state.stride(), *x_ring.stride(), *B_ring.stride(), *dt_ring.stride(), s_A_h,
            DOT_PRECISION=dot_precision, BLOCK_M=BLOCK_M, BLOCK_NC=BLOCK_NC, WIN=WIN,
            HAS_ORIGIN=spec_cursors is not None, num_warps=4, num_stages=1,
        )
    if reset_cursor:
        _reset_all(write_pos, spec_cursors, slots, null_slot)


def gdn_materialize(
    state: torch.Tensor,
    d_ring: torch.Tensor,
    k_ring: torch.Tensor,
    g_ring: torch.Tensor,
    write_pos: torch.Tensor,
    slots,
    *,
    use_qk_l2norm: bool = True,
    null_slot: Optional[int] = 0,
    reset_cursor: bool = True,
    dot_precision: str = "tf32x3",
    block_v: int = 16,
    spec_cursors: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    layered: bool = False,
) -> None:
    """Fold ring[0:w] of each listed slot into its GDN checkpoint, in place (see module docstring).

    state [S, HV, V, K] (fp32/bf16/fp16); d_ring [S, HV, L, V] (state dtype), k_ring
    [S, Hk, L, K] raw keys (activation dtype; L2-normalised here when
    ``use_qk_l2norm``), g_ring [S, HV, L] fp32 (one ring layer; the number of key heads
    Hk is ``k_ring.shape[1]``); last dims contiguous, other strides free; write_pos [S];
    slots [n].  ``reset_cursor``, ``spec_cursors`` and ``layered`` (state and the rings with a
    leading layer dimension, one launch) as in :func:`mamba2_materialize`.  Returns None.
    """
    fn = "gdn_materialize"
    layers, v, ly = _layers(fn, layered, state=state, d_ring=d_ring, k_ring=k_ring, g_ring=g_ring)
    state, d_ring, k_ring, g_ring = v["state"], v["d_ring"], v["k_ring"], v["g_ring"]
    for name, t in (("state", state), ("d_ring", d_ring), ("k_ring", k_ring), ("g_ring", g_ring)):
        if not isinstance(t, torch.Tensor):
            _err(fn, f"{name} must be a torch.Tensor")
        if t.device != state.device:
            _err(fn, f"{name} is on {t.device}, state on {state.device}")
    if state.dim() != 4 or d_ring.dim() != 4 or k_ring.dim() != 4 or g_ring.dim() != 3:
        _err(fn, f"expected state [S,HV,V,K], d_ring [S,HV,L,V], k_ring [S,Hk,L,K], g_ring [S,HV,L]; got "
                 f"{tuple(state.shape)}, {tuple(d_ring.shape)}, {tuple(k_ring.shape)}, {tuple(g_ring.shape)}")
    S, HV, V, K = state.shape
    L = d_ring.shape[2]
    Hk = k_ring.shape[1]
    if L < 1 or Hk < 1 or HV % Hk:
        _err(fn, f"need L >= 1 and HV={HV} a multiple of Hk={Hk}")
    for name, t, shape in (("d_ring", d_ring, (S, HV, L, V)), ("k_ring", k_ring, (S, Hk, L, K)),
                           ("g_ring", g_ring, (S, HV, L))):
        if tuple(t.shape) != shape:
            _err(fn, f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if g_ring.dtype != torch.float32:
        _err(fn, f"g_ring must be float32, got {g_ring.dtype}")
    for name, t in (("state", state), ("d_ring", d_ring), ("k_ring", k_ring)):
        if t.dtype not in _FLOAT_DTYPES:
            _err(fn, f"{name} must be float32/bfloat16/float16, got {t.dtype}")
        if t.stride(-1) != 1:
            _err(fn, f"{name} must be contiguous in its last dim, got strides {tuple(t.stride())}")
    if g_ring.stride(-1) != 1:
        _err(fn, f"g_ring must be contiguous in its last dim, got strides {tuple(g_ring.stride())}")
    _check_common(fn, write_pos, dot_precision, S, state.device)
    origin = _check_spec_cursors(fn, spec_cursors, write_pos)
    if block_v < 16 or block_v & (block_v - 1):
        _err(fn, f"block_v must be a power of two >= 16, got {block_v}")
    slots = _as_slots(fn, slots, state.device)
    n = slots.numel()
    if n == 0:
        return
    null = -1 if null_slot is None else int(null_slot)
    if L > 1:
        BK = max(16, next_pow2(K))
        BV = min(block_v, max(16, next_pow2(V)))
        LP = max(16, next_pow2(L - 1))
        v_tiles = triton.cdiv(V, BV)
        _gdn_materialize_kernel[(v_tiles * layers, n, HV)](
            state, d_ring, k_ring, g_ring, slots, write_pos, origin,
            null, v_tiles,
            ly["state"], ly["d_ring"], ly["k_ring"], ly["g_ring"],
            state.stride(0), state.stride(1), state.stride(2),
            d_ring.stride(0), d_ring.stride(1), d_ring.stride(2),
            k_ring.stride(0), k_ring.stride(1), k_ring.stride(2),
            g_ring.stride(0), g_ring.stride(1),
            HV=HV, HK=Hk, K=K, V=V, L=L, BK=BK, BV=BV, LP=LP,
            USE_L2NORM=bool(use_qk_l2norm), EPS=L2NORM_EPS, DOT_PRECISION=dot_precision,
            HAS_ORIGIN=spec_cursors is not None, num_warps=4, num_stages=1,
        )
    if reset_cursor:
        _reset_all(write_pos, spec_cursors, slots, null_slot)


def materialize_ring(ring, temporal: Sequence[torch.Tensor], slots, *, A: Optional[Sequence[torch.Tensor]] = None,
                     use_qk_l2norm: bool = True, null_slot: Optional[int] = 0,
                     dot_precision: str = "tf32x3") -> None:
    """Fold every layer of a :class:`~sglang_replayssm.ring.ReplayRing` for ``slots``, then reset the cursors.

    ``temporal[i]`` is pool layer i's checkpoint ``[S, ...]`` (SGLang's
    ``mamba_cache.temporal`` indexes as ``temporal[i]``; given as one ``[layers, S, ...]``
    tensor, as SGLang keeps it, all layers fold in one launch); ``A[i]`` is that layer's
    Mamba2 A (required for ``ring.kind == "mamba2"``, ignored for GDN).  All layers
    read the same cursors, which are reset once after the last layer.  A spec ring
    (``ring.spec_window`` set) is read through its origin cursor and all three of its
    cursors are reset.
    """
    slots = _as_slots("materialize_ring", slots, ring.write_pos.device)
    spec = ring.spec_cursors
    if ring.kind == "mamba2" and (A is None or len(A) < ring.num_layers):
        raise ValueError(f"materialize_ring: a Mamba2 ring of {ring.num_layers} layer(s) needs A per layer")
    if isinstance(temporal, torch.Tensor) and temporal.dim() > 0 and temporal.shape[0] == ring.num_layers:
        # SGLang's stacked [layers, S, ...] checkpoint: every layer in one launch
        t = ring.tensors
        if ring.kind == "mamba2":
            mamba2_materialize(temporal, t["x"], t["B"], t["dt"], _stacked(A[:ring.num_layers], *temporal.shape[2:]),
                               ring.write_pos,
                               slots, null_slot=null_slot, reset_cursor=False, dot_precision=dot_precision,
                               spec_cursors=spec, layered=True)
        else:
            gdn_materialize(temporal, t["d"], t["k"], t["g"], ring.write_pos, slots, use_qk_l2norm=use_qk_l2norm,
                            null_slot=null_slot, reset_cursor=False, dot_precision=dot_precision,
                            spec_cursors=spec, layered=True)
        _reset_all(ring.write_pos, spec, slots, null_slot)
        return
    for i in range(ring.num_layers):
        t = ring.layer(i)
        if ring.kind == "mamba2":
            mamba2_materialize(temporal[i], t["x"], t["B"], t["dt"], A[i], ring.write_pos, slots,
                               null_slot=null_slot, reset_cursor=False, dot_precision=dot_precision,
                               spec_cursors=spec)
        else:
            gdn_materialize(temporal[i], t["d"], t["k"], t["g"], ring.write_pos, slots,
                            use_qk_l2norm=use_qk_l2norm, null_slot=null_slot, reset_cursor=False,
                            dot_precision=dot_precision, spec_cursors=spec)
    _reset_all(ring.write_pos, spec, slots, null_slot)


def _stacked(params: Sequence[torch.Tensor], H: int, P: int, N: int) -> torch.Tensor:
    """The layers' A (each per head: [H], or [H, P] / [H, P, N] tied, as the per-layer fold accepts) as one
    ``[layers, H]`` tensor.  Built at every call (one copy kernel), so a weight update in place is never missed."""
    for p in params:
        _head_param("A", p, H, P, N)  # the per-layer fold's own check
    heads = [p[(slice(None),) + (0,) * (p.dim() - 1)] if p.dim() > 1 else p for p in params]
    if len({(tuple(h.shape), h.dtype, h.device) for h in heads}) != 1:
        raise ValueError("materialize_ring: the layers' A differ in shape, dtype or device")
    return torch.stack(heads)


# --------------------------------------------------------------------------------------
# PyTorch references (same arguments and side effects, fp32 math, host loop over slots)
# --------------------------------------------------------------------------------------


def _live_slots(slots, write_pos, null_slot, L, spec_cursors=None):
    """[(slot, physical ring positions of its w pending entries)] of the live listed slots."""
    null = -1 if null_slot is None else int(null_slot)
    out = []
    for s in torch.as_tensor(slots).reshape(-1).tolist():
        if s < 0 or s == null:
            continue
        w = min(max(int(write_pos[s]), 0), L - 1)
        o = min(max(int(spec_cursors[0][s]), 0), L - 1) if spec_cursors is not None else 0
        out.append((int(s), [(o + j) % L for j in range(w)]))
    return out


def _reset_ref(write_pos, spec_cursors, live):
    for s, _ in live:
        write_pos[s] = 0
        for t in spec_cursors or ():
            t[s] = 0


@torch.no_grad()
def mamba2_materialize_ref(state, x_ring, B_ring, dt_ring, A, write_pos, slots, *, null_slot=0,
                           reset_cursor=True, spec_cursors=None, **_unused):
    """PyTorch twin of :func:`mamba2_materialize` (fp32, one slot at a time)."""
    f32 = torch.float32
    H = state.shape[1]
    G = B_ring.shape[1]
    L = x_ring.shape[2]
    A_h = (A if A.dim() == 1 else A.reshape(H, -1)[:, 0]).to(f32)
    live = _live_slots(slots, write_pos, null_slot, L, spec_cursors)
    for s, pos in live:
        if not pos:
            continue
        delta = dt_ring[s][:, pos].to(f32)  # [H, w]
        sj = delta * torch.exp(A_h[:, None] * suffix_sum_excl_torch(delta, 1))  # as the kernel: no cancellation
        decay = torch.exp(A_h * delta.sum(1))
        X = x_ring[s][:, pos].to(f32)  # [H, w, P]
        Bw = B_ring[s][:, pos].to(f32).repeat_interleave(H // G, 0)  # [H, w, N]
        S_new = decay[:, None, None] * state[s].to(f32) + torch.einsum("hjp,hjn->hpn", X * sj[:, :, None], Bw)
        state[s] = S_new.to(state.dtype)
    if reset_cursor:
        _reset_ref(write_pos, spec_cursors, live)


@torch.no_grad()
def gdn_materialize_ref(state, d_ring, k_ring, g_ring, write_pos, slots, *, use_qk_l2norm=True, null_slot=0,
                        reset_cursor=True, spec_cursors=None, **_unused):
    """PyTorch twin of :func:`gdn_materialize` (fp32, one slot at a time)."""
    f32 = torch.float32
    HV = state.shape[1]
    Hk = k_ring.shape[1]
    L = d_ring.shape[2]
    live = _live_slots(slots, write_pos, null_slot, L, spec_cursors)
    for s, pos in live:
        if not pos:
            continue
        g = g_ring[s][:, pos].to(f32)  # [HV, w]
        c = torch.exp(suffix_sum_excl_torch(g, -1))
        eG = torch.exp(g.sum(-1))
        kr = k_ring[s][:, pos].to(f32)
        if use_qk_l2norm:
            kr = kr / torch.sqrt((kr * kr).sum(-1, keepdim=True) + L2NORM_EPS)
        kr = kr.repeat_interleave(HV // Hk, 0)  # [HV, w, K]
        dh = d_ring[s][:, pos].to(f32)  # [HV, w, V]
        S_new = eG[:, None, None] * state[s].to(f32) + torch.einsum("hjv,hjk->hvk", dh * c[:, :, None], kr)
        state[s] = S_new.to(state.dtype)
    if reset_cursor:
        _reset_ref(write_pos, spec_cursors, live)
