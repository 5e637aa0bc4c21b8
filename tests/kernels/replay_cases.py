"""One-call kernel cases against the fp64 and the fp32 sequential recurrence (decode, verify, materialize).

Each ``run_*`` fills a ring with random history (optionally holding large steps: dt + dt_bias ~ 22 for
Mamba2, gates ~ -22 exp(A_log) for GDN), runs the kernel once and returns ``[(name, kernel, fp64, fp32)]``:
every tensor the kernel produced (outputs; the stored checkpoint where the call writes one) next to the plain
sequential recurrence of the same inputs in fp64 (the oracle) and in fp32 (the yardstick). Inputs are drawn
on the CPU from ``gen`` and moved to ``device``; results come back on the CPU. Used by
test_replay_weights_accuracy.py (interpreter and CUDA) and test_tensor_core_paths_gpu.py (CUDA only).
"""

from __future__ import annotations

from typing import List, Tuple

import torch

from sglang_replayssm.kernels.gdn_ref import gdn_step_oracle, l2norm
from sglang_replayssm.kernels.gdn_replay import gdn_replay_decode
from sglang_replayssm.kernels.gdn_verify import gdn_verify
from sglang_replayssm.kernels.gdn_verify_ref import gdn_window_oracle
from sglang_replayssm.kernels.mamba2_ref import mamba2_step_oracle
from sglang_replayssm.kernels.mamba2_replay import mamba2_replay_decode
from sglang_replayssm.kernels.mamba2_verify import mamba2_verify
from sglang_replayssm.kernels.materialize import gdn_materialize, mamba2_materialize

F32, F64 = torch.float32, torch.float64
BIG = 22.0  # dt + dt_bias (Mamba2) / softplus argument (GDN) of a large step: above softplus' threshold 20

Case = List[Tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]


def rms(t: torch.Tensor) -> float:
    return float(t.to(F64).pow(2).mean().sqrt())


def rms_errors(case: Case):
    """[(name, rms |kernel - fp64|, rms |fp32 - fp64|, rms |fp64|)] per tensor of a case. Root mean square
    rather than max: the ratio of two maxima of a few hundred rounding errors swings by 2x from seed to seed,
    the RMS does not."""
    return [(name, rms(a.to(F64) - o.to(F64)), rms(r.to(F64) - o.to(F64)), rms(o)) for name, a, o, r in case]


def _rand_int(gen, hi):
    return int(torch.randint(0, hi, (1,), generator=gen))


def _ring_positions(gen, S, R, n_hist, circular):
    """Physical ring index of logical history position j per slot: j (linear ring) or (origin + j) % R."""
    origin = torch.randint(0, R, (S,), generator=gen) if circular else torch.zeros(S, dtype=torch.int64)
    return origin, [(int(origin[s]) + torch.arange(n_hist)) % R for s in range(S)]


# ----------------------------------------------------------------------------------------------------
# Mamba2
# ----------------------------------------------------------------------------------------------------


def _mamba2_inputs(gen, rows, H, P, N, G, n_hist, T, large):
    """Random S_ck, history (processed Δ; two large steps per row if ``large``), a window of T raw tokens
    (one large step on odd rows if ``large``); A in [-16, -1]."""
    A = -(1.0 + 15.0 * torch.rand(H, generator=gen))
    S0 = torch.randn(rows, H, P, N, generator=gen)
    dh = 0.005 + 0.2 * torch.rand(rows, H, n_hist, generator=gen)
    if large and n_hist:
        for r in range(rows):
            dh[r, :, torch.randperm(n_hist, generator=gen)[:2]] = BIG + torch.rand(1, generator=gen).item()
    xh = torch.randn(rows, H, n_hist, P, generator=gen)
    Bh = torch.randn(rows, G, n_hist, N, generator=gen)
    dt_bias = torch.randn(H, generator=gen) * 0.5 - 3.0
    dtw = torch.randn(rows, T, H, generator=gen) * 0.5  # softplus(dt + bias) ~ 0.05
    if large:
        for r in range(1, rows, 2):
            dtw[r, _rand_int(gen, T), :] = BIG - dt_bias
    xw = torch.randn(rows, T, H, P, generator=gen)
    Bw = torch.randn(rows, T, G, N, generator=gen)
    Cw = torch.randn(rows, T, G, N, generator=gen)
    return A, S0, dh, xh, Bh, dt_bias, dtw, xw, Bw, Cw


