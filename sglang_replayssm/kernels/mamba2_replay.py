"""ReplaySSM autoregressive decode for Mamba2 (selective state update), Triton.

Math (per row r, head h; slot s = state_indices[r], w = write_pos[r]; see
docs/method.md).  The decode window holds positions
j = 0..w: ring entries 0..w-1 of slot s plus the current token at w.  With
Δ_j the processed step sizes and Λ_j their inclusive prefix sums,

    s_j   = Δ_j · exp(A (Λ_w − Λ_j))                     (per-token weight; Λ_w − Λ_j summed
                                                          directly as Σ_{j<i<=w} Δ_i)
    S_w   = exp(A Λ_w) · S_ck + Σ_j s_j x_j B_jᵀ          ("state" form)
    y_w   = exp(A Λ_w) · (S_ck C) + Σ_j s_j (B_j·C) x_j   ("output-only" form)
    y    += D x ;  y *= silu(z)

Non-flush step (w < L−1): the output is produced from the checkpoint S_ck and the
ring, the current token's (x, Δ, B) are appended at ring position w, the state is
not written.  Flush step (w == L−1): S_w (which includes the current token) is
stored as the new checkpoint and nothing is appended.  L = 1 flushes every step,
which is exactly the baseline update.

Output-only replay
------------------
Two launches:
  1. ``_mamba2_bc_kernel``, grid (batch, G): for non-flush rows, bc[r, g, j] = B_j·C
     in fp32 for j <= w (B_w is the current B from the input, not the ring), into a
     per-call fp32 scratch [batch, G, WIN].  The N-length dot is done once per group
     instead of once per (head, P-block).  Trade-off: one extra small launch (a few
     µs, irrelevant under CUDA graphs) against re-reading [WIN, N] of B per program
     in the main kernel, which would double its load instructions (L2 hits, but the
     step is meant to be one streaming read of S_ck).
  2. ``_mamba2_replay_kernel``, grid (cdiv(P, BLOCK_M), batch, H) (with ``flush_first_max_batch``:
     (cdiv(P, BLOCK_M), H, batch), the flush rows' programs first, in the order the pre-kernel wrote).  Non-flush rows:
     one streaming read of the S_ck tile [BLOCK_M, N] and
     y = e^{AΛ}·(S_ck·C) + Σ_j x_j (s_j bc_j), all element-wise in fp32, no P×N
     matrix is built.  Flush rows: S_w = e^{AΛ} S_ck + x_win[BLOCK_M, WIN] @
     (s ⊙ B_win)[WIN, N] on the tensor cores, BLOCK_NC state columns at a time
     (``_rebuild_chunk``; bounded registers, y = S_w·C accumulated on the way),
     each chunk stored as the new checkpoint.  ``flush_unroll`` unrolls the chunk loop
     so that all chunk loads can be issued up front (the built-in default, faster on
     the H200 than a pipelined runtime loop; under a register cap the H200 file runs
     the loop: unrolled, the flush branch sets the kernel's registers).  The current
     token's inputs (x, C, dt, D, z) do not depend on the slot and are loaded before the
     branch on the cursor, overlapping its latency.

Rebuilding S_w on every step instead (y = S_w·C, a "state_and_output" route) was slower at every
batch and was removed (timings: eval/results/kernels-h200.md).  At batch 1 two launches cost more
than SGLang's one, so ``inline_bc_max_batch`` (launch config, default 1) folds the pre-kernel into the
main kernel for small batches (one launch; each program re-reads its group's B window).

Flush vs non-flush is a per-row runtime branch on device data (write_pos), so one
CUDA graph serves every cursor phase; rows are freely desynchronised.

Numerics: every reduction is fp32.  The dot operands are the fp32 values of the
window (activation-dtype x and B upcast exactly, fp32 s_j), multiplied with
``input_precision`` "tf32x3" (default) or "ieee" — plain tf32 drifts ~1e-2 and is
refused.  There is no intermediate rounding of the scaled operand to the activation
dtype, so the PyTorch reference (``mamba2_ref``) is plain fp32 math; the only
roundings are the stores (ring entries to the ring dtype, the state to the state
dtype on flush, the output to the out dtype).  Softplus is fp32 with threshold 20,
as in SGLang's ``selective_state_update``.

Layouts (``ring.py``): state [S, H, P, N], x_ring [S, H, L, P], B_ring [S, G, L, N],
dt_ring [S, H, L] fp32 (processed Δ).  Every tensor is addressed through all of its
strides; slot offsets are int64 (slot · stride(0) may exceed 2^31).  Rows whose
slot is < 0 or == null_slot are skipped entirely: no output, state or ring write.
write_pos is not range-checked on device (no sync); it is clamped into [0, L−1]
so that a bad cursor cannot address memory outside the slot.

Reuse: the window helpers (``_delta_from_raw``, ``_load_window_delta``,
``_window_weights``, ``_load_x_window``, ``_load_B_window``, ``_rebuild_state``,
``_rebuild_chunk``) take the window end and
the number of history entries as runtime scalars, so a speculative-verify kernel
(T tokens on top of checkpoint + history, no checkpoint write) can call them per
window token.

Launch parameters come from ``common.launch_config`` with family
``mamba2_output_only`` (registered below), keyed by the geometry string ``H{H}_P{P}_N{N}_G{G}_L{L}``, with a
state-dtype specific ``..._S{fp32|bf16|fp16}`` entry winning over it.
No SGLang import here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import FLOAT_DTYPES as _FLOAT_DTYPES, INDEX_DTYPES as _INT_DTYPES
from .common import SOFTPLUS_THRESHOLD, config_keys, launch_config, next_pow2, softplus, suffix_sum_excl
from .common import block_param, count_param, dot_precision_param, flag_param, maxnreg_param, register_cap
from .common import flush_first_row, register_family, warps_param, write_flush_first_rank
from .common import pdl_launch, pdl_on, pdl_trigger, pdl_wait

__all__ = [
    "mamba2_replay_decode",
    "geometry_key",
]

_SP_THRESHOLD = tl.constexpr(SOFTPLUS_THRESHOLD)

# Built-in launch parameters: the fastest measured on the H200 (eval/results/kernels-h200.json, tuning sweep:
# BLOCK_M 32 / 1 warp / BLOCK_NC 64 unrolled; eval/results/kernel-variants-h200/: B·C inline at batch 1,
# state_first round 2); the YAML files (kernels/configs/*.yaml) override them per GPU and geometry.
LAUNCH_DEFAULTS = {
    "mamba2_output_only": register_family("mamba2_output_only", {
        "BLOCK_M": block_param(32, 16),
        "BLOCK_NC": block_param(64, 16),  # state columns per flush rebuild chunk
        # 1 unrolls the flush chunk loop so every chunk's loads are issued up front; 0 keeps a runtime loop
        "flush_unroll": flag_param(1),
        "num_warps": warps_param(1),
        "num_stages": count_param(1, 1),
        "bc_num_warps": warps_param(2),  # the per-(row, group) B_j·C pre-kernel
        "dot_precision": dot_precision_param(),
        # batches up to this size compute B_j·C inside the main kernel (one launch instead of
        # two; each program re-reads its group's [WIN, N] B window). 0: never
        "inline_bc_max_batch": count_param(1),
        # 1: non-flush rows issue the checkpoint tile's load (and, inline, the B window's) before the
        # Δ / x ring loads and their weights, so the state's HBM round trip overlaps that dependent
        # chain (eval/results/kernel-variants-h200/ round 2). Flush rows are unchanged.
        "state_first": flag_param(1),
        # registers per thread (0: no cap). The flush branch (tensor-core rebuild) sets the kernel's register
        # count, so a cap buys the non-flush rows resident warps at the cost of spills on the flush branch
        "maxnreg": maxnreg_param(0),
        # the cap of the batches within inline_bc_max_batch (-1: maxnreg): batch 1 lost to a cap that wins at 32
        # and 256 (eval/results/kernel-variants-h200/regcap/)
        "inline_maxnreg": maxnreg_param(-1, inherit=True),
        # batches of at most this many rows start their flush rows' programs first (0: off): with few waves of
        # programs per launch, the long flush programs that start last set the launch's end. The grid becomes
        # (M tiles, heads, rows), each program reading its row from the flush-first order the B·C pre-kernel
        # writes (common.flush_first_row; only above inline_bc_max_batch). Off by default; on in the H200 file's
        # Nemotron-H entries (kernel-variants-h200/mixed-order/)
        "flush_first_max_batch": count_param(0),
        # 1: with the B·C pre-kernel, the decode kernel is launched as its programmatic dependent (sm90+): its
        # programs are scheduled while the pre-kernel runs and wait for it (griddepcontrol.wait) before anything else
        "pdl": flag_param(0),
    }),
}


# --------------------------------------------------------------------------------------
# jit helpers (shared with a later speculative-verify kernel)
# --------------------------------------------------------------------------------------


@triton.jit
def _delta_from_raw(dt_raw, dt_bias, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr):
    """Processed step size Δ = softplus(dt + dt_bias) (or dt + dt_bias), fp32."""
    d = dt_raw.to(tl.float32)
    if HAS_DT_BIAS:
        d += dt_bias.to(tl.float32)
    if DT_SOFTPLUS:
        d = softplus(d, _SP_THRESHOLD)
    return d


@triton.jit
def _load_window_delta(dtr_ptr, stride_l, offs_w, n_hist, pos_cur, delta_cur):
    """[WIN] fp32 window of Δ: ring entries j < n_hist, ``delta_cur`` at j == pos_cur, 0 elsewhere.

    ``dtr_ptr`` points at (slot, head) of the Δ ring.  Masked-off entries are never
    read, so stale or uninitialised ring memory cannot leak in (not even NaN).
    """
    hist = tl.load(dtr_ptr + offs_w * stride_l, mask=offs_w < n_hist, other=0.0).to(tl.float32)
    return tl.where(offs_w == pos_cur, delta_cur, hist)


@triton.jit
def _window_weights(delta_win, A, offs_w, end):
    """Replay weights over window positions 0..end.

    Returns (s [WIN], total_decay): s_j = Δ_j exp(A (Λ_end − Λ_j)) for j <= end and 0
    beyond; total_decay = exp(A Λ_end).  Λ is the inclusive prefix sum of ``delta_win``;
    Λ_end − Λ_j is taken as the direct suffix sum Σ_{j<i<=end} Δ_i (``suffix_sum_excl``), not
    as a difference of prefix sums, which cancels after a large Δ.
    """
    valid = offs_w <= end
    d = tl.where(valid, delta_win, 0.0)
    s = tl.where(valid, d * tl.exp(A * suffix_sum_excl(d, offs_w)), 0.0)
    return s, tl.exp(A * tl.sum(d, 0))


@triton.jit
def _load_x_window(xr_ptr, stride_l, stride_p, offs_m, mask_m, offs_w, n_hist, pos_cur, x_cur):
    """[BLOCK_M, WIN] fp32 tile X[m, j] = x_j[m]: ring for j < n_hist, ``x_cur`` at j == pos_cur."""
    ptrs = xr_ptr + offs_m[:, None] * stride_p + offs_w[None, :] * stride_l
    hist = tl.load(ptrs, mask=mask_m[:, None] & (offs_w[None, :] < n_hist), other=0.0).to(tl.float32)
    return tl.where(offs_w[None, :] == pos_cur, x_cur[:, None], hist)


@triton.jit
def _load_B_window(Br_ptr, stride_l, stride_n, offs_w, offs_n, mask_n, n_hist, pos_cur, B_cur):
    """[WIN, BLOCK_N] fp32 tile of B_j: ring for j < n_hist, ``B_cur`` at j == pos_cur."""
    ptrs = Br_ptr + offs_w[:, None] * stride_l + offs_n[None, :] * stride_n
    hist = tl.load(ptrs, mask=(offs_w[:, None] < n_hist) & mask_n[None, :], other=0.0).to(tl.float32)
    return tl.where(offs_w[:, None] == pos_cur, B_cur[None, :], hist)


@triton.jit
def _load_B_window_row(Br_base, s_Br_l, s_Br_n, B_row, s_B_n, offs_w, offs_n, mask_n, w):
    """The B window of a row at cursor ``w``: ring entries 0..w-1 and the current token's B (from ``B_row``)."""
    B_cur = tl.load(B_row + offs_n * s_B_n, mask=mask_n, other=0.0).to(tl.float32)
    return _load_B_window(Br_base, s_Br_l, s_Br_n, offs_w, offs_n, mask_n, w, w, B_cur)


