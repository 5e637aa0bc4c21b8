"""ReplaySSM tree speculative verify for Mamba2: T draft nodes per row over checkpoint + ring.

The tree version of :mod:`mamba2_verify` (SGLang EAGLE with ``--speculative-eagle-topk`` > 1):
same pools, ring, cursors and side effects, plus ``parents`` int [batch, T] (position 0 =
root = the last verified token, ``parents[b, s]`` in ``[0, s)``; see :mod:`spec_tree`).
Each node's output equals the sequential recurrence run over the committed history and
then the inputs on *its own* ancestor path root..s; no per-node state is written.

Math (per live row, head h; history as in the chain verify; ``anc(s)`` the nodes on the
path root..s, s included, built in-kernel from ``parents`` by pointer-jumping)::

    μ_s = Σ_{m ∈ anc(s)} Δ_m                                   (path sum, replaces the prefix sum)
    y_s = exp(A μ_s) (S_c · C_s) + Σ_{m ∈ anc(s)} Δ_m exp(A (μ_s − μ_m)) (B_m·C_s) x_m + D x_s

i.e. the chain formula with the causal mask ``m <= s`` replaced by ``m ∈ anc(s)`` (a chain,
``parents[s] = s − 1``, is the chain verify).  S_c is replayed on verify rows
(``exp(A μ_s) S_c·C_s = exp(A(Λ + μ_s)) S_ck·C_s + Σ_k Δ_k exp(A(Λ − Λ_k + μ_s)) (B_k·C_s) x_k``)
and built, stored (history only, never a draft) and used on flush rows, exactly as the
chain verify does.  The history exponents Λ − Λ_k are suffix sums (no two large prefix
sums are subtracted).  The window's (x, Δ, B) go to the ring at logical wp .. wp+T-1 in
node order; :func:`spec_tree.spec_commit_tree` later gathers the accepted path into
consecutive positions and moves the cursors.

Programs: grid (cdiv(P, BLOCK_M), batch, H); each reads its S_ck tile N-chunk by N-chunk
(writing it back once on flush rows), the history x tile [BLOCK_M, WH], Δ [WH], the group's
B history and the window's x/B/C/dt/z; the B·C dots are computed per program (group sharing
left to L2).  Rows whose slot is < 0 or == null_slot write nothing.

Numerics: every reduction fp32; the only roundings are the stores.  The flush fold is one
``tl.dot`` with ``dot_precision`` tf32x3 / ieee (plain tf32 is refused).
"""

from __future__ import annotations

from typing import Any, Dict

import torch
import triton
import triton.language as tl

from .common import (block_param, config_keys, count_param, dot_precision_param, launch_config, maxnreg_param,
                     next_pow2, register_cap, register_family, suffix_sum_excl, warps_param)
from .mamba2_replay import _delta_from_raw
from .mamba2_verify import mamba2_verify
from .spec_tree import _tree_ancestor_mask, check_parents_arg

__all__ = ["mamba2_tree_verify", "MAMBA2_TREE_VERIFY_DEFAULT_LAUNCH", "tree_verify_geometry_key"]

# Built-in launch parameters (not yet tuned on a GPU: the chain verify's measured tiles and warps).
MAMBA2_TREE_VERIFY_DEFAULT_LAUNCH: Dict[str, Any] = register_family("mamba2_tree_verify", {
    "BLOCK_M": block_param(32, 16),
    "BLOCK_NC": block_param(32, 16),
    "num_warps": warps_param(1),
    "num_stages": count_param(1, 1),
    "dot_precision": dot_precision_param(),
    "maxnreg": maxnreg_param(0),
})


def tree_verify_geometry_key(H: int, P: int, N: int, G: int, R: int, T: int) -> str:
    return f"H{H}_P{P}_N{N}_G{G}_R{R}_T{T}"


