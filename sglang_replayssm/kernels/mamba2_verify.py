"""ReplaySSM speculative verify for Mamba2: a window of T tokens over checkpoint + ring.

Same ring layout as standard decode (``ring.py``: x [S, H, R, P], B [S, G, R, N] in the
activation dtype, processed Δ [S, H, R] fp32) used as a *circular* ring of length
``R = B_hist + T``, with the per-slot cursors of :mod:`spec_cursor` (``wp`` committed
history entries, ``origin`` physical index of logical 0, ``flush`` flag).  The kernel
never writes a cursor; :func:`spec_cursor.spec_commit` moves them between forwards.

Math (per live row, head h; history k = 0..wp-1 at physical (origin + k) % R with
processed Δ_k, Λ_k = Σ_{i<=k} Δ_i, Λ = Λ_{wp-1}; window tokens s = 0..T-1 with
Δ_s = softplus(dt_s + dt_bias) and window-local inclusive prefix μ_s)::

    S_c    = exp(A Λ) S_ck + Σ_k Δ_k exp(A (Λ − Λ_k)) x_k B_kᵀ         (the committed state)
    y_s    = exp(A μ_s) (S_c · C_s) + Σ_{m<=s} Δ_m exp(A (μ_s − μ_m)) (B_m·C_s) x_m
    y_s   += D x_s ;  y_s *= silu(z_s)

(Λ − Λ_k and μ_s − μ_m are summed directly over the Δ between the two positions, never
taken as a difference of two prefix sums, which would cancel after a large Δ.)

Verify (``flush[slot] == 0``): S_c is never built.  Its contribution is replayed:
``exp(A μ_s) S_c·C_s = exp(A(Λ + μ_s)) (S_ck·C_s) + Σ_k Δ_k exp(A(Λ − Λ_k + μ_s)) (B_k·C_s) x_k``,
one streaming read of the S_ck tile, all element-wise fp32.  Flush
(``flush[slot] == 1``): S_c is built N-chunk by N-chunk (one ``tl.dot`` [BLOCK_M, WH] x
[WH, BLOCK_NC] with ``dot_precision`` tf32x3 / ieee — plain tf32 is refused), stored as
the new checkpoint (history only, never a draft), and the window is computed on top of
it with an empty history (``nonflush: chunked``); with the stream read (``nonflush: stream / mma``) a flush row's
outputs are a verify row's (the same S_c·C_s, replayed from S_ck) and its chunk loop only folds and stores (this
won over folding the dots into the loop on the H200, round 15).  Either way the window's
(x, Δ, B) are written to the ring at logical wp .. wp+T-1.  The output of every window position is produced (SGLang's
rejection sampler reads the logits of all of them).

Programs: grid (cdiv(P, BLOCK_M), batch, H).  Each reads its S_ck tile once (plus, on
flush, writes it once), the history x tile [BLOCK_M, WH], Δ [WH], the group's B
history [WH, N] and the window's x/B/C/dt/z.  The group-shared B·C dots are done per
program (``bc: inline``, group sharing left to L2) or once per (row, group) by
``_mamba2_verify_bc_kernel`` into an fp32 scratch (``bc: pre``; batches of at most
``inline_bc_max_batch`` rows stay inline, one launch); the per-token dots are
reduced as one 3-D broadcast (``reduce: bcast``) or T 2-D row reductions (``reduce: token``).
``nonflush: chunked`` reads the S_ck tile N-chunk by N-chunk on every row (each chunk's loads wait
behind the previous chunk's conditional ring / checkpoint stores); ``nonflush: stream`` lets
every live row read the whole [BLOCK_M, N] tile at once, all loads in flight together (the decode
kernel's output-only read), a flush row's chunk loop then only folding; ``nonflush: mma`` is that read with the
dots S_ck·C_s as one tl.dot on the tensor cores, fp32-accurate (tf32 passes over hi/lo halves,
``common.split_dot``).
``eval/verify_sass.py`` compares the variants offline; their H200 timings (one warp, ``reduce:
token``, ``bc: pre``, ``nonflush: stream``: the built-in defaults) are in eval/results/spec-variants-h200/.
Load order (round 15 on the H200: it won over the slot -> cursors -> Δ-weights -> tile chain and over the same
order without the per-row copy): what the row alone indexes (window, B·C, A, D, z) is issued before the slot; the
slot and cursors come from a per-row copy that the B·C pre-kernel writes (without a pre-kernel: the slot, then its
cursors); the history and the state tile are issued together, and the weights' math follows the dots. No early
return: a padded or null row runs with every load and store masked off.
Rows whose slot is < 0 or == null_slot write nothing.  The window is ``T`` tokens per row (SGLang's
chain verify: ``draft_token_num`` for every row); ``wp`` is clamped to [0, R − T] for memory safety only.

Tree (:func:`mamba2_tree_verify`, SGLang EAGLE with ``--speculative-eagle-topk`` > 1): the window
is T draft nodes with ``parents`` int [batch, T] (0 = root = the last verified token, ``parents[b, s]``
in ``[0, s)``; see :mod:`spec_tree`), and node s's output is the recurrence over the committed
history and then *its own* ancestor path root..s.  The same kernel (``IS_TREE``) builds the
ancestor mask ``anc(s)`` in-kernel by pointer-jumping and uses it where the chain uses ``m <= s``:
μ_s = Σ_{m ∈ anc(s)} Δ_m, and the window term sums over m ∈ anc(s) with μ_s − μ_m the Δ of the
path nodes after m.  A chain (``parents[s] = s − 1``) gives the chain verify.  The window goes to
the ring in node order; :func:`spec_tree.spec_commit_tree` gathers the accepted path later.

Numerics: every reduction fp32, no rounding of intermediates; the only roundings are
the stores (ring entries, the checkpoint on flush, the outputs).
"""

from __future__ import annotations

from typing import Any, Dict

import torch
import triton
import triton.language as tl

