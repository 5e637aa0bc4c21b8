"""Kernel-level decode benchmark: our ReplaySSM kernels vs SGLang 0.5.17's stock kernels.

GPU host (after ``source .sglang-bundle/bootstrap.sh``; pass the commit, the copy there
may have no .git)::

    GIT_COMMIT=<sha> python3 -m eval.bench_kernels --out $OUT/kernels-h200.json [--quick]

CPU harness check (Triton interpreter, tiny shapes, the times mean nothing)::

    python -m eval.bench_kernels --device cpu --out /tmp/kernels-cpu.json

Writes ``<out>.json`` (every number), ``<out>.md`` (tables) and ``<out>.png`` (speedup
vs batch per family), and prints a short table last.

What is compared, per (geometry, state dtype, batch), all rows in one batch:

* Mamba2: SGLang's decode ``selective_state_update`` (the Triton backend behind
  ``kernels/ops/mamba/triton_ops/ssu_dispatch.py``, the default ``--mamba-backend
  triton``; kernel ``mamba_ssm._selective_scan_update_kernel`` with its hand-picked
  BLOCK_SIZE_M=4 / num_warps=4 for dstate=128, PDL on sm90), called with the exact
  argument forms ``MambaMixer2`` uses (A/dt/dt_bias/D expanded with stride 0, x/B/C as
  strided views of the conv output), against ``mamba2_replay_decode`` (its one route,
  output-only replay; ``ROUTES`` names it in the result keys).
* GDN: ``fused_recurrent_gated_delta_rule_packed_decode`` (BV=32, 1 warp, 3 stages),
  upstream's own ReplaySSM decode ``fused_recurrent_gdn_replayssm_decode`` (called as
  ``TritonGDNKernel.packed_decode`` calls it under ``--enable-linear-replayssm``: ring
  d/k in the SSM dtype, g fp32, a ``force_flush`` int32 tensor, defaults BV=64, nk=2,
  1 warp, 3 stages) and ``gdn_replay_decode``.

ReplaySSM kernels are timed per cursor phase w (all rows in the same phase) and
amortised over the flush cycle, t = ((L-1)·mean(t_nonflush) + t_flush) / L (the plain
mean when all L phases are timed), and cross-checked with one graph that walks the
phases 0..L-1 in order (``t_cycle_us``).  At batches >= L also one launch with row i at phase
i % L (``t_mixed_us``, ``speedup_mixed``): what a server's desynchronised requests run, 1/L
of the rows flushing in every step; reported beside the amortised figures, not as a target.
Timing: CUDA-graph replays of a sequence of launches that rotates among several disjoint slot sets so that the state touched per
replay is several times the L2 (slots are a random permutation of 1..S-1, S >= 2b+1),
median over many replays.  Bytes: see ``*_bytes`` below (unique bytes each kernel must
move; achieved GB/s and the fraction of the device-to-device copy bandwidth measured in
the same run).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import math
import statistics
import sys
import time
import types
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from eval import bench_common as bc
from eval import report
# the scaffolding, geometries, stock-kernel import, workloads and fp64 references every kernel benchmark shares
# (eval.bench_spec and eval.tune_kernels import them from bench_common too; the tests reach them here)
from eval.bench_common import (BUFFER_LEN, CPU_BUFFER_LEN, CPU_GDN_GEOMETRIES, CPU_MAMBA2_GEOMETRIES,  # noqa: F401
                               DTYPE_BYTES, GDN_GEOMETRIES, L2_BYTES, MAMBA2_GEOMETRIES, MAX_SETS, MIXED_ORDERS,
                               STATE_DTYPES, TOUCH_FACTOR, GDNWork, Mamba2Work, Stock, Timer, amortise,
                               copy_bandwidth, gbps, gdn_ref_step, git_commit, load_stock, log, mamba2_ref_step,
                               mixed_wpos, phase_wpos, pick_device, quick_phases, sglang_version, slot_sets_needed)

# ---------------------------------------------------------------------------------
# run settings of the decode benchmark
# ---------------------------------------------------------------------------------
HEADLINE = {"mamba2": "nemotron-h-8b", "gdn": "qwen3-next-80b"}
BATCHES = (1, 8, 32, 128, 256, 512)
QUICK_BATCHES = (1, 32, 256)
CPU_BATCHES = (1, 3)
ROUTES = ("output_only",)  # Mamba2 decode routes timed (result keys replay_<route>; state_and_output was removed)


# ---------------------------------------------------------------------------------
# bytes model (unique bytes a kernel must move through DRAM; pure arithmetic)
# ---------------------------------------------------------------------------------
def _total(d: Dict[str, int]) -> Dict[str, int]:
    d = dict(d)
    d["total"] = sum(v for k, v in d.items() if k != "total")
    return d


def mamba2_stock_bytes(b: int, H: int, P: int, N: int, G: int, state_bytes: int,
                       act_bytes: int = 2) -> Dict[str, int]:
    """SGLang ``selective_state_update``, one decode token per row: read and write
    the state; read x, dt (one per head: stride 0 over P), B, C, the slot index and
    the per-head A (fp32), D and dt_bias (activation dtype); write y."""
    state = b * H * P * N * state_bytes
    return _total({
        "state_read": state,
        "state_write": state,
        "ring_read": 0,
        "ring_append": 0,
        "inputs": b * H * P * act_bytes + b * H * act_bytes + 2 * b * G * N * act_bytes + b * 4
        + H * (4 + 2 * act_bytes),
        "outputs": b * H * P * act_bytes,
    })


def mamba2_replay_bytes(b: int, H: int, P: int, N: int, G: int, L: int, w: int, state_bytes: int,
                        act_bytes: int = 2) -> Dict[str, int]:
    """``mamba2_replay_decode`` at cursor phase w (all rows): read the checkpoint,
    the w ring entries (x [H,P] and B [G,N] in the activation dtype, Δ [H] fp32), the
    current inputs as the stock kernel plus write_pos; write y; non-flush (w < L-1)
    appends one entry, the flush (w == L-1) writes the state instead.  Unique bytes:
    the fp32 B·C scratch [b, G, max(16, L)] is not counted."""
    entry = H * P * act_bytes + G * N * act_bytes + H * 4
    return _replay_phase_bytes(b, w, L, b * H * P * N * state_bytes, entry,
                               mamba2_stock_bytes(b, H, P, N, G, state_bytes, act_bytes), 0)


def _replay_phase_bytes(b: int, w: int, L: int, state: int, entry: int, stock: Dict[str, int],
                        extra_row_bytes: int) -> Dict[str, int]:
    """Shared ReplaySSM accounting at phase w: checkpoint read, w ring entries read,
    one entry appended (non-flush) or the state written (flush, w == L-1), the stock
    kernel's inputs/outputs plus the write_pos cursor (+ extra bytes per row)."""
    if not 0 <= w < L:
        raise ValueError(f"phase w={w} outside [0, {L})")
    flush = w == L - 1
    return _total({
        "state_read": state,
        "state_write": state if flush else 0,
        "ring_read": b * w * entry,
        "ring_append": 0 if flush else b * entry,
        "inputs": stock["inputs"] + b * (4 + extra_row_bytes),
        "outputs": stock["outputs"],
    })


