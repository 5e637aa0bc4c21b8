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
MANTISSA_BITS = {BF16: 7, F16: 10}


def beta_rounding_atol(b, dbeta):
    """Per-element atol [B, HV, V] for kernel-vs-reference outputs from the rounding of beta to b's dtype.

    Both round beta = sigmoid(b) (fp32) to b's dtype, like the stock kernel. Their fp32 sigmoids may differ
    in the last bit (the GPU's and the interpreter's exp against torch's), and when that value sits on a
    rounding tie of a 16-bit dtype the two betas land one unit apart (seen: b fp16, 6/384 outputs off by
    4.3e-6). The output is linear in beta, o = alpha S q^ + beta (v - alpha S k^)(k^ . q^), so one unit
    moves it by ulp_b(beta) |do/dbeta| (``dbeta``: gdn_replay_decode_ref's ``dbeta_out``); twice that is
    the margin for a tie at a power of two (the unit below is half the one above) and for dbeta being the
    reference's fp32 value rather than the kernel's. Nothing else a step computes is rounded to 16 bits before
    the output (a 16-bit state is read identically by both; its own rounding is checked separately, one ulp).
    Zero for an fp32 b (beta not rounded)."""
    if b.dtype not in MANTISSA_BITS:
        return torch.zeros_like(dbeta, dtype=torch.float64).cpu()
    beta = torch.sigmoid(b.detach().float().cpu()).to(b.dtype).double()
    _, e = torch.frexp(beta)  # beta = m 2^e, m in [0.5, 1): one unit is 2^(e - 1 - mantissa bits)
    ulp = torch.ldexp(torch.ones_like(beta), e - 1 - MANTISSA_BITS[b.dtype])
    return 2.0 * ulp[..., None] * dbeta.detach().double().abs().cpu()


def check_close(actual, expected, atol, rtol, what, scale=0.0):
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(e.shape)}"
    err = (a - e).abs()
    if scale and e.numel():
        atol = atol + scale * float(e.abs().max())
    bad = ~(err <= atol + rtol * e.abs())  # NaN counts as bad; atol may be a per-element tensor
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        atol_s = f"{float(atol[idx]):g} here" if torch.is_tensor(atol) else f"{atol:g}"
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements off (atol={atol_s}, rtol={rtol:g}); "
            f"max err {float(err.nan_to_num(float('inf')).max()):.3e}; first at {idx}: "
            f"got {float(a[idx]):.7g}, want {float(e[idx]):.7g}")
    return float(err.max()) if err.numel() else 0.0


def bits(t):
    """Bit pattern of a float tensor (NaN-safe equality)."""
    t = t.detach().contiguous().cpu()
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def max_err(a, b):
    return float((a.double().cpu() - b.double().cpu()).abs().max())