from .common import FLOAT_DTYPES as _FLOAT_DTYPES, INDEX_DTYPES as _INT_DTYPES
from .common import split_dot, suffix_sum_excl, tf32_split
from .common import (block_param, choice_param, config_keys, count_param, dot_precision_param, flag_param,
                     launch_config, maxnreg_param, next_pow2, pdl_launch, pdl_on, pdl_trigger, pdl_wait, register_cap,
                     register_family, warps_param)
from .mamba2_replay import _delta_from_raw, _head_param
from .spec_tree import _tree_ancestor_mask, check_parents_arg

__all__ = ["mamba2_verify", "mamba2_tree_verify", "MAMBA2_VERIFY_DEFAULT_LAUNCH", "verify_geometry_key"]

# How the per-token dots are reduced (the same math and fp32 order of terms per dot):
# "bcast" -- one [rows, T, NC] broadcast-and-sum per chunk (3-D temporaries);
# "token" -- T two-dimensional row reductions per chunk, as the decode kernel does for T = 1.
REDUCE_MODES = ("bcast", "token")
# Where the group-shared dots B_k·C_s (history) and B_m·C_s (window) are computed:
# "inline" -- in every program of the group (heads_per_group x P/BLOCK_M times per row);
# "pre"    -- once per (row, group) by ``_mamba2_verify_bc_kernel`` into an fp32 scratch
#             [batch, G, WH + TP, TP] that the main kernel reads.
BC_MODES = ("inline", "pre")
NONFLUSH_MODES = ("chunked", "stream", "mma")

# Built-in launch parameters: the fastest measured on the H200 (eval/results/spec-variants-h200/, rounds 1-2 and 7).
MAMBA2_VERIFY_DEFAULT_LAUNCH: Dict[str, Any] = register_family("mamba2_verify", {
    "BLOCK_M": block_param(32, 16),
    "BLOCK_NC": block_param(32, 16),
    "num_warps": warps_param(1),
    "num_stages": count_param(1, 1),
    "dot_precision": dot_precision_param(),
    "reduce": choice_param("token", REDUCE_MODES),
    "bc": choice_param("pre", BC_MODES),
    "bc_num_warps": warps_param(1),
    # with bc: pre, batches of at most this many rows still compute B·C inline (one launch instead
    # of two; at batch 1 the pre-kernel's extra launch costs more than the dots it shares)
    "inline_bc_max_batch": count_param(1),
    # register cap of the main kernel (0: none).  One-warp programs at 255 registers leave 8 warps per
    # SM (eval/verify_sass.py); a cap trades spills for resident warps, i.e. loads in flight
    "maxnreg": maxnreg_param(0),
    # how rows read their S_ck tile for the outputs: "chunked" (the N-chunk loop flush rows also take; the chunks'
    # conditional stores keep the next chunk's loads behind them) or "stream" (the whole [BLOCK_M, N]
    # tile in one read, all loads in flight together, as the decode kernel's output-only read; a flush row's
    # outputs replay its history on S_ck and its N-chunk loop only folds and stores) or "mma" (the
    # stream read, its dots S_ck·C_s as one [BLOCK_M, N] x [N, T] tl.dot in tf32 passes over hi/lo halves)
    "nonflush": choice_param("stream", NONFLUSH_MODES),
    # with nonflush "stream": the per-token dots S_ck·C_s of every live row sum the tile's column chunks of this
    # width element-wise first and reduce once per token. A [rows, 16] chunk is spread over fewer lanes than a
    # whole row, so a token's reduction takes fewer shuffle rounds (eval/results/spec-variants-h200/, round 7:
    # 16 won over 32 and over one reduction across the whole row, which is removed)
    "stream_chunk": block_param(16, 16),
    # software-pipeline stages of the N-chunk loop, a runtime loop (1: none; more: the next chunks' checkpoint, ring
    # and window loads are issued before this chunk's checkpoint store; chunks never overlap, so nothing is read
    # stale). 2 won over the loop unrolled, which is removed (eval/results/spec-variants-h200/, round 8); fp32 states
    # take 3 on the H200 (default.yaml, round 17) and 4 on an H100 (configs/h100.yaml, round 16)
    "flush_stages": count_param(2, 1),
    # 1: a flush row's fold x_hist @ (s ⊙ B_hist) as two tf32 passes (common.split_dot): the ring's x is 16-bit,
    # exact in tf32, so only s ⊙ B is split hi + lo; tf32x3's accuracy with one tensor-core pass fewer (an fp32
    # x ring: three passes). 0: tl.dot at dot_precision. On for fp32 states in default.yaml (won on the H200:
    # eval/results/spec-variants-h200/, round 13)
    "flush_split": flag_param(0),
    # 1: with the B·C pre-kernel, the main kernel is launched as its programmatic dependent (sm90+): its programs are
    # scheduled while the pre-kernel runs and wait for it (griddepcontrol.wait) before anything else. Untimed on the
    # H200; a wash on an H100, where waiting only before the outputs (the slot and cursors read without the
    # pre-kernel's per-row copy) lost and is removed (eval/results/spec-variants-h200/, round 18)
    "pdl": flag_param(0),
})

@triton.jit
def _add_token_dot(acc, X, c_t, col):
    """``acc[:, t] += X · c_t`` for the token column ``col`` ([1, TP] mask): one 2-D row reduction."""
    return acc + tl.where(col, tl.sum(X * c_t[None, :], 1)[:, None], 0.0)


