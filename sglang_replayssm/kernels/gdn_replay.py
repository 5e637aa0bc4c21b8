"""Gated DeltaNet (GDN) ReplaySSM decode: Triton kernels and wrapper.

Per live decode row (slot s, ring fill w = write_pos, buffer length L), per value head:

    S_{w-1} x = e^G (S_ck x) + sum_{j<w} e^{G-G_j} (k^_j . x) d_j        x in {q^, k^}
    d_w       = beta (v - alpha S_{w-1} k^)
    o         = alpha (S_{w-1} q^) + d_w (k^ . q^)
    w <  L-1 : append (d_w, raw k_w, g_w) at ring position w; S_ck untouched
    w == L-1 : S_ck <- alpha S_{w-1} + d_w k^^T   (flush, no append)

(G_j: inclusive prefix of the cached log-decays g, G = G_{w-1}; k^_j re-normalised
from the raw cached k_j.)  L = 1 is the stock packed decode on every step.

Routes
------
*Output-only replay (every step).*  The output never builds the V x K state: one
streaming pass over the S_ck tile gives (S_ck q^, S_ck k^); the history adds, per
cached position, the coefficients c_j (k^_j . q^) and c_j (k^_j . k^) and a weighted
sum of the w cached d vectors. All element-wise fp32 (no tensor cores, no TF32
drift); flush and non-flush rows produce their outputs with the same arithmetic.

*Flush (w == L-1, a per-row runtime branch: CUDA-graph safe).*  The S_ck tile is
still in registers from the output pass, so nothing is re-read: the kernel adds
sum_j c_j d_j k^_j^T to e^G S_ck and stores alpha S_{w-1} + d_w k^^T. ``flush=rank1``
(default) does that as L-1 exact fp32 rank-1 updates on CUDA cores; ``flush=dot`` as one
``tl.dot`` [BV, LP] x [LP, K]
with ``dot_precision`` "tf32x3" or "ieee" (plain "tf32" is refused: it drifts ~1e-2;
measured 6e-4 vs 2e-7 for tf32x3 on a flushed Qwen3-Next state).

``cast`` (launch option) rounds the 16-bit stores (out, d, state) either with
``_cast_rtne``'s bit arithmetic (``bits``, default; what the interpreter always uses) or
with the GPU's own conversion (``cvt``: cvt.rn, the same bits; offline, a bf16 state's
flush branch loses ~300 of its SASS instructions per warp and the kernel drops from 255
to 168 registers).

Launches and tiles
------------------
``scores=pre`` (default): a small pre-kernel, grid (batch, Hk), computes per (row,
k-head) (k^_j . q^, k^_j . k^, 1/|k_j|) for j < w into a per-call fp32 scratch
[batch, Hk, 3, LP] (LP = max(16, next_pow2(L-1))); the decode kernel then never
holds the [LP, K] key tile (``scores=inline`` computes the same per program; with ``scores=pre``,
batches of at most ``inline_scores_max_batch`` rows do too, in one launch).
Decode grid ``(cdiv(V, BV), batch, HV)``: each program owns one tile of BV value rows
x the whole K row of one (row, v-head).

``BKC`` > 0 (launch option) runs ``_gdn_replay_decode_kchunk_kernel`` instead: the same
math and writes, the tile streamed in K chunks of BKC columns (the output pass sums
S_ck q^ and S_ck k^ chunk by chunk; a flush row reads its tile a second time, from L2,
and stores the new checkpoint chunk by chunk), so the registers no longer hold a
[BV, K] tile and a larger BV fits (offline sm_90a, BV 32 x BKC 32: 168 registers, no
spills, about a third of the whole-tile kernel's issue bound;
eval/results/gdn-decode-sass-offline-kchunk.md). On the H200 BV 32 x BKC 32 with the tensor-core
flush is the fastest at batch 32 and above (eval/results/kernel-variants-h200/README.md); the H200
file runs it for an fp32 state.

Per decode program and step it reads: the S_ck tile (BV*K state-dtype elements), the
d slice of the w cached positions (BV*w, state dtype), the w cached g (fp32), the
scores (3*LP fp32), q, k (K each), the v slice and four gate scalars; it writes the
out slice, and then either (non-flush) d_w's slice + g_w (one program per (row,
v-head)) + raw k_w (one program per (row, k-head)), or (flush) the state tile.
Rows whose slot is < 0 or == null_slot write nothing at all (no out, state or ring).
DRAM bytes per (row, v-head) at Qwen3-Next with an fp32 state: non-flush 64 KiB of
S_ck + 0.5*w KiB of d + (0.25*w KiB of raw k per k-head, i.e. /2 per v-head);
flush: + a 64 KiB write. Stock decode: 128 KiB every step.

Timings against SGLang's stock and upstream kernels, and the offline SASS of the packaged
configs, are in eval/results (kernels-h200.md, kernel-variants-h200/, gdn-decode-sass-offline-*.md):
a flush step moves twice the DRAM bytes of a non-flush one and issues more instructions, so the
cycle is amortised over L steps.

Why this ring (d in the state dtype + raw k in the activation dtype + g fp32)
---------------------------------------------------------------------------
Qwen3-Next geometry (per TP rank) HV=32, Hk=16, K=V=128, L=16, bf16 activations,
fp32 state (2 MiB per slot per layer):

* Bytes. Our ring: d 32*16*128*4 = 256 KiB + k 16*16*128*2 = 64 KiB + g 2 KiB
  = 322 KiB per slot (+15.7 %). A raw (k, v, g, beta) ring: k 64 + v (bf16) 128
  + g 2 + beta 2 = 196 KiB (+9.6 %). Per decode step and v-head at the fullest fill
  (w = 15) a step reads 64 KiB of S_ck plus 7.5 KiB of d (ours) vs 3.75 KiB of v
  (raw), plus 1.9 KiB of k either way (shared by 2 v-heads): the raw ring would save
  <= 3.75 KiB of a ~73 KiB step (~5 %, ~2.6 % averaged over the cycle), and appends
  256 B of v instead of 512 B of d. With a bf16/fp16 state d is 2 bytes like v: no
  byte difference at all.
* Compute. A raw ring cannot be replayed by a rank-1 sum: every d_j depends on
  S_{j-1}, so each step would redo the chain: S_ck k^_j for all w cached keys (w+2
  mat-vecs over the streamed state instead of 2: ~8.5 flop/byte at w=15, past the
  fp32 CUDA-core roofline of an H200, ~14 flop/byte, once tf32x3's 3 passes or fp32
  FMAs are counted) plus a w x w triangular (UT) solve, on every step.
* Accuracy. With d cached at state precision the replay is an exact re-association
  of the sequential recurrence. Measured with :mod:`gdn_ref` (Qwen3-Next geometry,
  batch 4, 33 steps, fp32 state, bf16 activations, random realistic gates) against
  an fp64 sequential oracle: max output error 1.5e-7 (|o| <= 0.34), flushed state
  6.6e-7 (|S| <= 3.4). The same run with d rounded to bf16 (an activation-dtype d
  ring): output 2.4e-4, state 2.9e-3, and that error is folded into S_ck at every
  flush. A raw ring's UT solve in fp32 orders the arithmetic differently from the
  recurrence (a ~1e-3 gap is reported for the spec-window UT kernels). Raw k costs
  nothing in accuracy: it is exactly the kernel input, re-normalised on read with the
  same fp32 formula as the current step.
  So d in the state dtype buys fp32-exact replay for +126 KiB per slot (fp32 state).

Launch parameters come from ``common.launch_config("gdn_decode", key, ...)`` with key
``HV{HV}_HK{Hk}_K{K}_V{V}_L{L}`` (a ``..._S{fp32|bf16|fp16}`` entry for the state dtype wins). A speculative-verify kernel can reuse the history
helpers (``_history_weights``, ``_normalise_rows``, ``_history_coeffs``,
``_replay_apply``, ``_replay_state_rank1``) and the score pre-kernel's layout: they
replay a checkpoint plus a cached history for arbitrary query vectors.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

from .common import L2NORM_EPS, SOFTPLUS_THRESHOLD, interpreting, launch_config, next_pow2, softplus, suffix_sum_excl
from .common import flag_param, flush_first_rank_row, flush_first_row, write_flush_first_rank
from .common import pdl_launch, pdl_on, pdl_trigger, pdl_wait
from .common import FLOAT_DTYPES as _FLOAT_DTYPES, register_cap, register_family
from .common import block_param, choice_param, count_param, dot_precision_param, maxnreg_param, warps_param

__all__ = ["gdn_replay_decode", "gdn_launch_params", "GDN_DEFAULT_LAUNCH", "GDN_LAUNCH_CHOICES"]

_FLUSH_MODES = ("rank1", "dot")
_SCORE_MODES = ("inline", "pre")
_CAST_MODES = ("bits", "cvt")
# where a decode program of a pdl launch waits for its pre-kernel (launch option ``pdl_wait``): first thing, or just
# before it reads what the pre-kernel wrote
_PDL_WAITS = ("start", "scores")
# Built-in launch parameters: the fastest measured on the H200 for any geometry (eval/results/kernel-variants-h200/);
# per-GPU files override them per geometry (h200.yaml: the K-chunked tile for an fp32 state, cvt + BV 32 for bf16).
GDN_DEFAULT_LAUNCH: Dict[str, Any] = register_family("gdn_decode", {
    "BV": block_param(16),  # value rows per V tile
    "num_warps": warps_param(1),
    "num_stages": count_param(1, 1, what=" (software pipelining of the K-chunk loop, BKC > 0)"),
    "maxnreg": maxnreg_param(0),
    # "pre": key scores per (row, k-head) in a small pre-kernel; "inline": per program
    "scores": choice_param("pre", _SCORE_MODES),
    "scores_num_warps": warps_param(1),
    # batches of at most this many rows keep the scores inline with "pre" (one launch instead of two: at
    # batch 1 the pre-kernel's launch costs more than the scores it shares)
    "inline_scores_max_batch": count_param(1),
    # V tile for those small batches (0: BV). A bf16 state wants BV 32 at batch >= 32 but 16 at batch 1
    # (eval/results/kernel-variants-h200/bf16-state/)
    "inline_BV": block_param(0, also=(0,), what=" (0: BV)"),
    # warps per program for those small batches (0: num_warps; eval/results/kernel-variants-h200/kchunk/round2/)
    "inline_num_warps": warps_param(0, zero=True, what=" (0: num_warps)"),
    # K chunk of the checkpoint tile (0: the whole [BV, K] tile in registers). With a chunk the output pass
    # streams the tile and a flush row re-reads it (_gdn_replay_decode_kchunk_kernel); num_stages pipelines the
    # chunk loop
    "BKC": block_param(0, 16, also=(0,), what=" (0: the whole tile)"),
    # K chunk for the small batches of inline_scores_max_batch (-1: BKC; 0: the whole-tile kernel). Batch 1 is
    # fastest on the whole tile (eval/results/kernel-variants-h200/kchunk/)
    "inline_BKC": block_param(-1, 16, also=(-1, 0), what=" (-1: BKC, 0: the whole tile)"),
    # flush rebuild: "rank1" (fp32 CUDA-core FMAs) or "dot" (tensor cores, dot_precision)
    "flush": choice_param("rank1", _FLUSH_MODES),
    "dot_precision": dot_precision_param(),
    # rounding of the 16-bit stores (out, d, state): "bits" (_cast_rtne's bit arithmetic) or "cvt" (the
    # GPU's cvt.rn: the same values, fewer instructions); the interpreter always uses "bits"
    "cast": choice_param("bits", _CAST_MODES),
    # batches of at most this many rows start their flush rows' programs first (0: off). A flush step takes
    # about twice a non-flush one; with only a few waves of programs per launch (batch 32: two to three), those
    # that start last set the launch's end. The grid becomes (V tiles, v-heads, rows) and each program finds its
    # row from the score pre-kernel's flush-first order (common.flush_first_row; only with scores "pre" above
    # inline_scores_max_batch). Off by default; on in the H200 file's Qwen entries (kernel-variants-h200/mixed-order/)
    "flush_first_max_batch": count_param(0),
    # 1: with the pre-kernel, the decode kernel is launched as its programmatic dependent (sm90+): its programs are
    # scheduled while the pre-kernel runs and wait for it (griddepcontrol.wait) before anything else
    "pdl": flag_param(0),
    # where a pdl decode program waits for the pre-kernel: "start" (first thing) or "scores" (after the loads and the
    # output pass over its checkpoint tile, before it reads the pre-kernel's key scores or stores anything; with
    # flush_first_max_batch its row is then found from the write positions in-kernel, not from the pre-kernel's
    # order). "scores" takes its row that way with or without pdl in effect (the CPU interpreter checks that)
    "pdl_wait": choice_param("start", _PDL_WAITS),
})
# the string launch parameters that are speed choices (same results), for eval/tune_kernels.py
GDN_LAUNCH_CHOICES: Dict[str, Tuple[str, ...]] = {"flush": _FLUSH_MODES, "scores": _SCORE_MODES,
                                                  "cast": _CAST_MODES, "pdl_wait": _PDL_WAITS}


# ----------------------------------------------------------------------------------
# jit helpers (shared with a later speculative-verify kernel)
# ----------------------------------------------------------------------------------
@triton.jit
def _cast_rtne(x, dtype: tl.constexpr):
    """x.to(dtype) with round-to-nearest-even also for bf16.

    Triton's CPU interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even),
    so bf16 is rounded here by bit arithmetic; the final cast is then exact on both.
    """
    if dtype == tl.bfloat16:
        xf = x.to(tl.float32)
        bits = xf.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = tl.where(xf != xf, xf, bits.to(tl.float32, bitcast=True))
    return x.to(dtype)


@triton.jit
def _cast_store(x, dtype: tl.constexpr, BITS: tl.constexpr):
    """x.to(dtype) rounded to nearest even for a store: by _cast_rtne's bit arithmetic
    (BITS: launch option ``cast=bits``, and always in the interpreter, which truncates to
    bf16) or by the GPU's own conversion (``cast=cvt``: cvt.rn, the same values; the bit
    arithmetic of a [16, 128] bf16 state tile costs ~300 SASS instructions per warp)."""
    if BITS:
        return _cast_rtne(x, dtype)
    else:
        return x.to(dtype)


@triton.jit
def _gdn_gate(a_val, b_val, A_log_val, dt_bias_val, SOFTPLUS_THRESHOLD: tl.constexpr):
    """(g, beta) of one value head for one token from the loaded scalars; beta is
    rounded to b's dtype like the stock kernel."""
    x = a_val.to(tl.float32) + dt_bias_val.to(tl.float32)
    g = -tl.exp(A_log_val.to(tl.float32)) * softplus(x, SOFTPLUS_THRESHOLD)
    beta = _cast_rtne(tl.sigmoid(b_val.to(tl.float32)), b_val.dtype).to(tl.float32)
    return g, beta


