"""Causal conv1d over a speculative chain window, with the per-draft conv windows rollback reads.

What it computes is what SGLang's ``causal_conv1d_update`` (``sglang.kernels.ops.mamba.causal_conv1d_triton``)
computes for a chain target verify (``intermediate_conv_window`` given, no tree, no ``num_accept_tokens``, no
``cache_seqlens``), with the same side effects, so the two are interchangeable there.  Per row b (conv slot
``slot_b``, window row ``r_b``), channel f, kernel width K, window of T tokens, and the input sequence
``in(i) = conv_state[slot_b, f, K-1+i]`` for ``-(K-1) <= i < 0`` (the committed inputs, oldest first),
``in(i) = x[b, f, i]`` for ``0 <= i < T``::

    out[b, f, t]           = act(bias[f] + Σ_{j<K} w[f, j] · in(t - K + 1 + j))     t < T
    window[r_b, t, f, c]   = in(t - K + 2 + c)                                     c < K-1 (the window after token t)
    conv_state[slot_b, f, c] = in(T - K + 1 + c)                                   c < K-1

The products and their sum are fp32 (SGLang's kernel rounds each product to the input dtype first); act is
SiLU or none; the stores round to the output / window / state dtypes.  Rows whose slot is negative (SGLang's
pad slot -1) or past the state's slots write nothing, the window of a row whose window row is out of range
is not written; a padded row's ``out`` is left as allocated (as SGLang leaves it).

Memory layout, the reason this kernel exists: SGLang's conv state is ``[slots, dim, K-1]`` with the K-1 inputs
of a channel contiguous, and on CUDA its chain window is a deduplicated ``as_strided`` view of a
``[rows, dim, T+K-2]`` buffer (window step t, column c at physical column t + c).  A kernel that holds one
channel per lane and writes one column at a time writes 2 bytes every 6 (state) or 12 (window) bytes a store,
each store touching many 32-byte sectors partly.  Here a thread stores a channel's contiguous inputs whole, with
compile-time strides (so the compiler sees the row's alignment): one store for the deduplicated window, one for
the state.  Other layouts (a transposed state, a dense window) take the tensors' own strides.

Programs: grid (batch, cdiv(dim, BLOCK_F)); launch parameters in the family ``conv1d_verify``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import triton
import triton.language as tl

from .common import FLOAT_DTYPES, INDEX_DTYPES, block_param, launch_config, next_pow2, register_family, warps_param
from .conv_verify_ref import as_window_call

__all__ = ["conv1d_verify", "CONV1D_VERIFY_DEFAULT_LAUNCH", "window_is_deduplicated"]

CONV1D_VERIFY_DEFAULT_LAUNCH: Dict[str, Any] = register_family("conv1d_verify", {
    # channels a program (one row); SGLang's own kernel uses 256 channels on 4 warps
    "BLOCK_F": block_param(256, 16),
    "num_warps": warps_param(4),
})


@triton.jit
def _in_tile(x_row, st_row, offs_f, mask_f, s_x_d, s_x_t, s_st_d, s_st_c, first, WIDTH: tl.constexpr,
             K: tl.constexpr, T: tl.constexpr, WP: tl.constexpr):
    """[BLOCK_F, WP] tile of in(first + c), c < WIDTH (fp32; masked columns 0): the committed inputs from the conv
    state for negative positions, the window's from x."""
    c = tl.arange(0, WP)
    i = first + c
    live = mask_f[:, None] & (c < WIDTH)[None, :]
    from_state = (i < 0)[None, :]
    col_st = tl.maximum(i + (K - 1), 0)
    tok = tl.minimum(tl.maximum(i, 0), T - 1)
    v_st = tl.load(st_row + offs_f[:, None] * s_st_d + col_st[None, :] * s_st_c, mask=live & from_state, other=0.0)
    v_x = tl.load(x_row + offs_f[:, None] * s_x_d + tok[None, :] * s_x_t, mask=live & ~from_state, other=0.0)
    return tl.where(from_state, v_st.to(tl.float32), v_x.to(tl.float32))