@triton.jit
def _mamba2_tree_verify_kernel(
    state_ptr, xr_ptr, Br_ptr, dtr_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dtb_ptr, out_ptr, par_ptr,
    slot_ptr, wp_ptr, org_ptr, fl_ptr,
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
    s_par_b, s_par_t,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_NC: tl.constexpr, N_CHUNKS: tl.constexpr, WH: tl.constexpr, TP: tl.constexpr,
    LOG_TP: tl.constexpr,
):
    pid_m = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    g = h // heads_per_group
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if (slot < 0) | (slot == null_slot):
        return
    wp = tl.load(wp_ptr + slot).to(tl.int32)
    org = tl.load(org_ptr + slot).to(tl.int32)
    flag = tl.load(fl_ptr + slot)
    is_flush = flag != 0
    no_flush = flag == 0
    wp = tl.minimum(tl.maximum(wp, 0), R - T)  # memory safety only (the commit rule keeps wp + T <= R)
    org = tl.minimum(tl.maximum(org, 0), R - 1)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < P
    offs_t = tl.arange(0, TP)
    mask_t = offs_t < T
    offs_k = tl.arange(0, WH)
    valid_k = offs_k < wp
    phys_k = ((org + offs_k) % R).to(tl.int64)
    phys_t = ((org + wp + offs_t) % R).to(tl.int64)

    A = tl.load(A_ptr + h * s_A_h).to(tl.float32)
    if HAS_DT_BIAS:
        dtb = tl.load(dtb_ptr + h * s_dtb_h)
    else:
        dtb = 0.0

    # ---- tree: anc[m, s] (m on the path root..s), path sums μ_s ----
    anc = _tree_ancestor_mask(par_ptr + row * s_par_b, s_par_t, T, TP, LOG_TP)  # fp32 0/1 [m, s]
    on_path = (anc > 0.5) & mask_t[:, None]
    dt_win = tl.load(dt_ptr + row * s_dt_b + offs_t * s_dt_t + h * s_dt_h, mask=mask_t, other=0.0)
    d_win = tl.where(mask_t, _delta_from_raw(dt_win, dtb, HAS_DT_BIAS, DT_SOFTPLUS), 0.0)
    mu = tl.sum(tl.where(on_path, d_win[:, None], 0.0), 0)  # [s]
    x_win = tl.load(x_ptr + row * s_x_b + h * s_x_h + offs_m[:, None] * s_x_p + offs_t[None, :] * s_x_t,
                    mask=mask_m[:, None] & mask_t[None, :], other=0.0).to(tl.float32)  # [BLOCK_M, TP]

    # ---- history: Δ_k, suffix exponents Λ − Λ_k, x_k ----
    xr_base = xr_ptr + slot * s_xr_s + h * s_xr_h
    dtr_base = dtr_ptr + slot * s_dtr_s + h * s_dtr_h
    Br_base = Br_ptr + slot * s_Br_s + g * s_Br_g
    st_base = state_ptr + slot * s_st_s + h * s_st_h
    d_hist = tl.load(dtr_base + phys_k * s_dtr_r, mask=valid_k, other=0.0).to(tl.float32)
    lam_end = tl.sum(d_hist, 0)
    after_k = suffix_sum_excl(d_hist, offs_k)  # Σ_{k < i < wp} Δ_i, summed directly
    x_hist = tl.load(xr_base + offs_m[:, None] * s_xr_p + phys_k[None, :] * s_xr_r,
                     mask=mask_m[:, None] & valid_k[None, :], other=0.0).to(tl.float32)  # [BLOCK_M, WH]
    s_hist = tl.where(valid_k, d_hist * tl.exp(A * after_k), 0.0)  # fold weights

    # ---- N chunks: S·C_s (S = S_ck, or the folded S_c on flush), B_k·C_s, B_m·C_s ----
    SC = tl.zeros([BLOCK_M, TP], dtype=tl.float32)
    bc_h = tl.zeros([WH, TP], dtype=tl.float32)
    bc_w = tl.zeros([TP, TP], dtype=tl.float32)  # [m, s]
    decay_end = tl.exp(A * lam_end)
    write_B = (pid_m == 0) & (h % heads_per_group == 0)
    B_row = B_ptr + row * s_B_b + g * s_B_g
    C_row = C_ptr + row * s_C_b + g * s_C_g
    for c in tl.static_range(N_CHUNKS):
        offs_n = c * BLOCK_NC + tl.arange(0, BLOCK_NC)
        mask_n = offs_n < N
        st_ptrs = st_base + offs_m[:, None] * s_st_p + offs_n[None, :] * s_st_n
        st_mask = mask_m[:, None] & mask_n[None, :]
        S = tl.load(st_ptrs, mask=st_mask, other=0.0).to(tl.float32)
        B_w = tl.load(B_row + offs_t[:, None] * s_B_t + offs_n[None, :] * s_B_n,
                      mask=mask_t[:, None] & mask_n[None, :], other=0.0)  # [TP, NC]
        B_h = tl.load(Br_base + phys_k[:, None] * s_Br_r + offs_n[None, :] * s_Br_n,
                      mask=valid_k[:, None] & mask_n[None, :], other=0.0).to(tl.float32)  # [WH, NC]
        if is_flush:
            S = decay_end * S + tl.dot(x_hist, B_h * s_hist[:, None], input_precision=DOT_PRECISION)
            if wp > 0:
                tl.store(st_ptrs, S.to(state_ptr.dtype.element_ty), mask=st_mask)
        B_wf = B_w.to(tl.float32)
        for t in tl.static_range(TP):
            col = (offs_t == t)[None, :]
            C_t = tl.load(C_row + t * s_C_t + offs_n * s_C_n, mask=mask_n & (t < T), other=0.0).to(tl.float32)
            # column t of S·C, B_m·C and B_k·C (inline: the interpreter pays for every nested jit call)
            SC += tl.where(col, tl.sum(S * C_t[None, :], 1)[:, None], 0.0)
            bc_w += tl.where(col, tl.sum(B_wf * C_t[None, :], 1)[:, None], 0.0)
            if no_flush:
                bc_h += tl.where(col, tl.sum(B_h * C_t[None, :], 1)[:, None], 0.0)
        if write_B:
            tl.store(Br_base + phys_t[:, None] * s_Br_r + offs_n[None, :] * s_Br_n,
                     B_w.to(Br_ptr.dtype.element_ty), mask=mask_t[:, None] & mask_n[None, :])

    # ---- outputs: the chain's causal mask replaced by the ancestor mask ----
    # μ_s − μ_m for m on s's path: the Δ of the path nodes after m, summed directly ([m, i, s])
    after_m = tl.sum(tl.where((offs_t[None, :, None] > offs_t[:, None, None]) & (anc[None, :, :] > 0.5),
                              d_win[None, :, None], 0.0), axis=1)
    expo = tl.where(on_path, A * after_m, 0.0)
    w_w = tl.where(on_path, d_win[:, None] * tl.exp(expo) * bc_w, 0.0)  # [m, s]
    e_mu = tl.exp(A * mu)
    if is_flush:
        y = SC * e_mu[None, :]          # S_c is the new checkpoint, no history left
    else:
        y = SC * tl.exp(A * (lam_end + mu))[None, :]
    for t in tl.static_range(TP):
        sel = offs_t == t
        w_t = tl.sum(tl.where(sel[None, :], w_w, 0.0), 1)                       # [m]
        y_t = tl.sum(x_win * w_t[None, :], 1)
        if no_flush:
            bc_t = tl.sum(tl.where(sel[None, :], bc_h, 0.0), 1)                 # [k]
            wh_t = s_hist * bc_t * tl.sum(tl.where(sel, e_mu, 0.0), 0)
            y_t += tl.sum(x_hist * wh_t[None, :], 1)
        y += tl.where(sel[None, :], y_t[:, None], 0.0)
    if HAS_D:
        Dv = tl.load(D_ptr + h * s_D_h + offs_m * s_D_p, mask=mask_m, other=0.0).to(tl.float32)
        y += Dv[:, None] * x_win
    if HAS_Z:
        zv = tl.load(z_ptr + row * s_z_b + h * s_z_h + offs_m[:, None] * s_z_p + offs_t[None, :] * s_z_t,
                     mask=mask_m[:, None] & mask_t[None, :], other=0.0).to(tl.float32)
        y *= zv * tl.sigmoid(zv)
    om = mask_m[:, None] & mask_t[None, :]
    tl.store(out_ptr + row * s_o_b + h * s_o_h + offs_m[:, None] * s_o_p + offs_t[None, :] * s_o_t,
             y.to(out_ptr.dtype.element_ty), mask=om)

    # ---- window into the ring at logical wp .. wp+T-1, node order ----
    tl.store(xr_base + offs_m[:, None] * s_xr_p + phys_t[None, :] * s_xr_r,
             x_win.to(xr_ptr.dtype.element_ty), mask=om)
    if pid_m == 0:
        tl.store(dtr_base + phys_t * s_dtr_r, d_win.to(dtr_ptr.dtype.element_ty), mask=mask_t)


