"""Gated DeltaNet (GDN) ReplaySSM tree speculative verify: T draft nodes per row over a
checkpoint plus the circular ring of committed history.

The tree version of :mod:`gdn_verify` (SGLang EAGLE with ``--speculative-eagle-topk`` > 1):
same pools, ring, cursors and side effects, plus ``parents`` int [batch, T] (position 0 =
root = the last verified token, ``parents[b, s]`` in ``[0, s)``; see :mod:`spec_tree`).
Each node's output equals the sequential delta rule run over the committed history and then
the tokens on *its own* ancestor path root..i; no per-node state is written.

Math (per live row, v-head h; S_c the committed state, replayed from S_ck + history on
verify rows, built and stored on flush rows, exactly as the chain verify does;
``anc(i)`` the nodes on the path root..i, i included, built in-kernel from ``parents``)::

    Gamma_i = sum_{m in anc(i)} g_m                               (path sum)
    r_i  = beta_i (v_i - e^{Gamma_i} S_c k^_i)
    A_ij = beta_i e^{Gamma_i - Gamma_j} (k^_i . k^_j)             j in anc(i), j != i
    d_i  = r_i - sum_j A_ij d_j                                   (forward substitution, node order)
    o_i  = e^{Gamma_i} S_c q^_i + sum_{j in anc(i)} e^{Gamma_i - Gamma_j} (k^_j . q^_i) d_j

i.e. the chain's UT system with its Gram restricted to the ancestor set (parents precede
children, so node order is a valid substitution order; a chain, ``parents[i] = i - 1``, is
the chain verify).  d_i is node i's delta-rule correction along its own path, so the ring
entry written for node i is exactly what a chain verify of that path writes.
``Gamma_i - Gamma_j`` are suffix sums over the path (no two large prefix sums are
subtracted).  The window's (d_i, raw k_i, g_i) go to the ring at logical wp .. wp+T-1 in
node order; :func:`spec_tree.spec_commit_tree` later gathers the accepted path into
consecutive positions and moves the cursors.

Programs: grid ``(cdiv(V, BV), B, HV)``, one program per BV value rows of one (row,
v-head) holding the whole K row; the key scores (history and window Gram) are computed per
program.  Rows whose slot is < 0 or == ``null_slot`` write nothing.

Numerics: every reduction and element-wise product fp32 on CUDA cores; the flush fold is w
exact fp32 rank-1 updates; the only roundings are the stores (out, ring d in the state
dtype, the checkpoint).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import triton
import triton.language as tl

from .common import (L2NORM_EPS, SOFTPLUS_THRESHOLD, block_param, config_keys, count_param, launch_config,
                     maxnreg_param, next_pow2, register_cap, register_family, suffix_sum_excl, warps_param)
from .gdn_replay import _cast_rtne, _gdn_gate, _normalise_rows
from .gdn_verify import gdn_verify
from .spec_tree import _tree_ancestor_mask, check_parents_arg

__all__ = ["gdn_tree_verify", "GDN_TREE_VERIFY_DEFAULT_LAUNCH", "gdn_tree_verify_key"]

# Built-in launch parameters (not yet tuned on a GPU: the chain verify's measured tile, warps and register cap).
GDN_TREE_VERIFY_DEFAULT_LAUNCH: Dict[str, Any] = register_family("gdn_tree_verify", {
    "BV": block_param(16),  # value rows per program (the whole K row sits in one program)
    "num_warps": warps_param(1),
    "num_stages": count_param(1, 1),
    "maxnreg": maxnreg_param(168),
})


def gdn_tree_verify_key(HV: int, Hk: int, K: int, V: int, R: int, T: int) -> str:
    return f"HV{HV}_HK{Hk}_K{K}_V{V}_R{R}_T{T}"


@triton.jit
def _decay_weights(g, offs):
    """c_j = e^{sum_{m > j} g_m} and e^{sum_m g_m} for log-decays g (zero where not summed): exclusive suffix
    sums summed directly (``suffix_sum_excl``), so nothing that a large gate dominates is subtracted."""
    return tl.exp(suffix_sum_excl(g, offs)), tl.exp(tl.sum(g, axis=0))


@triton.jit
def _gdn_tree_verify_kernel(
    qkv, a, b, A_log, dt_bias,
    state, d_ring, k_ring, g_ring,
    state_indices, wp, origin, flush, out, parents,
    scale, null_slot,
    stride_idx, stride_wp, stride_org, stride_fl,
    stride_x0, stride_x1,
    stride_a0, stride_a1, stride_b0, stride_b1,
    stride_s0, stride_s1, stride_s2,
    stride_d0, stride_d1, stride_d2,
    stride_k0, stride_k1, stride_k2,
    stride_g0, stride_g1, stride_g2,
    stride_o0, stride_o1, stride_o2,
    stride_p0, stride_p1,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, R: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr, TP: tl.constexpr, LOG_TP: tl.constexpr,
    USE_L2NORM: tl.constexpr, ROUND_BETA: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr, EPS: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_n = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2)
    i_hk = i_hv // (HV // HK)

    slot = tl.load(state_indices + i_n * stride_idx).to(tl.int64)
    if (slot < 0) | (slot == null_slot):
        return  # padded / null row: nothing is written
    w = tl.load(wp + slot * stride_wp).to(tl.int32)
    org = tl.load(origin + slot * stride_org).to(tl.int32)
    is_flush = tl.load(flush + slot * stride_fl) != 0
    w = tl.minimum(tl.maximum(w, 0), R - T)  # memory safety only (the commit rule keeps w + T <= R)
    org = tl.minimum(tl.maximum(org, 0), R - 1)

    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    mask_v = o_v < V
    o_j = tl.arange(0, LP)
    valid = o_j < w
    ph = (org + o_j) % R  # physical ring index of history position j
    o_t = tl.arange(0, TP)
    mask_t = o_t < T
    pw = (org + w + o_t) % R  # physical ring index of window node i

    s_head = state + slot * stride_s0 + i_hv * stride_s1
    d_head = d_ring + slot * stride_d0 + i_hv * stride_d1
    k_head = k_ring + slot * stride_k0 + i_hk * stride_k1
    g_head = g_ring + slot * stride_g0 + i_hv * stride_g1
    x_row = qkv + i_n * stride_x0
    v_row = x_row + 2 * HK * K + i_hv * V
    out_row = out + i_n * stride_o0 + i_hv * stride_o2

    # ---- tree: anc[j, i] = node j on the path root..i ----
    anc = _tree_ancestor_mask(parents + i_n * stride_p0, stride_p1, T, TP, LOG_TP)

    # ---- loads: checkpoint tile, history (g, d slice), window (q, k, a, b) ----
    s_ck = tl.load(s_head + o_v[:, None] * stride_s2 + o_k[None, :], mask=mask_v[:, None] & mask_k[None, :],
                   other=0)
    g_hist = tl.load(g_head + ph * stride_g2, mask=valid, other=0.0).to(tl.float32)
    d_hist = tl.load(d_head + ph[None, :] * stride_d2 + o_v[:, None], mask=mask_v[:, None] & valid[None, :],
                     other=0).to(tl.float32)
    mask_tk = mask_t[:, None] & mask_k[None, :]
    q_win = tl.load(x_row + o_t[:, None] * stride_x1 + i_hk * K + o_k[None, :], mask=mask_tk, other=0)
    k_raw = tl.load(x_row + o_t[:, None] * stride_x1 + HK * K + i_hk * K + o_k[None, :], mask=mask_tk, other=0)
    a_win = tl.load(a + i_n * stride_a0 + o_t * stride_a1 + i_hv, mask=mask_t, other=0)
    b_win = tl.load(b + i_n * stride_b0 + o_t * stride_b1 + i_hv, mask=mask_t, other=0)
    A_log_val = tl.load(A_log + i_hv)
    dt_bias_val = tl.load(dt_bias + i_hv)

    # ---- window gates; the window's g (one writer per (row, v-head)) and raw k (one per (row, k-head)) go to
    # the ring now (disjoint from the history every program reads) ----
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

    # ---- history replay weights c_j = e^{G - G_j}, e^G ----
    c, eG = _decay_weights(g_hist, o_j)
    c = tl.where(valid, c, 0.0)
    s = s_ck.to(tl.float32)
    hq = tl.zeros([LP, TP], dtype=tl.float32)  # k^_j . q^_i (history j, verify rows only)
    hk = tl.zeros([LP, TP], dtype=tl.float32)  # k^_j . k^_i
    if is_flush:
        # ---- flush: S_c = e^G S_ck + sum_j c_j d_j k^_j^T becomes the checkpoint (history only) ----
        if w > 0:
            s = eG * s
            for j in range(0, w):  # exact fp32 rank-1 updates
                p_j = (org + j) % R
                c_j = tl.sum(tl.where(o_j == j, c, 0.0), axis=0)
                d_j = tl.load(d_head + p_j * stride_d2 + o_v, mask=mask_v, other=0).to(tl.float32)
                k_j = tl.load(k_head + p_j * stride_k2 + o_k, mask=mask_k, other=0).to(tl.float32)
                if USE_L2NORM:  # inline (as _l2norm_vec): no nested call per history entry
                    k_j = k_j / tl.sqrt(tl.sum(k_j * k_j) + EPS)
                s += (c_j * d_j)[:, None] * k_j[None, :]
            s_st = _cast_rtne(s, s_head.dtype.element_ty)
            tl.store(s_head + o_v[:, None] * stride_s2 + o_k[None, :], s_st, mask=mask_v[:, None] & mask_k[None, :])
            s = s_st.to(tl.float32)  # the window runs on the stored checkpoint
    else:
        for j in range(0, w):  # the history key scores, streamed once
            k_j = tl.load(k_head + ((org + j) % R) * stride_k2 + o_k, mask=mask_k, other=0).to(tl.float32)
            if USE_L2NORM:
                k_j = k_j / tl.sqrt(tl.sum(k_j * k_j) + EPS)
            row_j = o_j[:, None] == j
            hq = tl.where(row_j, tl.sum(q_hat * k_j[None, :], axis=1)[None, :], hq)
            hk = tl.where(row_j, tl.sum(k_hat * k_j[None, :], axis=1)[None, :], hk)
    eG_x = tl.where(is_flush, 1.0, eG)  # with a flush the history is folded: S_c x = s x
    c_x = tl.where(is_flush, 0.0, c)

    # ---- window, part 1 (independent of the tree): S_c q^_i, S_c k^_i, Gram kk[j, i], kq[j, i] ----
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
        kk = tl.where(col, tl.sum(k_hat * k_i[None, :], axis=1)[:, None], kk)
        kq = tl.where(col, tl.sum(k_hat * q_i[None, :], axis=1)[:, None], kq)

    # ---- path decays of every node at once: CW[j, i] = e^{Gamma_i - Gamma_j} for j in anc(i) (the g of the
    # path nodes after j, summed directly: [j, m, i]), 0 elsewhere; e^{Gamma_i} ----
    on_anc = anc > 0.5
    after_j = tl.sum(tl.where((o_t[None, :, None] > o_t[:, None, None]) & on_anc[None, :, :],
                              g_win[None, :, None], 0.0), axis=1)
    CW = tl.where(on_anc, tl.exp(after_j), 0.0)
    E_GAM = tl.exp(tl.sum(tl.where(on_anc, g_win[:, None], 0.0), axis=0))

    # ---- window, part 2: the UT forward substitution over each node's ancestors, in node order ----
    d_win = tl.zeros([BV, TP], dtype=tl.float32)
    o_win = tl.zeros([BV, TP], dtype=tl.float32)
    for i in tl.static_range(T):
        sel = o_t == i
        col = sel[None, :]
        beta_i = tl.sum(tl.where(sel, beta, 0.0), axis=0)
        v_i = tl.load(v_row + i * stride_x1 + o_v, mask=mask_v, other=0).to(tl.float32)
        cw = tl.sum(tl.where(col, CW, 0.0), axis=1)  # [TP] over j
        e_gam = tl.sum(tl.where(sel, E_GAM, 0.0), axis=0)
        kk_i = tl.sum(tl.where(col, kk, 0.0), axis=1)  # k^_j . k^_i over j
        kq_i = tl.sum(tl.where(col, kq, 0.0), axis=1)  # k^_j . q^_i over j
        r_i = beta_i * (v_i - e_gam * tl.sum(tl.where(col, s_k, 0.0), axis=1))
        a_row = tl.where(o_t < i, beta_i * cw * kk_i, 0.0)
        d_i = r_i - tl.sum(d_win * a_row[None, :], axis=1)
        d_win = tl.where(col, d_i[:, None], d_win)
        o_i = e_gam * tl.sum(tl.where(col, s_q, 0.0), axis=1) + tl.sum(d_win * (cw * kq_i)[None, :], axis=1)
        o_win = tl.where(col, o_i[:, None], o_win)

    # ---- outputs of every node, the window's d slice into the ring (node order) ----
    mask_vt = mask_v[:, None] & mask_t[None, :]
    tl.store(out_row + o_t[None, :] * stride_o1 + o_v[:, None], _cast_rtne(o_win, out_row.dtype.element_ty),
             mask=mask_vt)
    tl.store(d_head + pw[None, :] * stride_d2 + o_v[:, None], _cast_rtne(d_win, d_head.dtype.element_ty),
             mask=mask_vt)


def gdn_tree_verify(
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
    parents: torch.Tensor,
    *,
    scale: Optional[float] = None,
    use_qk_l2norm: bool = True,
    round_beta: bool = False,
    out: Optional[torch.Tensor] = None,
    null_slot: Optional[int] = 0,
) -> torch.Tensor:
    """Verify a tree of T draft nodes per row (see the module docstring).

    Arguments as :func:`gdn_verify.gdn_verify` plus ``parents`` int32/int64 [B, T] (``parents[b, 0] = -1``,
    ``parents[b, s]`` in ``[0, s)``: out-of-range values are the caller's bug, clamped in-kernel for memory
    safety).  Returns ``out`` [B, T, HV, V].  No host sync.
    """
    if not isinstance(mixed_qkv, torch.Tensor) or mixed_qkv.ndim != 3:
        raise ValueError(f"gdn_tree_verify: mixed_qkv must be a [B, T, 2*Hk*K + HV*V] tensor, got "
                         f"{tuple(getattr(mixed_qkv, 'shape', ()))}")
    B, T = mixed_qkv.shape[0], mixed_qkv.shape[1]
    check_parents_arg("gdn_tree_verify", parents, B, T, mixed_qkv.device)
    # the chain wrapper's argument checks, run on an empty batch (launches nothing, writes nothing)
    try:
        gdn_verify(mixed_qkv[:0], a[:0], b[:0], A_log, dt_bias, state, d_ring, k_ring, g_ring, state_indices[:0],
                   wp, origin, flush, scale=scale, use_qk_l2norm=use_qk_l2norm, round_beta=round_beta,
                   out=None if out is None else out[:0], null_slot=null_slot)
    except ValueError as e:
        raise ValueError(str(e).replace("gdn_verify:", "gdn_tree_verify:", 1)) from None
    HV, V, K = state.shape[1:]
    Hk = k_ring.shape[1]
    R = d_ring.shape[2]
    for name, t, shape in (("a", a, (B, T, HV)), ("b", b, (B, T, HV)), ("state_indices", state_indices, (B,))):
        if tuple(t.shape) != shape:
            raise ValueError(f"gdn_tree_verify: {name} must have shape {shape}, got {tuple(t.shape)}")
    if out is None:
        out = torch.empty((B, T, HV, V), dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    elif tuple(out.shape) != (B, T, HV, V):
        raise ValueError(f"gdn_tree_verify: out must have shape {(B, T, HV, V)}, got {tuple(out.shape)}")
    if B == 0:
        return out
    if scale is None:
        scale = K ** -0.5
    cfg = launch_config("gdn_tree_verify", config_keys(gdn_tree_verify_key(HV, Hk, K, V, R, T), state.dtype))
    BK = max(16, next_pow2(K))
    BV = max(16, min(cfg["BV"], next_pow2(V)))
    TP = max(2, next_pow2(T))
    grid = (triton.cdiv(V, BV), B, HV)
    _gdn_tree_verify_kernel[grid](
        mixed_qkv, a, b, A_log, dt_bias,
        state, d_ring, k_ring, g_ring,
        state_indices, wp, origin, flush, out, parents,
        float(scale), -1 if null_slot is None else int(null_slot),
        state_indices.stride(0), wp.stride(0), origin.stride(0), flush.stride(0),
        mixed_qkv.stride(0), mixed_qkv.stride(1),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        state.stride(0), state.stride(1), state.stride(2),
        d_ring.stride(0), d_ring.stride(1), d_ring.stride(2),
        k_ring.stride(0), k_ring.stride(1), k_ring.stride(2),
        g_ring.stride(0), g_ring.stride(1), g_ring.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        parents.stride(0), parents.stride(1),
        HK=Hk, HV=HV, K=K, V=V, R=R, T=T, BK=BK, BV=BV, LP=max(16, next_pow2(R - T)), TP=TP,
        LOG_TP=TP.bit_length() - 1,
        USE_L2NORM=bool(use_qk_l2norm), ROUND_BETA=bool(round_beta),
        SOFTPLUS_THRESHOLD=SOFTPLUS_THRESHOLD, EPS=L2NORM_EPS,
        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), **register_cap(cfg),
    )
    return out
