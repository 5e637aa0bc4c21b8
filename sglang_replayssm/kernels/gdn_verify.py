"""Gated DeltaNet (GDN) ReplaySSM speculative verify: a window of T tokens (a chain, or
a tree of T draft nodes) over a checkpoint plus a circular ring of committed history.

Pure math and plumbing (no SGLang import).  Reference: :mod:`gdn_verify_ref`.

Layouts (the standard-decode ring of :mod:`gdn_replay`, used as a circular ring)
------------------------------------------------------------------------------
* ``state``  [S, HV, V, K]  checkpoint S_ck (fp32 / bf16 / fp16), K contiguous.
* ``d_ring`` [S, HV, R, V]  state dtype: d_j = beta_j (v_j - alpha_j S_{j-1} k^_j).
* ``k_ring`` [S, Hk, R, K]  activation dtype: the *raw* (pre-L2-norm) k_j.
* ``g_ring`` [S, HV, R]     fp32 log-decay g_j.
* ``mixed_qkv`` [B, T, 2*Hk*K + HV*V] packed q|k|v of the window, ``a``/``b`` [B, T, HV],
  ``out`` [B, T, HV, V] (activation dtype by default).
Every pool is addressed through its real strides (slot stride(0) may exceed the
product of the trailing dims: views into a paged pool); last dims must be contiguous.

Cursor contract (:mod:`spec_cursor`)
------------------------------------
``R = B_hist + T`` (history block B_hist >= T).  Per *physical* slot s: ``wp[s]``
committed history entries (logical 0 .. wp-1), ``origin[s]`` the physical index of
logical 0 (logical j lives at physical (origin + j) % R), ``flush[s]`` set when this
verify must first fold the history into the checkpoint.  This kernel reads the
cursors and never writes them; :func:`spec_cursor.spec_commit` moves them between
forwards.  The commit rule guarantees ``wp + T <= R``; the kernel clamps wp to
[0, R - T] and origin to [0, R - 1] for memory safety only.

Math (per live row, v-head h; w = wp[s], G_j inclusive prefix of the cached g over
logical 0..j, G = G_{w-1}, k^_j = l2norm(cached raw k_j))
------------------------------------------------------------------------------------
Committed state  S_c = e^G S_ck + sum_{j<w} e^{G - G_j} d_j k^_j^T.

* flush[s] != 0: S_c is built (V tile by V tile), stored as the new checkpoint
  (history only, never a window token; skipped when w == 0, where S_c = S_ck), and
  the window is computed from the *stored* (state-dtype) S_c with an empty history,
  so the outputs are exactly what a verify from that checkpoint would produce.
* flush[s] == 0: S_c is never built.  For any vector x,
  S_c x = e^G (S_ck x) + sum_j e^{G - G_j} (k^_j . x) d_j   (output-only replay).

Window tokens i = 0..T-1: g_i = -exp(A_log) softplus(a_i + dt_bias) (threshold 20),
beta_i = sigmoid(b_i) in fp32 (rounded to b's dtype only with ``round_beta=True``,
like the packed decode kernel; SGLang's stock target-verify kernel does not round),
q^_i, k^_i L2-normalised with 1/sqrt(sum x^2 + 1e-6), q^ scaled.  Gamma_i = sum_{m<=i}
g_m (window-local).  The sequential delta rule S_i = alpha_i S_{i-1} + d_i k^_i^T,
d_i = beta_i (v_i - alpha_i S_{i-1} k^_i), o_i = S_i q^_i from S_c unrolls to a
unit-lower-triangular (UT) system solved by forward substitution:

    r_i  = beta_i (v_i - e^{Gamma_i} S_c k^_i)
    A_ij = beta_i e^{Gamma_i - Gamma_j} (k^_i . k^_j)            j < i
    d_i  = r_i - sum_{j<i} A_ij d_j
    o_i  = e^{Gamma_i} S_c q^_i + sum_{j<=i} e^{Gamma_i - Gamma_j} (k^_j . q^_i) d_j

Every window output is produced (the rejection sampler reads all of them) and the
window's (d_i, raw k_i, g_i) are written to the ring at logical w + i, physical
(origin + w + i) % R.  Those positions are disjoint from the history (w + T <= R), so
programs of one row never race.  Rejected drafts stay there, masked by the next
cursors, and are overwritten by the next verify: rollback is a cursor move.

Tree (:func:`gdn_tree_verify`, SGLang EAGLE with ``--speculative-eagle-topk`` > 1)
------------------------------------------------------------------------------
``parents`` int [B, T] (position 0 = root = the last verified token, ``parents[b, i]``
in ``[0, i)``; see :mod:`spec_tree`): node i's output is the sequential delta rule over
the committed history and then *its own* ancestor path root..i; no per-node state is
written.  The same kernel (``IS_TREE``) builds the ancestor mask anc(i) (i included)
in-kernel by pointer-jumping (``spec_tree._tree_ancestor_mask``) and uses it where the
chain uses j <= i: Gamma_i = sum_{m in anc(i)} g_m (path sums), A_ij and the o_i sum run
over j in anc(i), and e^{Gamma_i - Gamma_j} sums the g of the path nodes after j.
Parents precede children, so node order is a valid substitution order and d_i is node
i's delta-rule correction along its own path: the ring entry written for node i is what
a chain verify of that path writes.  History replay, flush, scores, ring writes (node
order) and null rows are the chain's; :func:`spec_tree.spec_commit_tree` later gathers
the accepted path into consecutive positions.  A chain (``parents[i] = i - 1``) gives the
chain verify.

Programs and traffic
--------------------
Grid ``(cdiv(V, BV), B, HV)``: one program per BV value rows of one (row, v-head),
holding the whole K row (BK = next_pow2(K)).  Each reads its S_ck tile [BV, K] once,
the history d slice [BV, w] (state dtype) and g [w], the history raw keys [w, K] of its
k-head (streamed one row at a time: on verify rows into the scores k^_j . q^_i and
k^_j . k^_i -- or, with ``scores: pre``, read from an fp32 scratch that
``_gdn_verify_scores_kernel`` fills once per (row, k-head) together with the window Gram
(batches of at most ``inline_scores_max_batch`` rows stay inline, one launch) -- on flush rows together with d_j into the rank-1 fold), and the window's
q, k [T, K], v slice [T, BV], a, b [T].  It writes the out slice [T, BV] and the
window's d slice [T, BV]; the program with V tile 0 also writes the window's g (one
writer per (row, v-head)) and, for the first v-head of a k-head group, the window's
raw k (one writer per (row, k-head)).  Flush rows also write their checkpoint tile
[BV, K].  Rows whose slot is < 0 or == ``null_slot`` write nothing at all (no out, no
state, no ring).  Tiles: history LP = max(16, next_pow2(R - T)) positions (the
largest history is R - T), window TP = max(2, next_pow2(T)).  S_c q^_i, S_c k^_i and
the window's Gram entries are computed for all T tokens at once ([BV, TP, K] and
[TP, TP, K] products: far fewer live registers than T separate mat-vecs); only the
forward substitution walks the tokens (a static loop over T).  DRAM bytes per (row,
v-head) at Qwen3-Next (K = V = 128, fp32 state, bf16 activations): 64 KiB of S_ck +
0.5 KiB of d and 0.25 KiB of raw k (shared by the 2 v-heads of a k-head) per history
entry, + T * 0.5 KiB of d written; a flush adds the 64 KiB checkpoint write.  SGLang's
stock target verify reads one state and writes T intermediate states (64 KiB each).
The history scores
are recomputed by every V tile and every v-head of a k-head group (a per-(row,
k-head) pre-kernel, as in standard decode, would remove that redundancy).

``v_loop`` > 1 (the built-in default from ``v_loop_min_batch`` rows up and for windows of at
most ``v_loop_max_window`` tokens; other launches keep the grid above): grid ``(cdiv(V, BV * v_loop), B, HV)``, each program runs the per-(row,
v-head) prologue once -- gates, q^/k^, key scores, Gram, the forward substitution's
per-token scalars and, on a flush row, the history keys' norms -- and then loops over its
v_loop value tiles (software-pipelined ``v_stages`` deep), holding each tile as [BV, k_parts, K / k_parts] so that fewer lanes
share a row's dot products (fewer shuffles; each dot one reduction, a lane's products one FMA chain).  Same math,
same bytes; a flush row's fold coefficient c_j / |k_j| carries the key's norm instead of normalising k_j
element-wise.  ``window_dot: split`` runs the window's dots against the tile on the tensor cores:
[BV, K] x [K, 2T] (columns q^_i, k^_i) and, on a verify row, the history's [BV, LP] x [LP, 2T].
``flush_rows: separate`` launches the looping kernel twice, built once for the rows that fold no history and once
for those that do (``flush_v_stages`` deep); each program of the other kind returns at once, and neither build
carries the other path's registers or shared memory (the packaged choice for fp32 states).  The looping kernel
folds a flush row's history on the tensor cores: e^G S + (d_hist c/|k|) [BV, LP] x k_hist [LP, K], and runs the folded
tile's window dots there too.

Numerics
--------
Every reduction and every element-wise product is fp32 on CUDA cores, but for the
window dots of ``window_dot: split`` and the looping kernel's fold, fp32-accurate on the tensor cores: each fp32
operand is split into a tf32 hi and the exact remainder lo, and hi.hi' + hi.lo' + lo.hi' summed in tf32 passes with
an fp32 accumulator (a 16-bit tile is exact in tf32: two passes); plain tf32 is never used.  Decays come from the
standard-decode helper ``_history_weights`` (exclusive suffix sums summed directly, so nothing is subtracted; the window's
e^{Gamma_i - Gamma_j} likewise come from sums over g_{j+1..i}), keys are
re-normalised with the same fp32 formula as the current token.  The one-tile launches' flush fold
is w exact fp32 rank-1 updates (``flush: rank1``, default) or one ``tl.dot`` [BV, LP] x
[LP, K] with ``dot_precision`` "tf32x3" / "ieee" (``flush: dot``; plain tf32 is
refused).  The window d_i stay fp32 inside the solve; the only roundings are the stores (out, ring d
in the state dtype, the checkpoint).  Measured in the CPU interpreter (tests/kernels/test_gdn_verify.py: fp32 state, fp32 or bf16 activations,
random realistic gates, 40-step simulations with random accepts, Qwen3-Next
geometry) against an fp64 sequential oracle: outputs <= 4e-7 (|o| <~ 1), flushed
checkpoints <= 2e-6 (|S| <~ 5); the fork's GDN spec tests allow atol 2e-3 (its UT
kernel re-rounds the checkpoint to the activation dtype).
The built-in launch parameters are the fastest measured on the H200 (one warp, ``reduce: token``,
``scores: pre`` above batch 1, a 168-register cap: eval/results/spec-variants-h200/ rounds 1-2;
4 warps with the broadcast reduction and inline scores, the earlier defaults, were the slowest;
from 64 rows up, ``v_loop`` 8 with k_parts 2 and no register cap: round 9; v_stages 3 and, for a 16-bit state,
``window_dot: split``: round 10 -- an fp32 state keeps the CUDA-core dots through default.yaml's ``default_Sfp32``).

Launch parameters: ``common.launch_config("gdn_verify", key)`` (the family registered below,
chain and tree alike) with key ``HV{HV}_HK{Hk}_K{K}_V{V}_R{R}_T{T}``.  The wrapper does no host sync
(CUDA-graph safe); flush vs verify is a per-row runtime branch on ``flush[slot]``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

from .common import FLOAT_DTYPES as _FLOAT_DTYPES
from .common import INDEX_DTYPES as _INT_DTYPES
from .common import (L2NORM_EPS, SOFTPLUS_THRESHOLD, block_param, choice_param, config_file, config_keys,
                     count_param, dot_precision_param, flag_param, launch_config, maxnreg_param, next_pow2,
                     pdl_launch, pdl_on, pdl_trigger, pdl_wait, register_cap, register_family, split_dot,
                     tf32_split, warps_param)
from .gdn_replay import _cast_rtne, _gdn_gate, _history_weights, _l2norm_vec, _normalise_rows
from .spec_tree import _tree_ancestor_mask, check_parents_arg

__all__ = ["gdn_verify", "gdn_tree_verify", "gdn_verify_launch_params", "GDN_VERIFY_DEFAULT_LAUNCH",
           "gdn_verify_key"]

_FLUSH_MODES = ("rank1", "dot")
_REDUCE_MODES = ("bcast", "token")
_WINDOW_DOTS = ("fma", "split")
_SCORES_MODES = ("inline", "pre")
_FLUSH_ROWS = ("fused", "separate")
# Built-in launch parameters: the fastest measured on the H200 (eval/results/spec-variants-h200/, rounds 1-2: one warp,
# T two-dimensional reductions, key scores in a pre-kernel except at batch 1, a 168-register cap for 12 warps per SM;
# round 9: from 64 rows up, the looping kernel, 8 value tiles a program, uncapped).
# Register use, offline ptxas for sm_90a (Qwen3-Next geometry, rank-1 flush): BV >= 32 or 1 warp hits 255 registers
# without a cap.
GDN_VERIFY_DEFAULT_LAUNCH: Dict[str, Any] = register_family("gdn_verify", {
    "BV": block_param(16),  # value rows per program (the whole K row sits in one program)
    "num_warps": warps_param(1),
    "num_stages": count_param(1, 1),
    # the one-tile launches' flush fold: "rank1" (exact fp32 CUDA-core FMAs) or "dot" (tl.dot, dot_precision). The
    # looping kernel (v_loop) always folds on the tensor cores in hi/lo tf32 passes, fp32-accurate: its rank-1 fold
    # lost on the H200 at both state dtypes and is removed (eval/results/spec-variants-h200/, round 11)
    "flush": choice_param("rank1", _FLUSH_MODES),
    "dot_precision": dot_precision_param(),
    # the window's dots against the state tile and each other: "bcast" (one [BV, T, K] broadcast-and-sum) or
    # "token" (T two-dimensional row reductions, as the decode kernel does for one token)
    "reduce": choice_param("token", _REDUCE_MODES),
    # the key scores k^_j.q^_i, k^_j.k^_i (history j) and the window Gram: "inline" (every program of a
    # k-head: HV/Hk v-heads x V/BV tiles) or "pre" (once per (row, k-head) by a pre-kernel, fp32 scratch)
    "scores": choice_param("pre", _SCORES_MODES),
    "scores_num_warps": warps_param(1),
    # with scores: pre, batches of at most this many rows still compute the scores inline (one launch)
    "inline_scores_max_batch": count_param(1),
    # register cap of the one-tile launches (0: none): fewer registers, more resident warps (ignored by the
    # interpreter); the looping kernel's is v_loop_maxnreg
    "maxnreg": maxnreg_param(168),
    # value tiles of BV rows per program (1: one tile a program): a program loops over v_loop tiles of one
    # (row, v-head), computing what the value rows share (gates, q^/k^, scores, the substitution's scalars) once
    "v_loop": count_param(8, 1),
    # software-pipelining depth of that loop (Triton's num_stages for it; 1: none)
    "v_stages": count_param(3, 1),
    # with v_loop > 1: a value tile is held as k_parts slices of its K row, so fewer lanes share a row's dot
    # products (v_loop > 1 always reduces per token and folds a flush on the tensor cores); slices are kept at
    # least MIN_K_SLICE wide (fewer parts where K is small)
    "k_parts": block_param(2),
    # with v_loop > 1: batches of fewer rows still launch one value tile per program (too few programs to loop)
    "v_loop_min_batch": count_param(64),
    # with v_loop > 1: windows of more tokens still launch one value tile per program (the loop holds 2T window
    # vectors across its tiles: at T = 8 they spill)
    "v_loop_max_window": count_param(4, 1),
    # with v_loop > 1, the window's dots (state tile x q^/k^; a verify row's history d x scores): "fma" (fp32 FMAs
    # and row reductions) or "split" (on the tensor cores: tf32 tl.dot passes over hi/lo halves, fp32-accurate)
    "window_dot": choice_param("split", _WINDOW_DOTS),
    # register cap of the looping kernel (v_loop > 1; 0: none, -1: as maxnreg)
    "v_loop_maxnreg": maxnreg_param(0, inherit=True),
    # with v_loop > 1, the rows that fold a history (flush rows): "fused" (one launch; each program takes its row's
    # path, so the kernel's registers and shared memory are the larger path's) or "separate" (two launches of the
    # looping kernel, each compiled for one path: verify rows, then flush rows; a program of the other kind returns)
    "flush_rows": choice_param("fused", _FLUSH_ROWS),
    # with flush_rows: separate, the flush launch's pipelining depth (0: as v_stages)
    "flush_v_stages": count_param(0, 0, " (0: as v_stages)"),
    # 1: each main launch that follows a kernel of this verify (the scores pre-kernel, or the verify rows' launch
    # before the flush rows') is launched as that kernel's programmatic dependent (sm90+): its programs are
    # scheduled while the kernel before runs, issue the window's loads, and wait for it (griddepcontrol.wait) before
    # they read its scores or store anything; a program that returns early waits first too
    "pdl": flag_param(0),
})


# The narrowest K slice of a looping kernel's value tile. Compiled for the H200, the window dots on the CUDA cores
# (window_dot: fma) over [BV, KS, 16] (or 8) slices came out wrong while the interpreter passed (24 CUDA tests at
# a040a5c, K = 24 and 32 with k_parts 2 and 4); slices of 32 and more passed there (K = 32 whole, K = 40 and 96 in
# halves, Qwen3-Next's 128 in halves).
MIN_K_SLICE = 32


def k_slices(k_parts: int, BK: int) -> int:
    """How many slices a looping kernel's value tile holds its K row in: ``k_parts``, fewer where a slice would be
    narrower than MIN_K_SLICE (one where BK itself is)."""
    return max(1, min(k_parts, BK // MIN_K_SLICE))


def gdn_verify_key(HV: int, Hk: int, K: int, V: int, R: int, T: int) -> str:
    return f"HV{HV}_HK{Hk}_K{K}_V{V}_R{R}_T{T}"


# ----------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------
@triton.jit
def _history_key_scores(k_head, stride_k2, org, w, R, q_hat, k_hat, o_j, o_k, mask_k,
                        LP: tl.constexpr, TP: tl.constexpr, USE_L2NORM: tl.constexpr, EPS: tl.constexpr):
    """hq[j, i] = k^_j . q^_i and hk[j, i] = k^_j . k^_i for the history j < w (zero rows past w),
    streaming the cached raw keys once (no [LP, K] tile held in registers)."""
    hq = tl.zeros([LP, TP], dtype=tl.float32)
    hk = tl.zeros([LP, TP], dtype=tl.float32)
    for j in range(0, w):
        k_j = _l2norm_vec(tl.load(k_head + ((org + j) % R) * stride_k2 + o_k, mask=mask_k, other=0).to(tl.float32),
                          USE_L2NORM, EPS)
        row_j = o_j[:, None] == j
        hq = tl.where(row_j, tl.sum(q_hat * k_j[None, :], axis=1)[None, :], hq)
        hk = tl.where(row_j, tl.sum(k_hat * k_j[None, :], axis=1)[None, :], hk)
    return hq, hk


@triton.jit
def _gram_column(kk, kq, k_hat, q_i, k_i, col):
    """Column i (``col``) of the window Gram: kk[j, i] = k^_j . k^_i, kq[j, i] = k^_j . q^_i."""
    kk = tl.where(col, tl.sum(k_hat * k_i[None, :], axis=1)[:, None], kk)
    kq = tl.where(col, tl.sum(k_hat * q_i[None, :], axis=1)[:, None], kq)
    return kk, kq


@triton.jit
def _window_gram(o_t, q_hat, k_hat, TP: tl.constexpr):
    """The window Gram kk[j, i] = k^_j . k^_i, kq[j, i] = k^_j . q^_i ([TP, TP] fp32)."""
    kk = tl.zeros([TP, TP], dtype=tl.float32)
    kq = tl.zeros([TP, TP], dtype=tl.float32)
    for i in tl.static_range(TP):
        sel = o_t == i
        q_i = tl.sum(tl.where(sel[:, None], q_hat, 0.0), axis=0)
        k_i = tl.sum(tl.where(sel[:, None], k_hat, 0.0), axis=0)
        kk, kq = _gram_column(kk, kq, k_hat, q_i, k_i, sel[None, :])
    return kk, kq


@triton.jit
def _gdn_verify_scores_kernel(
    qkv, k_ring, state_indices, wp, origin, flush, sc,
    scale, null_slot,
    stride_idx, stride_wp, stride_org, stride_fl,
    stride_x0, stride_x1,
    stride_k0, stride_k1, stride_k2,
    stride_sc0, stride_sc1,
    HK: tl.constexpr, K: tl.constexpr, R: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, LP: tl.constexpr, TP: tl.constexpr, USE_L2NORM: tl.constexpr, EPS: tl.constexpr,
    PDL: tl.constexpr,
):
    """scores: pre.  Per (row, k-head), fp32 rows of ``sc[row, hk]``: [0, LP) hq[j, i] = k^_j.q^_i and
    [LP, 2LP) hk[j, i] = k^_j.k^_i of the history (zero on flush rows, whose history is folded),
    then [2LP, 2LP+TP) kk[j, i] = k^_j.k^_i and [2LP+TP, 2LP+2TP) kq[j, i] = k^_j.q^_i of the window.
    ``PDL``: the main kernel, a programmatic dependent of this one, may start scheduling at once."""
    pdl_trigger(PDL)
    i_n = tl.program_id(0).to(tl.int64)
    i_hk = tl.program_id(1)
    slot = tl.load(state_indices + i_n * stride_idx).to(tl.int64)
    if (slot < 0) | (slot == null_slot):
        return
    w = tl.minimum(tl.maximum(tl.load(wp + slot * stride_wp).to(tl.int32), 0), R - T)
    org = tl.minimum(tl.maximum(tl.load(origin + slot * stride_org).to(tl.int32), 0), R - 1)
    fl = tl.load(flush + slot * stride_fl) != 0
    w_hist = tl.where(fl, 0, w)
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    o_j = tl.arange(0, LP)
    o_t = tl.arange(0, TP)
    mask_tk = (o_t < T)[:, None] & mask_k[None, :]
    x_row = qkv + i_n * stride_x0
    q_hat = _normalise_rows(tl.load(x_row + o_t[:, None] * stride_x1 + i_hk * K + o_k[None, :], mask=mask_tk,
                                    other=0), USE_L2NORM, EPS) * scale
    k_hat = _normalise_rows(tl.load(x_row + o_t[:, None] * stride_x1 + HK * K + i_hk * K + o_k[None, :],
                                    mask=mask_tk, other=0), USE_L2NORM, EPS)
    k_head = k_ring + slot * stride_k0 + i_hk * stride_k1
    hq, hk = _history_key_scores(k_head, stride_k2, org, w_hist, R, q_hat, k_hat, o_j, o_k, mask_k,
                                 LP, TP, USE_L2NORM, EPS)
    kk, kq = _window_gram(o_t, q_hat, k_hat, TP)
    base = sc + i_n * stride_sc0 + i_hk * stride_sc1
    tl.store(base + o_j[:, None] * TP + o_t[None, :], hq)
    tl.store(base + (LP + o_j)[:, None] * TP + o_t[None, :], hk)
    tl.store(base + (2 * LP + o_t)[:, None] * TP + o_t[None, :], kk)
    tl.store(base + (2 * LP + TP + o_t)[:, None] * TP + o_t[None, :], kq)


@triton.jit
def _load_scores(sc_base, o_j, o_t, LP: tl.constexpr, TP: tl.constexpr):
    """The scores pre-kernel's rows of one (row, k-head): hq, hk [LP, TP], kk, kq [TP, TP]."""
    hq = tl.load(sc_base + o_j[:, None] * TP + o_t[None, :])
    hk = tl.load(sc_base + (LP + o_j)[:, None] * TP + o_t[None, :])
    kk = tl.load(sc_base + (2 * LP + o_t)[:, None] * TP + o_t[None, :])
    kq = tl.load(sc_base + (2 * LP + TP + o_t)[:, None] * TP + o_t[None, :])
    return hq, hk, kk, kq


