"""PyTorch reference of the chain-verify causal conv1d (``conv_verify.conv1d_verify``).

:func:`conv1d_verify_ref` takes the same arguments and has the same side effects, row by row in fp32 (the
products and their sum; the stores round to the tensors' dtypes).  :func:`conv1d_chain_oracle` is the test
oracle: the plain causal convolution of the committed inputs followed by the window, in fp64, knowing nothing of
slots, windows or layouts.
"""

from __future__ import annotations

from typing import Any, Optional

import torch


@torch.no_grad()
def conv1d_chain_oracle(committed: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                        bias: Optional[torch.Tensor] = None, silu: bool = True, dtype=torch.float64) -> torch.Tensor:
    """One row: committed [dim, K-1] (oldest first), x [dim, T] -> the T outputs [dim, T] of the causal conv."""
    K = weight.shape[1]
    seq = torch.cat([committed[:, :K - 1], x], 1).to(dtype)
    w = weight.to(dtype)
    T = x.shape[1]
    y = torch.stack([(seq[:, t:t + K] * w).sum(1) for t in range(T)], 1)
    if bias is not None:
        y = y + bias.to(dtype)[:, None]
    return y * torch.sigmoid(y) if silu else y


def as_window_call(x: torch.Tensor, out: Optional[torch.Tensor], activation: Any):
    """(x [batch, dim, T], out or None, activation None or "silu"/"swish", squeeze): a 2-D one-token call as a window
    of one, ``activation`` True / False as SGLang's causal_conv1d_update reads it. Shared with the kernel wrapper."""
    if isinstance(activation, bool):
        activation = "silu" if activation else None
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
        if out is not None:
            out = out.unsqueeze(-1)
    return x, out, activation, squeeze


@torch.no_grad()
def conv1d_verify_ref(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                      bias: Optional[torch.Tensor] = None, activation: Any = None, *,
                      conv_state_indices: Optional[torch.Tensor] = None,
                      intermediate_conv_window: Optional[torch.Tensor] = None,
                      intermediate_state_indices: Optional[torch.Tensor] = None,
                      out: Optional[torch.Tensor] = None) -> torch.Tensor:
    x, out, activation, squeeze = as_window_call(x, out, activation)
    batch, dim, T = x.shape
    K = weight.shape[1]
    if out is None:
        out = torch.empty_like(x)
    f32 = torch.float32
    w = weight.to(f32)
    win = intermediate_conv_window
    rows = []
    for b in range(batch):
        slot = b if conv_state_indices is None else int(conv_state_indices[b])
        if slot < 0 or slot >= conv_state.shape[0]:
            rows.append(None)
            continue
        seq = torch.cat([conv_state[slot, :, :K - 1].to(f32), x[b].to(f32)], 1)  # in(-(K-1)) .. in(T-1)
        y = torch.zeros(dim, T, dtype=f32, device=x.device) if bias is None else bias.to(f32)[:, None].repeat(1, T)
        for j in range(K):  # the kernel's order: bias, then the taps oldest first
            y = y + w[:, j:j + 1] * seq[:, j:j + T]
        if activation is not None:
            y = y / (1.0 + torch.exp(-y))
        rows.append((slot, seq, y))
    # every row's loads before any store (the kernel's programs read a slot's state before writing it)
    for b, r in enumerate(rows):
        if r is None:
            continue
        slot, seq, y = r
        out[b] = y.to(out.dtype)
        if win is not None:
            wrow = b if intermediate_state_indices is None else int(intermediate_state_indices[b])
            if 0 <= wrow < win.shape[0]:
                for t in range(T):  # the window after token t: in(t-K+2) .. in(t), i.e. seq[t+1 : t+K]
                    win[wrow, t] = seq[:, t + 1:t + K].to(win.dtype)
        conv_state[slot, :, :K - 1] = seq[:, T:T + K - 1].to(conv_state.dtype)
    return out.squeeze(-1) if squeeze else out
