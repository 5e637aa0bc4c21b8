"""The two halves of the decode kernels' flush-first order (launch option ``flush_first_max_batch``), checked
against each other and a Python reference: ``write_flush_first_rank`` (the pre-kernel's (row, 0) programs write
order[rank] = row) and ``flush_first_rank_row`` (``pdl_wait: scores``: each decode program finds the row of its
rank from the write positions itself). A rank that found no row, or two, shows as a mismatch."""

from __future__ import annotations

import random

import pytest
import torch
import triton
import triton.language as tl

from sglang_replayssm.kernels.common import flush_first_rank_row, next_pow2, write_flush_first_rank


@triton.jit
def _write_order(write_pos, order, stride_wp, n_rows, L: tl.constexpr, FF: tl.constexpr):
    i_n = tl.program_id(0).to(tl.int64)
    write_flush_first_rank(order, write_pos, stride_wp, n_rows, i_n, L, FF)


@triton.jit
def _rows_of_ranks(write_pos, rows, stride_wp, n_rows, L: tl.constexpr, FF: tl.constexpr):
    # grid (1, 1, n_rows): the decode kernels' rank axis is their third
    tl.store(rows + tl.program_id(2), flush_first_rank_row(write_pos, stride_wp, n_rows, L, FF).to(tl.int32))


def _reference(ws, L):
    flush = [r for r, w in enumerate(ws) if max(w, 0) >= L - 1]
    return flush + [r for r in range(len(ws)) if r not in flush]


@pytest.mark.parametrize("seed", range(6))
def test_rank_row_inverts_the_written_order(device, seed):
    rng = random.Random(seed)
    for _ in range(4):
        B, L = rng.randint(1, 37), rng.randint(1, 7)
        stride, dtype = rng.choice([1, 2]), rng.choice([torch.int32, torch.int64])
        ws = [rng.randint(-4, L + 3) for _ in range(B)]
        if seed == 0:
            ws = [L - 1] * B  # every row flushing
        elif seed == 1:
            ws = [0] * B  # none
        base = torch.full((B * stride,), -7, dtype=dtype, device=device)
        wp = base[::stride]
        wp.copy_(torch.tensor(ws, dtype=dtype))
        FF = max(16, next_pow2(B))
        order = torch.full((B,), -1, dtype=torch.int32, device=device)
        rows = torch.full((B,), -1, dtype=torch.int32, device=device)
        _write_order[(B,)](wp, order, stride, B, L=L, FF=FF)
        _rows_of_ranks[(1, 1, B)](wp, rows, stride, B, L=L, FF=FF)
        want = _reference(ws, L)
        assert order.cpu().tolist() == want, (ws, L)
        assert rows.cpu().tolist() == want, (ws, L)