@triton.jit
def _rebuild_state(S_ck, total_decay, x_win, B_win, s, DOT_PRECISION: tl.constexpr):
    """S = total_decay · S_ck + x_win @ (s ⊙ B_win), fp32 (tensor cores, tf32x3/ieee)."""
    Bs = B_win * s[:, None]
    return total_decay * S_ck + tl.dot(x_win, Bs, input_precision=DOT_PRECISION)


@triton.jit
def _load_state_chunk(st_base, s_st_p, s_st_n, offs_m, mask_m, N, n0, BLOCK_NC: tl.constexpr):
    """Checkpoint columns n0..n0+BLOCK_NC [BLOCK_M, BLOCK_NC] in the state dtype (zeros past N)."""
    offs_c = n0 + tl.arange(0, BLOCK_NC)
    return tl.load(st_base + offs_m[:, None] * s_st_p + offs_c[None, :] * s_st_n,
                   mask=mask_m[:, None] & (offs_c < N)[None, :], other=0.0)


@triton.jit
def _rebuild_chunk(y, n0, st_base, s_st_p, s_st_n, offs_m, mask_m, N, B_row, s_B_n, C_row, s_C_n,
                   Br_base, s_Br_l, s_Br_n, offs_w, w, decay, x_win, s_w, is_flush,
                   DOT_PRECISION: tl.constexpr, BLOCK_NC: tl.constexpr):
    """State columns n0..n0+BLOCK_NC: S = e^{AΛ} S_ck + x_win @ (s ⊙ B_win); stored on flush.

    Returns y + S·C over these columns. The load and the rebuild stay two helpers: merged into one body, the
    sm_90a build's instruction order changes (offline PTX and SASS).
    """
    S = _load_state_chunk(st_base, s_st_p, s_st_n, offs_m, mask_m, N, n0, BLOCK_NC)
    return _rebuild_loaded_chunk(y, S, n0, st_base, s_st_p, s_st_n, offs_m, mask_m, N, B_row, s_B_n, C_row, s_C_n,
                                 Br_base, s_Br_l, s_Br_n, offs_w, w, decay, x_win, s_w, is_flush,
                                 DOT_PRECISION, BLOCK_NC)


