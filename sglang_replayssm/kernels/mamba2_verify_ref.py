"""PyTorch reference of the Mamba2 speculative verify, chain and tree (``mamba2_verify``).

``mamba2_verify_ref`` / ``mamba2_tree_verify_ref``: same arguments and side effects as
:func:`sglang_replayssm.kernels.mamba2_verify.mamba2_verify` / ``mamba2_tree_verify``, computed
row by row in fp32 with the kernel's association: the verify path replays the history through
``S_ck·C_s`` and ``B_k·C_s`` without building the state; the flush path builds the folded
checkpoint, stores it and runs the window on top of it; a tree masks the window by each node's
ancestors instead of ``m <= s``.  The only roundings are the stores.  The oracles for tests are
the plain sequential recurrence :func:`mamba2_ref.mamba2_step_oracle` and, for trees,
:func:`mamba2_tree_oracle` (that recurrence along each node's own path, fp64; it knows nothing
about rings, cursors or checkpoints).
"""

from __future__ import annotations

import torch

from .common import suffix_sum_excl_torch
from .mamba2_ref import _per_head, _per_head_dim, mamba2_step_oracle, process_dt
from .spec_tree import tree_ancestors, tree_path


@torch.no_grad()
def mamba2_tree_oracle(state, x, dt, A, B, C, parents, *, D=None, z=None, dt_bias=None, dt_softplus=True,
                       dtype=torch.float64):
    """Sequential recurrence per node along its path, one row.

    state [H, P, N] (the committed state); x [T, H, P]; dt [T, H]; B, C [T, G, N]; z [T, H, P];
    parents [T].  Returns (y [T, H, P], states [T, H, P, N]): node s's output and the state after it.
    """
    T = x.shape[0]
    ys, states = [None] * T, [None] * T
    for s in range(T):
        S = state.to(dtype)[None]
        for m in tree_path(parents, s):
            S, y = mamba2_step_oracle(S, x[m][None], dt[m][None], A, B[m][None], C[m][None], D=D,
                                      z=None if z is None else z[m][None], dt_bias=dt_bias,
                                      dt_softplus=dt_softplus, dtype=dtype)
        ys[s], states[s] = y[0], S[0]
    return torch.stack(ys), torch.stack(states)


@torch.no_grad()
def mamba2_tree_verify_ref(state, x_ring, B_ring, dt_ring, x, dt, A, B, C, state_indices, wp, origin, flush,
                           parents, *, D=None, z=None, dt_bias=None, dt_softplus=True, out=None, null_slot=0):
    return mamba2_verify_ref(state, x_ring, B_ring, dt_ring, x, dt, A, B, C, state_indices, wp, origin, flush,
                             D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus, out=out, null_slot=null_slot,
                             parents=parents)


@torch.no_grad()
def mamba2_verify_ref(state, x_ring, B_ring, dt_ring, x, dt, A, B, C, state_indices, wp, origin, flush,
                      *, D=None, z=None, dt_bias=None, dt_softplus=True, out=None, null_slot=0, parents=None):
    f32 = torch.float32
    batch, T, H, P = x.shape
    G = B.shape[2]
    r = H // G
    R = x_ring.shape[2]
    if out is None:
        out = torch.empty_like(x)
    if null_slot is None:
        null_slot = -1
    A_h = _per_head(A, H, f32)
    D_hp = _per_head_dim(D, H, P, f32)
    anc_all = tree_ancestors(parents).to(x.device) if parents is not None else None  # [batch, s, m]
    for row in range(batch):
        s = int(state_indices[row])
        if s < 0 or s == null_slot:
            continue
        w = min(max(int(wp[s]), 0), R - T)
        o = min(max(int(origin[s]), 0), R - 1)
        hist = [(o + k) % R for k in range(w)]
        win = [(o + w + t) % R for t in range(T)]
        d_win = torch.stack([process_dt(dt[row, t][None], dt_bias, dt_softplus, H, f32)[0] for t in range(T)],
                            dim=1)  # [H, T]
        if anc_all is None:
            on_path = torch.ones(T, T, dtype=torch.bool, device=x.device).tril().T  # [m, s]: m <= s
            mu = torch.cumsum(d_win, dim=1)  # [H, T]
        else:
            on_path = anc_all[row].T  # [m, s]: m on the path root..s
            mu = torch.einsum("hm,ms->hs", d_win, on_path.to(f32))  # path sums
        Xw = x[row].to(f32).permute(1, 0, 2)  # [H, T, P]
        Bw = B[row].to(f32).permute(1, 0, 2).repeat_interleave(r, dim=0)  # [H, T, N]
        Cw = C[row].to(f32).permute(1, 0, 2).repeat_interleave(r, dim=0)  # [H, T, N]
        d_h = dt_ring[s][:, hist].to(f32)  # [H, w]
        lam_end = d_h.sum(dim=1)  # [H]
        Xh = x_ring[s][:, hist].to(f32)  # [H, w, P]
        Bh = B_ring[s][:, hist].to(f32).repeat_interleave(r, dim=0)  # [H, w, N]
        s_h = d_h * torch.exp(A_h[:, None] * suffix_sum_excl_torch(d_h, 1))  # [H, w]; Λ − Λ_k summed directly
        S0 = state[s].to(f32)
        if int(flush[s]):
            S = torch.exp(A_h * lam_end)[:, None, None] * S0 + torch.einsum("hkp,hkn->hpn", Xh * s_h[:, :, None], Bh)
            if w > 0:
                state[s] = S.to(state.dtype)
            y = torch.exp(A_h[:, None] * mu)[:, :, None] * torch.einsum("hpn,htn->htp", S, Cw)
        else:
            y = torch.exp(A_h[:, None] * (lam_end[:, None] + mu))[:, :, None] * torch.einsum("hpn,htn->htp", S0, Cw)
            bc_h = torch.einsum("hkn,htn->hkt", Bh, Cw)
            w_h = s_h[:, :, None] * torch.exp(A_h[:, None, None] * mu[:, None, :]) * bc_h  # [H, w, T]
            y = y + torch.einsum("hkp,hkt->htp", Xh, w_h)
        bc_w = torch.einsum("hmn,htn->hmt", Bw, Cw)  # [H, m, s]
        # μ_s − μ_m summed directly over the Δ between, as the kernel
        after = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # [m, i]: i > m
        if anc_all is None:  # Σ_{m<i<=s} Δ_i: row-wise cumsum of the Δ after m
            between = torch.cumsum(torch.where(after, d_win[:, None, :], torch.zeros(())), dim=2)  # [H, m, s]
        else:  # the Δ of the path nodes after m, up to s
            between = torch.einsum("hi,mi,is->hms", d_win, after.to(f32), on_path.to(f32))
        expo = torch.where(on_path, A_h[:, None, None] * between, torch.zeros(()))
        w_w = torch.where(on_path, d_win[:, :, None] * torch.exp(expo) * bc_w, torch.zeros(()))
        y = y + torch.einsum("hmp,hms->hsp", Xw, w_w)
        if D_hp is not None:
            y = y + D_hp[:, None, :] * Xw
        if z is not None:
            zf = z[row].to(f32).permute(1, 0, 2)
            y = y * zf * torch.sigmoid(zf)
        out[row] = y.permute(1, 0, 2).to(out.dtype)
        for t, p in enumerate(win):
            x_ring[s, :, p] = x[row, t].to(x_ring.dtype)
            dt_ring[s, :, p] = d_win[:, t].to(dt_ring.dtype)
            B_ring[s, :, p] = B[row, t].to(B_ring.dtype)
    return out
