"""Helpers shared by the kernel test modules (random generators, bit views, tolerance checks)."""

from __future__ import annotations

import os

import torch

F64 = torch.float64


def make_gen():
    """A torch.Generator seeded from os.urandom (or REPLAYSSM_TEST_SEED), and its seed."""
    env = os.environ.get("REPLAYSSM_TEST_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(6), "little")
    return torch.Generator().manual_seed(seed), seed


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of ``t`` as an integer tensor (NaN-safe exact comparison)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def view_like(v: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """The view of ``base`` with the geometry of ``v`` (a view of a same-shaped base)."""
    return base.as_strided(v.shape, v.stride(), v.storage_offset())


def mismatch(actual, expected, rtol, atol):
    """(max excess ratio, worst index) of |a − e| against atol + rtol·|e|; ratio > 1 means a failure."""
    a = actual.to(F64)
    e = expected.to(F64)
    if a.numel() == 0:
        return 0.0, -1
    err = (a - e).abs()
    lim = atol + rtol * e.abs()
    ratio = torch.where(torch.isfinite(a), err / lim, torch.full_like(err, float("inf")))
    worst = int(torch.argmax(ratio.reshape(-1)))
    return float(ratio.reshape(-1)[worst]), worst
