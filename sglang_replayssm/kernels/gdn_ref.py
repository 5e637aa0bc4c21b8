"""PyTorch references for the Gated DeltaNet (GDN) ReplaySSM decode.

Two independent references, both plain PyTorch (no Triton, no SGLang import):

``gdn_step_oracle``
    One step of the *sequential* GDN recurrence on a dense per-row state, with the
    math of SGLang's stock packed decode kernel (``fused_recurrent_gated_delta_rule_
    packed_decode``): packed ``q|k|v`` input, gates g = -exp(A_log) softplus(a +
    dt_bias) (threshold 20), beta = sigmoid(b) rounded to b's dtype, q/k L2-normalised
    with 1/sqrt(sum x^2 + 1e-6), q scaled::

        S <- alpha S;  d = beta (v - S k);  S <- S + d k^T;  o = S q

    It knows nothing about rings or checkpoints; tests drive it step by step in fp64.

``gdn_replay_decode_ref``
    The replay algorithm itself, with exactly the signature and side effects of
    :func:`sglang_replayssm.kernels.gdn_replay.gdn_replay_decode` (reads the
    checkpoint and the (d, raw k, g) ring, writes out / ring / checkpoint), computed
    row by row in ``compute_dtype``. Same math and the same association as the
    kernel, so kernel-vs-reference comparisons can be much tighter than
    kernel-vs-oracle ones.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .common import suffix_sum_excl_torch

SOFTPLUS_THRESHOLD = 20.0
L2NORM_EPS = 1e-6


def split_qkv(mixed_qkv: torch.Tensor, num_k_heads: int, num_v_heads: int, head_k_dim: int,
              head_v_dim: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views q [B,Hk,K], k [B,Hk,K], v [B,HV,V] of a packed ``q|k|v`` tensor."""
    Hk, HV, K, V = num_k_heads, num_v_heads, head_k_dim, head_v_dim
    B = mixed_qkv.shape[0]
    q = mixed_qkv[:, : Hk * K].reshape(B, Hk, K)
    k = mixed_qkv[:, Hk * K: 2 * Hk * K].reshape(B, Hk, K)
    v = mixed_qkv[:, 2 * Hk * K: 2 * Hk * K + HV * V].reshape(B, HV, V)
    return q, k, v


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
              compute_dtype: torch.dtype = torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) [B, HV] in ``compute_dtype``.

    beta is computed in fp32 and rounded to ``b.dtype`` first, like the stock kernel
    (``tl.sigmoid(b.to(fp32)).to(b.dtype)``), so fp64 oracles see the same beta.
    """
    x = a.to(compute_dtype) + dt_bias.to(compute_dtype)
    sp = torch.where(x <= SOFTPLUS_THRESHOLD, torch.log(1.0 + torch.exp(torch.clamp(x, max=SOFTPLUS_THRESHOLD))), x)
    g = -torch.exp(A_log.to(compute_dtype)) * sp
    beta = torch.sigmoid(b.to(torch.float32)).to(b.dtype).to(compute_dtype)
    return g, beta


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (no clamping, as the kernels)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def _prep_qk(q, k, scale, use_qk_l2norm, cd):
    q = q.to(cd)
    k = k.to(cd)
    if use_qk_l2norm:
        q = l2norm(q)
        k = l2norm(k)
    return q * scale, k


def gdn_step_oracle(
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
    compute_dtype: torch.dtype = torch.float64,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One sequential GDN decode step for every row (the stock packed-decode math).

    ``state``: dense per-row states [B, HV, V, K] (any float dtype; not modified).
    Returns ``(o [B, HV, V], new_state [B, HV, V, K])``, both in ``compute_dtype``.
    """
    cd = compute_dtype
    B = mixed_qkv.shape[0]
    HV, V, K = state.shape[-3:]
    Hk = num_k_heads
    if scale is None:
        scale = K ** -0.5
    q, k, v = split_qkv(mixed_qkv, Hk, HV, K, V)
    q, k = _prep_qk(q, k, scale, use_qk_l2norm, cd)
    r = HV // Hk
    q = q.repeat_interleave(r, dim=1)  # [B, HV, K]
    k = k.repeat_interleave(r, dim=1)
    v = v.to(cd)
    g, beta = gdn_gates(a, b, A_log, dt_bias, cd)
    h = state.to(cd) * torch.exp(g)[:, :, None, None]
    d = (v - torch.einsum("bhvk,bhk->bhv", h, k)) * beta[:, :, None]
    h = h + d[:, :, :, None] * k[:, :, None, :]
    o = torch.einsum("bhvk,bhk->bhv", h, q)
    assert o.shape == (B, HV, V)
    return o, h