@triton.jit
def _l2norm_vec(x, USE_L2NORM: tl.constexpr, EPS: tl.constexpr):
    if USE_L2NORM:
        x = x / tl.sqrt(tl.sum(x * x) + EPS)
    return x


@triton.jit
def _load_history(g_head, k_head, stride_kl, d_head, stride_dl, o_v, mask_v, n_hist,
                  K: tl.constexpr, LP: tl.constexpr, BK: tl.constexpr):
    """Issue the loads of the cached positions j < n_hist of one (slot, v-head):
    g [LP] fp32, raw k [LP, BK] (its k-head), d slice [BV, LP]; zeros past n_hist."""
    o_j = tl.arange(0, LP)
    o_k = tl.arange(0, BK)
    valid = o_j < n_hist
    g = tl.load(g_head + o_j, mask=valid, other=0.0)
    kr = tl.load(k_head + o_j[:, None] * stride_kl + o_k[None, :], mask=valid[:, None] & (o_k < K)[None, :],
                 other=0)
    d = tl.load(d_head + o_j[None, :] * stride_dl + o_v[:, None], mask=mask_v[:, None] & valid[None, :], other=0)
    return g, kr, d


@triton.jit
def _history_weights(g, n_hist, LP: tl.constexpr):
    """Replay weights from the cached log-decays g [LP] (zeros past n_hist):
    c_j = e^{G - G_j} (0 for j >= n_hist) and e^G. The exponents are exclusive suffix sums
    sum_{i>j} g_i summed directly (``suffix_sum_excl``): neither two prefix sums nor an
    inclusive suffix sum and g_j are subtracted, which would cancel after a large gate."""
    o_j = tl.arange(0, LP)
    g = g.to(tl.float32)
    c = tl.where(o_j < n_hist, tl.exp(suffix_sum_excl(g, o_j)), 0.0)
    eG = tl.exp(tl.sum(g, axis=0))
    return c, eG


