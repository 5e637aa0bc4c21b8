"""PyTorch reference and fp64 oracle of the GDN tree verify (:mod:`gdn_tree_verify`).

``gdn_tree_verify_ref``: same arguments and side effects as ``gdn_tree_verify``, row by
row in ``compute_dtype`` with the kernel's association (history replayed on verify rows,
folded and stored on flush rows, then each node's UT row restricted to its ancestors).
``gdn_tree_oracle``: the *sequential* GDN recurrence (:func:`gdn_verify_ref.gdn_window_oracle`)
run, for every node, from a dense committed state along the node's own path root..i; it
knows nothing about rings, cursors or checkpoints.
"""

from __future__ import annotations

import torch

from .gdn_ref import _prep_qk, gdn_gates, history_weights, l2norm
from .gdn_verify_ref import _split_window, gdn_window_oracle, window_betas
from .spec_tree import tree_path

__all__ = ["gdn_tree_verify_ref", "gdn_tree_oracle"]


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


@torch.no_grad()
def gdn_tree_verify_ref(
    mixed_qkv, a, b, A_log, dt_bias, state, d_ring, k_ring, g_ring, state_indices, wp, origin, flush, parents,
    *, scale=None, use_qk_l2norm=True, round_beta=False, out=None, null_slot=0, compute_dtype=torch.float32,
):
    """Reference tree verify: same arguments and side effects as ``gdn_tree_verify``."""
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
            path = tree_path(parents[n], i)  # ancestors in node order, i last
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