def history_weights(g_hist: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Replay weights from cached log-decays ``g_hist`` [..., w].

    Returns ``(c [..., w], eG [...])`` with c_j = exp(G - G_j) = exp(sum_{i>j} g_i) and
    eG = exp(G), G = sum of all g. The exponents are exclusive suffix sums summed
    directly (no cancellation after a large gate), as the kernel forms them.
    """
    return torch.exp(suffix_sum_excl_torch(g_hist, -1)), torch.exp(g_hist.sum(-1))


@torch.no_grad()
def gdn_replay_decode_ref(
    mixed_qkv, a, b, A_log, dt_bias, state, d_ring, k_ring, g_ring, state_indices, write_pos,
    *, scale=None, use_qk_l2norm=True, out=None, null_slot=0, compute_dtype=torch.float32, dbeta_out=None,
):
    """Reference replay decode: same arguments and side effects as ``gdn_replay_decode``.

    ``dbeta_out`` (optional [B, HV, V] tensor) receives do/dbeta = (v - alpha S_{w-1} k^)(k^ . q^) of each
    live row: tests bound the effect of beta's rounding to b's dtype with it.

    Per live row (slot s, w = write_pos clamped to [0, L-1]):
      S_{w-1} x = e^G (S_ck x) + sum_{j<w} e^{G-G_j} (k^_j . x) d_j   for x in {q^, k^}
      d_w = beta (v - alpha S_{w-1} k^);  o = alpha S_{w-1} q^ + d_w (k^ . q^)
      w <  L-1: ring[w] <- (d_w, raw k_w, g_w)
      w == L-1: state[s] <- alpha (e^G S_ck + sum_j e^{G-G_j} d_j k^_j^T) + d_w k^^T
    """
    cd = compute_dtype
    B = mixed_qkv.shape[0]
    HV, V, K = state.shape[-3:]
    Hk = k_ring.shape[1]
    L = d_ring.shape[2]
    r = HV // Hk
    if scale is None:
        scale = K ** -0.5
    if out is None:
        out = torch.empty(B, HV, V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    out3 = out[:, 0] if out.ndim == 4 else out
    q_all, k_all, v_all = split_qkv(mixed_qkv, Hk, HV, K, V)
    g_all, beta_all = gdn_gates(a, b, A_log, dt_bias, torch.float32)
    idx = state_indices.tolist()
    wp = write_pos.tolist()
    for i in range(B):
        s = int(idx[i])
        if s < 0 or (null_slot is not None and s == null_slot):
            continue
        w = min(max(int(wp[i]), 0), L - 1)
        qh, kh = _prep_qk(q_all[i], k_all[i], scale, use_qk_l2norm, cd)  # [Hk, K]
        qv = qh.repeat_interleave(r, 0)  # [HV, K]
        kv = kh.repeat_interleave(r, 0)
        v = v_all[i].to(cd)
        g = g_all[i].to(cd)
        beta = beta_all[i].to(cd)
        alpha = torch.exp(g)
        S_ck = state[s].to(cd)
        sq = torch.einsum("hvk,hk->hv", S_ck, qv)
        sk = torch.einsum("hvk,hk->hv", S_ck, kv)
        if w > 0:
            c, eG = history_weights(g_ring[s, :, :w].to(cd))  # [HV, w], [HV]
            kr = k_ring[s, :, :w].to(cd)
            if use_qk_l2norm:
                kr = l2norm(kr)
            kr = kr.repeat_interleave(r, 0)  # [HV, w, K]
            dh = d_ring[s, :, :w].to(cd)  # [HV, w, V]
            sc_q = torch.einsum("hjk,hk->hj", kr, qv)
            sc_k = torch.einsum("hjk,hk->hj", kr, kv)
            sq = eG[:, None] * sq + torch.einsum("hjv,hj->hv", dh, c * sc_q)
            sk = eG[:, None] * sk + torch.einsum("hjv,hj->hv", dh, c * sc_k)
        d_cur = beta[:, None] * (v - alpha[:, None] * sk)
        kq = (kh * qh).sum(-1).repeat_interleave(r, 0)[:, None]
        o = alpha[:, None] * sq + d_cur * kq
        out3[i] = o.to(out3.dtype)
        if dbeta_out is not None:
            dbeta_out[i] = ((v - alpha[:, None] * sk) * kq).to(dbeta_out.dtype)
        if w == L - 1:
            S_prev = S_ck
            if w > 0:
                S_prev = eG[:, None, None] * S_ck + torch.einsum("hjv,hjk->hvk", dh * c[:, :, None], kr)
            S_new = alpha[:, None, None] * S_prev + d_cur[:, :, None] * kv[:, None, :]
            state[s] = S_new.to(state.dtype)
        else:
            d_ring[s, :, w] = d_cur.to(d_ring.dtype)
            k_ring[s, :, w] = k_all[i].to(k_ring.dtype)
            g_ring[s, :, w] = g_all[i].to(g_ring.dtype)
    return out