@triton.jit
def _normalise_rows(kr, USE_L2NORM: tl.constexpr, EPS: tl.constexpr):
    """Raw cached keys [LP, BK] -> k^ rows in fp32 (same formula as the current k)."""
    kr = kr.to(tl.float32)
    if USE_L2NORM:
        kr = kr / tl.sqrt(tl.sum(kr * kr, axis=1) + EPS)[:, None]
    return kr


@triton.jit
def _history_coeffs(k_hist, c, x):
    """Per cached position j: c_j (k^_j . x) [LP]; k_hist [LP, BK] normalised."""
    return c * tl.sum(k_hist * x[None, :], axis=1)


@triton.jit
def _replay_apply(s_ck_x, eG, d_hist, cx):
    """S x = e^G (S_ck x) + sum_j cx_j d_j for S = e^G S_ck + sum_j c_j d_j k^_j^T, where
    cx = _history_coeffs(k_hist, c, x): the output-only replay (S is never built)."""
    return eG * s_ck_x + tl.sum(d_hist * cx[None, :], axis=1)


@triton.jit
def _replay_state_rank1(s_prev, c, k_head, stride_kl, d_head, stride_dl, o_v, mask_v, o_k, mask_k,
                        N_HIST: tl.constexpr, LP: tl.constexpr, USE_L2NORM: tl.constexpr, EPS: tl.constexpr):
    """s_prev + sum_{j < N_HIST} c_j d_j k^_j^T as N_HIST element-wise fp32 rank-1 updates
    (exact fp32, no tensor cores; d_j and k_j are re-read, L1/L2-resident)."""
    o_j = tl.arange(0, LP)
    for j in tl.static_range(N_HIST):
        c_j = tl.sum(tl.where(o_j == j, c, 0.0), axis=0)
        d_j = tl.load(d_head + j * stride_dl + o_v, mask=mask_v, other=0).to(tl.float32)
        k_j = _l2norm_vec(tl.load(k_head + j * stride_kl + o_k, mask=mask_k, other=0).to(tl.float32),
                          USE_L2NORM, EPS)
        s_prev += (c_j * d_j)[:, None] * k_j[None, :]
    return s_prev


@triton.jit
def _replay_state_rank1_raw(s_prev, coef, k_head, stride_kl, d_head, stride_dl, o_v, mask_v, o_k, mask_k,
                            N_HIST: tl.constexpr, LP: tl.constexpr):
    """As _replay_state_rank1 with coef_j = c_j / |k_j| precomputed: raw k_j rows."""
    o_j = tl.arange(0, LP)
    for j in tl.static_range(N_HIST):
        coef_j = tl.sum(tl.where(o_j == j, coef, 0.0), axis=0)
        d_j = tl.load(d_head + j * stride_dl + o_v, mask=mask_v, other=0).to(tl.float32)
        k_j = tl.load(k_head + j * stride_kl + o_k, mask=mask_k, other=0).to(tl.float32)
        s_prev += (coef_j * d_j)[:, None] * k_j[None, :]
    return s_prev