@triton.jit
def _rebuild_loaded_chunk(y, S, n0, st_base, s_st_p, s_st_n, offs_m, mask_m, N, B_row, s_B_n, C_row, s_C_n,
                          Br_base, s_Br_l, s_Br_n, offs_w, w, decay, x_win, s_w, is_flush,
                          DOT_PRECISION: tl.constexpr, BLOCK_NC: tl.constexpr):
    """_rebuild_chunk with the checkpoint columns ``S`` already loaded (``_load_state_chunk``)."""
    offs_c = n0 + tl.arange(0, BLOCK_NC)
    mask_c = offs_c < N
    st_ptrs = st_base + offs_m[:, None] * s_st_p + offs_c[None, :] * s_st_n
    st_mask = mask_m[:, None] & mask_c[None, :]
    S = S.to(tl.float32)
    B_cur = tl.load(B_row + offs_c * s_B_n, mask=mask_c, other=0.0).to(tl.float32)
    B_win = _load_B_window(Br_base, s_Br_l, s_Br_n, offs_w, offs_c, mask_c, w, w, B_cur)
    S = _rebuild_state(S, decay, x_win, B_win, s_w, DOT_PRECISION)
    C_c = tl.load(C_row + offs_c * s_C_n, mask=mask_c, other=0.0).to(tl.float32)
    if is_flush:
        tl.store(st_ptrs, S.to(st_base.dtype.element_ty), mask=st_mask)
    return y + tl.sum(S * C_c[None, :], 1)