@triton.jit
def _add_token_dot_chunked(acc, st_base, s_st_p, s_st_n, offs_m, mask_m, N, c_row, s_c_n, live, col,
                           BLOCK_N: tl.constexpr, CH: tl.constexpr):
    """``acc[:, t] += S_ck · c_t`` over the tile's column chunks of width CH: the chunks' products are summed
    element-wise and reduced once (``stream_chunk``); the chunk loads repeat per token and are left to the
    compiler to share."""
    part = tl.zeros([offs_m.shape[0], CH], dtype=tl.float32)
    for ch in tl.static_range(BLOCK_N // CH):
        offs_c = ch * CH + tl.arange(0, CH)
        mask_c = offs_c < N
        S_c = tl.load(st_base + offs_m[:, None] * s_st_p + offs_c[None, :] * s_st_n,
                      mask=mask_m[:, None] & mask_c[None, :], other=0.0).to(tl.float32)
        c_c = tl.load(c_row + offs_c * s_c_n, mask=mask_c & live, other=0.0).to(tl.float32)
        part += S_c * c_c[None, :]
    return acc + tl.where(col, tl.sum(part, 1)[:, None], 0.0)


@triton.jit
def _mamba2_verify_bc_kernel(
    Br_ptr, B_ptr, C_ptr, slot_ptr, wp_ptr, org_ptr, fl_ptr, bc_ptr, rc_ptr,
    null_slot, N, R, T,
    s_Br_s, s_Br_g, s_Br_r, s_Br_n,
    s_B_b, s_B_t, s_B_g, s_B_n,
    s_C_b, s_C_t, s_C_g, s_C_n,
    s_bc_b, s_bc_g,
    BLOCK_NC: tl.constexpr, N_CHUNKS: tl.constexpr, WH: tl.constexpr, TP: tl.constexpr, HIST_ALL: tl.constexpr,
    PDL: tl.constexpr,
):
    """bc[row, g, k, s] = B_k · C_s (history k < wp; zero on flush rows unless ``HIST_ALL``)
    and bc[row, g, WH + m, s] = B_m · C_s (window m), fp32.  The programs of group 0 also write the row's slot and
    clamped cursors to rc[row] = (slot, wp, origin, flush) int32, every row (a padded or null row's cursors as 0),
    for the main kernel to read in one round trip.  ``HIST_ALL`` (the stream read, whose flush rows replay their
    history): the history's B_k · C_s on flush rows too.  ``PDL``: the main kernel, a programmatic dependent of
    this one, may start scheduling at once."""
    pdl_trigger(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    # every row's entry is written, a padded or null row's with its cursors as 0
    live = (slot >= 0) & (slot != null_slot)
    wp = tl.minimum(tl.maximum(tl.load(wp_ptr + slot, mask=live, other=0).to(tl.int32), 0), R - T)
    org = tl.minimum(tl.maximum(tl.load(org_ptr + slot, mask=live, other=0).to(tl.int32), 0), R - 1)
    flag = tl.load(fl_ptr + slot, mask=live, other=0)
    if g == 0:
        o4 = tl.arange(0, 4)
        rc = tl.where(o4 == 0, slot.to(tl.int32),
                      tl.where(o4 == 1, wp, tl.where(o4 == 2, org, (flag != 0).to(tl.int32))))
        tl.store(rc_ptr + row * 4 + o4, rc)
    if not live:
        return
    no_flush = flag == 0
    offs_t = tl.arange(0, TP)
    mask_t = offs_t < T
    offs_k = tl.arange(0, WH)
    if HIST_ALL:
        valid_k = offs_k < wp
    else:
        valid_k = (offs_k < wp) & no_flush
    phys_k = ((org + offs_k) % R).to(tl.int64)
    bc_h = tl.zeros([WH, TP], dtype=tl.float32)
    bc_w = tl.zeros([TP, TP], dtype=tl.float32)
    for c in tl.static_range(N_CHUNKS):
        offs_n = c * BLOCK_NC + tl.arange(0, BLOCK_NC)
        mask_n = offs_n < N
        B_h = tl.load(Br_ptr + slot * s_Br_s + g * s_Br_g + phys_k[:, None] * s_Br_r + offs_n[None, :] * s_Br_n,
                      mask=valid_k[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
        B_w = tl.load(B_ptr + row * s_B_b + g * s_B_g + offs_t[:, None] * s_B_t + offs_n[None, :] * s_B_n,
                      mask=mask_t[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
        for t in tl.static_range(TP):
            col = (offs_t == t)[None, :]
            C_t = tl.load(C_ptr + row * s_C_b + g * s_C_g + t * s_C_t + offs_n * s_C_n,
                          mask=mask_n & (t < T), other=0.0).to(tl.float32)
            bc_h = _add_token_dot(bc_h, B_h, C_t, col)
            bc_w = _add_token_dot(bc_w, B_w, C_t, col)
    base = bc_ptr + row * s_bc_b + g * s_bc_g
    tl.store(base + offs_k[:, None] * TP + offs_t[None, :], bc_h)
    tl.store(base + (WH + offs_t)[:, None] * TP + offs_t[None, :], bc_w)


@triton.jit
def _verify_chunk(c, SC, bc_h, bc_w, st_base, s_st_p, s_st_n, offs_m, mask_m, N, C_row, s_C_t, s_C_n, offs_t, mask_t, T,
                  B_row, s_B_t, s_B_n, write_B, Br_base, s_Br_r, s_Br_n, phys_k, valid_k, phys_t, is_flush, no_flush,
                  wp, decay_end, x_hist, s_hist, DOT_PRECISION: tl.constexpr, BLOCK_NC: tl.constexpr,
                  TP: tl.constexpr, PER_TOKEN: tl.constexpr, BC_PRE: tl.constexpr, SPLIT: tl.constexpr,
                  X_EXACT: tl.constexpr, DOTS: tl.constexpr):
    """State columns c·BLOCK_NC .. of one program: on a flush row the history folded into the checkpoint chunk
    (stored), then the chunk's per-token dots S·C_s (and B·C_s unless the pre-kernel made them); the window's B
    chunk goes to the ring. Returns (SC, bc_h, bc_w).  ``DOTS`` False (the stream read): the fold and its
    store only (the row's dots and its B ring entries were made by the stream read, which every live row takes)."""
    offs_n = c * BLOCK_NC + tl.arange(0, BLOCK_NC)
    mask_n = offs_n < N
    st_ptrs = st_base + offs_m[:, None] * s_st_p + offs_n[None, :] * s_st_n
    st_mask = mask_m[:, None] & mask_n[None, :]
    S = tl.load(st_ptrs, mask=st_mask, other=0.0).to(tl.float32)
    if (not PER_TOKEN) and (not BC_PRE) and DOTS:
        C_w = tl.load(C_row + offs_t[:, None] * s_C_t + offs_n[None, :] * s_C_n,
                      mask=mask_t[:, None] & mask_n[None, :], other=0.0).to(tl.float32)  # [TP, NC]
    if DOTS:
        b_mask = mask_t[:, None] & mask_n[None, :]
        if BC_PRE:
            b_mask = b_mask & write_B
        B_w = tl.load(B_row + offs_t[:, None] * s_B_t + offs_n[None, :] * s_B_n, mask=b_mask, other=0.0)  # [TP, NC]
    h_mask = valid_k[:, None] & mask_n[None, :]
    if BC_PRE or (not DOTS):
        h_mask = h_mask & is_flush
    B_h = tl.load(Br_base + phys_k[:, None] * s_Br_r + offs_n[None, :] * s_Br_n,
                  mask=h_mask, other=0.0).to(tl.float32)  # [WH, NC]
    if is_flush:
        if SPLIT:  # x_hist exact in tf32 when the ring is 16-bit: two passes over the split s ⊙ B
            b_hi, b_lo = tf32_split(B_h * s_hist[:, None])
            if X_EXACT:
                S = split_dot(x_hist, b_hi, b_lo, decay_end * S, tl.bfloat16)
            else:
                S = split_dot(x_hist, b_hi, b_lo, decay_end * S, tl.float32)
        else:
            S = decay_end * S + tl.dot(x_hist, B_h * s_hist[:, None], input_precision=DOT_PRECISION)
        if wp > 0:
            tl.store(st_ptrs, S.to(st_base.dtype.element_ty), mask=st_mask)
    if DOTS:
        if PER_TOKEN or BC_PRE:
            B_wf = B_w.to(tl.float32)
            for t in tl.static_range(TP):
                col = (offs_t == t)[None, :]
                C_t = tl.load(C_row + t * s_C_t + offs_n * s_C_n, mask=mask_n & (t < T), other=0.0).to(tl.float32)
                SC = _add_token_dot(SC, S, C_t, col)
                if not BC_PRE:  # the group-shared dots, unless the pre-kernel made them
                    bc_w = _add_token_dot(bc_w, B_wf, C_t, col)
                    if no_flush:
                        bc_h = _add_token_dot(bc_h, B_h, C_t, col)
        else:
            B_wf = B_w.to(tl.float32)
            if no_flush:
                bc_h += tl.sum(B_h[:, None, :] * C_w[None, :, :], 2)
            SC += tl.sum(S[:, None, :] * C_w[None, :, :], 2)
            bc_w += tl.sum(B_wf[:, None, :] * C_w[None, :, :], 2)
        if write_B:
            tl.store(Br_base + phys_t[:, None] * s_Br_r + offs_n[None, :] * s_Br_n,
                     B_w.to(Br_base.dtype.element_ty), mask=mask_t[:, None] & mask_n[None, :])
    return SC, bc_h, bc_w


def verify_geometry_key(H: int, P: int, N: int, G: int, R: int, T: int) -> str:
    return f"H{H}_P{P}_N{N}_G{G}_R{R}_T{T}"


@triton.jit
def _mamba2_verify_kernel(
    state_ptr, xr_ptr, Br_ptr, dtr_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dtb_ptr, out_ptr,
    slot_ptr, wp_ptr, org_ptr, fl_ptr, bc_ptr, par_ptr, rc_ptr,
    null_slot, P, N, R, T, heads_per_group,
    s_st_s, s_st_h, s_st_p, s_st_n,
    s_xr_s, s_xr_h, s_xr_r, s_xr_p,
    s_Br_s, s_Br_g, s_Br_r, s_Br_n,
    s_dtr_s, s_dtr_h, s_dtr_r,
    s_x_b, s_x_t, s_x_h, s_x_p,
    s_dt_b, s_dt_t, s_dt_h,
    s_A_h,
    s_B_b, s_B_t, s_B_g, s_B_n,
    s_C_b, s_C_t, s_C_g, s_C_n,
    s_D_h, s_D_p,
    s_z_b, s_z_t, s_z_h, s_z_p,
    s_dtb_h,
    s_o_b, s_o_t, s_o_h, s_o_p,
    s_bc_b, s_bc_g,
    s_par_b, s_par_t,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_NC: tl.constexpr, N_CHUNKS: tl.constexpr, WH: tl.constexpr, TP: tl.constexpr,
    PER_TOKEN: tl.constexpr, BC_PRE: tl.constexpr, STREAM: tl.constexpr, BLOCK_N: tl.constexpr,
    STREAM_CHUNK: tl.constexpr, FLUSH_STAGES: tl.constexpr,
    IS_TREE: tl.constexpr, LOG_TP: tl.constexpr, NF_MMA: tl.constexpr,
    FLUSH_SPLIT: tl.constexpr, X_EXACT: tl.constexpr, ROW_CUR: tl.constexpr, PDL: tl.constexpr,
):
    pdl_wait(PDL)  # PDL: launched as the B·C pre-kernel's dependent
    pid_m = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    g = h // heads_per_group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < P
    offs_t = tl.arange(0, TP)
    mask_t = offs_t < T
    offs_k = tl.arange(0, WH)
    # what the row alone indexes (window, B·C, A, D, z), issued before the slot is known
    A = tl.load(A_ptr + h * s_A_h).to(tl.float32)
    if HAS_DT_BIAS:
        dtb = tl.load(dtb_ptr + h * s_dtb_h)
    else:
        dtb = 0.0
    dt_win = tl.load(dt_ptr + row * s_dt_b + offs_t * s_dt_t + h * s_dt_h, mask=mask_t, other=0.0)
    x_win_raw = tl.load(x_ptr + row * s_x_b + h * s_x_h + offs_m[:, None] * s_x_p + offs_t[None, :] * s_x_t,
                        mask=mask_m[:, None] & mask_t[None, :], other=0.0)  # [BLOCK_M, TP]
    if HAS_D:
        Dv_raw = tl.load(D_ptr + h * s_D_h + offs_m * s_D_p, mask=mask_m, other=0.0)
    if HAS_Z:
        z_raw = tl.load(z_ptr + row * s_z_b + h * s_z_h + offs_m[:, None] * s_z_p + offs_t[None, :] * s_z_t,
                        mask=mask_m[:, None] & mask_t[None, :], other=0.0)
    if BC_PRE:  # (a padded row's entry was never written: read, unused, its outputs masked off)
        bc_base = bc_ptr + row * s_bc_b + g * s_bc_g
        bc_h = tl.load(bc_base + offs_k[:, None] * TP + offs_t[None, :])
        bc_w = tl.load(bc_base + (WH + offs_t)[:, None] * TP + offs_t[None, :])
    if IS_TREE:
        anc = _tree_ancestor_mask(par_ptr + row * s_par_b, s_par_t, T, TP, LOG_TP) > 0.5  # [m, s]: m on root..s
    # no early return: the compiler would sink the loads above into the live branch, behind the slot's wait.
    # A padded or null row runs with every load and store masked off by `live`.
    if ROW_CUR:  # the row's slot and cursors, copied per row by the pre-kernel: one round trip
        slot = tl.load(rc_ptr + row * 4).to(tl.int64)
        wp = tl.load(rc_ptr + row * 4 + 1)
        org = tl.load(rc_ptr + row * 4 + 2)
        flag = tl.load(rc_ptr + row * 4 + 3)
        live = (slot >= 0) & (slot != null_slot)
    else:  # no pre-kernel (bc inline, or a batch within inline_bc_max_batch): the slot, then its cursors
        slot = tl.load(slot_ptr + row).to(tl.int64)
        live = (slot >= 0) & (slot != null_slot)
        wp = tl.load(wp_ptr + slot, mask=live, other=0).to(tl.int32)
        org = tl.load(org_ptr + slot, mask=live, other=0).to(tl.int32)
        flag = tl.load(fl_ptr + slot, mask=live, other=0)
    is_flush = live & (flag != 0)
    no_flush = live & (flag == 0)
    wp = tl.minimum(tl.maximum(wp, 0), R - T)  # memory safety only (the commit rule keeps wp + T <= R)
    org = tl.minimum(tl.maximum(org, 0), R - 1)

    valid_k = offs_k < wp
    # org + k < 2R on every lane a mask lets through (k < wp <= R - T; t < T): one conditional subtract
    pk = org + offs_k
    pt = org + wp + offs_t
    phys_k = tl.where(pk >= R, pk - R, pk).to(tl.int64)
    phys_t = tl.where(pt >= R, pt - R, pt).to(tl.int64)
    valid_k = valid_k & live

    # ---- history: Δ_k, x_k (issued with the state tile's loads below; converted and weighted after the dots) ----
    xr_base = xr_ptr + slot * s_xr_s + h * s_xr_h
    dtr_base = dtr_ptr + slot * s_dtr_s + h * s_dtr_h
    Br_base = Br_ptr + slot * s_Br_s + g * s_Br_g
    st_base = state_ptr + slot * s_st_s + h * s_st_h
    d_hist = tl.load(dtr_base + phys_k * s_dtr_r, mask=valid_k, other=0.0).to(tl.float32)
    x_hist_raw = tl.load(xr_base + offs_m[:, None] * s_xr_p + phys_k[None, :] * s_xr_r,
                         mask=mask_m[:, None] & valid_k[None, :], other=0.0)

    # ---- S_ck·C_s (every row with the stream read), B_k·C_s, B_m·C_s; the N-chunk fold on flush rows ----
    SC = tl.zeros([BLOCK_M, TP], dtype=tl.float32)
    if not BC_PRE:
        bc_h = tl.zeros([WH, TP], dtype=tl.float32)
        bc_w = tl.zeros([TP, TP], dtype=tl.float32)  # [m, s]
    write_B = (pid_m == 0) & (h % heads_per_group == 0)
    B_row = B_ptr + row * s_B_b + g * s_B_g
    C_row = C_ptr + row * s_C_b + g * s_C_g
    if STREAM:
        # every live row: one streaming read of the whole [BLOCK_M, N] S_ck tile, in column chunks of STREAM_CHUNK
        # summed element-wise per token (all loads issued together, as the decode kernel does). A flush row's
        # outputs replay its history on S_ck as a verify row's do; its N-chunk loop below only folds and stores
        run_chunks = is_flush
        if no_flush | is_flush:
            offs_nf = tl.arange(0, BLOCK_N)
            mask_nf = offs_nf < N
            bf_mask = mask_t[:, None] & mask_nf[None, :]
            if BC_PRE:
                bf_mask = bf_mask & write_B
            B_wn = tl.load(B_row + offs_t[:, None] * s_B_t + offs_nf[None, :] * s_B_n, mask=bf_mask, other=0.0)
            if not BC_PRE:
                B_hn = tl.load(Br_base + phys_k[:, None] * s_Br_r + offs_nf[None, :] * s_Br_n,
                               mask=valid_k[:, None] & mask_nf[None, :], other=0.0).to(tl.float32)
                B_wnf = B_wn.to(tl.float32)
            if NF_MMA:  # S_ck [BLOCK_M, N] x C^T [N, TP] on the tensor cores, fp32-accurate (split_dot)
                S_t = tl.load(st_base + offs_m[:, None] * s_st_p + offs_nf[None, :] * s_st_n,
                              mask=mask_m[:, None] & mask_nf[None, :], other=0.0).to(tl.float32)
                C_w = tl.load(C_row + offs_nf[:, None] * s_C_n + offs_t[None, :] * s_C_t,
                              mask=mask_nf[:, None] & mask_t[None, :], other=0.0).to(tl.float32)
                c_hi, c_lo = tf32_split(C_w)
                SC = split_dot(S_t, c_hi, c_lo, SC, state_ptr.dtype.element_ty)
            for t in tl.static_range(TP):
                col = (offs_t == t)[None, :]
                if not BC_PRE:
                    C_t = tl.load(C_row + t * s_C_t + offs_nf * s_C_n, mask=mask_nf & (t < T),
                                  other=0.0).to(tl.float32)
                if not NF_MMA:
                    SC = _add_token_dot_chunked(SC, st_base, s_st_p, s_st_n, offs_m, mask_m, N, C_row + t * s_C_t,
                                                s_C_n, t < T, col, BLOCK_N, STREAM_CHUNK)
                if not BC_PRE:
                    bc_w = _add_token_dot(bc_w, B_wnf, C_t, col)
                    bc_h = _add_token_dot(bc_h, B_hn, C_t, col)
            if write_B:
                tl.store(Br_base + phys_t[:, None] * s_Br_r + offs_nf[None, :] * s_Br_n,
                         B_wn.to(Br_ptr.dtype.element_ty), mask=mask_t[:, None] & mask_nf[None, :])
    else:
        run_chunks = live  # every row, N chunk by N chunk, a flush row's dots from its folded chunks
    # the window's and the history's weights, off the loads' critical path:
    # ---- window: Δ_s, μ_s (chain: prefix sums; tree: sums over the path root..s), x_s ----
    d_win = tl.where(mask_t, _delta_from_raw(dt_win, dtb, HAS_DT_BIAS, DT_SOFTPLUS), 0.0)
    if IS_TREE:
        mu = tl.sum(tl.where(anc & mask_t[:, None], d_win[:, None], 0.0), 0)
    else:
        mu = tl.cumsum(d_win, 0)
    x_win = x_win_raw.to(tl.float32)
    lam_end = tl.sum(d_hist, 0)
    x_hist = x_hist_raw.to(tl.float32)  # [BLOCK_M, WH]
    # fold weights Δ_k e^{A(Λ − Λ_k)}, Λ − Λ_k summed directly (no prefix-sum difference: see suffix_sum_excl)
    s_hist = tl.where(valid_k, d_hist * tl.exp(A * suffix_sum_excl(d_hist, offs_k)), 0.0)
    decay_end = tl.exp(A * lam_end)
    if run_chunks:  # a runtime loop (one chunk's registers live at a time), software-pipelined FLUSH_STAGES deep
        if STREAM:  # the stream read of S_ck must be done in every warp before any warp stores the fold over it
            tl.debug_barrier()
        for c in tl.range(0, N_CHUNKS, num_stages=FLUSH_STAGES):
            SC, bc_h, bc_w = _verify_chunk(
                c, SC, bc_h, bc_w, st_base, s_st_p, s_st_n, offs_m, mask_m, N, C_row, s_C_t, s_C_n, offs_t, mask_t,
                T, B_row, s_B_t, s_B_n, write_B, Br_base, s_Br_r, s_Br_n, phys_k, valid_k, phys_t, is_flush,
                no_flush, wp, decay_end, x_hist, s_hist, DOT_PRECISION, BLOCK_NC, TP, PER_TOKEN, BC_PRE, FLUSH_SPLIT,
                X_EXACT, not STREAM)

    # ---- outputs ----
    # μ_s − μ_m [m, s], summed directly over the Δ between (nothing subtracted: no cancellation)
    if IS_TREE:
        causal = anc & mask_t[:, None]  # [m, s]: m on the path root..s
        # the Δ of the nodes i > m on s's path ([m, i, s], summed over i)
        between = tl.sum(tl.where((offs_t[None, :, None] > offs_t[:, None, None]) & anc[None, :, :],
                                  d_win[None, :, None], 0.0), 1)
    else:
        causal = (offs_t[:, None] <= offs_t[None, :]) & mask_t[:, None]  # [m, s]: m <= s
        # Σ_{m<i<=s} Δ_i: a masked [m, s, i] sum rather than a 2-D cumsum (Triton 3.6 fails to lower small 2-D
        # scans in some layouts)
        between_i = (offs_t[None, None, :] > offs_t[:, None, None]) & (offs_t[None, None, :] <= offs_t[None, :, None])
        between = tl.sum(tl.where(between_i, d_win[None, None, :], 0.0), 2)
    expo = tl.where(causal, A * between, 0.0)
    w_w = tl.where(causal, d_win[:, None] * tl.exp(expo) * bc_w, 0.0)  # [m, s]
    if STREAM:  # every row: S_ck's dots and the history replayed (a flush row's fold only stores)
        y = SC * tl.exp(A * (lam_end + mu))[None, :]
        hist_rows = no_flush | is_flush
    else:
        if is_flush:
            y = SC * tl.exp(A * mu)[None, :]          # S_c is the new checkpoint, no history left
        else:
            y = SC * tl.exp(A * (lam_end + mu))[None, :]
        hist_rows = no_flush
    if PER_TOKEN:
        e_mu = tl.exp(A * mu)
        for t in tl.static_range(TP):
            sel = offs_t == t
            w_t = tl.sum(tl.where(sel[None, :], w_w, 0.0), 1)                       # [m]
            y_t = tl.sum(x_win * w_t[None, :], 1)
            if hist_rows:
                bc_t = tl.sum(tl.where(sel[None, :], bc_h, 0.0), 1)                 # [k]
                wh_t = s_hist * bc_t * tl.sum(tl.where(sel, e_mu, 0.0), 0)
                y_t += tl.sum(x_hist * wh_t[None, :], 1)
            y += tl.where(sel[None, :], y_t[:, None], 0.0)
    else:
        if hist_rows:
            w_h = s_hist[:, None] * tl.exp(A * mu)[None, :] * bc_h
            y += tl.sum(x_hist[:, :, None] * w_h[None, :, :], 1)
        y += tl.sum(x_win[:, :, None] * w_w[None, :, :], 1)
    if HAS_D:
        y += Dv_raw.to(tl.float32)[:, None] * x_win
    if HAS_Z:
        zv = z_raw.to(tl.float32)
        y *= zv * tl.sigmoid(zv)
    om = mask_m[:, None] & mask_t[None, :] & live
    tl.store(out_ptr + row * s_o_b + h * s_o_h + offs_m[:, None] * s_o_p + offs_t[None, :] * s_o_t,
             y.to(out_ptr.dtype.element_ty), mask=om)

    # ---- window into the ring at logical wp .. wp+T-1 ----
    tl.store(xr_base + offs_m[:, None] * s_xr_p + phys_t[None, :] * s_xr_r,
             x_win.to(xr_ptr.dtype.element_ty), mask=om)
    if pid_m == 0:
        tl.store(dtr_base + phys_t * s_dtr_r, d_win.to(dtr_ptr.dtype.element_ty), mask=mask_t & live)


def _err(msg: str):
    raise ValueError(f"mamba2_verify: {msg}")


def _check_shape(name, t, shape):
    if tuple(t.shape) != tuple(shape):
        _err(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def mamba2_verify(
    state, x_ring, B_ring, dt_ring,
    x, dt, A, B, C,
    state_indices, wp, origin, flush,
    *, D=None, z=None, dt_bias=None, dt_softplus=True, out=None, null_slot=0, parents=None,
):
    """Verify a window of T tokens per row (see the module docstring).

    state [S, H, P, N]; x_ring [S, H, R, P], B_ring [S, G, R, N], dt_ring [S, H, R] fp32;
    x [batch, T, H, P]; dt [batch, T, H] (or [batch, T, H, P] tied over P); A [H] or
    [H, P, N] tied; B, C [batch, T, G, N]; D [H] or [H, P]; z [batch, T, H, P];
    dt_bias [H] or [H, P] tied; state_indices [batch]; wp, origin, flush [S] (slot
    cursors); ``parents`` int32/int64 [batch, T] makes the window a tree (see
    :func:`mamba2_tree_verify`).  Returns ``out`` [batch, T, H, P].  No host sync.
    """
    named = dict(state=state, x_ring=x_ring, B_ring=B_ring, dt_ring=dt_ring, x=x, dt=dt, A=A, B=B, C=C,
                 state_indices=state_indices, wp=wp, origin=origin, flush=flush, D=D, z=z, dt_bias=dt_bias,
                 out=out)
    for name, t in named.items():
        if t is not None and not isinstance(t, torch.Tensor):
            _err(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dev = state.device
    for name, t in named.items():
        if t is not None and t.device != dev:
            _err(f"{name} is on {t.device} but state is on {dev}")
    if state.dim() != 4:
        _err(f"state must be [S, H, P, N], got shape {tuple(state.shape)}")
    S_slots, H, P, N = state.shape
    if x.dim() != 4:
        _err(f"x must be [batch, T, H, P], got shape {tuple(x.shape)}")
    batch, T = x.shape[0], x.shape[1]
    _check_shape("x", x, (batch, T, H, P))
    if T < 1:
        _err("the window T = x.shape[1] must be >= 1")
    if x_ring.dim() != 4:
        _err(f"x_ring must be [S, H, R, P], got shape {tuple(x_ring.shape)}")
    R = x_ring.shape[2]
    if R < 2 * T:
        _err(f"ring length R = x_ring.shape[2] = {R} must be >= 2T = {2 * T} (history block >= window)")
    _check_shape("x_ring", x_ring, (S_slots, H, R, P))
    if B.dim() != 4:
        _err(f"B must be [batch, T, G, N], got shape {tuple(B.shape)}")
    G = B.shape[2]
    if G < 1 or H % G:
        _err(f"number of heads H={H} must be a multiple of the number of groups G={G}")
    _check_shape("B", B, (batch, T, G, N))
    _check_shape("C", C, (batch, T, G, N))
    _check_shape("B_ring", B_ring, (S_slots, G, R, N))
    _check_shape("dt_ring", dt_ring, (S_slots, H, R))
    if dt_ring.dtype != torch.float32:
        _err(f"dt_ring must be float32 (processed Δ), got {dt_ring.dtype}")
    for name in ("state", "x_ring", "B_ring", "x", "dt", "A", "B", "C"):
        if named[name].dtype not in _FLOAT_DTYPES:
            _err(f"{name} must be float32/bfloat16/float16, got {named[name].dtype}")
    if dt.dim() == 3:
        _check_shape("dt", dt, (batch, T, H))
    elif dt.dim() == 4:
        _check_shape("dt", dt, (batch, T, H, P))
        if P > 1 and dt.stride(3) != 0:
            _err(f"dt [batch, T, H, P] must be tied over P (stride 0 over P), got strides {dt.stride()}")
    else:
        _err(f"dt must be [batch, T, H] or [batch, T, H, P], got shape {tuple(dt.shape)}")
    try:
        s_A_h, _ = _head_param("A", A, H, P, N)
        s_dtb_h = _head_param("dt_bias", dt_bias, H, P)[0] if dt_bias is not None else 0
        s_D_h, s_D_p = _head_param("D", D, H, P, tie=False) if D is not None else (0, 0)
    except ValueError as e:
        _err(str(e).split(": ", 1)[-1])
    for name in ("dt_bias", "D", "z"):
        t = named[name]
        if t is not None and t.dtype not in _FLOAT_DTYPES:
            _err(f"{name} must be float32/bfloat16/float16, got {t.dtype}")
    if z is not None:
        _check_shape("z", z, (batch, T, H, P))
    _check_shape("state_indices", state_indices, (batch,))
    for name in ("state_indices", "wp", "origin", "flush"):
        if named[name].dtype not in _INT_DTYPES:
            _err(f"{name} must be int32 or int64, got {named[name].dtype}")
    for name in ("wp", "origin", "flush"):
        _check_shape(name, named[name], (S_slots,))
    # the kernels read row r and slot s at ptr + r / ptr + s: strided views are copied (a no-op when contiguous)
    state_indices, wp, origin, flush = (t.contiguous() for t in (state_indices, wp, origin, flush))
    if out is None:
        out = torch.empty_like(x)
    else:
        _check_shape("out", out, (batch, T, H, P))
        if out.dtype not in _FLOAT_DTYPES:
            _err(f"out must be float32/bfloat16/float16, got {out.dtype}")
    if parents is not None:
        check_parents_arg("mamba2_verify", parents, batch, T, dev)
    if batch == 0:
        return out

    keys = config_keys(verify_geometry_key(H, P, N, G, R, T), state.dtype)
    cfg = launch_config("mamba2_verify", keys)  # entries checked against the registration above
    BLOCK_M, BLOCK_NC = cfg["BLOCK_M"], cfg["BLOCK_NC"]
    BLOCK_NC = min(BLOCK_NC, max(16, next_pow2(N)))
    WH = max(16, next_pow2(R - T))
    TP = max(2, next_pow2(T))
    dz = z.stride() if z is not None else (0, 0, 0, 0)
    n_chunks = triton.cdiv(N, BLOCK_NC)
    bc_pre = cfg["bc"] == "pre" and batch > cfg["inline_bc_max_batch"]  # host-side: one CUDA graph per batch size
    stream = cfg["nonflush"] in ("stream", "mma")
    rc = state_indices  # never read without the pre-kernel
    pdl = bc_pre and pdl_on(cfg["pdl"], dev)  # only behind the pre-kernel
    if bc_pre:  # per-call scratch (inside a CUDA graph it comes from the graph's pool)
        bc = torch.empty((batch, G, WH + TP, TP), dtype=torch.float32, device=dev)
        rc = torch.empty((batch, 4), dtype=torch.int32, device=dev)  # each row's slot and cursors
        _mamba2_verify_bc_kernel[(batch, G)](
            B_ring, B, C, state_indices, wp, origin, flush, bc, rc,
            -1 if null_slot is None else int(null_slot), N, R, T,
            *B_ring.stride(), *B.stride(), *C.stride(), bc.stride(0), bc.stride(1),
            BLOCK_NC=BLOCK_NC, N_CHUNKS=n_chunks, WH=WH, TP=TP, HIST_ALL=stream, PDL=pdl,
            num_warps=int(cfg["bc_num_warps"]), num_stages=1,
        )
    else:
        bc = out  # never read
    grid = (triton.cdiv(P, BLOCK_M), batch, H)
    _mamba2_verify_kernel[grid](
        state, x_ring, B_ring, dt_ring,
        x, dt, A, B, C,
        D if D is not None else x, z if z is not None else x, dt_bias if dt_bias is not None else dt,
        out, state_indices, wp, origin, flush, bc, parents if parents is not None else state_indices, rc,
        -1 if null_slot is None else int(null_slot), P, N, R, T, H // G,
        *state.stride(), *x_ring.stride(), *B_ring.stride(), *dt_ring.stride(),
        *x.stride(), dt.stride(0), dt.stride(1), dt.stride(2), s_A_h,
        *B.stride(), *C.stride(),
        s_D_h, s_D_p, *dz, s_dtb_h, *out.stride(),
        bc.stride(0) if bc_pre else 0, bc.stride(1) if bc_pre else 0,
        *(parents.stride() if parents is not None else (0, 0)),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=bool(dt_softplus), DOT_PRECISION=cfg["dot_precision"],
        BLOCK_M=BLOCK_M, BLOCK_NC=BLOCK_NC, N_CHUNKS=n_chunks, WH=WH, TP=TP,
        PER_TOKEN=cfg["reduce"] == "token", BC_PRE=bc_pre,
        STREAM=stream, BLOCK_N=max(16, next_pow2(N)), NF_MMA=cfg["nonflush"] == "mma",
        STREAM_CHUNK=min(cfg["stream_chunk"], max(16, next_pow2(N))) if cfg["nonflush"] == "stream" else 0,
        FLUSH_STAGES=int(cfg["flush_stages"]),
        IS_TREE=parents is not None, LOG_TP=TP.bit_length() - 1,
        FLUSH_SPLIT=bool(cfg["flush_split"]), X_EXACT=x_ring.dtype in (torch.bfloat16, torch.float16),
        ROW_CUR=bc_pre, PDL=pdl,
        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), **register_cap(cfg), **pdl_launch(pdl),
    )
    return out


def mamba2_tree_verify(
    state, x_ring, B_ring, dt_ring,
    x, dt, A, B, C,
    state_indices, wp, origin, flush, parents,
    *, D=None, z=None, dt_bias=None, dt_softplus=True, out=None, null_slot=0,
):
    """Verify a tree of T draft nodes per row: :func:`mamba2_verify` with ``parents`` int32/int64
    [batch, T] (``parents[b, 0] = -1``, ``parents[b, s]`` in ``[0, s)``: out-of-range values are the
    caller's bug, read as the root in-kernel for memory safety).  Returns ``out`` [batch, T, H, P].  No host sync."""
    if parents is None:
        raise ValueError("mamba2_tree_verify: parents must be a torch.Tensor, got NoneType")
    try:
        return mamba2_verify(state, x_ring, B_ring, dt_ring, x, dt, A, B, C, state_indices, wp, origin, flush,
                             D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus, out=out, null_slot=null_slot,
                             parents=parents)
    except ValueError as e:
        raise ValueError(str(e).replace("mamba2_verify:", "mamba2_tree_verify:", 1)) from None