@triton.jit
def _gdn_history_scores_kernel(
    qkv, k_ring, state_indices, write_pos, scores,
    scale, null_slot,
    stride_idx, stride_wp, stride_qkv, stride_k0, stride_k1, stride_k2, order, n_rows,
    HK: tl.constexpr, K: tl.constexpr, L: tl.constexpr, BK: tl.constexpr, LP: tl.constexpr,
    USE_L2NORM: tl.constexpr, EPS: tl.constexpr, FF: tl.constexpr, PDL: tl.constexpr,
):
    """Per (row, k-head), once instead of once per (v-head, V tile): the scores of the
    cached keys against the current token, scores[row, hk] = (k^_j . q^, k^_j . k^,
    1/|k_j|) for j < write_pos, so the decode kernel never holds the [LP, K] key tile.
    ``PDL``: the decode kernel, a programmatic dependent of this one, may start scheduling at once."""
    pdl_trigger(PDL)
    i_n = tl.program_id(0).to(tl.int64)
    i_hk = tl.program_id(1)
    slot = tl.load(state_indices + i_n * stride_idx).to(tl.int64)
    w = tl.load(write_pos + i_n * stride_wp).to(tl.int32)
    if FF > 0:  # flush-first order for the decode kernel (flush_first_row), from the (row, 0) programs
        if i_hk == 0:
            write_flush_first_rank(order, write_pos, stride_wp, n_rows, i_n, L, FF)
    if (slot < 0) | (slot == null_slot):
        return
    w = tl.minimum(tl.maximum(w, 0), L - 1)
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    o_j = tl.arange(0, LP)
    valid = o_j < w
    k_head = k_ring + slot * stride_k0 + i_hk * stride_k1
    kr = tl.load(k_head + o_j[:, None] * stride_k2 + o_k[None, :], mask=valid[:, None] & mask_k[None, :], other=0)
    row = qkv + i_n * stride_qkv
    q = tl.load(row + i_hk * K + o_k, mask=mask_k, other=0)
    k = tl.load(row + HK * K + i_hk * K + o_k, mask=mask_k, other=0)
    q = _l2norm_vec(q.to(tl.float32), USE_L2NORM, EPS) * scale
    k = _l2norm_vec(k.to(tl.float32), USE_L2NORM, EPS)
    kr = kr.to(tl.float32)
    if USE_L2NORM:
        rn = 1.0 / tl.sqrt(tl.sum(kr * kr, axis=1) + EPS)
    else:
        rn = tl.full([LP], 1.0, tl.float32)
    kh = _normalise_rows(kr, USE_L2NORM, EPS)
    p = scores + (i_n * HK + i_hk) * (3 * LP) + o_j
    tl.store(p, tl.sum(kh * q[None, :], axis=1))
    tl.store(p + LP, tl.sum(kh * k[None, :], axis=1))
    tl.store(p + 2 * LP, rn)


@triton.jit
def _tile_load(s_head, stride_s2, d_head, stride_dl, v_row, t, o_b, o_k, mask_k, o_j, valid,
               V: tl.constexpr, BV: tl.constexpr, L: tl.constexpr):
    """Loads of V tile ``t``: checkpoint rows [BV, BK], cached d [BV, LP], current v [BV]."""
    o_v = t * BV + o_b
    mask_v = o_v < V
    s = tl.load(s_head + o_v[:, None] * stride_s2 + o_k[None, :], mask=mask_v[:, None] & mask_k[None, :], other=0)
    v = tl.load(v_row + o_v, mask=mask_v, other=0)
    if L > 1:
        d = tl.load(d_head + o_j[None, :] * stride_dl + o_v[:, None], mask=mask_v[:, None] & valid[None, :],
                    other=0)
    else:
        d = 0.0
    return s, d, v


@triton.jit
def _tile_finish(s_ck, d_hist, v, t, o_b, o_k, mask_k, q, k, kq, alpha, beta, eG, c, cq, ck, k_hist,
                 is_flush, w, out_row, s_head, stride_s2, d_head, stride_dl, k_head, stride_kl, rn,
                 V: tl.constexpr, BV: tl.constexpr, L: tl.constexpr, LP: tl.constexpr,
                 PRE_SCORES: tl.constexpr, FLUSH: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 USE_L2NORM: tl.constexpr, EPS: tl.constexpr, CAST_BITS: tl.constexpr):
    """Output of V tile ``t``, then either the flushed checkpoint rows or the appended d_w."""
    o_v = t * BV + o_b
    mask_v = o_v < V
    s_ck = s_ck.to(tl.float32)
    sq = tl.sum(s_ck * q[None, :], axis=1)
    sk = tl.sum(s_ck * k[None, :], axis=1)
    if L > 1:
        d_hist = d_hist.to(tl.float32)
        sq = _replay_apply(sq, eG, d_hist, cq)
        sk = _replay_apply(sk, eG, d_hist, ck)
    d_cur = beta * (v.to(tl.float32) - alpha * sk)
    o = alpha * sq + d_cur * kq
    tl.store(out_row + o_v, _cast_store(o, out_row.dtype.element_ty, CAST_BITS), mask=mask_v)
    if is_flush:
        # S_{w-1} from the tile already in registers (no second read), then the new checkpoint
        if L > 1:
            if FLUSH == "dot":
                if PRE_SCORES:  # the key tile is only needed here: load it now
                    o_j = tl.arange(0, LP)
                    kh = tl.load(k_head + o_j[:, None] * stride_kl + o_k[None, :],
                                 mask=(o_j < w)[:, None] & mask_k[None, :], other=0).to(tl.float32)
                    kh = kh * rn[:, None]
                else:
                    kh = k_hist
                s_prev = eG * s_ck + tl.dot(d_hist * c[None, :], kh, input_precision=DOT_PRECISION)
            elif PRE_SCORES:
                s_prev = _replay_state_rank1_raw(eG * s_ck, c * rn, k_head, stride_kl, d_head, stride_dl, o_v,
                                                 mask_v, o_k, mask_k, L - 1, LP)
            else:
                s_prev = _replay_state_rank1(eG * s_ck, c, k_head, stride_kl, d_head, stride_dl, o_v, mask_v,
                                             o_k, mask_k, L - 1, LP, USE_L2NORM, EPS)
        else:
            s_prev = s_ck
        s_new = alpha * s_prev + d_cur[:, None] * k[None, :]
        tl.store(s_head + o_v[:, None] * stride_s2 + o_k[None, :],
                 _cast_store(s_new, s_head.dtype.element_ty, CAST_BITS), mask=mask_v[:, None] & mask_k[None, :])
    else:
        tl.store(d_head + w * stride_dl + o_v, _cast_store(d_cur, d_head.dtype.element_ty, CAST_BITS), mask=mask_v)


@triton.jit
def _row_cursor(state_indices, write_pos, i_n, stride_idx, stride_wp, null_slot, L: tl.constexpr):
    """(slot, ring fill w clamped to [0, L-1], live) of batch row i_n; not live: a padded (slot < 0) or null
    row, which writes nothing."""
    slot = tl.load(state_indices + i_n * stride_idx).to(tl.int64)
    w = tl.load(write_pos + i_n * stride_wp).to(tl.int32)
    return slot, tl.minimum(tl.maximum(w, 0), L - 1), (slot >= 0) & (slot != null_slot)


@triton.jit
def _row_and_head(order, write_pos, stride_wp, n_rows, FF: tl.constexpr, RANK: tl.constexpr, L: tl.constexpr):
    """(batch row, v-head) of a decode program: the grid is (V tiles, rows, v-heads), or with FF > 0 (flush rows
    first, launch option ``flush_first_max_batch``) (V tiles, v-heads, ranks), the row read from ``order`` or, with
    RANK, found from the write positions (``pdl_wait: scores``)."""
    if FF == 0:
        i_n = tl.program_id(1).to(tl.int64)
        i_hv = tl.program_id(2)
    elif RANK:
        i_n = flush_first_rank_row(write_pos, stride_wp, n_rows, L, FF)
        i_hv = tl.program_id(1)
    else:
        i_n = flush_first_row(order)
        i_hv = tl.program_id(1)
    return i_n, i_hv