@triton.jit
def _fold_history_dot(s, eG, c, d_hist, k_head, stride_k2, ph, valid, o_k, mask_k,
                      USE_L2NORM: tl.constexpr, EPS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """S_c = e^G s + sum_j c_j d_j k^_j^T as one tl.dot [BV, LP] x [LP, BK]: s [BV, BK] fp32, d_hist [BV, LP]
    fp32, the history's raw keys read at physical ring rows ph (masked by valid) and normalised here."""
    k_hist = tl.load(k_head + ph[:, None] * stride_k2 + o_k[None, :], mask=valid[:, None] & mask_k[None, :], other=0)
    k_hist = _normalise_rows(k_hist, USE_L2NORM, EPS)
    return eG * s + tl.dot(d_hist * c[None, :], k_hist, input_precision=DOT_PRECISION)


@triton.jit
def _verify_window_loads(qkv, a, b, A_log, dt_bias, i_n, i_hv, i_hk, o_t, mask_t, o_k, mask_k,
                         stride_x0, stride_x1, stride_a0, stride_a1, stride_b0, stride_b1, HK: tl.constexpr,
                         K: tl.constexpr):
    """The window's raw inputs of one (row, v-head): q, k [TP, BK], a, b [TP], A_log, dt_bias."""
    x_row = qkv + i_n * stride_x0
    mask_tk = mask_t[:, None] & mask_k[None, :]
    q_win = tl.load(x_row + o_t[:, None] * stride_x1 + i_hk * K + o_k[None, :], mask=mask_tk, other=0)
    k_raw = tl.load(x_row + o_t[:, None] * stride_x1 + HK * K + i_hk * K + o_k[None, :], mask=mask_tk, other=0)
    a_win = tl.load(a + i_n * stride_a0 + o_t * stride_a1 + i_hv, mask=mask_t, other=0)
    b_win = tl.load(b + i_n * stride_b0 + o_t * stride_b1 + i_hv, mask=mask_t, other=0)
    A_log_val = tl.load(A_log + i_hv)
    dt_bias_val = tl.load(dt_bias + i_hv)
    return q_win, k_raw, a_win, b_win, A_log_val, dt_bias_val


@triton.jit
def _verify_window_math(q_win, k_raw, a_win, b_win, A_log_val, dt_bias_val, k_head, g_head, i_v, i_hv, o_t, mask_t,
                        o_k, mask_k, pw, scale, stride_k2, stride_g2, HK: tl.constexpr, HV: tl.constexpr,
                        USE_L2NORM: tl.constexpr, ROUND_BETA: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr,
                        EPS: tl.constexpr):
    """From the window's raw inputs: the gates g [TP] (0 past T) and beta; the window's g (one writer per
    (row, v-head): V tile 0) and raw k (one per (row, k-head)) go to the ring at physical rows pw now (disjoint from
    the history every program reads); returns g, beta, q^ (scaled), k^."""
    mask_tk = mask_t[:, None] & mask_k[None, :]
    g_win, beta_r = _gdn_gate(a_win, b_win, A_log_val, dt_bias_val, SOFTPLUS_THRESHOLD)
    g_win = tl.where(mask_t, g_win, 0.0)
    if ROUND_BETA:
        beta = beta_r
    else:
        beta = tl.sigmoid(b_win.to(tl.float32))
    if i_v == 0:
        tl.store(g_head + pw * stride_g2, g_win, mask=mask_t)
        if i_hv % (HV // HK) == 0:
            tl.store(k_head + pw[:, None] * stride_k2 + o_k[None, :], k_raw.to(k_head.dtype.element_ty),
                     mask=mask_tk)
    q_hat = _normalise_rows(q_win, USE_L2NORM, EPS) * scale  # [TP, BK] fp32
    k_hat = _normalise_rows(k_raw, USE_L2NORM, EPS)
    return g_win, beta, q_hat, k_hat


@triton.jit
def _verify_window_inputs(qkv, a, b, A_log, dt_bias, k_head, g_head, i_n, i_v, i_hv, i_hk, o_t, mask_t, o_k, mask_k,
                          pw, scale, stride_x0, stride_x1, stride_a0, stride_a1, stride_b0, stride_b1, stride_k2,
                          stride_g2, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, USE_L2NORM: tl.constexpr,
                          ROUND_BETA: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr, EPS: tl.constexpr):
    """The window's inputs of one (row, v-head): :func:`_verify_window_loads`, then :func:`_verify_window_math`
    (loads q, k [TP, BK], a, b [TP]; returns g, beta, q^ (scaled), k^; writes the window's g and raw k to the ring)."""
    q_win, k_raw, a_win, b_win, A_log_val, dt_bias_val = _verify_window_loads(
        qkv, a, b, A_log, dt_bias, i_n, i_hv, i_hk, o_t, mask_t, o_k, mask_k,
        stride_x0, stride_x1, stride_a0, stride_a1, stride_b0, stride_b1, HK, K)
    return _verify_window_math(q_win, k_raw, a_win, b_win, A_log_val, dt_bias_val, k_head, g_head, i_v, i_hv, o_t,
                               mask_t, o_k, mask_k, pw, scale, stride_k2, stride_g2, HK, HV, USE_L2NORM, ROUND_BETA,
                               SOFTPLUS_THRESHOLD, EPS)


@triton.jit
def _token_coeffs(i, o_t, beta, g_win, kk, kq, anc, TP: tl.constexpr, IS_TREE: tl.constexpr):
    """Window token i's scalars of the forward substitution: beta_i, e^{Gamma_i}, the row
    a[j] = beta_i e^{Gamma_i - Gamma_j} (k^_j . k^_i) (j < i) and w[j] = e^{Gamma_i - Gamma_j} (k^_j . q^_i)."""
    sel = o_t == i
    col = sel[None, :]
    beta_i = tl.sum(tl.where(sel, beta, 0.0), axis=0)
    if IS_TREE:
        on_path = tl.sum(tl.where(col, anc, 0.0), axis=1) > 0.5
        cw, e_gam = _history_weights(tl.where(on_path, g_win, 0.0), i + 1, TP)
        cw = tl.where(on_path, cw, 0.0)
    else:
        cw, e_gam = _history_weights(tl.where(o_t <= i, g_win, 0.0), i + 1, TP)
    kk_i = tl.sum(tl.where(col, kk, 0.0), axis=1)
    kq_i = tl.sum(tl.where(col, kq, 0.0), axis=1)
    return beta_i, e_gam, tl.where(o_t < i, beta_i * cw * kk_i, 0.0), cw * kq_i


@triton.jit
def _vloop_fma_dots(s, q3, k3, d_hist, hq, hk, eG, c, o_t, BV: tl.constexpr, TP: tl.constexpr, KS: tl.constexpr,
                    KW: tl.constexpr):
    """A verify row's window dots against a [BV, KS, KW] state tile on the CUDA cores (fp32 FMAs, row reductions):
    e^G s.q^_i plus the history's sum_j c_j d_j k^_j.q^_i for every token i (likewise k^_i); returns [BV, TP] each."""
    s_q = tl.zeros([BV, TP], dtype=tl.float32)
    s_k = tl.zeros([BV, TP], dtype=tl.float32)
    for i in tl.static_range(TP):
        sel = o_t == i
        col = sel[None, :]
        q_i = tl.sum(tl.where(sel[:, None, None], q3, 0.0), axis=0)  # [KS, KW]
        k_i = tl.sum(tl.where(sel[:, None, None], k3, 0.0), axis=0)
        # [BV]: one reduction over the [KS, KW] row (a lane's products summed in one FMA chain)
        sq_i = tl.sum(tl.reshape(s * q_i[None, :, :], [BV, KS * KW]), axis=1)
        sk_i = tl.sum(tl.reshape(s * k_i[None, :, :], [BV, KS * KW]), axis=1)
        hq_i = tl.sum(tl.where(col, hq, 0.0), axis=1)  # [LP]
        hk_i = tl.sum(tl.where(col, hk, 0.0), axis=1)
        sq_i = eG * sq_i + tl.sum(d_hist * (c * hq_i)[None, :], axis=1)
        sk_i = eG * sk_i + tl.sum(d_hist * (c * hk_i)[None, :], axis=1)
        s_q = tl.where(col, sq_i[:, None], s_q)
        s_k = tl.where(col, sk_i[:, None], s_k)
    return s_q, s_k


@triton.jit
def _gdn_vloop_tile(v0, s_head, stride_s2, d_head, stride_d2, k_head, stride_k2, v_row, stride_x1,
                    out_row, stride_o1, o_k, mask_k, o_k3, mask_k3, valid, o_t, mask_t, ph, pw, q3, k3, hq, hk, eG, c,
                    cd, beta, coef_e, coef_a, coef_w, qk2, qk_lo, hc2,
                    V: tl.constexpr, T: tl.constexpr, BV: tl.constexpr, TP: tl.constexpr, KS: tl.constexpr,
                    KW: tl.constexpr, FOLD: tl.constexpr, WDOT: tl.constexpr):
    """One value tile (BV rows) of a (row, v-head) in ``v_loop``, held as [BV, KS, KW] (the K row cut in KS
    parts of KW: fewer lanes share a row's K, so its dot products take fewer shuffles): the checkpoint tile
    (folded and stored on a flush row, ``FOLD``), the window's dots against it, the forward substitution (its
    per-token scalars computed once per program), and the tile's out and ring d."""
    o_v = v0 + tl.arange(0, BV)
    mask_v = o_v < V
    if FOLD:
        # the fold on the tensor cores: e^G S + (d_hist * cd) [BV, LP] x k_hist [LP, K] (hi/lo split, tf32 passes),
        # stored; then the window's dots against the stored checkpoint (empty history) on the tensor cores too
        d_hist = tl.load(d_head + ph[None, :] * stride_d2 + o_v[:, None], mask=mask_v[:, None] & valid[None, :],
                         other=0).to(tl.float32)
        kh = tl.load(k_head + ph[:, None] * stride_k2 + o_k[None, :], mask=valid[:, None] & mask_k[None, :],
                     other=0).to(tl.float32)
        kh_hi, kh_lo = tf32_split(kh)
        s2 = tl.load(s_head + o_v[:, None] * stride_s2 + o_k[None, :], mask=mask_v[:, None] & mask_k[None, :],
                     other=0).to(tl.float32)
        s2 = split_dot(d_hist * cd[None, :], kh_hi, kh_lo, eG * s2, tl.float32)
        s_st = _cast_rtne(s2, s_head.dtype.element_ty)
        tl.store(s_head + o_v[:, None] * stride_s2 + o_k[None, :], s_st, mask=mask_v[:, None] & mask_k[None, :])
        acc = split_dot(s_st.to(tl.float32), qk2, qk_lo, tl.zeros([BV, 2 * TP], dtype=tl.float32),
                        s_head.dtype.element_ty)
        s_q, s_k = tl.split(tl.reshape(acc, [BV, TP, 2]))
    elif WDOT:  # a verify row's tile, loaded as the dot's operand
        # the window's dots on the tensor cores: e^G [BV, K] x [K, 2TP] (columns q^_i, k^_i interleaved) plus the
        # history's [BV, LP] x [LP, 2TP] (c_j k^_j.q^_i, c_j k^_j.k^_i)
        s2 = tl.load(s_head + o_v[:, None] * stride_s2 + o_k[None, :], mask=mask_v[:, None] & mask_k[None, :],
                     other=0).to(tl.float32)
        d_hist = tl.load(d_head + ph[None, :] * stride_d2 + o_v[:, None], mask=mask_v[:, None] & valid[None, :],
                         other=0).to(tl.float32)
        hc_hi, hc_lo = tf32_split(hc2)
        acc = split_dot(s2, qk2, qk_lo, tl.zeros([BV, 2 * TP], dtype=tl.float32), s_head.dtype.element_ty)
        acc = split_dot(d_hist, hc_hi, hc_lo, eG * acc, d_head.dtype.element_ty)
        s_q, s_k = tl.split(tl.reshape(acc, [BV, TP, 2]))
    else:  # a verify row's tile, its window dots on the CUDA cores
        s = tl.load(s_head + o_v[:, None, None] * stride_s2 + o_k3[None, :, :],
                    mask=mask_v[:, None, None] & mask_k3[None, :, :], other=0).to(tl.float32)
        d_hist = tl.load(d_head + ph[None, :] * stride_d2 + o_v[:, None], mask=mask_v[:, None] & valid[None, :],
                         other=0).to(tl.float32)
        s_q, s_k = _vloop_fma_dots(s, q3, k3, d_hist, hq, hk, eG, c, o_t, BV, TP, KS, KW)
    d_win = tl.zeros([BV, TP], dtype=tl.float32)
    o_win = tl.zeros([BV, TP], dtype=tl.float32)
    for i in tl.static_range(T):
        sel = o_t == i
        col = sel[None, :]
        beta_i = tl.sum(tl.where(sel, beta, 0.0), axis=0)
        e_gam = tl.sum(tl.where(sel, coef_e, 0.0), axis=0)
        a_row = tl.sum(tl.where(sel[:, None], coef_a, 0.0), axis=0)
        w_row = tl.sum(tl.where(sel[:, None], coef_w, 0.0), axis=0)
        v_i = tl.load(v_row + i * stride_x1 + o_v, mask=mask_v, other=0).to(tl.float32)
        r_i = beta_i * (v_i - e_gam * tl.sum(tl.where(col, s_k, 0.0), axis=1))
        d_i = r_i - tl.sum(d_win * a_row[None, :], axis=1)
        d_win = tl.where(col, d_i[:, None], d_win)
        o_i = e_gam * tl.sum(tl.where(col, s_q, 0.0), axis=1) + tl.sum(d_win * w_row[None, :], axis=1)
        o_win = tl.where(col, o_i[:, None], o_win)
    mask_vt = mask_v[:, None] & mask_t[None, :]
    tl.store(out_row + o_t[None, :] * stride_o1 + o_v[:, None], _cast_rtne(o_win, out_row.dtype.element_ty),
             mask=mask_vt)
    tl.store(d_head + pw[None, :] * stride_d2 + o_v[:, None], _cast_rtne(d_win, d_head.dtype.element_ty),
             mask=mask_vt)


@triton.jit
def _gdn_verify_kernel(
    qkv, a, b, A_log, dt_bias,
    state, d_ring, k_ring, g_ring,
    state_indices, wp, origin, flush, out, sc, parents,
    scale, null_slot,
    stride_idx, stride_wp, stride_org, stride_fl,
    stride_x0, stride_x1,
    stride_a0, stride_a1, stride_b0, stride_b1,
    stride_s0, stride_s1, stride_s2,
    stride_d0, stride_d1, stride_d2,
    stride_k0, stride_k1, stride_k2,
    stride_g0, stride_g1, stride_g2,
    stride_o0, stride_o1, stride_o2,
    stride_sc0, stride_sc1, stride_p0, stride_p1,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr, TP: tl.constexpr,
    USE_L2NORM: tl.constexpr, ROUND_BETA: tl.constexpr, FLUSH_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SOFTPLUS_THRESHOLD: tl.constexpr, EPS: tl.constexpr, PER_TOKEN: tl.constexpr, SCORES_PRE: tl.constexpr,
    IS_TREE: tl.constexpr, LOG_TP: tl.constexpr, VL: tl.constexpr, V_STAGES: tl.constexpr, KS: tl.constexpr,
    WDOT: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr, PDL_NEXT: tl.constexpr,
):
    """One program per VL value tiles (BV rows each) of a (row, v-head).  VL == 1: the tile is held as [BV, K];
    VL > 1 (``v_loop``): what does not depend on the value rows (gates, q^/k^, key scores, Gram, the
    substitution's per-token scalars, a flush's key norms) is computed once per program and the tiles, each
    held as [BV, KS, K / KS], run in a loop (:func:`_gdn_vloop_tile`).  ROWS: 0 every row, 1 the rows that fold
    no history (verify rows, flushes of an empty history), 2 the rows that do (``flush_rows: separate``); the other
    rows' programs return at once.  ``PDL``: launched as the programmatic dependent of the kernel before it (every
    program waits for that kernel before it reads its scores, stores anything or returns); ``PDL_NEXT``: the next
    launch is this one's dependent and may start scheduling at once."""
    pdl_trigger(PDL_NEXT)
    i_v = tl.program_id(0)
    i_n = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2)
    i_hk = i_hv // (HV // HK)

    slot = tl.load(state_indices + i_n * stride_idx).to(tl.int64)
    if (slot < 0) | (slot == null_slot):
        pdl_wait(PDL)
        return  # padded / null row: nothing is written
    # the slot's cursor (w history tokens from ring position org; flush: fold the history first)
    w = tl.load(wp + slot * stride_wp).to(tl.int32)
    org = tl.load(origin + slot * stride_org).to(tl.int32)
    is_flush = tl.load(flush + slot * stride_fl) != 0
    w = tl.minimum(tl.maximum(w, 0), R - T)  # memory safety only (the commit rule keeps w + T <= R)
    org = tl.minimum(tl.maximum(org, 0), R - 1)
    fold = is_flush & (w > 0)  # a flush of an empty history is a verify from the checkpoint
    if ROWS == 1:
        if fold:
            pdl_wait(PDL)
            return  # a folding row: the other launch's
    if ROWS == 2:
        if not fold:
            pdl_wait(PDL)
            return

    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    o_j = tl.arange(0, LP)
    valid = o_j < w
    o_t = tl.arange(0, TP)
    mask_t = o_t < T
    # physical ring indices of history position j and window token i: org + j < 2R on every lane a mask lets
    # through (j < w <= R - T; i < T), so one conditional subtract
    ph = tl.where(org + o_j >= R, org + o_j - R, org + o_j)
    pw = tl.where(org + w + o_t >= R, org + w + o_t - R, org + w + o_t)

    s_head = state + slot * stride_s0 + i_hv * stride_s1
    d_head = d_ring + slot * stride_d0 + i_hv * stride_d1
    k_head = k_ring + slot * stride_k0 + i_hk * stride_k1
    g_head = g_ring + slot * stride_g0 + i_hv * stride_g1
    v_row = qkv + i_n * stride_x0 + 2 * HK * K + i_hv * V
    out_row = out + i_n * stride_o0 + i_hv * stride_o2
    if VL == 1:
        pdl_wait(PDL)
        o_v = i_v * BV + tl.arange(0, BV)
        mask_v = o_v < V

        # ---- loads: checkpoint tile, history (g, d slice); the window's inputs, gates and ring entries ----
        s_ck = tl.load(s_head + o_v[:, None] * stride_s2 + o_k[None, :], mask=mask_v[:, None] & mask_k[None, :],
                       other=0)
        g_hist = tl.load(g_head + ph * stride_g2, mask=valid, other=0.0)
        d_hist = tl.load(d_head + ph[None, :] * stride_d2 + o_v[:, None], mask=mask_v[:, None] & valid[None, :],
                         other=0)
        g_win, beta, q_hat, k_hat = _verify_window_inputs(
            qkv, a, b, A_log, dt_bias, k_head, g_head, i_n, i_v, i_hv, i_hk, o_t, mask_t, o_k, mask_k, pw, scale,
            stride_x0, stride_x1, stride_a0, stride_a1, stride_b0, stride_b1, stride_k2, stride_g2,
            HK, HV, K, USE_L2NORM, ROUND_BETA, SOFTPLUS_THRESHOLD, EPS)

        # ---- history replay weights c_j = e^{G - G_j}, e^G ----
        c, eG = _history_weights(g_hist, w, LP)
        d_hist = d_hist.to(tl.float32)
        s = s_ck.to(tl.float32)
        # history scores of the window vectors, hq[j, i] = k^_j . q^_i and hk[j, i] = k^_j . k^_i
        # (verify rows; zero on flush rows, whose history is folded into s instead)
        hq = tl.zeros([LP, TP], dtype=tl.float32)
        hk = tl.zeros([LP, TP], dtype=tl.float32)
        if is_flush:
            # ---- flush: S_c = e^G S_ck + sum_j c_j d_j k^_j^T becomes the checkpoint ----
            if w > 0:
                if FLUSH_DOT:
                    s = _fold_history_dot(s, eG, c, d_hist, k_head, stride_k2, ph, valid, o_k, mask_k,
                                          USE_L2NORM, EPS, DOT_PRECISION)
                else:
                    s = eG * s
                    for j in range(0, w):  # exact fp32 rank-1 updates (d_j, k_j re-read: L1-resident)
                        p_j = (org + j) % R
                        c_j = tl.sum(tl.where(o_j == j, c, 0.0), axis=0)
                        d_j = tl.load(d_head + p_j * stride_d2 + o_v, mask=mask_v, other=0).to(tl.float32)
                        k_j = _l2norm_vec(tl.load(k_head + p_j * stride_k2 + o_k, mask=mask_k, other=0).to(tl.float32),
                                          USE_L2NORM, EPS)
                        s += (c_j * d_j)[:, None] * k_j[None, :]
                s_st = _cast_rtne(s, s_head.dtype.element_ty)
                tl.store(s_head + o_v[:, None] * stride_s2 + o_k[None, :], s_st, mask=mask_v[:, None] & mask_k[None, :])
                s = s_st.to(tl.float32)  # the window runs on the stored checkpoint
        elif not SCORES_PRE:
            # ---- verify: the history key scores, streamed once ----
            hq, hk = _history_key_scores(k_head, stride_k2, org, w, R, q_hat, k_hat, o_j, o_k, mask_k,
                                         LP, TP, USE_L2NORM, EPS)
        if SCORES_PRE:
            sc_base = sc + i_n * stride_sc0 + i_hk * stride_sc1
            hq = tl.load(sc_base + o_j[:, None] * TP + o_t[None, :])
            hk = tl.load(sc_base + (LP + o_j)[:, None] * TP + o_t[None, :])
        # with a flush the history is folded: S_c x = s x
        eG_x = tl.where(is_flush, 1.0, eG)
        c_x = tl.where(is_flush, 0.0, c)

        # ---- window, part 1 (independent of the solve), all tokens at once:
        # S_c q^_i, S_c k^_i (checkpoint tile + replayed history) and the Gram entries
        # kk[j, i] = k^_j . k^_i, kq[j, i] = k^_j . q^_i ----
        if PER_TOKEN:
            s_q = tl.zeros([BV, TP], dtype=tl.float32)
            s_k = tl.zeros([BV, TP], dtype=tl.float32)
            kk = tl.zeros([TP, TP], dtype=tl.float32)
            kq = tl.zeros([TP, TP], dtype=tl.float32)
            for i in tl.static_range(TP):
                sel = o_t == i
                col = sel[None, :]
                q_i = tl.sum(tl.where(sel[:, None], q_hat, 0.0), axis=0)  # [BK]
                k_i = tl.sum(tl.where(sel[:, None], k_hat, 0.0), axis=0)
                hq_i = tl.sum(tl.where(col, hq, 0.0), axis=1)  # [LP]
                hk_i = tl.sum(tl.where(col, hk, 0.0), axis=1)
                sq_i = eG_x * tl.sum(s * q_i[None, :], axis=1) + tl.sum(d_hist * (c_x * hq_i)[None, :], axis=1)
                sk_i = eG_x * tl.sum(s * k_i[None, :], axis=1) + tl.sum(d_hist * (c_x * hk_i)[None, :], axis=1)
                s_q = tl.where(col, sq_i[:, None], s_q)
                s_k = tl.where(col, sk_i[:, None], s_k)
                if not SCORES_PRE:
                    kk, kq = _gram_column(kk, kq, k_hat, q_i, k_i, col)
        else:
            s_q = tl.sum(s[:, None, :] * q_hat[None, :, :], axis=2)  # [BV, TP]
            s_k = tl.sum(s[:, None, :] * k_hat[None, :, :], axis=2)
            s_q = eG_x * s_q + tl.sum(d_hist[:, :, None] * (c_x[:, None] * hq)[None, :, :], axis=1)
            s_k = eG_x * s_k + tl.sum(d_hist[:, :, None] * (c_x[:, None] * hk)[None, :, :], axis=1)
            if not SCORES_PRE:
                kk = tl.sum(k_hat[:, None, :] * k_hat[None, :, :], axis=2)  # [TP, TP]
                kq = tl.sum(k_hat[:, None, :] * q_hat[None, :, :], axis=2)
        if SCORES_PRE:
            kk = tl.load(sc_base + (2 * LP + o_t)[:, None] * TP + o_t[None, :])
            kq = tl.load(sc_base + (2 * LP + TP + o_t)[:, None] * TP + o_t[None, :])

        if IS_TREE:
            # ---- tree: anc[j, i] = 1 when node j is on the path root..i (i included) ----
            anc = _tree_ancestor_mask(parents + i_n * stride_p0, stride_p1, T, TP, LOG_TP)

        # ---- window, part 2: UT forward substitution, one token (tree: node) at a time ----
        d_win = tl.zeros([BV, TP], dtype=tl.float32)
        o_win = tl.zeros([BV, TP], dtype=tl.float32)
        for i in tl.static_range(T):
            sel = o_t == i
            col = sel[None, :]
            beta_i = tl.sum(tl.where(sel, beta, 0.0), axis=0)
            v_i = tl.load(v_row + i * stride_x1 + o_v, mask=mask_v, other=0).to(tl.float32)
            if IS_TREE:
                # path decays: the chain's sums over the g of the nodes on the path root..i only, cw_j = 0 off the path
                # (ancestors precede i, so the Gram and the substitution below are the chain's, restricted by cw)
                on_path = tl.sum(tl.where(col, anc, 0.0), axis=1) > 0.5
                cw, e_gam = _history_weights(tl.where(on_path, g_win, 0.0), i + 1, TP)
                cw = tl.where(on_path, cw, 0.0)
            else:
                # window decays: cw_j = e^{Gamma_i - Gamma_j} (j <= i, 0 past i), e^{Gamma_i}; the exponents summed
                # directly over g_{j+1..i} (_history_weights). Not one [TP, TP] cumsum before the loop: Triton 3.6 fails
                # to lower that 2-D scan for one-warp programs (ScanOpToLLVM assertion; eval.verify_sass gdn/t1)
                cw, e_gam = _history_weights(tl.where(o_t <= i, g_win, 0.0), i + 1, TP)
            kk_i = tl.sum(tl.where(col, kk, 0.0), axis=1)  # k^_j . k^_i over j
            kq_i = tl.sum(tl.where(col, kq, 0.0), axis=1)  # k^_j . q^_i over j
            r_i = beta_i * (v_i - e_gam * tl.sum(tl.where(col, s_k, 0.0), axis=1))
            a_row = tl.where(o_t < i, beta_i * cw * kk_i, 0.0)
            d_i = r_i - tl.sum(d_win * a_row[None, :], axis=1)
            d_win = tl.where(col, d_i[:, None], d_win)
            o_i = e_gam * tl.sum(tl.where(col, s_q, 0.0), axis=1) + tl.sum(d_win * (cw * kq_i)[None, :], axis=1)
            o_win = tl.where(col, o_i[:, None], o_win)

        # ---- outputs of every window token, the window's d slice into the ring ----
        mask_vt = mask_v[:, None] & mask_t[None, :]
        tl.store(out_row + o_t[None, :] * stride_o1 + o_v[:, None], _cast_rtne(o_win, out_row.dtype.element_ty),
                 mask=mask_vt)
        tl.store(d_head + pw[None, :] * stride_d2 + o_v[:, None], _cast_rtne(d_win, d_head.dtype.element_ty),
                 mask=mask_vt)
    else:
        x_row = qkv + i_n * stride_x0

        g_hist = tl.load(g_head + ph * stride_g2, mask=valid, other=0.0)
        # the window's q^, k^ again as [TP, KS, KW] (K cut in KS parts), the form the value tiles take
        KW: tl.constexpr = BK // KS
        o_k3 = tl.arange(0, KS)[:, None] * KW + tl.arange(0, KW)[None, :]
        mask_k3 = o_k3 < K
        mask_tk3 = mask_t[:, None, None] & mask_k3[None, :, :]
        # every load of the prologue is issued before its math and its ring stores (a store keeps the loads after
        # it behind it): the window's inputs, its q / k as tiles, the pre-kernel's scores and a flush's history keys
        # (their norms) come in one round trip with the gates of the history. This won on the H200 over the chained
        # order and over reading the slot and cursors from a per-row copy (eval/results/spec-variants-h200/, round 15)
        q_win, k_raw, a_win, b_win, A_log_val, dt_bias_val = _verify_window_loads(
            qkv, a, b, A_log, dt_bias, i_n, i_hv, i_hk, o_t, mask_t, o_k, mask_k,
            stride_x0, stride_x1, stride_a0, stride_a1, stride_b0, stride_b1, HK, K)
        q3_raw = tl.load(x_row + o_t[:, None, None] * stride_x1 + i_hk * K + o_k3[None, :, :], mask=mask_tk3,
                         other=0)
        k3_raw = tl.load(x_row + o_t[:, None, None] * stride_x1 + HK * K + i_hk * K + o_k3[None, :, :],
                         mask=mask_tk3, other=0)
        # PDL: the loads above read what the kernel before this launch does not write (the window's inputs; the
        # gates of this row's own history); its scores, and every store, come after the wait
        pdl_wait(PDL)
        if SCORES_PRE:
            hq_pre, hk_pre, kk_pre, kq_pre = _load_scores(sc + i_n * stride_sc0 + i_hk * stride_sc1, o_j, o_t,
                                                          LP, TP)
        if USE_L2NORM and ROWS != 1:  # a flush's history keys, all at once (squared norms, K chunk by chunk)
            fold_j = valid & fold
            knorm2 = tl.zeros([LP], dtype=tl.float32)
            for kc in tl.static_range(0, BK, KW):
                o_kc = kc + tl.arange(0, KW)
                kj = tl.load(k_head + ph[:, None] * stride_k2 + o_kc[None, :],
                             mask=fold_j[:, None] & (o_kc < K)[None, :], other=0).to(tl.float32)
                knorm2 += tl.sum(kj * kj, axis=1)
        g_win, beta, q_hat, k_hat = _verify_window_math(
            q_win, k_raw, a_win, b_win, A_log_val, dt_bias_val, k_head, g_head, i_v, i_hv, o_t, mask_t, o_k,
            mask_k, pw, scale, stride_k2, stride_g2, HK, HV, USE_L2NORM, ROUND_BETA, SOFTPLUS_THRESHOLD, EPS)
        q3 = q3_raw.to(tl.float32)
        k3 = k3_raw.to(tl.float32)
        c, eG = _history_weights(g_hist, w, LP)
        if USE_L2NORM:
            q3 = q3 / tl.sqrt(tl.sum(tl.sum(q3 * q3, axis=2), axis=1) + EPS)[:, None, None]
            k3 = k3 / tl.sqrt(tl.sum(tl.sum(k3 * k3, axis=2), axis=1) + EPS)[:, None, None]
        q3 = q3 * scale

        # key scores of the history (verify rows) and the window Gram, once per program
        hq = tl.zeros([LP, TP], dtype=tl.float32)
        hk = tl.zeros([LP, TP], dtype=tl.float32)
        cd = c  # a flush's fold coefficients c_j / sqrt(|k_j|^2 + eps)
        if SCORES_PRE:
            hq, hk, kk, kq = hq_pre, hk_pre, kk_pre, kq_pre
        else:
            if not is_flush:
                hq, hk = _history_key_scores(k_head, stride_k2, org, w, R, q_hat, k_hat, o_j, o_k, mask_k,
                                             LP, TP, USE_L2NORM, EPS)
            kk, kq = _window_gram(o_t, q_hat, k_hat, TP)
        if USE_L2NORM and ROWS != 1:
            cd = tl.where(fold_j, c / tl.sqrt(knorm2 + EPS), c)

        if IS_TREE:
            anc = _tree_ancestor_mask(parents + i_n * stride_p0, stride_p1, T, TP, LOG_TP)
        else:
            anc = kk  # unused
        # the forward substitution's per-token scalars: row i of coef_a / coef_w, entry i of coef_e
        coef_e = tl.zeros([TP], dtype=tl.float32)
        coef_a = tl.zeros([TP, TP], dtype=tl.float32)
        coef_w = tl.zeros([TP, TP], dtype=tl.float32)
        for i in tl.static_range(T):
            beta_i, e_gam, a_row, w_row = _token_coeffs(i, o_t, beta, g_win, kk, kq, anc, TP, IS_TREE)
            row = (o_t == i)[:, None]
            coef_e = tl.where(o_t == i, e_gam, coef_e)
            coef_a = tl.where(row, a_row[None, :], coef_a)
            coef_w = tl.where(row, w_row[None, :], coef_w)

        if WDOT or ROWS != 1:  # the window's dot operands (see _gdn_vloop_tile), once per program
            qk2, qk_lo = tf32_split(tl.reshape(tl.join(tl.trans(q_hat), tl.trans(k_hat)), [BK, 2 * TP]))
            hc2 = tl.reshape(tl.join(c[:, None] * hq, c[:, None] * hk), [LP, 2 * TP])
        else:
            qk_lo = q_hat  # unused
            qk2 = q_hat  # unused
            hc2 = hq
        v_base = i_v * (VL * BV)
        if ROWS != 0:  # one kind of row, known when compiling
            FOLD_ROWS: tl.constexpr = ROWS == 2
            for vi in tl.range(0, VL, num_stages=V_STAGES):
                _gdn_vloop_tile(v_base + vi * BV, s_head, stride_s2, d_head, stride_d2, k_head, stride_k2, v_row,
                                stride_x1, out_row, stride_o1, o_k, mask_k, o_k3, mask_k3, valid, o_t, mask_t, ph, pw,
                                q3, k3, hq, hk, eG, c, cd, beta, coef_e, coef_a, coef_w, qk2, qk_lo, hc2,
                                V, T, BV, TP, KS, KW, FOLD_ROWS, WDOT)
        elif fold:
            for vi in tl.range(0, VL, num_stages=V_STAGES):
                _gdn_vloop_tile(v_base + vi * BV, s_head, stride_s2, d_head, stride_d2, k_head, stride_k2, v_row,
                                stride_x1, out_row, stride_o1, o_k, mask_k, o_k3, mask_k3, valid, o_t, mask_t, ph, pw,
                                q3, k3, hq, hk, eG, c, cd, beta, coef_e, coef_a, coef_w, qk2, qk_lo, hc2,
                                V, T, BV, TP, KS, KW, True, WDOT)
        else:
            for vi in tl.range(0, VL, num_stages=V_STAGES):
                _gdn_vloop_tile(v_base + vi * BV, s_head, stride_s2, d_head, stride_d2, k_head, stride_k2, v_row,
                                stride_x1, out_row, stride_o1, o_k, mask_k, o_k3, mask_k3, valid, o_t, mask_t, ph, pw,
                                q3, k3, hq, hk, eG, c, cd, beta, coef_e, coef_a, coef_w, qk2, qk_lo, hc2,
                                V, T, BV, TP, KS, KW, False, WDOT)


# ----------------------------------------------------------------------------------
# wrapper
# ----------------------------------------------------------------------------------
_CFG_CACHE: Dict[Tuple[Tuple[str, ...], str], Dict[str, Any]] = {}


def gdn_verify_launch_params(HV: int, Hk: int, K: int, V: int, R: int, T: int, state_dtype=None) -> Dict[str, Any]:
    """Launch parameters for a geometry (cached per config file; YAML via ``launch_config``; a
    ``..._S{dtype}`` entry for the state dtype wins over the plain geometry key)."""
    keys = config_keys(gdn_verify_key(HV, Hk, K, V, R, T), state_dtype)
    ck = (keys, str(config_file()))
    cfg = _CFG_CACHE.get(ck)
    if cfg is None:
        cfg = launch_config("gdn_verify", keys)  # entries checked against the registration above
        if cfg["v_loop"] > 1 and cfg["reduce"] != "token":
            raise ValueError(f"gdn_verify: v_loop > 1 needs reduce: token, got reduce: {cfg['reduce']}; set v_loop: 1 "
                             f"with it ({config_file()})")
        _CFG_CACHE[ck] = cfg
    return cfg


def _err(msg: str):
    raise ValueError(f"gdn_verify: {msg}")


def _shape(name: str, t: torch.Tensor, shape, what: str = ""):
    if tuple(t.shape) != tuple(shape):
        _err(f"{name} must have shape {tuple(shape)}{what}, got {tuple(t.shape)}")


def gdn_verify(
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
    wp: torch.Tensor,
    origin: torch.Tensor,
    flush: torch.Tensor,
    *,
    scale: Optional[float] = None,
    use_qk_l2norm: bool = True,
    round_beta: bool = False,
    out: Optional[torch.Tensor] = None,
    null_slot: Optional[int] = 0,
    parents: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Speculative verify of a window of T tokens per row (see the module docstring).

    Shapes: mixed_qkv [B, T, 2*Hk*K + HV*V]; a, b [B, T, HV]; A_log, dt_bias [HV];
    state [S, HV, V, K] (fp32/bf16/fp16); d_ring [S, HV, R, V] (state dtype);
    k_ring [S, Hk, R, K] (mixed_qkv dtype, raw k); g_ring [S, HV, R] fp32;
    state_indices [B]; wp, origin, flush [S] (per-slot cursors, int32/int64; read
    only); out [B, T, HV, V] (allocated in mixed_qkv's dtype when None).  Any strides
    with a contiguous last dim.  Rows whose slot is < 0 or == ``null_slot`` are
    skipped entirely (``null_slot=None``: only negative slots).  ``parents``
    int32/int64 [B, T] makes the window a tree (see :func:`gdn_tree_verify`).  No
    device syncs.
    """
    tensors = dict(mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, d_ring=d_ring,
                   k_ring=k_ring, g_ring=g_ring, state_indices=state_indices, wp=wp, origin=origin, flush=flush)
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
    if d_ring.ndim != 4:
        _err(f"d_ring must be [S, HV, R, V], got shape {tuple(d_ring.shape)}")
    R = d_ring.shape[2]
    _shape("d_ring", d_ring, (S, HV, R, V))
    if k_ring.ndim != 4:
        _err(f"k_ring must be [S, Hk, R, K], got shape {tuple(k_ring.shape)}")
    Hk = k_ring.shape[1]
    if Hk < 1 or HV % Hk:
        _err(f"k_ring: HV ({HV}) must be a positive multiple of Hk = k_ring.shape[1] ({Hk})")
    _shape("k_ring", k_ring, (S, Hk, R, K))
    _shape("g_ring", g_ring, (S, HV, R))
    if mixed_qkv.ndim != 3:
        _err(f"mixed_qkv must be [B, T, 2*Hk*K + HV*V], got shape {tuple(mixed_qkv.shape)}")
    B, T, width = mixed_qkv.shape
    if width != 2 * Hk * K + HV * V:
        _err(f"mixed_qkv last dim must be 2*Hk*K + HV*V = {2 * Hk * K + HV * V} "
             f"(Hk={Hk}, K={K}, HV={HV}, V={V}), got {width}")
    if T < 1:
        _err("mixed_qkv: the window T = mixed_qkv.shape[1] must be >= 1")
    if R < 2 * T:
        _err(f"d_ring: ring length R = d_ring.shape[2] = {R} must be >= 2T = {2 * T} (history block B = R - T "
             f">= window T)")
    _shape("a", a, (B, T, HV))
    _shape("b", b, (B, T, HV))
    _shape("A_log", A_log, (HV,))
    _shape("dt_bias", dt_bias, (HV,))
    _shape("state_indices", state_indices, (B,))
    if parents is not None:
        check_parents_arg("gdn_verify", parents, B, T, dev)
    for name in ("wp", "origin", "flush"):
        _shape(name, tensors[name], (S,), " (one cursor per state slot)")
    for name in ("state_indices", "wp", "origin", "flush"):
        if tensors[name].dtype not in _INT_DTYPES:
            _err(f"{name} must be int32 or int64, got {tensors[name].dtype}")

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
    for name in ("a", "b", "A_log", "dt_bias"):
        if tensors[name].dtype not in _FLOAT_DTYPES:
            _err(f"{name} must be fp32/bf16/fp16, got {tensors[name].dtype}")
    for name in ("mixed_qkv", "a", "b", "state", "d_ring", "k_ring"):
        if tensors[name].stride(-1) != 1:
            _err(f"{name} must be contiguous in its last dim (got strides {tuple(tensors[name].stride())})")
    for name in ("A_log", "dt_bias"):
        if tensors[name].stride(0) != 1:
            _err(f"{name} must be contiguous (got stride {tensors[name].stride(0)})")

    if out is None:
        out = torch.empty((B, T, HV, V), dtype=act, device=dev)
    if not isinstance(out, torch.Tensor) or out.device != dev:
        _err("out must be a tensor on the inputs' device")
    _shape("out", out, (B, T, HV, V))
    if out.dtype not in _FLOAT_DTYPES:
        _err(f"out dtype must be fp32/bf16/fp16, got {out.dtype}")
    if out.stride(-1) != 1:
        _err(f"out must be contiguous in its last dim (got strides {tuple(out.stride())})")

    if B == 0:
        return out
    if scale is None:
        scale = K ** -0.5

    cfg = gdn_verify_launch_params(HV, Hk, K, V, R, T, state.dtype)
    BK = max(16, next_pow2(K))
    BV = max(16, min(cfg["BV"], next_pow2(V)))
    LP = max(16, next_pow2(R - T))
    TP = max(2, next_pow2(T))
    scores_pre = cfg["scores"] == "pre" and B > cfg["inline_scores_max_batch"]  # host-side, per graph batch
    pdl = pdl_on(cfg["pdl"], dev)
    null = -1 if null_slot is None else int(null_slot)
    if scores_pre:  # per-call scratch (inside a CUDA graph it comes from the graph's pool)
        sc = torch.empty((B, Hk, 2 * LP + 2 * TP, TP), dtype=torch.float32, device=dev)
        _gdn_verify_scores_kernel[(B, Hk)](
            mixed_qkv, k_ring, state_indices, wp, origin, flush, sc, float(scale), null,
            state_indices.stride(0), wp.stride(0), origin.stride(0), flush.stride(0),
            mixed_qkv.stride(0), mixed_qkv.stride(1), k_ring.stride(0), k_ring.stride(1), k_ring.stride(2),
            sc.stride(0), sc.stride(1),
            HK=Hk, K=K, R=R, T=T, BK=BK, LP=LP, TP=TP, USE_L2NORM=bool(use_qk_l2norm), EPS=L2NORM_EPS,
            PDL=pdl, num_warps=cfg["scores_num_warps"], num_stages=1,
        )
    else:
        sc = out  # never read
    VL = (min(cfg["v_loop"], triton.cdiv(V, BV)) if B >= cfg["v_loop_min_batch"] and T <= cfg["v_loop_max_window"]
          else 1)
    loop_args = dict(VL=1, V_STAGES=1, KS=1, WDOT=False) if VL == 1 else dict(
        VL=VL, V_STAGES=cfg["v_stages"], KS=k_slices(cfg["k_parts"], BK), WDOT=cfg["window_dot"] == "split")
    if VL > 1 and cfg["flush_rows"] == "separate":  # verify rows, then flush rows: each launch compiled for one path
        launches = [dict(loop_args, ROWS=1), dict(loop_args, ROWS=2, V_STAGES=cfg["flush_v_stages"] or cfg["v_stages"])]
    else:
        launches = [dict(loop_args, ROWS=0)]
    grid = (triton.cdiv(V, BV * VL), B, HV)
    for i, rows_args in enumerate(launches):
        dependent = pdl and (scores_pre or i > 0)  # a kernel of this verify runs before it
        _gdn_verify_kernel[grid](
            mixed_qkv, a, b, A_log, dt_bias,
            state, d_ring, k_ring, g_ring,
            state_indices, wp, origin, flush, out, sc, state_indices if parents is None else parents,
            float(scale), null,
            state_indices.stride(0), wp.stride(0), origin.stride(0), flush.stride(0),
            mixed_qkv.stride(0), mixed_qkv.stride(1),
            a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            state.stride(0), state.stride(1), state.stride(2),
            d_ring.stride(0), d_ring.stride(1), d_ring.stride(2),
            k_ring.stride(0), k_ring.stride(1), k_ring.stride(2),
            g_ring.stride(0), g_ring.stride(1), g_ring.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            sc.stride(0) if scores_pre else 0, sc.stride(1) if scores_pre else 0,
            0 if parents is None else parents.stride(0), 0 if parents is None else parents.stride(1),
            HK=Hk, HV=HV, K=K, V=V, R=R, T=T, BK=BK, BV=BV, LP=LP, TP=TP,
            USE_L2NORM=bool(use_qk_l2norm), ROUND_BETA=bool(round_beta), FLUSH_DOT=cfg["flush"] == "dot",
            PER_TOKEN=cfg["reduce"] == "token", SCORES_PRE=scores_pre,
            IS_TREE=parents is not None, LOG_TP=TP.bit_length() - 1,
            DOT_PRECISION=cfg["dot_precision"], SOFTPLUS_THRESHOLD=SOFTPLUS_THRESHOLD, EPS=L2NORM_EPS,
            PDL=dependent, PDL_NEXT=pdl and i + 1 < len(launches),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
            **rows_args, **register_cap(cfg if VL == 1 or cfg["v_loop_maxnreg"] == -1 else
                                        dict(cfg, maxnreg=cfg["v_loop_maxnreg"])), **pdl_launch(dependent),
        )
    return out


def gdn_tree_verify(mixed_qkv, a, b, A_log, dt_bias, state, d_ring, k_ring, g_ring, state_indices, wp, origin, flush,
                    parents, *, scale=None, use_qk_l2norm=True, round_beta=False, out=None,
                    null_slot=0) -> torch.Tensor:
    """Verify a tree of T draft nodes per row: :func:`gdn_verify` (same arguments and types) with ``parents``
    int32/int64 [B, T] (``parents[b, 0] = -1``, ``parents[b, s]`` in ``[0, s)``: out-of-range values are the
    caller's bug, read as the root in-kernel for memory safety).  Returns ``out`` [B, T, HV, V].  No host sync."""
    if parents is None:
        raise ValueError("gdn_tree_verify: parents must be a torch.Tensor, got NoneType")
    try:
        return gdn_verify(mixed_qkv, a, b, A_log, dt_bias, state, d_ring, k_ring, g_ring, state_indices, wp, origin,
                          flush, scale=scale, use_qk_l2norm=use_qk_l2norm, round_beta=round_beta, out=out,
                          null_slot=null_slot, parents=parents)
    except ValueError as e:
        msg = str(e)
        if not msg.startswith("gdn_verify: "):
            raise
        raise ValueError("gdn_tree_verify: " + msg[len("gdn_verify: "):]) from None