@triton.jit
def _load_row_cursor(slot_ptr, wpos_ptr, row, null_slot, L):
    """(slot int64, clamped write position, live flag) of a decode row."""
    slot = tl.load(slot_ptr + row).to(tl.int64)
    live = (slot >= 0) & (slot != null_slot)
    w = tl.load(wpos_ptr + row).to(tl.int32)
    w = tl.minimum(tl.maximum(w, 0), L - 1)
    return slot, w, live


# --------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------


@triton.jit
def _mamba2_bc_kernel(
    Br_ptr, B_ptr, C_ptr, slot_ptr, wpos_ptr, bc_ptr,
    null_slot, N, L,
    s_Br_s, s_Br_g, s_Br_l, s_Br_n,
    s_B_b, s_B_g, s_B_n,
    s_C_b, s_C_g, s_C_n,
    s_bc_b, s_bc_g, order_ptr, n_rows,
    BLOCK_N: tl.constexpr, WIN: tl.constexpr, FF: tl.constexpr, PDL: tl.constexpr,
):
    """bc[row, g, j] = B_j · C_cur (fp32) for j <= w on non-flush rows; with FF > 0 also the decode kernel's
    flush-first order (common.write_flush_first_rank, from the (row, 0) programs). ``PDL``: the decode kernel, a
    programmatic dependent of this one, may start scheduling at once."""
    pdl_trigger(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    slot, w, live = _load_row_cursor(slot_ptr, wpos_ptr, row, null_slot, L)
    if FF > 0:
        if g == 0:
            write_flush_first_rank(order_ptr, wpos_ptr, 1, n_rows, row, L, FF)
    if live & (w < L - 1):
        offs_n = tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        offs_w = tl.arange(0, WIN)
        B_cur = tl.load(B_ptr + row * s_B_b + g * s_B_g + offs_n * s_B_n, mask=mask_n, other=0.0).to(tl.float32)
        C = tl.load(C_ptr + row * s_C_b + g * s_C_g + offs_n * s_C_n, mask=mask_n, other=0.0).to(tl.float32)
        B_win = _load_B_window(Br_ptr + slot * s_Br_s + g * s_Br_g, s_Br_l, s_Br_n,
                               offs_w, offs_n, mask_n, w, w, B_cur)
        bc = tl.sum(B_win * C[None, :], 1)
        tl.store(bc_ptr + row * s_bc_b + g * s_bc_g + offs_w, bc)


@triton.jit
def _mamba2_replay_kernel(
    state_ptr, xr_ptr, Br_ptr, dtr_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dtb_ptr, out_ptr,
    slot_ptr, wpos_ptr, bc_ptr,
    null_slot, P, N, L, heads_per_group,
    s_st_s, s_st_h, s_st_p, s_st_n,
    s_xr_s, s_xr_h, s_xr_l, s_xr_p,
    s_Br_s, s_Br_g, s_Br_l, s_Br_n,
    s_dtr_s, s_dtr_h, s_dtr_l,
    s_x_b, s_x_h, s_x_p,
    s_dt_b, s_dt_h,
    s_A_h,
    s_B_b, s_B_g, s_B_n,
    s_C_b, s_C_g, s_C_n,
    s_D_h, s_D_p,
    s_z_b, s_z_h, s_z_p,
    s_dtb_h,
    s_o_b, s_o_h, s_o_p,
    s_bc_b, s_bc_g, order_ptr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NC: tl.constexpr, WIN: tl.constexpr,
    FLUSH_UNROLL: tl.constexpr, INLINE_BC: tl.constexpr, STATE_FIRST: tl.constexpr, FF: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # PDL: launched as the B·C pre-kernel's dependent
    pid_m = tl.program_id(0)
    # scalar offsets in int64: free at this scale, and no int32 product can overflow
    if FF == 0:
        row = tl.program_id(1).to(tl.int64)
        h = tl.program_id(2).to(tl.int64)
    else:  # flush rows first (launch option flush_first_max_batch): the grid is (M tiles, heads, ranks)
        row = flush_first_row(order_ptr)
        h = tl.program_id(1).to(tl.int64)
    g = h // heads_per_group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < P
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_w = tl.arange(0, WIN)

    # The current token's inputs do not depend on the slot: they are loaded before the
    # branch on the cursor so that their latency overlaps the cursor load's.
    slot = tl.load(slot_ptr + row).to(tl.int64)
    w = tl.load(wpos_ptr + row).to(tl.int32)
    if HAS_DT_BIAS:
        dtb = tl.load(dtb_ptr + h * s_dtb_h)
    else:
        dtb = 0.0
    dt_raw = tl.load(dt_ptr + row * s_dt_b + h * s_dt_h)
    A = tl.load(A_ptr + h * s_A_h).to(tl.float32)
    x_cur = tl.load(x_ptr + row * s_x_b + h * s_x_h + offs_m * s_x_p, mask=mask_m, other=0.0).to(tl.float32)
    C = tl.load(C_ptr + row * s_C_b + g * s_C_g + offs_n * s_C_n, mask=mask_n, other=0.0).to(tl.float32)
    if HAS_D:
        if not STATE_FIRST:
            Dv = tl.load(D_ptr + h * s_D_h + offs_m * s_D_p, mask=mask_m, other=0.0).to(tl.float32)
    if HAS_Z:
        zv = tl.load(z_ptr + row * s_z_b + h * s_z_h + offs_m * s_z_p, mask=mask_m, other=0.0).to(tl.float32)

    if (slot >= 0) & (slot != null_slot):
        w = tl.minimum(tl.maximum(w, 0), L - 1)  # memory safety only: write_pos is not range-checked
        w64 = w.to(tl.int64)
        is_flush = w == L - 1
        delta_cur = _delta_from_raw(dt_raw, dtb, HAS_DT_BIAS, DT_SOFTPLUS)

        # window (history 0..w-1 from the ring, current token at w)
        xr_base = xr_ptr + slot * s_xr_s + h * s_xr_h
        dtr_base = dtr_ptr + slot * s_dtr_s + h * s_dtr_h
        Br_base = Br_ptr + slot * s_Br_s + g * s_Br_g
        st_base = state_ptr + slot * s_st_s + h * s_st_h
        if STATE_FIRST:  # the tile (masked off on flush rows) before the window chain
            st_tile = st_base + offs_m[:, None] * s_st_p + offs_n[None, :] * s_st_n
            S_pre = tl.load(st_tile, mask=mask_m[:, None] & mask_n[None, :] & (w != L - 1), other=0.0)
            if INLINE_BC:
                B_pre = _load_B_window_row(Br_base, s_Br_l, s_Br_n, B_ptr + row * s_B_b + g * s_B_g, s_B_n,
                                           offs_w, offs_n, mask_n & (w != L - 1), w)
        delta_win = _load_window_delta(dtr_base, s_dtr_l, offs_w, w, w, delta_cur)
        s_w, decay = _window_weights(delta_win, A, offs_w, w)
        x_win = _load_x_window(xr_base, s_xr_l, s_xr_p, offs_m, mask_m, offs_w, w, w, x_cur)

        if is_flush:
            # S_w = e^{AΛ} S_ck + x_win @ (s ⊙ B_win), built BLOCK_NC state columns at a time
            # (bounded registers), y accumulated on the way, S_w stored as the new checkpoint.
            y = tl.zeros([BLOCK_M], dtype=tl.float32)
            if FLUSH_UNROLL:
                for n0 in tl.static_range(0, BLOCK_N, BLOCK_NC):
                    y = _rebuild_chunk(y, n0, st_base, s_st_p, s_st_n, offs_m, mask_m, N,
                                       B_ptr + row * s_B_b + g * s_B_g, s_B_n, C_ptr + row * s_C_b + g * s_C_g, s_C_n,
                                       Br_base, s_Br_l, s_Br_n, offs_w, w, decay, x_win, s_w, is_flush,
                                       DOT_PRECISION, BLOCK_NC)
            else:
                for n0 in range(0, N, BLOCK_NC):
                    y = _rebuild_chunk(y, n0, st_base, s_st_p, s_st_n, offs_m, mask_m, N,
                                       B_ptr + row * s_B_b + g * s_B_g, s_B_n, C_ptr + row * s_C_b + g * s_C_g, s_C_n,
                                       Br_base, s_Br_l, s_Br_n, offs_w, w, decay, x_win, s_w, is_flush,
                                       DOT_PRECISION, BLOCK_NC)
        else:
            # output-only replay: one streaming read of the S_ck tile, no P×N build
            if STATE_FIRST:
                S = S_pre.to(tl.float32)
            else:
                st_ptrs = st_base + offs_m[:, None] * s_st_p + offs_n[None, :] * s_st_n
                S = tl.load(st_ptrs, mask=mask_m[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
            if INLINE_BC:  # small batches: B_j·C here, no pre-kernel launch
                if STATE_FIRST:
                    B_win = B_pre
                else:
                    B_win = _load_B_window_row(Br_base, s_Br_l, s_Br_n, B_ptr + row * s_B_b + g * s_B_g, s_B_n,
                                               offs_w, offs_n, mask_n, w)
                bc = tl.sum(B_win * C[None, :], 1)
            else:
                bc = tl.load(bc_ptr + row * s_bc_b + g * s_bc_g + offs_w, mask=offs_w <= w, other=0.0)
            y = decay * tl.sum(S * C[None, :], 1) + tl.sum(x_win * (s_w * bc)[None, :], 1)

        if HAS_D:
            if STATE_FIRST:  # loaded here: held from the top it was spilled, and its wait came before the tile
                Dv = tl.load(D_ptr + h * s_D_h + offs_m * s_D_p, mask=mask_m, other=0.0).to(tl.float32)
            y += Dv * x_cur
        if HAS_Z:
            y *= zv * tl.sigmoid(zv)
        tl.store(out_ptr + row * s_o_b + h * s_o_h + offs_m * s_o_p, y.to(out_ptr.dtype.element_ty), mask=mask_m)

        # append the current token's inputs (non-flush only); Δ and B once per (row, head / group)
        if w < L - 1:
            tl.store(xr_base + w64 * s_xr_l + offs_m * s_xr_p, x_cur.to(xr_ptr.dtype.element_ty), mask=mask_m)
            if pid_m == 0:
                tl.store(dtr_base + w64 * s_dtr_l, delta_cur.to(dtr_ptr.dtype.element_ty))
                if h % heads_per_group == 0:
                    B_cur = tl.load(B_ptr + row * s_B_b + g * s_B_g + offs_n * s_B_n, mask=mask_n, other=0.0)
                    tl.store(Br_base + w64 * s_Br_l + offs_n * s_Br_n, B_cur.to(Br_ptr.dtype.element_ty),
                             mask=mask_n)


# --------------------------------------------------------------------------------------
# Python wrapper
# --------------------------------------------------------------------------------------


def geometry_key(H: int, P: int, N: int, G: int, L: int) -> str:
    return f"H{H}_P{P}_N{N}_G{G}_L{L}"


def _err(msg: str):
    raise ValueError(f"mamba2_replay_decode: {msg}")


def _check_float(name, t):
    if t.dtype not in _FLOAT_DTYPES:
        _err(f"{name} must be float32/bfloat16/float16, got {t.dtype}")


def _check_shape(name, t, shape):
    if tuple(t.shape) != tuple(shape):
        _err(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def _head_param(name, t, H, P, N=None, tie=True):
    """Stride over the head axis of a per-head parameter given as [H], [H, P] or [H, P, N].

    With ``tie`` the trailing axes must have stride 0 (the value is per head); without
    it ([H, P] D) the P stride is returned as well.
    """
    if t.dim() == 1:
        _check_shape(name, t, (H,))
        return t.stride(0), 0
    if t.dim() == 2:
        _check_shape(name, t, (H, P))
        if tie and P > 1 and t.stride(1) != 0:
            _err(f"{name} [H, P] must be tied over P (stride 0 over P), got strides {t.stride()}")
        return t.stride(0), t.stride(1)
    if t.dim() == 3 and N is not None:
        _check_shape(name, t, (H, P, N))
        if (P > 1 and t.stride(1) != 0) or (N > 1 and t.stride(2) != 0):
            _err(f"{name} [H, P, N] must be tied over P and N (stride 0), got strides {t.stride()}")
        return t.stride(0), 0
    shapes = "[H], [H, P]" + (" or [H, P, N]" if N is not None else "")
    _err(f"{name} must be {shapes}, got shape {tuple(t.shape)}")


def mamba2_replay_decode(
    state,
    x_ring,
    B_ring,
    dt_ring,
    x,
    dt,
    A,
    B,
    C,
    state_indices,
    write_pos,
    *,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=True,
    out=None,
    null_slot=0,
):
    """One ReplaySSM decode step for a batch of rows (see the module docstring).

    state [S, H, P, N] checkpoint (fp32/bf16/fp16, any strides); x_ring [S, H, L, P],
    B_ring [S, G, L, N] (activation dtype), dt_ring [S, H, L] fp32; x [batch, H, P];
    dt [batch, H] or [batch, H, P] tied over P; A [H] or [H, P, N] tied; B, C
    [batch, G, N]; state_indices, write_pos [batch] int32/int64; D [H] or [H, P];
    z [batch, H, P]; dt_bias [H] or [H, P] tied.  Rows with slot < 0 or == null_slot
    are skipped (nothing written).  Returns ``out`` [batch, H, P].
    """
    tensors = dict(state=state, x_ring=x_ring, B_ring=B_ring, dt_ring=dt_ring, x=x, dt=dt, A=A, B=B, C=C,
                   state_indices=state_indices, write_pos=write_pos, D=D, z=z, dt_bias=dt_bias, out=out)
    for name, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            _err(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dev = state.device
    for name, t in tensors.items():
        if t is not None and t.device != dev:
            _err(f"{name} is on {t.device} but state is on {dev}")

    if state.dim() != 4:
        _err(f"state must be [S, H, P, N], got shape {tuple(state.shape)}")
    S_slots, H, P, N = state.shape
    if x.dim() != 3:
        _err(f"x must be [batch, H, P], got shape {tuple(x.shape)}")
    batch = x.shape[0]
    _check_shape("x", x, (batch, H, P))
    if x_ring.dim() != 4:
        _err(f"x_ring must be [S, H, L, P], got shape {tuple(x_ring.shape)}")
    L = x_ring.shape[2]
    if L < 1:
        _err("ring length L = x_ring.shape[2] must be >= 1")
    _check_shape("x_ring", x_ring, (S_slots, H, L, P))
    if B.dim() != 3:
        _err(f"B must be [batch, G, N], got shape {tuple(B.shape)}")
    G = B.shape[1]
    if G < 1 or H % G:
        _err(f"number of heads H={H} must be a multiple of the number of groups G={G}")
    _check_shape("B", B, (batch, G, N))
    _check_shape("C", C, (batch, G, N))
    _check_shape("B_ring", B_ring, (S_slots, G, L, N))
    _check_shape("dt_ring", dt_ring, (S_slots, H, L))
    if dt_ring.dtype != torch.float32:
        _err(f"dt_ring must be float32 (processed Δ), got {dt_ring.dtype}")
    for name in ("state", "x_ring", "B_ring", "x", "dt", "A", "B", "C"):
        _check_float(name, tensors[name])

    if dt.dim() == 2:
        _check_shape("dt", dt, (batch, H))
    elif dt.dim() == 3:
        _check_shape("dt", dt, (batch, H, P))
        if P > 1 and dt.stride(2) != 0:
            _err(f"dt [batch, H, P] must be tied over P (stride 0 over P), got strides {dt.stride()}")
    else:
        _err(f"dt must be [batch, H] or [batch, H, P], got shape {tuple(dt.shape)}")
    s_A_h, _ = _head_param("A", A, H, P, N)
    if dt_bias is not None:
        _check_float("dt_bias", dt_bias)
        s_dtb_h, _ = _head_param("dt_bias", dt_bias, H, P)
    else:
        s_dtb_h = 0
    if D is not None:
        _check_float("D", D)
        s_D_h, s_D_p = _head_param("D", D, H, P, tie=False)
    else:
        s_D_h = s_D_p = 0
    if z is not None:
        _check_float("z", z)
        _check_shape("z", z, (batch, H, P))
    for name, t in (("state_indices", state_indices), ("write_pos", write_pos)):
        if t.dtype not in _INT_DTYPES:
            _err(f"{name} must be int32 or int64, got {t.dtype}")
        _check_shape(name, t, (batch,))
    # the kernels read row r at ptr + r: a strided view is copied (one small copy; the server's are contiguous)
    state_indices, write_pos = state_indices.contiguous(), write_pos.contiguous()
    if out is None:
        out = torch.empty_like(x)
    else:
        _check_float("out", out)
        _check_shape("out", out, (batch, H, P))
    if null_slot is None:
        null_slot = -1
    null_slot = int(null_slot)

    keys = config_keys(geometry_key(H, P, N, G, L), state.dtype)
    cfg = launch_config("mamba2_output_only", keys)  # entries checked against the registration above
    BLOCK_M = cfg["BLOCK_M"]
    BLOCK_NC = cfg["BLOCK_NC"]
    if batch == 0:
        return out

    BLOCK_N = max(16, next_pow2(N))
    BLOCK_NC = min(BLOCK_NC, BLOCK_N)
    WIN = max(16, next_pow2(L))
    heads_per_group = H // G

    inline_bc = batch <= cfg["inline_bc_max_batch"]
    pdl = not inline_bc and pdl_on(cfg["pdl"], state.device)
    # flush rows first (their order written by the B·C pre-kernel, so only with it); 0: the rows in grid order
    FF = max(16, next_pow2(batch)) if not inline_bc and batch <= cfg["flush_first_max_batch"] else 0
    # per call (graph-safe); None without FF: no kernel parameter, the same build as without the option
    order = torch.empty(batch, dtype=torch.int32, device=dev) if FF else None
    if not inline_bc:
        bc = torch.empty((batch, G, WIN), dtype=torch.float32, device=dev)
        _mamba2_bc_kernel[(batch, G)](
            B_ring, B, C, state_indices, write_pos, bc,
            null_slot, N, L,
            *B_ring.stride(), *B.stride(), *C.stride(),
            bc.stride(0), bc.stride(1), order, batch if FF else None,
            BLOCK_N=BLOCK_N, WIN=WIN, FF=FF, PDL=pdl,
            num_warps=int(cfg["bc_num_warps"]),
        )
        s_bc_b, s_bc_g = bc.stride(0), bc.stride(1)
    else:
        bc = dt_ring  # never read (INLINE_BC)
        s_bc_b = s_bc_g = 0

    grid = (triton.cdiv(P, BLOCK_M), H, batch) if FF else (triton.cdiv(P, BLOCK_M), batch, H)
    _mamba2_replay_kernel[grid](
        state, x_ring, B_ring, dt_ring,
        x, dt, A, B, C,
        D if D is not None else x, z if z is not None else x, dt_bias if dt_bias is not None else dt,
        out, state_indices, write_pos, bc,
        null_slot, P, N, L, heads_per_group,
        *state.stride(), *x_ring.stride(), *B_ring.stride(), *dt_ring.stride(),
        *x.stride(), dt.stride(0), dt.stride(1), s_A_h,
        *B.stride(), *C.stride(),
        s_D_h, s_D_p,
        *(z.stride() if z is not None else (0, 0, 0)),
        s_dtb_h,
        *out.stride(),
        s_bc_b, s_bc_g, order,
        HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=bool(dt_softplus),
        DOT_PRECISION=cfg["dot_precision"],
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_NC=BLOCK_NC, WIN=WIN, FLUSH_UNROLL=bool(cfg["flush_unroll"]),
        INLINE_BC=inline_bc, STATE_FIRST=bool(cfg["state_first"]), FF=FF, PDL=pdl,
        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), **register_cap(cfg, inline_bc),
        **pdl_launch(pdl),
    )
    return out