@triton.jit
def _chunk_dots(acc_q, acc_k, s, q_row, k_row, kc, o_c, K: tl.constexpr):
    """(acc_q + s q[kc:kc+BKC], acc_k + s k[kc:kc+BKC]) for one K chunk s [BV, BKC] of the checkpoint tile."""
    mask_c = (kc + o_c) < K
    q_c = tl.load(q_row + kc + o_c, mask=mask_c, other=0).to(tl.float32)
    k_c = tl.load(k_row + kc + o_c, mask=mask_c, other=0).to(tl.float32)
    return acc_q + tl.sum(s * q_c[None, :], axis=1), acc_k + tl.sum(s * k_c[None, :], axis=1)


@triton.jit
def _slot_heads(state, d_ring, k_ring, g_ring, slot, i_hv, i_hk, stride_s0, stride_s1, stride_d0, stride_d1,
                stride_k0, stride_k1, stride_g0, stride_g1):
    """Base pointers of one (slot, v-head): its checkpoint, d ring and g ring, and its k-head's raw-k ring."""
    return (state + slot * stride_s0 + i_hv * stride_s1, d_ring + slot * stride_d0 + i_hv * stride_d1,
            k_ring + slot * stride_k0 + i_hk * stride_k1, g_ring + slot * stride_g0 + i_hv * stride_g1)