def mamba2_tree_verify(
    state, x_ring, B_ring, dt_ring,
    x, dt, A, B, C,
    state_indices, wp, origin, flush, parents,
    *, D=None, z=None, dt_bias=None, dt_softplus=True, out=None, null_slot=0,
):
    """Verify a tree of T draft nodes per row (see the module docstring).

    Arguments as :func:`mamba2_verify.mamba2_verify` plus ``parents`` int32/int64 [batch, T]
    (``parents[b, 0] = -1``, ``parents[b, s]`` in ``[0, s)``: out-of-range values are the caller's
    bug, clamped in-kernel for memory safety).  Returns ``out`` [batch, T, H, P].  No host sync.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"mamba2_tree_verify: x must be a [batch, T, H, P] tensor, got "
                         f"{tuple(getattr(x, 'shape', ()))}")
    batch, T = x.shape[0], x.shape[1]
    check_parents_arg("mamba2_tree_verify", parents, batch, T, x.device)
    # the chain wrapper's argument checks, run on an empty batch (launches nothing, writes nothing)
    try:
        mamba2_verify(state, x_ring, B_ring, dt_ring, x[:0], dt[:0], A, B[:0], C[:0], state_indices[:0],
                      wp, origin, flush, D=D, z=None if z is None else z[:0], dt_bias=dt_bias,
                      dt_softplus=dt_softplus, out=None if out is None else out[:0], null_slot=null_slot)
    except ValueError as e:
        raise ValueError(str(e).replace("mamba2_verify:", "mamba2_tree_verify:", 1)) from None
    if tuple(state_indices.shape) != (batch,):
        raise ValueError(f"mamba2_tree_verify: state_indices must have shape ({batch},), got "
                         f"{tuple(state_indices.shape)}")
    if out is None:
        out = torch.empty_like(x)
    elif tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"mamba2_tree_verify: out must have shape {tuple(x.shape)}, got {tuple(out.shape)}")
    if batch == 0:
        return out
    S_slots, H, P, N = state.shape
    G = B.shape[2]
    R = x_ring.shape[2]
    s_A_h = A.stride(0)  # [H] or tied [H, P(, N)] (checked by the chain wrapper): the stride between heads
    s_dtb_h = dt_bias.stride(0) if dt_bias is not None else 0
    if D is None:
        s_D_h = s_D_p = 0
    elif D.dim() == 1:
        s_D_h, s_D_p = D.stride(0), 0
    else:
        s_D_h, s_D_p = D.stride(0), D.stride(1)

    cfg = launch_config("mamba2_tree_verify", config_keys(tree_verify_geometry_key(H, P, N, G, R, T), state.dtype))
    BLOCK_M = cfg["BLOCK_M"]
    BLOCK_NC = min(cfg["BLOCK_NC"], max(16, next_pow2(N)))
    WH = max(16, next_pow2(R - T))
    TP = max(2, next_pow2(T))
    dz = z.stride() if z is not None else (0, 0, 0, 0)
    grid = (triton.cdiv(P, BLOCK_M), batch, H)
    _mamba2_tree_verify_kernel[grid](
        state, x_ring, B_ring, dt_ring,
        x, dt, A, B, C,
        D if D is not None else x, z if z is not None else x, dt_bias if dt_bias is not None else dt,
        out, parents, state_indices, wp, origin, flush,
        -1 if null_slot is None else int(null_slot), P, N, R, T, H // G,
        *state.stride(), *x_ring.stride(), *B_ring.stride(), *dt_ring.stride(),
        *x.stride(), dt.stride(0), dt.stride(1), dt.stride(2), s_A_h,
        *B.stride(), *C.stride(),
        s_D_h, s_D_p, *dz, s_dtb_h, *out.stride(), parents.stride(0), parents.stride(1),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=bool(dt_softplus), DOT_PRECISION=cfg["dot_precision"],
        BLOCK_M=BLOCK_M, BLOCK_NC=BLOCK_NC, N_CHUNKS=triton.cdiv(N, BLOCK_NC), WH=WH, TP=TP,
        LOG_TP=TP.bit_length() - 1,
        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), **register_cap(cfg),
    )
    return out
