"""PyTorch references for the Mamba2 ReplaySSM decode kernels.

Two kinds:

* :func:`mamba2_replay_decode_ref`: the same replay math and the same side effects
  as :func:`sglang_replayssm.kernels.mamba2_replay.mamba2_replay_decode` (same
  arguments), written with plain PyTorch ops and a Python loop over rows.  Its
  rounding matches the kernels': every intermediate is fp32 (no rounding of scaled
  operands), softplus is the fp32 ``log(1 + exp(u))`` with threshold 20, and the only
  roundings are the stores (ring entries to ring dtype, the state to state dtype on
  flush, the output to out dtype).  Non-flush steps use the output-only form, flush
  steps rebuild the state.

* :func:`mamba2_step_oracle`: the plain sequential recurrence of one token
  S = e^{AΔ} S + Δ x Bᵀ ; y = S·C + D x ; y *= silu(z), on dense per-row states,
  computed in fp64 (or any dtype given).  It knows nothing about rings or replay.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .common import SOFTPLUS_THRESHOLD, suffix_sum_excl_torch


def _softplus(u: torch.Tensor) -> torch.Tensor:
    return torch.where(u <= SOFTPLUS_THRESHOLD, torch.log(1.0 + torch.exp(u)), u)


def _per_head(t: Optional[torch.Tensor], H: int, dtype) -> Optional[torch.Tensor]:
    """[H] values of a per-head parameter given as [H], [H, P] or [H, P, N] (tied)."""
    if t is None:
        return None
    if t.dim() == 1:
        return t.to(dtype)
    return t.reshape(H, -1)[:, 0].to(dtype)


def _per_head_dim(t: Optional[torch.Tensor], H: int, P: int, dtype) -> Optional[torch.Tensor]:
    """[H, P] values of D given as [H] or [H, P]."""
    if t is None:
        return None
    if t.dim() == 1:
        return t.to(dtype)[:, None].expand(H, P)
    return t.to(dtype)


def _dt_per_head(dt: torch.Tensor) -> torch.Tensor:
    """[batch, H] raw dt from [batch, H] or a [batch, H, P] view tied over P."""
    return dt if dt.dim() == 2 else dt[..., 0]


def process_dt(dt, dt_bias, dt_softplus: bool, H: int, dtype=torch.float32) -> torch.Tensor:
    """Processed Δ [batch, H] = softplus(dt + dt_bias), computed in ``dtype``."""
    d = _dt_per_head(dt).to(dtype)
    if dt_bias is not None:
        d = d + _per_head(dt_bias, H, dtype)[None, :]
    if dt_softplus:
        if dtype == torch.float32:
            d = _softplus(d)
        else:  # exact softplus for the high-precision oracle
            d = torch.where(d <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(d)), d)
    return d


def mamba2_step_oracle(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    dt_softplus: bool = True,
    dtype: torch.dtype = torch.float64,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One sequential Mamba2 step on dense states.

    state [batch, H, P, N] (one state per row, any dtype); x [batch, H, P]; dt [batch, H]
    or [batch, H, P] tied; A [H] or [H, P, N] tied; B, C [batch, G, N]; D [H] or [H, P];
    z [batch, H, P]; dt_bias [H] or [H, P] tied.  Returns (new_state, y) in ``dtype``.
    """
    batch, H, P, N = state.shape
    G = B.shape[1]
    r = H // G
    S = state.to(dtype)
    delta = process_dt(dt, dt_bias, dt_softplus, H, dtype)  # [batch, H]
    A_h = _per_head(A, H, dtype)
    xf = x.to(dtype)
    Bh = B.to(dtype).repeat_interleave(r, dim=1)  # [batch, H, N]
    Ch = C.to(dtype).repeat_interleave(r, dim=1)
    dA = torch.exp(A_h[None, :] * delta)  # [batch, H]
    S = S * dA[:, :, None, None] + (delta[:, :, None] * xf)[..., None] * Bh[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", S, Ch)
    if D is not None:
        y = y + _per_head_dim(D, H, P, dtype)[None] * xf
    if z is not None:
        zf = z.to(dtype)
        y = y * zf * torch.sigmoid(zf)
    return S, y


def mamba2_replay_decode_ref(
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
    """PyTorch twin of ``mamba2_replay_decode`` (same arguments, same writes)."""
    f32 = torch.float32
    batch, H, P = x.shape
    N = state.shape[-1]
    G = B.shape[1]
    r = H // G
    L = x_ring.shape[2]
    if out is None:
        out = torch.empty_like(x)
    if null_slot is None:
        null_slot = -1
    A_h = _per_head(A, H, f32)
    D_hp = _per_head_dim(D, H, P, f32)
    delta_cur_all = process_dt(dt, dt_bias, dt_softplus, H, f32)  # [batch, H]
    slots = state_indices.tolist()
    wps = write_pos.tolist()
    for row in range(batch):
        s = int(slots[row])
        if s < 0 or s == null_slot:
            continue
        w = min(max(int(wps[row]), 0), L - 1)
        flush = w == L - 1
        d_cur = delta_cur_all[row]  # [H]
        delta = torch.cat([dt_ring[s, :, :w].to(f32), d_cur[:, None]], dim=1)  # [H, w+1]
        # Λ_end − Λ_j summed directly over the Δ after j, as the kernel (no prefix-sum cancellation)
        sj = delta * torch.exp(A_h[:, None] * suffix_sum_excl_torch(delta, 1))  # [H, w+1]
        decay = torch.exp(A_h * delta.sum(1))  # [H]
        X = torch.cat([x_ring[s, :, :w, :].to(f32), x[row].to(f32)[:, None, :]], dim=1)  # [H, w+1, P]
        Bw = torch.cat([B_ring[s, :, :w, :].to(f32), B[row].to(f32)[:, None, :]], dim=1)  # [G, w+1, N]
        Bw = Bw.repeat_interleave(r, dim=0)  # [H, w+1, N]
        Ch = C[row].to(f32).repeat_interleave(r, dim=0)  # [H, N]
        S0 = state[s].to(f32)  # [H, P, N]
        if flush:
            S_new = decay[:, None, None] * S0 + torch.einsum("hjp,hjn->hpn", X * sj[:, :, None], Bw)
            y = torch.einsum("hpn,hn->hp", S_new, Ch)
            if flush:
                state[s] = S_new.to(state.dtype)
        else:
            bc = torch.einsum("hjn,hn->hj", Bw, Ch)
            y = decay[:, None] * torch.einsum("hpn,hn->hp", S0, Ch) + torch.einsum("hj,hjp->hp", sj * bc, X)
        xc = x[row].to(f32)
        if D_hp is not None:
            y = y + D_hp * xc
        if z is not None:
            zf = z[row].to(f32)
            y = y * zf * torch.sigmoid(zf)
        out[row] = y.to(out.dtype)
        if not flush:
            x_ring[s, :, w, :] = x[row].to(x_ring.dtype)
            dt_ring[s, :, w] = d_cur.to(dt_ring.dtype)
            B_ring[s, :, w, :] = B[row].to(B_ring.dtype)
    return out
