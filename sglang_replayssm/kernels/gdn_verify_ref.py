"""PyTorch references for the GDN ReplaySSM speculative verify, chain and tree (:mod:`gdn_verify`).

Plain PyTorch (no Triton kernel), no SGLang import.

``gdn_verify_ref`` / ``gdn_tree_verify_ref``
    The verify algorithm itself (history replay or flush fold, then the window's UT
    forward substitution), with exactly the arguments and side effects of
    :func:`sglang_replayssm.kernels.gdn_verify.gdn_verify` / ``gdn_tree_verify`` (reads
    the checkpoint, the circular (d, raw k, g) ring and the cursors; writes out, the
    window's ring entries and, on flush rows, the checkpoint; never the cursors),
    computed row by row in ``compute_dtype`` with the kernel's association.  A tree
    restricts each node's UT row to its ancestors (the chain is the tree with
    ``parents[i] = i - 1``).  With ``compute_dtype=torch.float64`` and fp64 pools it is
    an exact check of the algebra.

``gdn_window_oracle``
    The *sequential* GDN recurrence over a window of tokens from dense per-row states
    (the stock decode math of :func:`gdn_ref.gdn_step_oracle`, token by token), which
    also returns each token's d_i = beta_i (v_i - alpha_i S_{i-1} k^_i) and the state
    after every token.  Knows nothing about rings, cursors or checkpoints.

``gdn_tree_oracle``
    ``gdn_window_oracle`` run, for every node of a tree, along the node's own path
    root..i (fp64; independent of the tree algebra above).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .gdn_ref import _prep_qk, gdn_gates, history_weights, l2norm, split_qkv
from .spec_tree import tree_path

__all__ = ["gdn_verify_ref", "gdn_tree_verify_ref", "gdn_window_oracle", "gdn_tree_oracle", "window_betas"]


def window_betas(b: torch.Tensor, round_beta: bool) -> torch.Tensor:
    """beta = sigmoid(b) in fp32; rounded to b's dtype only with ``round_beta``."""
    beta = torch.sigmoid(b.to(torch.float32))
    return beta.to(b.dtype).to(torch.float32) if round_beta else beta


def _split_window(mixed_qkv, Hk, HV, K, V):
    B, T, W = mixed_qkv.shape
    q, k, v = split_qkv(mixed_qkv.reshape(B * T, W), Hk, HV, K, V)
    return q.reshape(B, T, Hk, K), k.reshape(B, T, Hk, K), v.reshape(B, T, HV, V)