@triton.jit
def _in_vec(x_row, st_row, offs_f, mask_f, s_x_d, s_x_t, s_st_d, s_st_c, i: tl.constexpr, K: tl.constexpr):
    """[BLOCK_F] vector in(i) for one position i (a compile-time constant)."""
    if i < 0:
        v = tl.load(st_row + offs_f * s_st_d + (K - 1 + i) * s_st_c, mask=mask_f, other=0.0)
    else:
        v = tl.load(x_row + offs_f * s_x_d + i * s_x_t, mask=mask_f, other=0.0)
    return v.to(tl.float32)


@triton.jit
def _conv1d_verify_kernel(
    x_ptr, w_ptr, bias_ptr, state_ptr, slots_ptr, win_ptr, win_rows_ptr, out_ptr,
    dim, n_slots, n_win_rows,
    s_x_b, s_x_d, s_x_t,
    s_w_d, s_w_k,
    s_st_s, s_st_d, s_st_c,
    s_win_r, s_win_t, s_win_d, s_win_c,
    s_o_b, s_o_d, s_o_t,
    T: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, WP: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, HAS_SLOTS: tl.constexpr, HAS_WIN: tl.constexpr,
    HAS_WIN_ROWS: tl.constexpr, DEDUP: tl.constexpr, STATE_ROWS: tl.constexpr, WIN_ROWS: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    b = tl.program_id(0)
    if HAS_SLOTS:
        slot = tl.load(slots_ptr + b).to(tl.int64)
    else:
        slot = b.to(tl.int64)
    if (slot < 0) | (slot >= n_slots):
        return
    f0 = tl.program_id(1) * BLOCK_F
    offs_f = f0 + tl.arange(0, BLOCK_F)
    mask_f = offs_f < dim
    x_row = x_ptr + b.to(tl.int64) * s_x_b
    st_row = state_ptr + slot * s_st_s
    # a channel's state / window columns contiguous, channels back to back (STATE_ROWS, WIN_ROWS): compile-time
    # strides, so that the compiler sees the alignment of a channel's row
    if STATE_ROWS:
        st_d: tl.constexpr = K - 1
        st_c: tl.constexpr = 1
    else:
        st_d = s_st_d
        st_c = s_st_c
    if WIN_ROWS:
        w_d: tl.constexpr = T + K - 2
        w_c: tl.constexpr = 1
    else:
        w_d = s_win_d
        w_c = s_win_c

    # every conv-state load before the first conv-state store (the tl.debug_barrier below): the new state overwrites
    # columns other threads read; outputs and windows never share memory with the inputs
    kk = tl.arange(0, KP)
    w = tl.load(w_ptr + offs_f[:, None] * s_w_d + kk[None, :] * s_w_k, mask=mask_f[:, None] & (kk < K)[None, :],
                other=0.0).to(tl.float32)
    if HAS_BIAS:
        acc0 = tl.load(bias_ptr + offs_f, mask=mask_f, other=0.0).to(tl.float32)
    else:
        acc0 = tl.zeros([BLOCK_F], dtype=tl.float32)
    new_state = _in_tile(x_row, st_row, offs_f, mask_f, s_x_d, s_x_t, st_d, st_c, T - K + 1, K - 1, K, T, KP)
    if HAS_WIN:
        if HAS_WIN_ROWS:
            wrow = tl.load(win_rows_ptr + b).to(tl.int64)
        else:
            wrow = b.to(tl.int64)
        win_ok = (wrow >= 0) & (wrow < n_win_rows)
        win_row = win_ptr + wrow * s_win_r
        if DEDUP:  # window step t, column c at physical column t + c: T + K - 2 columns in(-(K-2)) .. in(T-1)
            win = _in_tile(x_row, st_row, offs_f, mask_f, s_x_d, s_x_t, st_d, st_c, 2 - K, T + K - 2, K, T, WP)

    o_row = out_ptr + b.to(tl.int64) * s_o_b
    for t in tl.static_range(T):
        acc = acc0
        for j in tl.static_range(K):
            w_j = tl.sum(tl.where((kk == j)[None, :], w, 0.0), 1)
            acc += w_j * _in_vec(x_row, st_row, offs_f, mask_f, s_x_d, s_x_t, st_d, st_c, t - K + 1 + j, K)
        if SILU:
            acc = acc / (1.0 + tl.exp(-acc))
        tl.store(o_row + offs_f * s_o_d + t * s_o_t, acc.to(out_ptr.dtype.element_ty), mask=mask_f)
    if HAS_WIN:
        if not DEDUP:  # one [BLOCK_F, K-1] window a step (the dense layout)
            cc = tl.arange(0, KP)
            wmask = mask_f[:, None] & (cc < K - 1)[None, :] & win_ok
            for t in tl.static_range(T):
                wt = _in_tile(x_row, st_row, offs_f, mask_f, s_x_d, s_x_t, st_d, st_c, t - K + 2, K - 1, K, T,
                              KP)
                tl.store(win_row + t * s_win_t + offs_f[:, None] * w_d + cc[None, :] * w_c,
                         wt.to(win_ptr.dtype.element_ty), mask=wmask)

    tl.debug_barrier()
    cs = tl.arange(0, KP)
    tl.store(st_row + offs_f[:, None] * st_d + cs[None, :] * st_c, new_state.to(state_ptr.dtype.element_ty),
             mask=mask_f[:, None] & (cs < K - 1)[None, :])
    if HAS_WIN:
        if DEDUP:
            cw = tl.arange(0, WP)
            tl.store(win_row + offs_f[:, None] * w_d + cw[None, :] * w_c,
                     win.to(win_ptr.dtype.element_ty), mask=mask_f[:, None] & (cw < T + K - 2)[None, :] & win_ok)


def window_is_deduplicated(window: torch.Tensor) -> bool:
    """SGLang's CUDA chain layout: a step moves the window by one physical column (``stride(1) == stride(3)``)."""
    return window.stride(1) == window.stride(3)


def _geometry_key(dim: int, K: int, T: int) -> str:
    return f"D{dim}_K{K}_T{T}"


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share storage (conservatively: the same storage at all)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def argument_problem(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                     bias: Optional[torch.Tensor] = None, activation: Any = None, *,
                     conv_state_indices: Optional[torch.Tensor] = None,
                     intermediate_conv_window: Optional[torch.Tensor] = None,
                     intermediate_state_indices: Optional[torch.Tensor] = None,
                     out: Optional[torch.Tensor] = None) -> Optional[str]:
    """Why :func:`conv1d_verify` refuses these arguments (None: it takes them). The seam hands refused calls to
    SGLang's own kernel."""
    if not (activation in (None, False, True) or activation in ("silu", "swish")):
        return f"activation {activation!r}; expected None, 'silu' or 'swish'"
    x, out, _, _ = as_window_call(x, out, None)
    if x.dim() != 3:
        return f"x has shape {tuple(x.shape)}; expected [batch, dim, T] or [batch, dim]"
    batch, dim, T = x.shape
    if weight.dim() != 2 or weight.shape[0] != dim:
        return f"weight {tuple(weight.shape)} is not [dim={dim}, K]"
    K = int(weight.shape[1])
    if K < 2:
        return f"kernel width {K} < 2"
    if conv_state.dim() != 3 or conv_state.shape[1] != dim or conv_state.shape[2] < K - 1:
        return f"conv_state {tuple(conv_state.shape)} is not [slots, dim={dim}, >= {K - 1}]"
    if bias is not None and tuple(bias.shape) != (dim,):
        return f"bias {tuple(bias.shape)} is not [{dim}]"
    for name, t in (("x", x), ("conv_state", conv_state), ("weight", weight), ("bias", bias)):
        if t is not None and t.dtype not in FLOAT_DTYPES:
            return f"{name} dtype {t.dtype} not in {FLOAT_DTYPES}"
    for name, t in (("conv_state_indices", conv_state_indices),
                    ("intermediate_state_indices", intermediate_state_indices)):
        # as SGLang's kernel: the first batch entries are read
        if t is not None and (t.dtype not in INDEX_DTYPES or t.dim() != 1 or t.shape[0] < batch):
            return f"{name} must be int32/int64 of shape (>= {batch},), got {t.dtype} {tuple(t.shape)}"
    win = intermediate_conv_window
    if win is not None:
        if win.dim() != 4 or win.shape[1] < T or win.shape[2] != dim or win.shape[3] != K - 1:
            return f"intermediate_conv_window {tuple(win.shape)} is not [rows, >= T={T}, dim={dim}, K-1={K - 1}]"
        if win.dtype not in FLOAT_DTYPES:
            return f"intermediate_conv_window dtype {win.dtype} not in {FLOAT_DTYPES}"
    if out is not None:
        if tuple(out.shape) != (batch, dim, T):
            return f"out {tuple(out.shape)} is not {(batch, dim, T)}"
        if out.dtype not in FLOAT_DTYPES:
            return f"out dtype {out.dtype} not in {FLOAT_DTYPES}"
        if any(_overlaps(out, t) for t in (x, conv_state) + ((win,) if win is not None else ())):
            return ("out shares memory with x, conv_state or the window (a token's inputs are read after earlier "
                    "tokens' outputs are stored)")
    return None


def conv1d_verify(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                  activation: Any = None, *, conv_state_indices: Optional[torch.Tensor] = None,
                  intermediate_conv_window: Optional[torch.Tensor] = None,
                  intermediate_state_indices: Optional[torch.Tensor] = None,
                  out: Optional[torch.Tensor] = None, launch: Optional[Dict[str, Any]] = None) -> torch.Tensor:
    """Chain-verify causal conv1d (see the module docstring).

    x [batch, dim, T] (any strides; a 2-D [batch, dim] is one token), conv_state [slots, dim, >= K-1] (columns
    0..K-2 are the committed inputs, oldest first), weight [dim, K], bias [dim] or None, activation None / False
    or "silu" / "swish" / True; conv_state_indices [>= batch] (None: row b is slot b; negative: a padded row);
    intermediate_conv_window [rows, >= T, dim, K-1] or None, intermediate_state_indices [>= batch] (None: row b;
    of both index tensors the first batch entries are read). Returns ``out`` (default: ``torch.empty_like(x)``),
    same shape as x, sharing no memory with the inputs. Arguments :func:`argument_problem` refuses raise ValueError.
    """
    problem = argument_problem(x, conv_state, weight, bias, activation, conv_state_indices=conv_state_indices,
                               intermediate_conv_window=intermediate_conv_window,
                               intermediate_state_indices=intermediate_state_indices, out=out)
    if problem is not None:
        raise ValueError(f"conv1d_verify: {problem}")
    x, out, activation, squeeze = as_window_call(x, out, activation)
    batch, dim, T = x.shape
    K = int(weight.shape[1])
    win = intermediate_conv_window
    # the kernel reads row b's indices at ptr + b: strided index views are copied (a no-op when contiguous)
    if conv_state_indices is not None:
        conv_state_indices = conv_state_indices[:batch].contiguous()
    if intermediate_state_indices is not None:
        intermediate_state_indices = intermediate_state_indices[:batch].contiguous()
    if out is None:
        out = torch.empty_like(x)
    if batch == 0:
        return out.squeeze(-1) if squeeze else out
    cfg = launch_config("conv1d_verify", _geometry_key(dim, K, T))
    if launch:  # explicit launch parameters (benchmarks, tests) on top of the configured ones
        cfg = {**cfg, **launch}
    BLOCK_F = int(cfg["BLOCK_F"])
    dedup = win is not None and window_is_deduplicated(win)
    ws = win.stride() if win is not None else (0, 0, 0, 0)
    grid = (batch, triton.cdiv(dim, BLOCK_F))
    _conv1d_verify_kernel[grid](
        x, weight, bias if bias is not None else weight, conv_state,
        conv_state_indices if conv_state_indices is not None else x,
        win if win is not None else x,
        intermediate_state_indices if intermediate_state_indices is not None else x, out,
        dim, conv_state.shape[0], win.shape[0] if win is not None else 0,
        *x.stride(), *weight.stride(), *conv_state.stride(), *ws, *out.stride(),
        T=T, K=K, KP=next_pow2(K), WP=next_pow2(T + K - 2),
        HAS_BIAS=bias is not None, SILU=activation is not None, HAS_SLOTS=conv_state_indices is not None,
        HAS_WIN=win is not None, HAS_WIN_ROWS=intermediate_state_indices is not None, DEDUP=dedup,
        STATE_ROWS=conv_state.stride(2) == 1 and conv_state.stride(1) == K - 1,
        WIN_ROWS=dedup and ws[3] == 1 and ws[2] == T + K - 2,
        BLOCK_F=BLOCK_F, num_warps=int(cfg["num_warps"]))
    return out.squeeze(-1) if squeeze else out