def gdn_stock_bytes(b: int, HV: int, Hk: int, K: int, V: int, state_bytes: int,
                    act_bytes: int = 2) -> Dict[str, int]:
    """SGLang ``fused_recurrent_gated_delta_rule_packed_decode``: read and write the
    state; read mixed_qkv, a, b, the slot index, A_log (fp32) and dt_bias; write o."""
    state = b * HV * V * K * state_bytes
    return _total({
        "state_read": state,
        "state_write": state,
        "ring_read": 0,
        "ring_append": 0,
        "inputs": b * (2 * Hk * K + HV * V) * act_bytes + 2 * b * HV * act_bytes + b * 4
        + HV * (4 + act_bytes),
        "outputs": b * HV * V * act_bytes,
    })


def gdn_replay_bytes(b: int, HV: int, Hk: int, K: int, V: int, L: int, w: int, state_bytes: int,
                     act_bytes: int = 2, d_bytes: Optional[int] = None, k_bytes: Optional[int] = None,
                     extra_row_bytes: int = 0) -> Dict[str, int]:
    """A GDN ReplaySSM decode at phase w: read the checkpoint and w ring entries
    (d [HV,V] in ``d_bytes``, k [Hk,K] in ``k_bytes``, g [HV] fp32), the stock inputs
    plus write_pos (+ ``extra_row_bytes`` per row, e.g. upstream's force_flush); write
    o; append one entry (non-flush) or write the state (flush).  Ours: d in the state
    dtype, k in the activation dtype (defaults).  Upstream: d and k in the state
    dtype.  Upstream's flush re-reads the state tile (an L2 hit, not counted)."""
    d_bytes = state_bytes if d_bytes is None else d_bytes
    k_bytes = act_bytes if k_bytes is None else k_bytes
    entry = HV * V * d_bytes + Hk * K * k_bytes + HV * 4
    return _replay_phase_bytes(b, w, L, b * HV * V * K * state_bytes, entry,
                               gdn_stock_bytes(b, HV, Hk, K, V, state_bytes, act_bytes), extra_row_bytes)


def mixed_bytes(per_phase: Callable[[int], Dict[str, int]], L: int, batch: int) -> float:
    """Bytes of the mixed launch: each row at its own phase, i.e. the row-weighted mean of ``per_phase`` (which
    counts all rows at one phase)."""
    counts = collections.Counter(i % L for i in range(batch))
    return sum(n * per_phase(w)["total"] for w, n in counts.items()) / batch


def amortised_bytes(per_phase: Callable[[int], Dict[str, int]], L: int) -> Dict[str, float]:
    """Mean over the L phases of a flush cycle of ``per_phase(w)`` (each key)."""
    rows = [per_phase(w) for w in range(L)]
    return {k: sum(r[k] for r in rows) / L for k in rows[0]}


# ---------------------------------------------------------------------------------
# stock SGLang kernels
# ---------------------------------------------------------------------------------


FAIRNESS_NOTES = [
    "Stock Mamba2 = SGLang's default --mamba-backend triton path (flashinfer's selective_state_update is opt-in); "
    "its launch table gives BLOCK_SIZE_M=4, num_warps=4 at dstate 128, and it launches with PDL on sm90.",
    "Stock kernels get SGLang's exact argument forms (stride-0 expanded A/dt/dt_bias/D, x/B/C strided views of "
    "the conv output, out [b,1,HV,V]); our Mamba2 kernel receives the same tensors.",
    "Upstream GDN ReplaySSM: ring d and k in the SSM dtype (fp32 at fp32 state) as memory_pool.py allocates them, "
    "force_flush int32 tensor passed (HAS_FORCE_FLUSH) as the backend does, kernel defaults BV=64, nk=2, 1 warp, "
    "3 stages; its replay dot runs on bf16 tensor cores (see its flushed-state error in the correctness check).",
    "Not in any kernel time: the per-forward cursor bookkeeping (upstream: gather/where/unique/scatter on "
    "write_pos once per step, shared by all layers; ours will have its own).",
    "ReplaySSM times are per-phase (all rows at the same write_pos) amortised over the L-step flush cycle; "
    "t_cycle_us is an independent in-order cycle measurement.  t_mixed_us (batches >= L) times one launch with row "
    "i at phase i % L, flush and non-flush programs mixed as in a server; the targets read the amortised times.",
    "Bytes are unique DRAM bytes per launch (L2 re-reads and the output_only B.C scratch not counted).",
]


def interpreter_probes() -> Dict[str, Any]:
    """Two Triton-interpreter behaviours that distort CPU-mode comparisons: a bf16
    ``tl.dot`` (upstream's GDN ReplaySSM uses one on every step) and whether an
    fp32 -> bf16 ``.to`` rounds to nearest even (SGLang's kernels round beta that way)."""
    import torch
    import triton
    import triton.language

    globals()["tl"] = triton.language

    @triton.jit
    def _probe_kernel(a_ptr, b_ptr, c_ptr, x_ptr, y_ptr):
        o = tl.arange(0, 16)
        a = tl.load(a_ptr + o[:, None] * 16 + o[None, :]).to(tl.bfloat16)
        b = tl.load(b_ptr + o[:, None] * 16 + o[None, :]).to(tl.bfloat16)
        tl.store(c_ptr + o[:, None] * 16 + o[None, :], tl.dot(a, b).to(tl.float32))
        tl.store(y_ptr + o, tl.load(x_ptr + o).to(tl.bfloat16).to(tl.float32))

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    x = torch.rand(16, generator=g)
    c, y = torch.empty(16, 16), torch.empty(16)
    _probe_kernel[(1,)](a, b, c, x, y)
    ref = a.bfloat16().float() @ b.bfloat16().float()
    return {"bf16_dot_ok": bool(((c - ref).abs().max() <= 1e-3 * ref.abs().max()).item()),
            "bf16_cast_rtne": bool(torch.equal(y, x.bfloat16().float()))}