@torch.no_grad()
def gdn_window_oracle(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    *,
    num_k_heads: int,
    scale: Optional[float] = None,
    use_qk_l2norm: bool = True,
    round_beta: bool = False,
    compute_dtype: torch.dtype = torch.float64,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequential GDN over a window: S_i = alpha_i S_{i-1} + d_i k^_i^T, o_i = S_i q^_i.

    mixed_qkv [B, T, W], a, b [B, T, HV], ``state`` [B, HV, V, K] (dense, not modified).
    Returns ``(o [B, T, HV, V], d [B, T, HV, V], states [B, T, HV, V, K])`` in
    ``compute_dtype``; ``states[:, i]`` is the state after token i.
    """
    cd = compute_dtype
    B, T, _ = mixed_qkv.shape
    HV, V, K = state.shape[-3:]
    Hk = num_k_heads
    r = HV // Hk
    if scale is None:
        scale = K ** -0.5
    q, k, v = _split_window(mixed_qkv, Hk, HV, K, V)
    g, _ = gdn_gates(a.reshape(B * T, HV), b.reshape(B * T, HV), A_log, dt_bias, cd)
    g = g.reshape(B, T, HV)
    beta = window_betas(b, round_beta).to(cd)
    h = state.to(cd).clone()
    outs, ds, states = [], [], []
    for i in range(T):
        qi, ki = _prep_qk(q[:, i], k[:, i], scale, use_qk_l2norm, cd)
        qi = qi.repeat_interleave(r, dim=1)  # [B, HV, K]
        ki = ki.repeat_interleave(r, dim=1)
        h = h * torch.exp(g[:, i])[:, :, None, None]
        d = beta[:, i, :, None] * (v[:, i].to(cd) - torch.einsum("bhvk,bhk->bhv", h, ki))
        h = h + d[..., None] * ki[:, :, None, :]
        outs.append(torch.einsum("bhvk,bhk->bhv", h, qi))
        ds.append(d)
        states.append(h.clone())
    return torch.stack(outs, 1), torch.stack(ds, 1), torch.stack(states, 1)


@torch.no_grad()
def gdn_verify_ref(
    mixed_qkv, a, b, A_log, dt_bias, state, d_ring, k_ring, g_ring, state_indices, wp, origin, flush,
    *, scale=None, use_qk_l2norm=True, round_beta=False, out=None, null_slot=0, compute_dtype=torch.float32,
    parents=None,
):
    """Reference verify: same arguments and side effects as ``gdn_verify``.

    Per live row (slot s, w = wp[s] clamped to [0, R-T], o = origin[s], history
    logical j < w at physical (o + j) % R):
      S_c = e^G S_ck + sum_j e^{G-G_j} d_j k^_j^T   (built and stored on flush rows,
            then re-read in the state dtype; replayed per query vector otherwise)
      window i: r_i, A_ij, d_i (forward substitution), o_i as in the module docstring,
            over j <= i (chain) or j on the path root..i (``parents``)
      ring[(o + w + i) % R] <- (d_i, raw k_i, g_i)
    """
    cd = compute_dtype
    B, T, _ = mixed_qkv.shape
    HV, V, K = state.shape[-3:]
    Hk = k_ring.shape[1]
    R = d_ring.shape[2]
    r = HV // Hk
    if scale is None:
        scale = K ** -0.5
    if out is None:
        out = torch.empty(B, T, HV, V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    q_all, k_all, v_all = _split_window(mixed_qkv, Hk, HV, K, V)
    # gates in fp32 like the kernel (fp64 when the whole reference runs in fp64)
    g_dtype = torch.float64 if cd == torch.float64 else torch.float32
    g_all, _ = gdn_gates(a.reshape(B * T, HV), b.reshape(B * T, HV), A_log, dt_bias, g_dtype)
    g_all = g_all.reshape(B, T, HV)
    beta_all = window_betas(b, round_beta)
    idx = state_indices.tolist()
    for n in range(B):
        s = int(idx[n])
        if s < 0 or (null_slot is not None and s == null_slot):
            continue
        w = min(max(int(wp[s]), 0), R - T)
        o = min(max(int(origin[s]), 0), R - 1)
        is_flush = int(flush[s]) != 0
        ph = [(o + j) % R for j in range(w)]
        qh, kh = _prep_qk(q_all[n], k_all[n], scale, use_qk_l2norm, cd)  # [T, Hk, K]
        qv = qh.repeat_interleave(r, 1)  # [T, HV, K]
        kv = kh.repeat_interleave(r, 1)
        S_ck = state[s].to(cd)
        if w > 0:
            c, eG = history_weights(g_ring[s][:, ph].to(cd))  # [HV, w], [HV]
            kr = k_ring[s][:, ph].to(cd)  # [Hk, w, K]
            if use_qk_l2norm:
                kr = l2norm(kr)
            kr = kr.repeat_interleave(r, 0)  # [HV, w, K]
            dh = d_ring[s][:, ph].to(cd)  # [HV, w, V]
        if is_flush:
            if w > 0:
                S1 = eG[:, None, None] * S_ck + torch.einsum("hjv,hjk->hvk", dh * c[:, :, None], kr)
                state[s] = S1.to(state.dtype)
            S_c = state[s].to(cd)
            sq = torch.einsum("hvk,thk->thv", S_c, qv)
            sk = torch.einsum("hvk,thk->thv", S_c, kv)
        else:
            sq = torch.einsum("hvk,thk->thv", S_ck, qv)
            sk = torch.einsum("hvk,thk->thv", S_ck, kv)
            if w > 0:
                cq = c[None] * torch.einsum("hjk,thk->thj", kr, qv)
                ck = c[None] * torch.einsum("hjk,thk->thj", kr, kv)
                sq = eG[None, :, None] * sq + torch.einsum("hjv,thj->thv", dh, cq)
                sk = eG[None, :, None] * sk + torch.einsum("hjv,thj->thv", dh, ck)
        g_w = g_all[n].to(cd)  # [T, HV]
        beta = beta_all[n].to(cd)
        v = v_all[n].to(cd)
        D = torch.zeros(T, HV, V, dtype=cd, device=S_ck.device)
        for i in range(T):
            # j runs over the tokens 0..i (chain) or the nodes on the path root..i (tree), i last
            path = list(range(i + 1)) if parents is None else tree_path(parents[n], i)
            cw, e_gam = history_weights(g_w[path].transpose(0, 1))  # [HV, len], [HV]
            kk = torch.einsum("jhk,hk->hj", kv[path], kv[i])
            kq = torch.einsum("jhk,hk->hj", kv[path], qv[i])
            r_i = beta[i][:, None] * (v[i] - e_gam[:, None] * sk[i])
            a_row = beta[i][:, None] * cw[:, :-1] * kk[:, :-1]
            D[i] = r_i - torch.einsum("hj,jhv->hv", a_row, D[path[:-1]])
            o_i = e_gam[:, None] * sq[i] + torch.einsum("hj,jhv->hv", cw * kq, D[path])
            out[n, i] = o_i.to(out.dtype)
        for i in range(T):
            p = (o + w + i) % R
            d_ring[s, :, p] = D[i].to(d_ring.dtype)
            k_ring[s, :, p] = k_all[n, i].to(k_ring.dtype)
            g_ring[s, :, p] = g_all[n, i].to(g_ring.dtype)
    return out


@torch.no_grad()
def gdn_tree_verify_ref(
    mixed_qkv, a, b, A_log, dt_bias, state, d_ring, k_ring, g_ring, state_indices, wp, origin, flush, parents,
    *, scale=None, use_qk_l2norm=True, round_beta=False, out=None, null_slot=0, compute_dtype=torch.float32,
):
    """Reference tree verify: same arguments and side effects as ``gdn_tree_verify``."""
    return gdn_verify_ref(mixed_qkv, a, b, A_log, dt_bias, state, d_ring, k_ring, g_ring, state_indices, wp, origin,
                          flush, scale=scale, use_qk_l2norm=use_qk_l2norm, round_beta=round_beta, out=out,
                          null_slot=null_slot, compute_dtype=compute_dtype, parents=parents)


@torch.no_grad()
def gdn_tree_oracle(mixed_qkv, a, b, A_log, dt_bias, state, parents, *, num_k_heads, scale=None,
                    use_qk_l2norm=True, round_beta=False, compute_dtype=torch.float64):
    """Sequential GDN along every node's path, one row.

    mixed_qkv [T, W]; a, b [T, HV]; state [HV, V, K] (the committed state, not modified); parents [T].
    Returns ``(o [T, HV, V], d [T, HV, V], states [T, HV, V, K])``: node i's output, its delta-rule
    correction along its path and the state after it.
    """
    T = mixed_qkv.shape[0]
    outs, ds, states = [], [], []
    for i in range(T):
        path = torch.tensor(tree_path(parents, i), dtype=torch.long, device=mixed_qkv.device)
        o, d, st = gdn_window_oracle(mixed_qkv[path][None], a[path][None], b[path][None], A_log, dt_bias,
                                     state[None], num_k_heads=num_k_heads, scale=scale,
                                     use_qk_l2norm=use_qk_l2norm, round_beta=round_beta,
                                     compute_dtype=compute_dtype)
        outs.append(o[0, -1])
        ds.append(d[0, -1])
        states.append(st[0, -1])
    return torch.stack(outs), torch.stack(ds), torch.stack(states)