def _mamba2_sequential(dtype, A, S0, dh, xh, Bh, dt_bias, dtw, xw, Bw, Cw):
    """Plain sequential recurrence in ``dtype``: the history (processed Δ), then the window (raw dt).
    Returns (state after the history, state after the window, outputs [rows, T, H, P])."""
    S = S0.to(dtype)
    for j in range(dh.shape[2]):
        S, _ = mamba2_step_oracle(S, xh[:, :, j], dh[:, :, j], A, Bh[:, :, j], Bh[:, :, j],
                                  dt_softplus=False, dtype=dtype)
    S_hist = S
    ys = []
    for t in range(dtw.shape[1]):
        S, y = mamba2_step_oracle(S, xw[:, t], dtw[:, t], A, Bw[:, t], Cw[:, t], dt_bias=dt_bias, dtype=dtype)
        ys.append(y)
    return S_hist, S, torch.stack(ys, 1)


def _mamba2_pools(rows, H, P, N, G, R, S0, dh, xh, Bh, positions):
    S = rows + 1  # slot 0: the null slot
    state = torch.zeros(S, H, P, N)
    x_ring = torch.zeros(S, H, R, P)
    B_ring = torch.zeros(S, G, R, N)
    dt_ring = torch.zeros(S, H, R)
    for r in range(rows):
        s, phys = r + 1, positions[r + 1]
        state[s] = S0[r]
        x_ring[s][:, phys] = xh[r]
        B_ring[s][:, phys] = Bh[r]
        dt_ring[s][:, phys] = dh[r]
    return state, x_ring, B_ring, dt_ring


def run_mamba2_decode(device, gen, *, H, P, N, G, L, w, rows=4, large=True) -> Case:
    """One decode step at ring fill ``w`` (w == L-1: a flush, the checkpoint is checked too)."""
    A, S0, dh, xh, Bh, dt_bias, dtw, xw, Bw, Cw = inputs = _mamba2_inputs(gen, rows, H, P, N, G, w, 1, large)
    _, positions = _ring_positions(gen, rows + 1, L, w, circular=False)
    pools = [t.to(device) for t in _mamba2_pools(rows, H, P, N, G, L, S0, dh, xh, Bh, positions)]
    slots = torch.arange(1, rows + 1, dtype=torch.int32, device=device)
    out = mamba2_replay_decode(*pools, xw[:, 0].to(device), dtw[:, 0].to(device), A.to(device), Bw[:, 0].to(device),
                               Cw[:, 0].to(device), slots, torch.full((rows,), w, dtype=torch.int32, device=device),
                               dt_bias=dt_bias.to(device))
    _, S64, y64 = _mamba2_sequential(F64, *inputs)
    _, S32, y32 = _mamba2_sequential(F32, *inputs)
    case = [("out", out.cpu(), y64[:, 0], y32[:, 0])]
    if w == L - 1:  # the new checkpoint includes the current token
        case.append(("checkpoint", pools[0][slots.long()].cpu(), S64, S32))
    return case