def load_ours() -> Dict[str, Any]:
    """Our kernel entry points (None + error when a module is not importable yet)."""
    out: Dict[str, Any] = {"errors": {}}
    try:
        from sglang_replayssm.kernels.mamba2_replay import mamba2_replay_decode

        out["mamba2"] = mamba2_replay_decode
    except Exception as e:
        out["mamba2"] = None
        out["errors"]["mamba2"] = f"{type(e).__name__}: {e}"
    try:
        from sglang_replayssm.kernels.gdn_replay import gdn_replay_decode

        out["gdn"] = gdn_replay_decode
    except Exception as e:
        out["gdn"] = None
        out["errors"]["gdn"] = f"{type(e).__name__}: {e}"
    return out


def ours_launch_info() -> Dict[str, Any]:
    """Launch parameters our kernels resolve (defaults + the YAML in force)."""
    info: Dict[str, Any] = {}
    try:
        from sglang_replayssm.kernels import common

        info["config_file"] = str(common.config_file())
        info["config_file_exists"] = common.config_file().is_file()
    except Exception as e:
        info["error"] = repr(e)
    return info


# ---------------------------------------------------------------------------------
# correctness checks against the fp64 references (bench_common)
# ---------------------------------------------------------------------------------
def _maxabs(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def check_mamba2(stock_fn, ours_fn, geom, L: int, batch: int, device: str, seed: int = 1234) -> Dict[str, Any]:
    """One flush cycle (L steps from an empty ring) at fp32 state: every kernel's
    output vs the fp64 recurrence and ours vs stock; the checkpoint after the flush;
    non-flush steps must leave the checkpoint untouched.  Ring entries past the cursor
    and outputs are poisoned with NaN beforehand."""
    import torch

    w = Mamba2Work(geom, batch, L, "fp32", device, 1, seed)
    H, P, G, N = w.H, w.P, w.G, w.N
    idx = w.sets[0]["idx"]
    rows = idx.long()
    state0 = w.state.clone()
    ref = state0[rows].double()
    states = {"stock": state0.clone()} if stock_fn else {}
    rings = {}
    for r in ROUTES:
        states[r] = state0.clone()
        rings[r] = (torch.full_like(w.x_ring, float("nan")), torch.full_like(w.B_ring, float("nan")),
                    torch.full_like(w.dt_ring, float("nan")))
    gen = torch.Generator(device=device).manual_seed(seed + 7)
    res: Dict[str, Any] = {"family": "mamba2", "geometry": geom, "batch": batch, "L": L, "state_dtype": "fp32",
                           "steps": L, "ring_poison": "nan"}
    out_rel = {k: 0.0 for k in states}
    out_vs_stock = {r: 0.0 for r in ROUTES}
    all_written = {k: True for k in states}
    untouched = {r: None for r in ROUTES}
    for t in range(L):
        xbc = torch.empty((batch, H * P + 2 * G * N), dtype=torch.bfloat16, device=device).normal_(0, 1, generator=gen)
        xbc[:, H * P:] *= 0.3
        x, Bm, Cm = torch.split(xbc, [H * P, G * N, G * N], dim=-1)
        x, Bm, Cm = x.view(batch, H, P), Bm.view(batch, G, N), Cm.view(batch, G, N)
        dt = torch.empty((batch, H), dtype=torch.bfloat16, device=device).normal_(0, 0.5, generator=gen)
        dt_e = dt[:, :, None].expand(-1, -1, P)
        ref, y_ref = mamba2_ref_step(ref, x, dt, w.A_h, Bm, Cm, w.D_h, w.dt_bias_h)
        outs = {}
        if stock_fn:
            o = torch.full((batch, H, P), float("nan"), dtype=torch.bfloat16, device=device)
            stock_fn(states["stock"], x, dt_e, w.A, Bm, Cm, w.D, z=None, dt_bias=w.dt_bias, dt_softplus=True,
                     state_batch_indices=idx, out=o)
            outs["stock"] = o
        wp = torch.full((batch,), t, dtype=torch.int32, device=device)
        for r in ROUTES:
            o = torch.full((batch, H, P), float("nan"), dtype=torch.bfloat16, device=device)
            xr, Br, dtr = rings[r]
            ours_fn(states[r], xr, Br, dtr, x, dt_e, w.A, Bm, Cm, idx, wp, D=w.D, z=None, dt_bias=w.dt_bias,
                    dt_softplus=True, out=o)
            outs[r] = o
            if t == L - 2:
                untouched[r] = bool(torch.equal(states[r][rows], state0[rows]))
        for k, o in outs.items():
            all_written[k] = all_written[k] and bool(torch.isfinite(o).all())
            out_rel[k] = max(out_rel[k], bc.rel_err(o, y_ref))
        if "stock" in outs:
            for r in ROUTES:
                out_vs_stock[r] = max(out_vs_stock[r], _maxabs(outs[r], outs["stock"]))
    res["out_rel_err_vs_fp64"] = out_rel
    res["out_max_abs_diff_vs_stock"] = out_vs_stock if stock_fn else None
    res["outputs_all_written_finite"] = all_written
    res["state_rel_err_vs_fp64_after_flush"] = {k: bc.rel_err(s[rows], ref) for k, s in states.items()}
    if stock_fn:
        res["state_max_abs_diff_vs_stock_after_flush"] = {
            r: _maxabs(states[r][rows], states["stock"][rows]) for r in ROUTES}
    res["checkpoint_untouched_before_flush"] = untouched
    return res


def check_gdn(stock_fn, upstream_fn, ours_fn, geom, L: int, batch: int, device: str,
              seed: int = 4321) -> Dict[str, Any]:
    """GDN counterpart of :func:`check_mamba2` (ours and upstream's ReplaySSM vs the
    stock packed decode and the fp64 recurrence)."""
    import torch

    w = GDNWork(geom, batch, L, "fp32", device, 1, seed, with_upstream=False)
    HV, Hk, K, V = w.HV, w.Hk, w.K, w.V
    idx = w.sets[0]["idx"]
    rows = idx.long()
    state0 = w.state.clone()
    ref = state0[rows].double()
    kinds = (["stock"] if stock_fn else []) + (["upstream"] if upstream_fn else []) + ["ours"]
    states = {k: state0.clone() for k in kinds}
    nan = float("nan")
    ours_ring = (torch.full_like(w.d_ring, nan), torch.full_like(w.k_ring, nan), torch.full_like(w.g_ring, nan))
    up_ring = (torch.full_like(w.d_ring, nan), torch.full((w.num_slots, Hk, L, K), nan, device=device),
               torch.full_like(w.g_ring, nan))
    ff = torch.zeros((batch,), dtype=torch.int32, device=device)
    gen = torch.Generator(device=device).manual_seed(seed + 7)
    res: Dict[str, Any] = {"family": "gdn", "geometry": geom, "batch": batch, "L": L, "state_dtype": "fp32",
                           "steps": L, "ring_poison": "nan"}
    out_rel = {k: 0.0 for k in kinds}
    vs_stock = {k: 0.0 for k in kinds if k != "stock"}
    all_written = {k: True for k in kinds}
    untouched: Dict[str, Optional[bool]] = {k: None for k in kinds if k != "stock"}
    width = 2 * Hk * K + HV * V
    for t in range(L):
        mq = torch.empty((batch, width), dtype=torch.bfloat16, device=device).normal_(0, 1, generator=gen)
        a = torch.empty((batch, HV), dtype=torch.bfloat16, device=device).normal_(0, 1, generator=gen)
        bb = torch.empty((batch, HV), dtype=torch.bfloat16, device=device).normal_(0, 1, generator=gen)
        ref, o_ref = gdn_ref_step(ref, mq, a, bb, w.A_log, w.dt_bias, Hk, K, V, w.scale)
        wp = torch.full((batch,), t, dtype=torch.int32, device=device)
        outs = {}
        for k in kinds:
            o = torch.full((batch, 1, HV, V), nan, dtype=torch.bfloat16, device=device)
            if k == "stock":
                stock_fn(mixed_qkv=mq, a=a, b=bb, A_log=w.A_log, dt_bias=w.dt_bias, scale=w.scale,
                         initial_state=states[k], out=o, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
            elif k == "upstream":
                upstream_fn(mixed_qkv=mq, a=a, b=bb, A_log=w.A_log, dt_bias=w.dt_bias, scale=w.scale,
                            initial_state=states[k], d_cache=up_ring[0], k_cache=up_ring[1], g_cache=up_ring[2],
                            out=o, ssm_state_indices=idx, write_pos=wp, force_flush=ff,
                            use_qk_l2norm_in_kernel=True)
            else:
                ours_fn(mq, a, bb, w.A_log, w.dt_bias, states[k], ours_ring[0], ours_ring[1], ours_ring[2], idx, wp,
                        scale=w.scale, use_qk_l2norm=True, out=o)
            outs[k] = o[:, 0]
            if k != "stock" and t == L - 2:
                untouched[k] = bool(torch.equal(states[k][rows], state0[rows]))
        for k, o in outs.items():
            all_written[k] = all_written[k] and bool(torch.isfinite(o).all())
            out_rel[k] = max(out_rel[k], bc.rel_err(o, o_ref))
            if k != "stock" and "stock" in outs:
                vs_stock[k] = max(vs_stock[k], _maxabs(o, outs["stock"]))
    res["out_rel_err_vs_fp64"] = out_rel
    res["out_max_abs_diff_vs_stock"] = vs_stock if stock_fn else None
    res["outputs_all_written_finite"] = all_written
    res["state_rel_err_vs_fp64_after_flush"] = {k: bc.rel_err(s[rows], ref) for k, s in states.items()}
    if stock_fn:
        res["state_max_abs_diff_vs_stock_after_flush"] = {
            k: _maxabs(states[k][rows], states["stock"][rows]) for k in kinds if k != "stock"}
    res["checkpoint_untouched_before_flush"] = untouched
    return res


# ---------------------------------------------------------------------------------
# one case
# ---------------------------------------------------------------------------------
def _replay_timing(timer: Timer, make_fn: Callable[[int, int], Callable], n_sets: int, L: int,
                   phases: Sequence[int], min_launches: int, bytes_fn: Callable[[int], Dict[str, int]],
                   copy_bw: Optional[float], with_cycle: bool = True, batch: int = 0) -> Dict[str, Any]:
    """Per-phase times (all rows at phase w), their flush-cycle amortisation and the
    in-order cycle graph, with bytes and bandwidth; with ``batch`` >= L also the mixed launch
    (``make_fn(s, L)``: row i at phase i % L, see :func:`mixed_wpos`)."""
    n_launch = max(n_sets, min_launches)
    phase_us: Dict[int, float] = {}
    phase_detail: Dict[int, Dict[str, Any]] = {}
    for w in phases:
        t = timer([make_fn(i % n_sets, w) for i in range(n_launch)])
        phase_us[w] = t["us"]
        nb = bytes_fn(w)["total"]
        phase_detail[w] = {"us": t["us"], "bytes": nb, "GBps": gbps(nb, t["us"]), "reps": t["reps"],
                           "launches": t["launches"], "method": t["method"], "spread": t.get("spread")}
    t_amort = amortise(phase_us, L)
    nonflush = [t for w, t in phase_us.items() if w != L - 1]
    cyc = None
    if with_cycle:
        n_cyc = L * max(1, math.ceil(max(n_sets, min_launches) / L))
        c = timer([make_fn(i % n_sets, i % L) for i in range(n_cyc)])
        cyc = c["us"]
    bytes_amort = amortised_bytes(bytes_fn, L)
    out = {
        "phase_us": phase_us,
        "phases": phase_detail,
        "t_nonflush_mean_us": statistics.fmean(nonflush) if nonflush else None,
        "t_flush_us": phase_us.get(L - 1),
        "t_amort_us": t_amort,
        "t_cycle_us": cyc,
        "bytes_amort": bytes_amort["total"],
        "bytes_breakdown_amort": bytes_amort,
        "bytes_nonflush_w0": bytes_fn(0)["total"],
        "bytes_flush": bytes_fn(L - 1)["total"],
    }
    out["GBps"] = gbps(out["bytes_amort"], t_amort)
    out["bw_fraction"] = report.ratio(out["GBps"], copy_bw)
    if L > 1 and batch >= L:
        m = timer([make_fn(i % n_sets, L) for i in range(n_launch)])
        nb = mixed_bytes(bytes_fn, L, batch)
        out["t_mixed_us"] = m["us"]
        out["mixed"] = {"us": m["us"], "bytes": nb, "GBps": gbps(nb, m["us"]),
                        "bw_fraction": report.ratio(gbps(nb, m["us"]), copy_bw), "reps": m["reps"],
                        "launches": m["launches"], "method": m["method"], "spread": m.get("spread")}
    return out


def _stock_entry(timer, fns, nb, label, copy_bw) -> Dict[str, Any]:
    t = timer(fns)
    entry = {"name": label, "t_us": t["us"], "bytes": nb["total"], "bytes_breakdown": nb,
             "GBps": gbps(nb["total"], t["us"]), "timing": t}
    entry["bw_fraction"] = report.ratio(entry["GBps"], copy_bw)
    return entry


def run_mamba2_case(name, geom, batch, L, sdtype, device, stock: Stock, ours, timer: Timer,
                    phases, copy_bw, min_launches, seed, routes=ROUTES) -> Dict[str, Any]:
    sb = DTYPE_BYTES[sdtype]
    row = geom["H"] * geom["P"] * geom["N"] * sb
    n_sets = 2 if device == "cpu" else slot_sets_needed(batch, row)
    w = Mamba2Work(geom, batch, L, sdtype, device, n_sets, seed)
    H, P, N, G = w.H, w.P, w.N, w.G
    case = bc.case_header("mamba2", name, geom, sdtype, batch, {"L": L}, w.num_slots, n_sets, row,
                          max(n_sets, min_launches))
    if stock.mamba2 is not None:
        case["kernels"]["stock"] = _stock_entry(
            timer, [w.stock_fn(stock.mamba2, i % n_sets) for i in range(max(n_sets, min_launches))],
            mamba2_stock_bytes(batch, H, P, N, G, sb), "sglang selective_state_update (triton)", copy_bw)
    if ours is not None:
        for r in routes:
            res = _replay_timing(timer, lambda s, ph: w.ours_fn(ours, s, ph), n_sets, L, phases,
                                 min_launches, lambda ph: mamba2_replay_bytes(batch, H, P, N, G, L, ph, sb), copy_bw,
                                 with_cycle=True, batch=batch)
            res["name"] = f"sglang_replayssm mamba2_replay_decode route={r}"
            case["kernels"][f"replay_{r}"] = res
    case["finite"] = w.finite()
    del w
    return bc.close_case(case, device, _case_summary)


def run_gdn_case(name, geom, batch, L, sdtype, device, stock: Stock, ours, timer: Timer,
                 phases, copy_bw, min_launches, seed) -> Dict[str, Any]:
    sb = DTYPE_BYTES[sdtype]
    row = geom["HV"] * geom["V"] * geom["K"] * sb
    n_sets = 2 if device == "cpu" else slot_sets_needed(batch, row)
    w = GDNWork(geom, batch, L, sdtype, device, n_sets, seed, with_upstream=stock.gdn_upstream is not None)
    HV, Hk, K, V = w.HV, w.Hk, w.K, w.V
    case = bc.case_header("gdn", name, geom, sdtype, batch, {"L": L}, w.num_slots, n_sets, row,
                          max(n_sets, min_launches))
    if stock.gdn is not None:
        case["kernels"]["stock"] = _stock_entry(
            timer, [w.stock_fn(stock.gdn, i % n_sets) for i in range(max(n_sets, min_launches))],
            gdn_stock_bytes(batch, HV, Hk, K, V, sb), "sglang fused_recurrent_gated_delta_rule_packed_decode",
            copy_bw)
    if stock.gdn_upstream is not None:
        res = _replay_timing(timer, lambda s, ph: w.upstream_fn(stock.gdn_upstream, s, ph), n_sets, L, phases,
                             min_launches,
                             lambda ph: gdn_replay_bytes(batch, HV, Hk, K, V, L, ph, sb, d_bytes=sb, k_bytes=sb,
                                                         extra_row_bytes=4), copy_bw, batch=batch)
        res["name"] = "sglang fused_recurrent_gdn_replayssm_decode (--enable-linear-replayssm)"
        case["kernels"]["upstream_replay"] = res
    if ours is not None:
        res = _replay_timing(timer, lambda s, ph: w.ours_fn(ours, s, ph), n_sets, L, phases, min_launches,
                             lambda ph: gdn_replay_bytes(batch, HV, Hk, K, V, L, ph, sb), copy_bw, batch=batch)
        res["name"] = "sglang_replayssm gdn_replay_decode"
        case["kernels"]["replay"] = res
    case["finite"] = w.finite()
    del w
    return bc.close_case(case, device, _case_summary)


def _case_summary(case: Dict[str, Any]) -> None:
    """Best ReplaySSM variant, speedups (stock time / ReplaySSM amortised time)."""
    ks = case["kernels"]
    stock_t = ks.get("stock", {}).get("t_us")
    ours = {k: v for k, v in ks.items() if k.startswith("replay")}
    best_key = None
    for k, v in ours.items():
        if report.is_number(v.get("t_amort_us")) and (
                best_key is None or v["t_amort_us"] < ours[best_key]["t_amort_us"]):
            best_key = k
    case["best"] = best_key
    case["best_route"] = best_key[len("replay_"):] if best_key and best_key.startswith("replay_") else best_key
    case["speedup_by_variant"] = {k: report.ratio(stock_t, v.get("t_amort_us")) for k, v in ours.items()}
    best = ours.get(best_key, {}) if best_key else {}
    case["t_ours_us"] = best.get("t_amort_us")
    case["speedup"] = report.ratio(stock_t, best.get("t_amort_us"))
    case["bw_fraction"] = best.get("bw_fraction")
    case["GBps"] = best.get("GBps")
    # the mixed launch (rows at every phase, as in a server; not a target, which reads the amortised times)
    case["t_ours_mixed_us"] = best.get("t_mixed_us")
    case["speedup_mixed"] = report.ratio(stock_t, best.get("t_mixed_us"))
    up = ks.get("upstream_replay")
    if up is not None:
        case["upstream_speedup"] = report.ratio(stock_t, up.get("t_amort_us"))
        case["vs_upstream"] = report.ratio(up.get("t_amort_us"), best.get("t_amort_us"))
        case["vs_upstream_mixed"] = report.ratio(up.get("t_mixed_us"), best.get("t_mixed_us"))


# ---------------------------------------------------------------------------------
# summary / outputs
# ---------------------------------------------------------------------------------
def build_summary(cases: List[Dict[str, Any]], mamba2_geoms: Sequence[str], gdn_geoms: Sequence[str],
                  headline: Dict[str, str]) -> Dict[str, Any]:
    s: Dict[str, Any] = {"headline_geometry": dict(headline),
                         "definitions": {
                             "speedup": "stock t_us / ReplaySSM t_amort_us (best route for Mamba2)",
                             "vs_upstream": "upstream ReplaySSM t_amort_us / ours t_amort_us (>1: ours faster)",
                             "bw_fraction": "ReplaySSM amortised model bytes / t_amort / measured copy bandwidth",
                             "speedup_mixed": "stock t_us / ReplaySSM t_mixed_us: one launch with row i at phase "
                                              "i % L (batch >= L; not a target)",
                             "vs_upstream_mixed": "upstream t_mixed_us / ours t_mixed_us"}}
    for fam, prefix, dt, bs, c in bc.summary_cells(cases, {"mamba2": mamba2_geoms, "gdn": gdn_geoms}, headline):
        s[f"{prefix}_decode_speedup_bs{bs}_{dt}"] = c.get("speedup") if c else None
        s[f"{prefix}_decode_bw_fraction_bs{bs}_{dt}"] = c.get("bw_fraction") if c else None
        if bs > 1:  # the mixed launch needs batch >= L
            s[f"{prefix}_decode_speedup_mixed_bs{bs}_{dt}"] = c.get("speedup_mixed") if c else None
        s[f"{prefix}_stock_bw_fraction_bs{bs}_{dt}"] = (
            c["kernels"].get("stock", {}).get("bw_fraction") if c else None)
        if fam == "mamba2":
            s[f"{prefix}_decode_best_route_bs{bs}_{dt}"] = c.get("best_route") if c else None
        if fam == "gdn":
            s[f"{prefix}_decode_vs_upstream_bs{bs}_{dt}"] = c.get("vs_upstream") if c else None
            s[f"{prefix}_upstream_speedup_bs{bs}_{dt}"] = c.get("upstream_speedup") if c else None
            if bs > 1:
                s[f"{prefix}_decode_vs_upstream_mixed_bs{bs}_{dt}"] = c.get("vs_upstream_mixed") if c else None
    # mixed ring phases at batch 32, where they cost most relative to the aligned launch (issue 25's key)
    for fam, prefix, dt, bs, c in bc.summary_cells(cases, {"mamba2": mamba2_geoms, "gdn": gdn_geoms}, headline,
                                                   batches=(32,)):
        s[f"{prefix}_decode_speedup_mixed_bs{bs}_{dt}"] = c.get("speedup_mixed") if c else None
        if fam == "gdn":
            s[f"{prefix}_decode_vs_upstream_mixed_bs{bs}_{dt}"] = c.get("vs_upstream_mixed") if c else None
    s["by_geometry"] = bc.by_geometry(
        cases, ("speedup", "best_route", "bw_fraction", "vs_upstream", "upstream_speedup", "t_ours_us",
                "speedup_mixed", "vs_upstream_mixed", "t_ours_mixed_us"),
        extra=lambda c: {"t_stock_us": c["kernels"].get("stock", {}).get("t_us")})
    return s


def _us(c, key, field="t_amort_us"):
    k = c["kernels"].get(key)
    if not k:
        return None
    return k.get("t_us") if key == "stock" else k.get(field)


def markdown_report(result: Dict[str, Any]) -> List[tuple]:
    cases = result["cases"]
    env = {k: result.get(k) for k in ("git_commit", "sglang_version", "gpu", "torch", "triton", "device")}
    env["copy bandwidth (GB/s)"] = result.get("copy_bw_GBps")
    env["L"] = result.get("L")
    env["mode"] = result.get("mode")
    sections = [("Environment", report.markdown_kv(env))]
    rows = []
    for chk in result.get("correctness", []):
        if "error" in chk:
            rows.append([chk.get("family"), "error: " + chk["error"][:120], "", "", "", ""])
            continue
        for k, rel in chk["out_rel_err_vs_fp64"].items():
            vs = (chk.get("out_max_abs_diff_vs_stock") or {}).get(k)
            st = chk["state_rel_err_vs_fp64_after_flush"].get(k)
            rows.append([f"{chk['family']} bs{chk['batch']}", k, bc.sci(rel), bc.sci(vs), bc.sci(st),
                         str(chk["outputs_all_written_finite"].get(k))])
    sections.append(("Correctness spot check (fp32 state, one flush cycle from an empty ring)",
                     report.markdown_table(["case", "kernel", "out rel err vs fp64", "out max |Δ| vs stock",
                                            "state rel err after flush", "outputs written & finite"], rows,
                                           align=["l", "l", "r", "r", "r", "r"])))
    m_rows, g_rows = [], []
    for c in cases:
        ks = c["kernels"]
        st = ks.get("stock", {})
        if c["family"] == "mamba2":
            oo = ks.get("replay_output_only", {})
            best = ks.get(c.get("best") or "", {})
            m_rows.append([c["geometry"], c["state_dtype"], c["batch"], report.fmt(st.get("t_us"), 1),
                           report.fmt(oo.get("t_amort_us"), 1),
                           c.get("best_route") or "—", report.fmt(c.get("speedup"), 2),
                           report.fmt(best.get("t_nonflush_mean_us"), 1), report.fmt(best.get("t_flush_us"), 1),
                           report.fmt(best.get("GBps"), 0), report.fmt(c.get("bw_fraction"), pct=True),
                           report.fmt(st.get("GBps"), 0), report.fmt(st.get("bw_fraction"), pct=True),
                           report.fmt(best.get("t_mixed_us"), 1), report.fmt(c.get("speedup_mixed"), 2)])
        else:
            r, up = ks.get("replay", {}), ks.get("upstream_replay", {})
            g_rows.append([c["geometry"], c["state_dtype"], c["batch"], report.fmt(st.get("t_us"), 1),
                           report.fmt(up.get("t_amort_us"), 1), report.fmt(r.get("t_amort_us"), 1),
                           report.fmt(c.get("speedup"), 2), report.fmt(c.get("vs_upstream"), 2),
                           report.fmt(c.get("upstream_speedup"), 2),
                           report.fmt(r.get("t_nonflush_mean_us"), 1), report.fmt(r.get("t_flush_us"), 1),
                           report.fmt(r.get("GBps"), 0), report.fmt(c.get("bw_fraction"), pct=True),
                           report.fmt(up.get("GBps"), 0), report.fmt(st.get("GBps"), 0),
                           report.fmt(st.get("bw_fraction"), pct=True), report.fmt(r.get("t_mixed_us"), 1),
                           report.fmt(up.get("t_mixed_us"), 1), report.fmt(c.get("speedup_mixed"), 2),
                           report.fmt(c.get("vs_upstream_mixed"), 2)])
    if m_rows:
        sections.append(("Mamba2 decode (µs per launch; ReplaySSM amortised over the flush cycle; mixed: one launch "
                         "with row i at phase i % L, batches >= L, of the route best amortised)",
                         report.markdown_table(["geometry", "state", "bs", "stock", "ours", "best",
                                                "speedup", "best non-flush", "best flush", "ours GB/s", "ours %copy",
                                                "stock GB/s", "stock %copy", "best route mixed", "mixed vs stock"],
                                               m_rows)))
    if g_rows:
        sections.append(("GDN decode (µs per launch; ReplaySSM amortised over the flush cycle; mixed: one launch "
                         "with row i at phase i % L, batches >= L)",
                         report.markdown_table(["geometry", "state", "bs", "stock", "upstream RS", "ours",
                                                "ours vs stock", "ours vs upstream", "upstream vs stock",
                                                "ours non-flush", "ours flush", "ours GB/s", "ours %copy",
                                                "upstream GB/s", "stock GB/s", "stock %copy", "ours mixed",
                                                "upstream mixed", "mixed: ours vs stock", "mixed: ours vs upstream"],
                                               g_rows)))
    return sections + bc.summary_sections(result.get("summary", {}), result.get("notes") or [])


def plot_report(result: Dict[str, Any], path) -> bool:
    def series(fam, g, dt, sel):
        out = [bc.batch_series(f"ours/stock {g} {dt}", sel, "speedup", style="-")]
        if fam == "gdn":
            out.append(bc.batch_series(f"upstream RS/stock {g} {dt}", sel, "upstream_speedup", style="--",
                                       marker="x"))
        return out

    return bc.plot_speedups(result, path, (("mamba2", "Mamba2 decode"), ("gdn", "GDN decode")),
                            "speedup vs stock (amortised)", series, f"L={result.get('L')}")


def stdout_table(result: Dict[str, Any]) -> str:
    rows = []
    for c in result["cases"]:
        rows.append([c["family"], c["geometry"], c["state_dtype"], c["batch"],
                     report.fmt(_us(c, "stock"), 1),
                     report.fmt(c.get("t_ours_us"), 1), (c.get("best_route") or "—")[:6],
                     report.fmt(c.get("speedup"), 2), report.fmt(c.get("bw_fraction"), pct=True),
                     report.fmt(_us(c, "upstream_replay"), 1), report.fmt(c.get("vs_upstream"), 2)])
    return report.text_table(["fam", "geometry", "state", "bs", "stock us", "ours us", "route", "speedup",
                              "%copy", "upstr us", "vs upstr"], rows)


# ---------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output JSON path (.md and .png written beside it)")
    ap.add_argument("--resummarize", action="store_true",
                    help="measure nothing: rebuild the summary keys of the existing --out JSON from its cases")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: headline geometries, batches 1/32/256, phases 0, L/2, L-2, L-1")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="cpu: tiny geometries in the Triton interpreter (harness check only)")
    ap.add_argument("--family", choices=("mamba2", "gdn", "all"), default="all")
    ap.add_argument("--geometries", nargs="*", default=None, help="subset of geometry names")
    ap.add_argument("--batches", type=int, nargs="*", default=None)
    ap.add_argument("--dtypes", nargs="*", choices=STATE_DTYPES, default=None)
    ap.add_argument("--L", type=int, default=None, help=f"ring length (default {BUFFER_LEN}; cpu {CPU_BUFFER_LEN})")
    ap.add_argument("--all-phases", action="store_true", help="time every phase even with --quick")
    ap.add_argument("--check-batch", type=int, default=None, help="batch of the correctness spot check (8; cpu 2)")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness spot check")
    ap.add_argument("--target-ms", type=float, default=None, help="timed milliseconds per measurement")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="stop starting new cases after this many seconds (default 330 on cuda)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mixed-order", choices=MIXED_ORDERS, default="modulo",
                    help="row order of the mixed launch's phases: modulo (row i at phase i %% L), flush-first "
                         "or flush-last (the same phases sorted so the flush rows come first / last)")
    return ap.parse_args(argv)


def resummarize(path) -> Dict[str, Any]:
    """Rebuild the ``summary`` of a benchmark JSON from its measured cases (after a change of the summary keys);
    every key is derived, nothing is measured or typed in.  Rewrites the JSON in place and returns the summary."""
    result = report.read_json(path)
    head = result["summary"]["headline_geometry"]
    geoms = result["geometries"]
    result["summary"] = build_summary(result["cases"], list(geoms.get("mamba2", {})), list(geoms.get("gdn", {})),
                                      head)
    report.write_json(path, result)
    return result["summary"]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.resummarize:
        try:
            s = resummarize(args.out)
        except (OSError, KeyError, ValueError) as e:
            log(f"!! --resummarize {args.out}: {type(e).__name__}: {e}")
            return 2
        log(f"-- rebuilt {len(s)} summary keys of {args.out}")
        return 0
    bc.MIXED_ORDER = args.mixed_order  # the work objects' mixed launch (bench_common.mixed_wpos)
    t_start = time.time()
    device = bc.start_device(args.device)
    if device is None:
        return 2
    cpu = device == "cpu"
    L = args.L or (CPU_BUFFER_LEN if cpu else BUFFER_LEN)
    m_geoms = CPU_MAMBA2_GEOMETRIES if cpu else MAMBA2_GEOMETRIES
    g_geoms = CPU_GDN_GEOMETRIES if cpu else GDN_GEOMETRIES
    headline = {"mamba2": next(iter(m_geoms)), "gdn": next(iter(g_geoms))}
    if args.quick and not args.geometries:
        m_geoms = {headline["mamba2"]: m_geoms[headline["mamba2"]]}
        g_geoms = {headline["gdn"]: g_geoms[headline["gdn"]]}
    if args.geometries:
        unknown = set(args.geometries) - set(m_geoms) - set(g_geoms)
        if unknown:
            log(f"!! unknown geometries {sorted(unknown)}; known: {sorted(m_geoms) + sorted(g_geoms)}")
            return 2
        m_geoms = {k: v for k, v in m_geoms.items() if k in args.geometries}
        g_geoms = {k: v for k, v in g_geoms.items() if k in args.geometries}
    if args.family == "mamba2":
        g_geoms = {}
    elif args.family == "gdn":
        m_geoms = {}
    if args.batches:
        batches = tuple(args.batches)
    else:
        batches = CPU_BATCHES if cpu else (QUICK_BATCHES if args.quick else BATCHES)
    dtypes = tuple(args.dtypes) if args.dtypes else STATE_DTYPES
    phases = list(range(L)) if (args.all_phases or not args.quick) else quick_phases(L)
    if cpu:
        phases = list(range(L)) if args.all_phases else quick_phases(L)
    target_ms = args.target_ms or (10.0 if args.quick else 20.0)
    budget = args.time_budget_s if args.time_budget_s is not None else (330.0 if not cpu else 1e9)
    min_launches = 2 if cpu else 4

    log(f"== bench_kernels: device={device} L={L} batches={list(batches)} dtypes={list(dtypes)} "
        f"phases={phases} mamba2={list(m_geoms)} gdn={list(g_geoms)}")
    stock = load_stock(device)
    ours = load_ours()
    for k, e in ours["errors"].items():
        log(f"!! our {k} kernel not importable: {e}")

    result = bc.result_header(
        device, args.quick, {"L": L, "mixed_order": bc.MIXED_ORDER}, phases=phases, batches=batches, dtypes=dtypes,
        geometries={"mamba2": m_geoms, "gdn": g_geoms}, stock=stock.info(),
        ours={"errors": ours["errors"], "launch": ours_launch_info()},
        timing_method="CUDA graph replay, events, median", target_ms=target_ms, min_launches=min_launches,
        fairness_notes=FAIRNESS_NOTES)
    if cpu:
        try:
            probes = interpreter_probes()
        except Exception as e:
            probes = {"error": f"{type(e).__name__}: {e}"}
        result["interpreter_probes"] = probes
        if probes.get("bf16_dot_ok") is False:
            result["notes"].append("Triton interpreter computes bf16 tl.dot wrongly: upstream's GDN ReplaySSM "
                                   "(bf16 tl.dot on every step) gives garbage on CPU; only the GPU run is meaningful.")
        if probes.get("bf16_cast_rtne") is False:
            result["notes"].append("Triton interpreter's fp32->bf16 cast does not round to nearest even: SGLang's "
                                   "stock GDN (beta rounded to b's dtype) is off by ~1e-3 on CPU.")

    cb = bc.measure_copy_bandwidth(result, device)

    result["correctness"] = []
    if not args.no_check:
        cbatch = args.check_batch or (2 if cpu else 8)
        for fam, geoms in (("mamba2", m_geoms), ("gdn", g_geoms)):
            if geoms and ours.get(fam) is not None:
                g = next(iter(geoms))
                check = (partial(check_mamba2, stock.mamba2, ours[fam], geoms[g], L, cbatch, device) if fam == "mamba2"
                         else partial(check_gdn, stock.gdn, stock.gdn_upstream, ours[fam], geoms[g], L, cbatch, device))
                bc.run_check(result, fam, g, check, _check_line, f"-- correctness {fam} {g} bs{cbatch} fp32, {L} steps")

    # case order: headline geometries first (fp32 then bf16, families interleaved), then the rest
    plan = []
    for dt in dtypes:
        for fam, geoms in (("mamba2", m_geoms), ("gdn", g_geoms)):
            if headline[fam] in geoms:
                plan += [(fam, headline[fam], dt, b) for b in batches]
    for dt in dtypes:
        for fam, geoms in (("mamba2", m_geoms), ("gdn", g_geoms)):
            plan += [(fam, g, dt, b) for g in geoms if g != headline[fam] for b in batches]
    timer = Timer(device, target_ms=target_ms)

    def run_one(i, fam, g, dt, b):
        if fam == "mamba2":
            return run_mamba2_case(g, m_geoms[g], b, L, dt, device, stock, ours.get("mamba2"), timer, phases,
                                   cb["GBps"], min_launches, args.seed + i)
        return run_gdn_case(g, g_geoms[g], b, L, dt, device, stock, ours.get("gdn"), timer, phases,
                            cb["GBps"], min_launches, args.seed + i)

    bc.run_cases(result, plan, run_one, _case_line, device=device, t_start=t_start, budget=budget)
    cb_end = bc.remeasure_copy_bandwidth(result, device)
    log(f"-- copy bandwidth again: {report.fmt(cb_end['GBps'], 0)} GB/s (start {report.fmt(cb['GBps'], 0)})")
    bc.note_skips_and_fallbacks(result, timer)
    result["summary"] = build_summary(result["cases"], list(m_geoms), list(g_geoms), headline)
    bc.write_outputs(result, args.out, t_start, "Kernel decode benchmark", markdown_report, plot_report, stdout_table,
                     ("mamba2_decode_speedup_bs256_fp32", "mamba2_decode_bw_fraction_bs256_fp32",
                      "mamba2_decode_speedup_bs1_fp32", "gdn_decode_speedup_bs256_fp32",
                      "gdn_decode_vs_upstream_bs256_fp32"))
    return 0


def _case_line(c: Dict[str, Any]) -> str:
    return (f"stock {report.fmt(_us(c, 'stock'), 1)} us, "
            f"ours {report.fmt(c.get('t_ours_us'), 1)} us ({c.get('best_route')}), "
            f"speedup {report.fmt(c.get('speedup'), 2)}"
            + (f", upstream {report.fmt(_us(c, 'upstream_replay'), 1)} us, vs upstream "
               f"{report.fmt(c.get('vs_upstream'), 2)}" if c["family"] == "gdn" else ""))


def _check_line(r: Dict[str, Any]) -> str:
    if "error" in r:
        return f"!! check failed: {r['error']}"
    rel = ", ".join(f"{k} {v:.2e}" for k, v in r["out_rel_err_vs_fp64"].items())
    vs = r.get("out_max_abs_diff_vs_stock") or {}
    vs_s = ", ".join(f"{k} {v:.2e}" for k, v in vs.items())
    bad = [k for k, v in r["outputs_all_written_finite"].items() if not v]
    tail = f"; !! not written/finite: {bad}" if bad else ""
    return f"out rel err vs fp64: {rel}; max|Δ| vs stock: {vs_s or '—'}{tail}"


if __name__ == "__main__":
    sys.exit(main())
