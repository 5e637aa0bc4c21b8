"""Tolerances and comparison helpers shared by the GDN kernel test modules (decode and verify)."""

from __future__ import annotations

import torch

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16

PRECISIONS = {  # (state dtype, activation dtype)
    "s32-a16b": (F32, BF16),
    "s32-a32": (F32, F32),
    "s16b-a16b": (BF16, BF16),
    "s16-a16": (F16, F16),
}
EPS = {BF16: 2.0 ** -7, F16: 2.0 ** -10}
ORACLE_TOL = {  # state dtype -> {"out": (atol, rtol, scale), "state": (atol, rtol, scale)}
    F32: {"out": (2e-5, 2e-5, 0.0), "state": (2e-5, 2e-5, 0.0)},
    BF16: {"out": (0.0, EPS[BF16], 2 * EPS[BF16]), "state": (0.0, EPS[BF16], 4 * EPS[BF16])},
    F16: {"out": (0.0, EPS[F16], 2 * EPS[F16]), "state": (0.0, EPS[F16], 4 * EPS[F16])},
}
ULP_RTOL = {F32: 1e-5, BF16: 2.0 ** -7, F16: 2.0 ** -10}
REF_OUT_TOL = (2e-6, 1e-5)


def check_close(actual, expected, atol, rtol, what, scale=0.0):
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(e.shape)}"
    err = (a - e).abs()
    if scale and e.numel():
        atol = atol + scale * float(e.abs().max())
    bad = ~(err <= atol + rtol * e.abs())  # NaN counts as bad
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements off (atol={atol:g}, rtol={rtol:g}); "
            f"max err {float(err.nan_to_num(float('inf')).max()):.3e}; first at {idx}: "
            f"got {float(a[idx]):.7g}, want {float(e[idx]):.7g}")
    return float(err.max()) if err.numel() else 0.0


def bits(t):
    """Bit pattern of a float tensor (NaN-safe equality)."""
    t = t.detach().contiguous().cpu()
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def max_err(a, b):
    return float((a.double().cpu() - b.double().cpu()).abs().max())