def run_mamba2_verify(device, gen, *, H, P, N, G, T, R, flush, rows=4, large=True, act=None) -> Case:
    """One verify call over a full history (wp = R - T, circular ring); ``flush``: the history is folded
    into the checkpoint (checked too) and the window runs on top of it. ``act`` (e.g. bf16): x, B and C (window and
    ring) in that dtype, their values drawn on its grid so that the fp32 and fp64 references see the same numbers;
    the output is written in fp32."""
    wp = R - T
    A, S0, dh, xh, Bh, dt_bias, dtw, xw, Bw, Cw = _mamba2_inputs(gen, rows, H, P, N, G, wp, T, large)
    if act is not None:
        xh, Bh, xw, Bw, Cw = (t.to(act).to(F32) for t in (xh, Bh, xw, Bw, Cw))
    inputs = A, S0, dh, xh, Bh, dt_bias, dtw, xw, Bw, Cw
    origin, positions = _ring_positions(gen, rows + 1, R, wp, circular=True)
    pools = [t.to(device) for t in _mamba2_pools(rows, H, P, N, G, R, S0, dh, xh, Bh, positions)]
    a = act or F32
    pools[1], pools[2] = pools[1].to(a), pools[2].to(a)
    S = rows + 1
    slots = torch.arange(1, rows + 1, dtype=torch.int32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    out = mamba2_verify(*pools, xw.to(device, a), dtw.to(device), A.to(device), Bw.to(device, a), Cw.to(device, a),
                        slots, torch.full((S,), wp, **i32), origin.to(**i32), torch.full((S,), int(flush), **i32),
                        dt_bias=dt_bias.to(device), out=torch.empty(rows, T, H, P, device=device))
    Sh64, _, y64 = _mamba2_sequential(F64, *inputs)
    Sh32, _, y32 = _mamba2_sequential(F32, *inputs)
    case = [("out", out.cpu(), y64, y32)]
    if flush:
        case.append(("checkpoint", pools[0][slots.long()].cpu(), Sh64, Sh32))
    return case


def run_mamba2_materialize(device, gen, *, H, P, N, G, L, w, rows=4, large=True, **kw) -> Case:
    """Fold ring[0:w] of every slot into its checkpoint (``kw``: dot_precision, block sizes)."""
    A, S0, dh, xh, Bh, dt_bias, dtw, xw, Bw, Cw = inputs = _mamba2_inputs(gen, rows, H, P, N, G, w, 1, large)
    _, positions = _ring_positions(gen, rows + 1, L, w, circular=False)
    pools = [t.to(device) for t in _mamba2_pools(rows, H, P, N, G, L, S0, dh, xh, Bh, positions)]
    wpos = torch.full((rows + 1,), w, dtype=torch.int32, device=device)
    slots = torch.arange(1, rows + 1, dtype=torch.int32, device=device)
    mamba2_materialize(*pools, A.to(device), wpos, slots, **kw)
    S64 = _mamba2_sequential(F64, *inputs)[0]
    S32 = _mamba2_sequential(F32, *inputs)[0]
    return [("checkpoint", pools[0][slots.long()].cpu(), S64, S32)]


# ----------------------------------------------------------------------------------------------------
# GDN
# ----------------------------------------------------------------------------------------------------


def _gdn_inputs(gen, rows, Hk, HV, K, V, n_hist, T, large):
    """Random S_ck, history (d, raw k, g) and a window of T packed tokens; with ``large`` two large gates
    per row in the history (one 2-4 positions from the end, where its d_j still dominates the state) and one in
    the window on odd rows. exp(A_log) in [2, 8] (models: up to 16)."""
    A_log = torch.log(2.0 + 6.0 * torch.rand(HV, generator=gen))
    dt_bias = torch.randn(HV, generator=gen) * 0.5 - 2.0
    S0 = torch.randn(rows, HV, V, K, generator=gen) * 0.5
    gh = -(0.01 + 0.3 * torch.rand(rows, HV, n_hist, generator=gen))
    if large and n_hist:
        for r in range(rows):
            late = max(n_hist - 2 - _rand_int(gen, 3), 0)  # not the last: a weight with terms after it
            for j in (_rand_int(gen, n_hist), late):
                gh[r, :, j] = -(BIG + torch.rand(1, generator=gen).item()) * torch.exp(A_log)
    dh = torch.randn(rows, HV, n_hist, V, generator=gen) * 0.5
    kh = torch.randn(rows, Hk, n_hist, K, generator=gen)
    qkv = torch.randn(rows, T, 2 * Hk * K + HV * V, generator=gen)
    a = torch.randn(rows, T, HV, generator=gen) * 0.5
    if large:
        for r in range(1, rows, 2):
            a[r, _rand_int(gen, T), :] = BIG - dt_bias
    b = torch.randn(rows, T, HV, generator=gen)
    return A_log, dt_bias, S0, gh, dh, kh, qkv, a, b


def _gdn_fold(dtype, S0, gh, dh, kh):
    """Sequential fold of the history in ``dtype``: S = e^{g_j} S + d_j k^_j^T."""
    S = S0.to(dtype)
    khat = l2norm(kh.to(dtype)).repeat_interleave(S0.shape[1] // kh.shape[1], dim=1)  # [rows, HV, n, K]
    for j in range(gh.shape[2]):
        S = S * torch.exp(gh[:, :, j].to(dtype))[:, :, None, None] + dh[:, :, j].to(dtype)[..., None] * khat[:, :, j, None, :]
    return S


def _gdn_pools(rows, Hk, HV, K, V, R, S0, gh, dh, kh, positions):
    S = rows + 1
    state = torch.zeros(S, HV, V, K)
    d_ring = torch.zeros(S, HV, R, V)
    k_ring = torch.zeros(S, Hk, R, K)
    g_ring = torch.zeros(S, HV, R)
    for r in range(rows):
        s, phys = r + 1, positions[r + 1]
        state[s] = S0[r]
        d_ring[s][:, phys] = dh[r]
        k_ring[s][:, phys] = kh[r]
        g_ring[s][:, phys] = gh[r]
    return state, d_ring, k_ring, g_ring


def run_gdn_decode(device, gen, *, Hk, HV, K, V, L, w, rows=4, large=True) -> Case:
    """One decode step at ring fill ``w`` (w == L-1: a flush, the checkpoint is checked too)."""
    A_log, dt_bias, S0, gh, dh, kh, qkv, a, b = _gdn_inputs(gen, rows, Hk, HV, K, V, w, 1, large)
    _, positions = _ring_positions(gen, rows + 1, L, w, circular=False)
    pools = [t.to(device) for t in _gdn_pools(rows, Hk, HV, K, V, L, S0, gh, dh, kh, positions)]
    slots = torch.arange(1, rows + 1, dtype=torch.int32, device=device)
    out = gdn_replay_decode(qkv[:, 0].to(device), a[:, 0].to(device), b[:, 0].to(device), A_log.to(device),
                            dt_bias.to(device), *pools, slots, torch.full((rows,), w, dtype=torch.int32, device=device))
    res = {dt: gdn_step_oracle(qkv[:, 0], a[:, 0], b[:, 0], A_log, dt_bias, _gdn_fold(dt, S0, gh, dh, kh),
                               num_k_heads=Hk, compute_dtype=dt) for dt in (F64, F32)}
    case = [("out", out.reshape(rows, HV, V).cpu(), res[F64][0], res[F32][0])]
    if w == L - 1:
        case.append(("checkpoint", pools[0][slots.long()].cpu(), res[F64][1], res[F32][1]))
    return case


def run_gdn_verify(device, gen, *, Hk, HV, K, V, T, R, flush, rows=4, large=True) -> Case:
    """One verify call over a full history (wp = R - T, circular ring); ``flush``: the folded history is
    the stored checkpoint (checked too)."""
    wp = R - T
    A_log, dt_bias, S0, gh, dh, kh, qkv, a, b = _gdn_inputs(gen, rows, Hk, HV, K, V, wp, T, large)
    origin, positions = _ring_positions(gen, rows + 1, R, wp, circular=True)
    pools = [t.to(device) for t in _gdn_pools(rows, Hk, HV, K, V, R, S0, gh, dh, kh, positions)]
    S = rows + 1
    slots = torch.arange(1, rows + 1, dtype=torch.int32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    out = gdn_verify(qkv.to(device), a.to(device), b.to(device), A_log.to(device), dt_bias.to(device), *pools, slots,
                     torch.full((S,), wp, **i32), origin.to(**i32), torch.full((S,), int(flush), **i32))
    res = {}
    for dt in (F64, F32):
        S_hist = _gdn_fold(dt, S0, gh, dh, kh)
        res[dt] = (S_hist, gdn_window_oracle(qkv, a, b, A_log, dt_bias, S_hist, num_k_heads=Hk, compute_dtype=dt)[0])
    case = [("out", out.cpu(), res[F64][1], res[F32][1])]
    if flush:
        case.append(("checkpoint", pools[0][slots.long()].cpu(), res[F64][0], res[F32][0]))
    return case


def run_gdn_materialize(device, gen, *, Hk, HV, K, V, L, w, rows=4, large=True, **kw) -> Case:
    """Fold ring[0:w] of every slot into its checkpoint (``kw``: dot_precision, block_v)."""
    A_log, dt_bias, S0, gh, dh, kh, qkv, a, b = _gdn_inputs(gen, rows, Hk, HV, K, V, w, 1, large)
    _, positions = _ring_positions(gen, rows + 1, L, w, circular=False)
    pools = [t.to(device) for t in _gdn_pools(rows, Hk, HV, K, V, L, S0, gh, dh, kh, positions)]
    wpos = torch.full((rows + 1,), w, dtype=torch.int32, device=device)
    slots = torch.arange(1, rows + 1, dtype=torch.int32, device=device)
    gdn_materialize(*pools, wpos, slots, **kw)
    return [("checkpoint", pools[0][slots.long()].cpu(), _gdn_fold(F64, S0, gh, dh, kh), _gdn_fold(F32, S0, gh, dh, kh))]