@triton.jit
def _append_g_k(g_head, k_head, stride_k2, w, g, k_raw, o_k, mask_k, first_tile, i_hv,
                HV: tl.constexpr, HK: tl.constexpr, L: tl.constexpr):
    """A non-flush row appends g_w (one writer per (row, v-head): its first V tile) and raw k_w (one writer
    per (row, k-head)) at ring position w."""
    if first_tile & (w < L - 1):
        tl.store(g_head + w, g)
        if i_hv % (HV // HK) == 0:
            tl.store(k_head + w * stride_k2 + o_k, k_raw.to(k_head.dtype.element_ty), mask=mask_k)


@triton.jit
def _score_loads(scores, i_n, i_hk, o_j, valid, c, HK: tl.constexpr, LP: tl.constexpr):
    """(c q-scores, c k-scores, 1/|k_j|) of the cached keys, as the score pre-kernel wrote them for (row, k-head)."""
    p_sc = scores + (i_n * HK + i_hk) * (3 * LP) + o_j
    return (c * tl.load(p_sc, mask=valid, other=0.0), c * tl.load(p_sc + LP, mask=valid, other=0.0),
            tl.load(p_sc + 2 * LP, mask=valid, other=0.0))


@triton.jit
def _token_loads(row, a, b, A_log, dt_bias, i_n, i_hv, i_hk, o_k, mask_k, stride_a, stride_b,
                 HK: tl.constexpr, K: tl.constexpr):
    """The current token's q and raw k of k-head i_hk, and the gate inputs of v-head i_hv."""
    q = tl.load(row + i_hk * K + o_k, mask=mask_k, other=0)
    k_raw = tl.load(row + HK * K + i_hk * K + o_k, mask=mask_k, other=0)
    return (q, k_raw, tl.load(a + i_n * stride_a + i_hv), tl.load(b + i_n * stride_b + i_hv), tl.load(A_log + i_hv),
            tl.load(dt_bias + i_hv))


# ----------------------------------------------------------------------------------
# decode kernel
# ----------------------------------------------------------------------------------
@triton.jit
def _gdn_replay_decode_kernel(
    qkv, a, b, A_log, dt_bias,
    state, d_ring, k_ring, g_ring,
    state_indices, write_pos, out, scores,
    scale, null_slot,
    stride_idx, stride_wp,
    stride_qkv, stride_a, stride_b,
    stride_s0, stride_s1, stride_s2,
    stride_d0, stride_d1, stride_d2,
    stride_k0, stride_k1, stride_k2,
    stride_g0, stride_g1,
    stride_o0, stride_o1, n_rows, order,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr, NUM_STAGES: tl.constexpr,
    USE_L2NORM: tl.constexpr, PRE_SCORES: tl.constexpr, FLUSH: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SOFTPLUS_THRESHOLD: tl.constexpr, EPS: tl.constexpr, CAST_BITS: tl.constexpr, FF: tl.constexpr,
    PDL: tl.constexpr, LATE: tl.constexpr,
):
    # program: one V tile of BV rows of one (row, v-head)
    tl.static_assert(PRE_SCORES or not LATE, "LATE waits before the pre-kernel's scores: it needs them")
    if not LATE:
        pdl_wait(PDL)  # PDL: launched as the score pre-kernel's dependent, waiting first thing
    i_vp = tl.program_id(0)
    i_n, i_hv = _row_and_head(order, write_pos, stride_wp, n_rows, FF, LATE, L)
    i_hk = i_hv // (HV // HK)

    slot, w, live = _row_cursor(state_indices, write_pos, i_n, stride_idx, stride_wp, null_slot, L)
    if not live:
        if LATE:
            pdl_wait(PDL)
        return  # padded / null row: nothing is written
    is_flush = w == L - 1

    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    o_b = tl.arange(0, BV)
    o_j = tl.arange(0, LP)
    valid = o_j < w
    s_head, d_head, k_head, g_head = _slot_heads(state, d_ring, k_ring, g_ring, slot, i_hv, i_hk, stride_s0, stride_s1,
                                                 stride_d0, stride_d1, stride_k0, stride_k1, stride_g0, stride_g1)
    row = qkv + i_n * stride_qkv
    v_row = row + 2 * HK * K + i_hv * V
    t0 = i_vp

    # ---- every load of the first tile is issued before any arithmetic (LATE: the pre-kernel's scores last, behind
    # the wait) ----
    s_ck, d_hist, v = _tile_load(s_head, stride_s2, d_head, stride_d2, v_row, t0, o_b, o_k, mask_k, o_j, valid,
                                 V, BV, L)
    if LATE:
        q, k_raw, a_val, b_val, A_log_val, dt_bias_val = _token_loads(row, a, b, A_log, dt_bias, i_n, i_hv, i_hk,
                                                                     o_k, mask_k, stride_a, stride_b, HK, K)
    if L > 1:
        g_hist = tl.load(g_head + o_j, mask=valid, other=0.0)
        if PRE_SCORES:
            if LATE:
                pdl_wait(PDL)
            p_sc = scores + (i_n * HK + i_hk) * (3 * LP) + o_j
            sc_q = tl.load(p_sc, mask=valid, other=0.0)
            sc_k = tl.load(p_sc + LP, mask=valid, other=0.0)
            rn = tl.load(p_sc + 2 * LP, mask=valid, other=0.0)
        else:
            k_hist = tl.load(k_head + o_j[:, None] * stride_k2 + o_k[None, :],
                             mask=valid[:, None] & mask_k[None, :], other=0)
    if not LATE:
        q, k_raw, a_val, b_val, A_log_val, dt_bias_val = _token_loads(row, a, b, A_log, dt_bias, i_n, i_hv, i_hk,
                                                                     o_k, mask_k, stride_a, stride_b, HK, K)

    # ---- per (row, v-head): current token and history coefficients ----
    q = _l2norm_vec(q.to(tl.float32), USE_L2NORM, EPS) * scale
    k = _l2norm_vec(k_raw.to(tl.float32), USE_L2NORM, EPS)
    kq = tl.sum(k * q)
    g, beta = _gdn_gate(a_val, b_val, A_log_val, dt_bias_val, SOFTPLUS_THRESHOLD)
    alpha = tl.exp(g)
    if L > 1:
        c, eG = _history_weights(g_hist, w, LP)
        if PRE_SCORES:
            cq = c * sc_q
            ck = c * sc_k
            k_hist = 0.0
        else:
            rn = 0.0
            k_hist = _normalise_rows(k_hist, USE_L2NORM, EPS)
            cq = _history_coeffs(k_hist, c, q)
            ck = _history_coeffs(k_hist, c, k)
    else:
        rn = 0.0
        c = 0.0
        eG = 1.0
        cq = 0.0
        ck = 0.0
        k_hist = 0.0
    out_row = out + i_n * stride_o0 + i_hv * stride_o1

    # ---- the V tile: output-only replay, then flush or append ----
    _tile_finish(s_ck, d_hist, v, t0, o_b, o_k, mask_k, q, k, kq, alpha, beta, eG, c, cq, ck, k_hist,
                 is_flush, w, out_row, s_head, stride_s2, d_head, stride_d2, k_head, stride_k2, rn,
                 V, BV, L, LP, PRE_SCORES, FLUSH, DOT_PRECISION, USE_L2NORM, EPS, CAST_BITS)

    _append_g_k(g_head, k_head, stride_k2, w, g, k_raw, o_k, mask_k, i_vp == 0, i_hv, HV, HK, L)


@triton.jit
def _gdn_replay_decode_kchunk_kernel(
    qkv, a, b, A_log, dt_bias,
    state, d_ring, k_ring, g_ring,
    state_indices, write_pos, out, scores,
    scale, null_slot,
    stride_idx, stride_wp,
    stride_qkv, stride_a, stride_b,
    stride_s0, stride_s1, stride_s2,
    stride_d0, stride_d1, stride_d2,
    stride_k0, stride_k1, stride_k2,
    stride_g0, stride_g1,
    stride_o0, stride_o1, n_rows, order,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr, LP: tl.constexpr, NUM_STAGES: tl.constexpr,
    USE_L2NORM: tl.constexpr, PRE_SCORES: tl.constexpr, FLUSH: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SOFTPLUS_THRESHOLD: tl.constexpr, EPS: tl.constexpr, CAST_BITS: tl.constexpr, FF: tl.constexpr,
    PDL: tl.constexpr, LATE: tl.constexpr,
):
    """The decode step of ``_gdn_replay_decode_kernel`` (same math, same writes) with the checkpoint
    tile streamed in K chunks of BKC columns (launch option ``BKC`` > 0): the output pass accumulates
    (S_ck q, S_ck k) chunk by chunk, so no program holds its [BV, K] tile, and a flush row reads its
    tile a second time (from L2: the same program read it a moment before) to store the new
    checkpoint chunk by chunk. Keys enter through their norms: q^ = q |q|^-1 scale, k^ = k |k|^-1,
    and the cached keys' 1/|k_j| (``rn``), so a chunk never needs a whole-row norm. LATE (``pdl_wait: scores``):
    the pre-kernel's scores are read after the output pass, behind the wait."""
    tl.static_assert(PRE_SCORES or not LATE, "LATE waits before the pre-kernel's scores: it needs them")
    if not LATE:
        pdl_wait(PDL)  # PDL: launched as the score pre-kernel's dependent, waiting first thing
    i_v = tl.program_id(0)
    i_n, i_hv = _row_and_head(order, write_pos, stride_wp, n_rows, FF, LATE, L)
    i_hk = i_hv // (HV // HK)

    slot, w, live = _row_cursor(state_indices, write_pos, i_n, stride_idx, stride_wp, null_slot, L)
    if not live:
        if LATE:
            pdl_wait(PDL)
        return  # padded / null row: nothing is written
    is_flush = w == L - 1

    o_v = i_v * BV + tl.arange(0, BV)
    mask_v = o_v < V
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    o_c = tl.arange(0, BKC)
    o_j = tl.arange(0, LP)
    valid = o_j < w
    s_head, d_head, k_head, g_head = _slot_heads(state, d_ring, k_ring, g_ring, slot, i_hv, i_hk, stride_s0, stride_s1,
                                                 stride_d0, stride_d1, stride_k0, stride_k1, stride_g0, stride_g1)
    row = qkv + i_n * stride_qkv
    q_row = row + i_hk * K
    k_row = row + HK * K + i_hk * K
    p_tile = s_head + o_v[:, None] * stride_s2 + o_c[None, :]  # chunk 0 of the checkpoint tile

    # ---- per (row, v-head) scalars and the history, as in _gdn_replay_decode_kernel ----
    q = tl.load(q_row + o_k, mask=mask_k, other=0).to(tl.float32)
    k_raw = tl.load(k_row + o_k, mask=mask_k, other=0)
    kf = k_raw.to(tl.float32)
    if USE_L2NORM:
        rq = scale / tl.sqrt(tl.sum(q * q) + EPS)
        rk = 1.0 / tl.sqrt(tl.sum(kf * kf) + EPS)
    else:
        rq = scale
        rk = 1.0
    kq = tl.sum(kf * q) * (rq * rk)
    v = tl.load(row + 2 * HK * K + i_hv * V + o_v, mask=mask_v, other=0).to(tl.float32)
    g, beta = _gdn_gate(tl.load(a + i_n * stride_a + i_hv), tl.load(b + i_n * stride_b + i_hv),
                        tl.load(A_log + i_hv), tl.load(dt_bias + i_hv), SOFTPLUS_THRESHOLD)
    alpha = tl.exp(g)
    if L > 1:
        d_hist = tl.load(d_head + o_j[None, :] * stride_d2 + o_v[:, None], mask=mask_v[:, None] & valid[None, :],
                         other=0).to(tl.float32)
        c, eG = _history_weights(tl.load(g_head + o_j, mask=valid, other=0.0), w, LP)
        if PRE_SCORES:
            if not LATE:
                cq, ck, rn = _score_loads(scores, i_n, i_hk, o_j, valid, c, HK, LP)
        else:
            kr = tl.load(k_head + o_j[:, None] * stride_k2 + o_k[None, :], mask=valid[:, None] & mask_k[None, :],
                         other=0).to(tl.float32)
            if USE_L2NORM:
                rn = 1.0 / tl.sqrt(tl.sum(kr * kr, axis=1) + EPS)
            else:
                rn = tl.full([LP], 1.0, tl.float32)
            kh = kr * rn[:, None]
            cq = _history_coeffs(kh, c, q * rq)
            ck = _history_coeffs(kh, c, kf * rk)

    # ---- output pass: (S_ck q, S_ck k) over K chunks ----
    acc_q = tl.zeros([BV], dtype=tl.float32)
    acc_k = tl.zeros([BV], dtype=tl.float32)
    for kc in tl.range(0, K, BKC, num_stages=NUM_STAGES):
        s = tl.load(p_tile + kc, mask=mask_v[:, None] & ((kc + o_c) < K)[None, :], other=0).to(tl.float32)
        acc_q, acc_k = _chunk_dots(acc_q, acc_k, s, q_row, k_row, kc, o_c, K)
    sq = acc_q * rq
    sk = acc_k * rk
    if L > 1:
        if PRE_SCORES:
            if LATE:
                pdl_wait(PDL)
                cq, ck, rn = _score_loads(scores, i_n, i_hk, o_j, valid, c, HK, LP)
        sq = _replay_apply(sq, eG, d_hist, cq)
        sk = _replay_apply(sk, eG, d_hist, ck)
    d_cur = beta * (v - alpha * sk)
    o = alpha * sq + d_cur * kq
    out_row = out + i_n * stride_o0 + i_hv * stride_o1
    tl.store(out_row + o_v, _cast_store(o, out_row.dtype.element_ty, CAST_BITS), mask=mask_v)

    if is_flush:
        # S_{w-1} = e^G S_ck + sum_j c_j d_j k^_j^T, then alpha S_{w-1} + d_w k^T, chunk by chunk
        for kc in tl.range(0, K, BKC, num_stages=NUM_STAGES):
            mask_c = (kc + o_c) < K
            p_s = p_tile + kc
            s = tl.load(p_s, mask=mask_v[:, None] & mask_c[None, :], other=0).to(tl.float32)
            k_c = tl.load(k_row + kc + o_c, mask=mask_c, other=0).to(tl.float32) * rk
            if L > 1:
                if FLUSH == "dot":
                    kr_c = tl.load(k_head + o_j[:, None] * stride_k2 + (kc + o_c)[None, :],
                                   mask=valid[:, None] & mask_c[None, :], other=0).to(tl.float32)
                    s_prev = eG * s + tl.dot(d_hist * (c * rn)[None, :], kr_c, input_precision=DOT_PRECISION)
                else:
                    s_prev = _replay_state_rank1_raw(eG * s, c * rn, k_head + kc, stride_k2, d_head, stride_d2, o_v,
                                                     mask_v, o_c, mask_c, L - 1, LP)
            else:
                s_prev = s
            s_new = _cast_store(alpha * s_prev + d_cur[:, None] * k_c[None, :], s_head.dtype.element_ty, CAST_BITS)
            tl.store(p_s, s_new, mask=mask_v[:, None] & mask_c[None, :])
    else:
        tl.store(d_head + w * stride_d2 + o_v, _cast_store(d_cur, d_head.dtype.element_ty, CAST_BITS), mask=mask_v)

    _append_g_k(g_head, k_head, stride_k2, w, g, k_raw, o_k, mask_k, i_v == 0, i_hv, HV, HK, L)


# ----------------------------------------------------------------------------------
# wrapper
# ----------------------------------------------------------------------------------
_CFG_CACHE: Dict[Tuple[Tuple[str, ...], str], Dict[str, Any]] = {}


def gdn_launch_params(HV: int, Hk: int, K: int, V: int, L: int, state_dtype=None) -> Dict[str, Any]:
    """Launch parameters for a geometry (cached; YAML via ``common.launch_config``; a
    ``..._S{dtype}`` entry for the state dtype wins over the plain geometry key)."""
    from .common import config_file, config_keys

    keys = config_keys(f"HV{HV}_HK{Hk}_K{K}_V{V}_L{L}", state_dtype)
    ck = (keys, str(config_file()))
    cfg = _CFG_CACHE.get(ck)
    if cfg is None:
        cfg = launch_config("gdn_decode", keys)  # entries checked against the registration above
        _CFG_CACHE[ck] = cfg
    return cfg


def _err(msg: str):
    raise ValueError(f"gdn_replay_decode: {msg}")


def _check_last_contig(name: str, t: torch.Tensor):
    if t.stride(-1) != 1:
        _err(f"{name} must be contiguous in its last dim (got strides {tuple(t.stride())})")


def gdn_replay_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    d_ring: torch.Tensor,
    k_ring: torch.Tensor,
    g_ring: torch.Tensor,
    state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    *,
    scale: Optional[float] = None,
    use_qk_l2norm: bool = True,
    out: Optional[torch.Tensor] = None,
    null_slot: Optional[int] = 0,
) -> torch.Tensor:
    """One GDN ReplaySSM decode step for a batch of rows (see the module docstring).

    Shapes: mixed_qkv [B, 2*Hk*K + HV*V]; a, b [B, HV]; A_log, dt_bias [HV];
    state [S, HV, V, K] (fp32/bf16/fp16); d_ring [S, HV, L, V] (state dtype);
    k_ring [S, Hk, L, K] (mixed_qkv dtype, raw k); g_ring [S, HV, L] fp32;
    state_indices [B] int32/int64; write_pos [B] int32/int64 in [0, L) (values
    outside are clamped in-kernel); out [B, HV, V] or [B, 1, HV, V] (allocated in
    mixed_qkv's dtype when None). Rows whose slot is < 0 or == ``null_slot`` are
    skipped entirely (``null_slot=None``: only negative slots). No device syncs.
    """
    tensors = dict(mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, d_ring=d_ring,
                   k_ring=k_ring, g_ring=g_ring, state_indices=state_indices, write_pos=write_pos)
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            _err(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dev = mixed_qkv.device
    for name, t in tensors.items():
        if t.device != dev:
            _err(f"{name} is on {t.device}, mixed_qkv on {dev}; all inputs must share a device")

    if state.ndim != 4:
        _err(f"state must be [S, HV, V, K], got shape {tuple(state.shape)}")
    S, HV, V, K = state.shape
    if d_ring.ndim != 4 or k_ring.ndim != 4 or g_ring.ndim != 3:
        _err(f"rings must be d [S,HV,L,V], k [S,Hk,L,K], g [S,HV,L]; got shapes {tuple(d_ring.shape)}, "
             f"{tuple(k_ring.shape)}, {tuple(g_ring.shape)}")
    L = d_ring.shape[2]
    Hk = k_ring.shape[1]
    if L < 1:
        _err("ring length L = d_ring.shape[2] must be >= 1")
    if Hk < 1 or HV % Hk:
        _err(f"HV ({HV}) must be a positive multiple of Hk = k_ring.shape[1] ({Hk})")
    if tuple(d_ring.shape) != (S, HV, L, V):
        _err(f"d_ring must have shape {(S, HV, L, V)}, got {tuple(d_ring.shape)}")
    if tuple(k_ring.shape) != (S, Hk, L, K):
        _err(f"k_ring must have shape {(S, Hk, L, K)}, got {tuple(k_ring.shape)}")
    if tuple(g_ring.shape) != (S, HV, L):
        _err(f"g_ring must have shape {(S, HV, L)}, got {tuple(g_ring.shape)}")
    if mixed_qkv.ndim != 2:
        _err(f"mixed_qkv must be 2-D [B, 2*Hk*K + HV*V], got shape {tuple(mixed_qkv.shape)}")
    B, width = mixed_qkv.shape
    if width != 2 * Hk * K + HV * V:
        _err(f"mixed_qkv last dim must be 2*Hk*K + HV*V = {2 * Hk * K + HV * V} "
             f"(Hk={Hk}, K={K}, HV={HV}, V={V}), got {width}")
    for name, t in (("a", a), ("b", b)):
        if t.ndim != 2 or tuple(t.shape) != (B, HV):
            _err(f"{name} must have shape {(B, HV)}, got {tuple(t.shape)}")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if t.ndim != 1 or t.shape[0] != HV:
            _err(f"{name} must have shape ({HV},), got {tuple(t.shape)}")
    for name, t in (("state_indices", state_indices), ("write_pos", write_pos)):
        if t.ndim != 1 or t.shape[0] != B:
            _err(f"{name} must have shape ({B},), got {tuple(t.shape)}")
        if t.dtype not in (torch.int32, torch.int64):
            _err(f"{name} must be int32 or int64, got {t.dtype}")

    act = mixed_qkv.dtype
    if act not in _FLOAT_DTYPES:
        _err(f"mixed_qkv dtype must be fp32/bf16/fp16, got {act}")
    if state.dtype not in _FLOAT_DTYPES:
        _err(f"state dtype must be fp32/bf16/fp16, got {state.dtype}")
    if d_ring.dtype != state.dtype:
        _err(f"d_ring dtype must equal the state dtype {state.dtype}, got {d_ring.dtype}")
    if k_ring.dtype != act:
        _err(f"k_ring dtype must equal the activation (mixed_qkv) dtype {act}, got {k_ring.dtype}")
    if g_ring.dtype != torch.float32:
        _err(f"g_ring dtype must be float32, got {g_ring.dtype}")
    for name, t in (("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias)):
        if not t.is_floating_point():
            _err(f"{name} must be a floating-point tensor, got {t.dtype}")

    for name in ("mixed_qkv", "a", "b", "A_log", "dt_bias", "state", "d_ring", "k_ring", "g_ring"):
        _check_last_contig(name, tensors[name])

    if out is None:
        out = torch.empty((B, HV, V), dtype=act, device=dev)
    if not isinstance(out, torch.Tensor) or out.device != dev:
        _err("out must be a tensor on the inputs' device")
    if out.ndim == 4 and tuple(out.shape) == (B, 1, HV, V):
        out3 = out[:, 0]
    elif out.ndim == 3 and tuple(out.shape) == (B, HV, V):
        out3 = out
    else:
        _err(f"out must have shape {(B, HV, V)} or {(B, 1, HV, V)}, got {tuple(out.shape)}")
    if out3.dtype not in _FLOAT_DTYPES:
        _err(f"out dtype must be fp32/bf16/fp16, got {out3.dtype}")
    _check_last_contig("out", out3)

    if B == 0:
        return out
    if scale is None:
        scale = K ** -0.5

    cfg = gdn_launch_params(HV, Hk, K, V, L, state.dtype)
    BK = max(16, next_pow2(K))
    small = B <= cfg["inline_scores_max_batch"]  # host-side, per graph batch
    BV = max(16, min(cfg["inline_BV"] if small and cfg["inline_BV"] else cfg["BV"], next_pow2(V)))
    BKC = cfg["inline_BKC"] if small and cfg["inline_BKC"] >= 0 else cfg["BKC"]
    num_warps = cfg["inline_num_warps"] if small and cfg["inline_num_warps"] else cfg["num_warps"]
    LP = max(16, next_pow2(max(L - 1, 1)))
    null = -1 if null_slot is None else int(null_slot)
    use_l2 = bool(use_qk_l2norm)
    pre = cfg["scores"] == "pre" and L > 1 and not small
    pdl = pre and pdl_on(cfg["pdl"], dev)
    late = pre and cfg["pdl_wait"] == "scores"  # the scores read after the output pass (behind the wait with pdl)
    # flush rows first (only with the pre-kernel: it writes their order, or with `late` each program finds its row
    # from the write positions); 0: the rows in grid order
    FF = max(16, next_pow2(B)) if pre and B <= cfg["flush_first_max_batch"] else 0
    grid = (triton.cdiv(V, BV), HV, B) if FF else (triton.cdiv(V, BV), B, HV)
    # per call (graph-safe); None without FF: no kernel parameter, the same build as without the option
    order = torch.empty(B, dtype=torch.int32, device=dev) if FF and not late else None
    if pre:  # per (row, k-head) scores of the cached keys; scratch is per call (graph-safe)
        scores = torch.empty(B * Hk * 3 * LP, dtype=torch.float32, device=dev)
        _gdn_history_scores_kernel[(B, Hk)](
            mixed_qkv, k_ring, state_indices, write_pos, scores,
            float(scale), null,
            state_indices.stride(0), write_pos.stride(0), mixed_qkv.stride(0),
            k_ring.stride(0), k_ring.stride(1), k_ring.stride(2), order, B if order is not None else None,
            HK=Hk, K=K, L=L, BK=BK, LP=LP, USE_L2NORM=use_l2, EPS=L2NORM_EPS, FF=FF if order is not None else 0,
            PDL=pdl,
            num_warps=cfg["scores_num_warps"], num_stages=1,
        )
    else:
        scores = g_ring  # unused placeholder pointer
    # the two decode kernels take the same runtime arguments and share most compile-time ones
    args = (mixed_qkv, a, b, A_log, dt_bias,
            state, d_ring, k_ring, g_ring,
            state_indices, write_pos, out3, scores,
            float(scale), null,
            state_indices.stride(0), write_pos.stride(0),
            mixed_qkv.stride(0), a.stride(0), b.stride(0),
            state.stride(0), state.stride(1), state.stride(2),
            d_ring.stride(0), d_ring.stride(1), d_ring.stride(2),
            k_ring.stride(0), k_ring.stride(1), k_ring.stride(2),
            g_ring.stride(0), g_ring.stride(1),
            out3.stride(0), out3.stride(1), B if FF and late else None, order)
    common = dict(HK=Hk, HV=HV, K=K, V=V, L=L, BK=BK, BV=BV, LP=LP, NUM_STAGES=cfg["num_stages"],
                  USE_L2NORM=use_l2, PRE_SCORES=pre, FLUSH=cfg["flush"],
                  DOT_PRECISION=cfg["dot_precision"], SOFTPLUS_THRESHOLD=SOFTPLUS_THRESHOLD, EPS=L2NORM_EPS,
                  CAST_BITS=cfg["cast"] == "bits" or interpreting(), FF=FF, PDL=pdl, LATE=late,
                  num_warps=num_warps, num_stages=cfg["num_stages"], **register_cap(cfg), **pdl_launch(pdl))
    if BKC:
        _gdn_replay_decode_kchunk_kernel[grid](*args, BKC=min(BKC, BK), **common)
    else:
        _gdn_replay_decode_kernel[grid](*args, **common)
    return out
