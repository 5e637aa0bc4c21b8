"""Kernel-level speculative-verify benchmark: our ReplaySSM verify kernels vs SGLang 0.5.17's.

GPU host (after ``source .sglang-bundle/bootstrap.sh``; pass the commit, the copy there
may have no .git)::

    GIT_COMMIT=<sha> python3 -m eval.bench_spec --out eval/results/spec-kernels-h200.json [--quick]

CPU harness check (Triton interpreter, tiny shapes, the times mean nothing)::

    python -m eval.bench_spec --device cpu --out /tmp/spec-cpu.json

Writes ``<out>.json`` (every number), ``<out>.md`` (tables) and ``<out>.png`` (speedup
vs batch per family), prints a short table last, and exits 1 when the correctness
check (ours vs stock, fp32 state) fails or could not run (the files are still written).

What is compared, per (geometry, state dtype, batch), one verify window of T = 4 tokens
(3 drafts) per row, history block B = 16, ring R = B + T = 20, accept 3 of 4 on every
step (as ``SGLANG_SIMULATE_ACC_LEN=3``):

* Stock Mamba2 (what SGLang runs per layer per verify step): ``selective_state_update``
  through ``ssu_dispatch`` (the default ``--mamba-backend triton``), called as
  ``sglang.srt.layers.attention.mamba.mamba.MambaMixer2`` calls it in target verify
  (x/dt/B/C views [bs, T, ...] of the conv output, A/dt_bias/D expanded with stride 0,
  ``disable_state_update=True``, ``intermediate_states_buffer`` [bs+1, T, H, P, N] in the
  state dtype, ``cache_steps=T``, ``intermediate_state_indices=arange(bs)``,
  ``retrieve_parent_token=None``), then the commit SGLang runs after the verify:
  ``fused_mamba_state_scatter_with_mask`` of snapshot ``accept-1`` into the state.
* Stock GDN: ``fused_sigmoid_gating_delta_rule_update`` with the arguments of
  ``TritonGDNKernel.target_verify`` (q/k/v [1, bs*T, heads, dim] split views of the
  packed projection, ``cu_seqlens``, ``disable_state_update=True``, intermediate buffer
  [bs+1, T, HV, V, K], ``cache_steps=T``), then the same scatter.
* Ours: ``mamba2_verify`` / ``gdn_verify`` on the circular ring, plus ``spec_commit``
  (accept 3), amortised over the flush cycle of the cursor rule (below).

Flush cycle.  ``spec_commit`` moves the cursors: after a flush verify ``wp <- a``,
otherwise ``wp <- wp + a``; then ``flush <- wp + 2T > R``.  From a reset (wp = 0) the
states at each verify are wp = 0 (once), then a, 2a, ... until ``k·a + 2T > R``.  So
the steady cycle is wp = a, 2a, ..., L_c·a with only the last one flushing, and

    L_c = floor((R - 2T) / a) + 1         (T=4, R=20, a=3: L_c = 5, wp = 3, 6, 9, 12, 15*)

(:func:`spec_cycle` derives it by simulating the rule and checks the closed form).  Each
state of the cycle is timed with every row at that (wp, origin, flush); ours per step is
``t = mean over the cycle of t_verify(state) + t_commit`` (``bench_common.amortise``;
with a subset of states timed, the non-flush mean is extrapolated).  Cross-check: one
CUDA graph that walks the cycle in order, verify then the real ``spec_commit`` per layer
and step (``t_cycle_us``); afterwards the cursors must be back at the cycle's start.
The reset state (wp = 0, the first verify after a prefill) is timed for information
only.  ``spec_commit`` runs once per step for all layers in the server; it is charged
here once per layer (conservative).

Timing, copy bandwidth, L2 defeat (several disjoint slot sets, one per emulated layer,
rotated within one graph), device pick, the case loop and the result/report scaffolding:
:mod:`eval.bench_common`, shared with :mod:`eval.bench_kernels`, and so are the stock-kernel
import (with its CPU shims), the geometries and the fp64 decode steps.
Bytes: see ``*_bytes`` below.
"""

from __future__ import annotations

import argparse
import importlib
import math
import statistics
import sys
import time
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from eval import bench_common as bc
from eval import report

# ---------------------------------------------------------------------------------
# run settings
# ---------------------------------------------------------------------------------
WINDOW = 4          # T: the verify window (1 + 3 draft tokens)
HISTORY = 16        # B: history block (--replayssm-buffer-len); ring R = B + T
ACCEPT = 3          # window tokens committed per step (SGLANG_SIMULATE_ACC_LEN=3)
MAMBA2_GEOMETRIES = {"nemotron-h-8b": bc.MAMBA2_GEOMETRIES["nemotron-h-8b"]}
GDN_GEOMETRIES = {"qwen3-next-80b": bc.GDN_GEOMETRIES["qwen3-next-80b"]}
EXTRA_MAMBA2 = {k: v for k, v in bc.MAMBA2_GEOMETRIES.items() if k not in MAMBA2_GEOMETRIES}
EXTRA_GDN = {k: v for k, v in bc.GDN_GEOMETRIES.items() if k not in GDN_GEOMETRIES}
TINY_MAMBA2 = dict(bc.CPU_MAMBA2_GEOMETRIES)
TINY_GDN = dict(bc.CPU_GDN_GEOMETRIES)
BATCHES = (1, 8, 32, 128, 256)
QUICK_BATCHES = (1, 32, 256)
CPU_BATCHES = (1, 2)
STATE_DTYPES = bc.STATE_DTYPES
CHECK_RTOL = 1e-3   # ours vs stock, fp32 state, fp32 outputs: |Δ| <= atol + rtol·|stock|
CHECK_ATOL = 1e-3
INT32 = 4

FAIRNESS_NOTES = [
    "Stock = the kernels SGLang 0.5.17 runs per layer in a chain target verify with the default "
    "--mamba-backend triton / Triton GDN decode backend, with their exact argument forms; the commit is "
    "SGLang's fused_mamba_state_scatter_with_mask of the accepted snapshot (one launch per layer here; SGLang "
    "issues one launch for all layers, same bytes).",
    "Ours = mamba2_verify / gdn_verify on the ring + spec_commit.  spec_commit is one launch per step for all "
    "layers in the server; it is charged once per layer here (conservative).",
    "Not in either time: the conv1d update and its intermediate-window scatter (unchanged by ReplaySSM), "
    "SGLang's q/k/v split kernel (fused_qkv_split_gdn_prefill) and our seam's re-pack of q|k|v "
    "(torch.cat); both GDN kernels read the same packed projection here (stock through split views).",
    "Ours is timed per cursor state (all rows in one state) and amortised over the flush cycle; "
    "t_cycle_us walks the cycle in order with the real spec_commit as a cross-check.",
    "Bytes are unique DRAM bytes per step and layer (L2 re-reads not counted); GB/s fractions are of the "
    "device-to-device copy bandwidth measured in the same run.",
]


# ---------------------------------------------------------------------------------
# cursor cycle (pure Python; the rule of sglang_replayssm.kernels.spec_cursor)
# ---------------------------------------------------------------------------------
def commit_rule(wp: int, origin: int, flush: int, accepted: int, T: int, R: int) -> Tuple[int, int, int]:
    """One ``spec_commit`` of one row: (wp, origin, flush) after committing ``accepted``."""
    if accepted > 0:
        if flush:
            origin, wp = (origin + wp) % R, accepted
        else:
            wp = wp + accepted
    return wp, origin, int(wp + 2 * T > R)


def cycle_length(T: int, R: int, accept: int) -> int:
    """Steps per flush cycle in steady state: floor((R - 2T) / a) + 1."""
    return (R - 2 * T) // accept + 1


def spec_cycle(T: int, R: int, accept: int) -> Dict[str, Any]:
    """Cursor states at each verify from a reset, with every step accepting ``accept``.

    Returns the transient states (before the steady cycle: the reset state wp = 0) and
    one steady cycle (a consecutive pass of the simulation, ending with its only flush
    state), each as dicts {wp, origin, flush}; checks the closed-form length."""
    if not (isinstance(T, int) and T >= 1 and isinstance(R, int) and R >= 2 * T):
        raise ValueError(f"spec cycle: need T >= 1 and R >= 2T, got T={T!r}, R={R!r}")
    if not (isinstance(accept, int) and 1 <= accept <= T):
        raise ValueError(f"spec cycle: accept must be in [1, T={T}], got {accept!r}")
    wp, org, fl = 0, 0, int(2 * T > R)  # spec_reset
    states: List[Tuple[int, int, int]] = []
    first: Dict[Tuple[int, int], int] = {}
    while (wp, fl) not in first:
        first[(wp, fl)] = len(states)
        states.append((wp, org, fl))
        wp, org, fl = commit_rule(wp, org, fl, accept, T, R)
    start = first[(wp, fl)]
    L = len(states) - start
    cycle = []
    for _ in range(L):  # the next pass: same (wp, flush) sequence, steady-state origins
        cycle.append((wp, org, fl))
        wp, org, fl = commit_rule(wp, org, fl, accept, T, R)
    if [(w, f) for w, _, f in cycle] != [(w, f) for w, _, f in states[start:]]:
        raise AssertionError("spec cycle: the second pass differs from the first")
    if [i for i, (_, _, f) in enumerate(cycle) if f] != [L - 1]:
        raise AssertionError(f"spec cycle: expected one flush, last; got {cycle}")
    closed = cycle_length(T, R, accept)
    if closed != L:
        raise AssertionError(f"spec cycle: simulated length {L} != closed form {closed}")
    as_dict = lambda s: {"wp": s[0], "origin": s[1], "flush": s[2]}  # noqa: E731
    return {
        "T": T, "R": R, "B": R - T, "accept": accept,
        "transient": [as_dict(s) for s in states[:start]],
        "cycle": [as_dict(s) for s in cycle],
        "length": L,
        "length_closed_form": closed,
        "flush_wp": cycle[-1][0],
        "formula": "after a flush wp = a; wp grows by a per step; a step flushes when wp + 2T > R, so the cycle "
                   "is wp = a, 2a, ..., L_c*a with L_c = floor((R - 2T)/a) + 1 (only the last flushes)",
    }


# ---------------------------------------------------------------------------------
# bytes model (unique bytes per step and layer; pure arithmetic)
# ---------------------------------------------------------------------------------
BYTE_KEYS = ("state_read", "state_write", "snapshot_write", "snapshot_read", "ring_read", "ring_write",
             "inputs", "outputs", "indices")


def _bytes(**kw) -> Dict[str, int]:
    d = {k: int(kw.pop(k, 0)) for k in BYTE_KEYS}
    if kw:
        raise KeyError(f"unknown byte keys {sorted(kw)}")
    d["total"] = sum(d.values())
    return d


def scatter_bytes(b: int, state_row: int) -> Dict[str, int]:
    """``fused_mamba_state_scatter_with_mask``: read one snapshot per row and write it
    into the state; read the slot and step index per row."""
    return _bytes(snapshot_read=b * state_row, state_write=b * state_row, indices=2 * b * INT32)


def commit_bytes(b: int) -> Dict[str, int]:
    """``spec_commit``: read the slot and accepted count per row, read and write the
    three int32 cursors of the row's slot."""
    return _bytes(indices=2 * b * INT32 + 6 * b * INT32)


def _mamba2_io(b, H, P, N, G, T, act):
    """Window inputs both Mamba2 kernels read (x, dt one per head, B, C; A fp32, D and
    dt_bias per head in the activation dtype: stride 0 over P/N) and their output."""
    inputs = b * T * (H * P + H + 2 * G * N) * act + H * (4 + 2 * act)
    return inputs, b * T * H * P * act


def mamba2_stock_bytes(b: int, H: int, P: int, N: int, G: int, T: int, state_bytes: int,
                       act_bytes: int = 2) -> Dict[str, int]:
    """Stock Mamba2 verify step: SSU (read the state, write T snapshots; the slot and
    buffer index per row) + the accepted-snapshot scatter."""
    row = H * P * N * state_bytes
    inputs, outputs = _mamba2_io(b, H, P, N, G, T, act_bytes)
    ssu = _bytes(state_read=b * row, snapshot_write=T * b * row, inputs=inputs, outputs=outputs,
                 indices=2 * b * INT32)
    return _sum_bytes(ssu, scatter_bytes(b, row))


def mamba2_ours_bytes(b: int, H: int, P: int, N: int, G: int, T: int, wp: int, flush: int, state_bytes: int,
                      act_bytes: int = 2) -> Dict[str, int]:
    """``mamba2_verify`` with every row at cursor state (wp, flush): read the checkpoint
    and wp ring entries (x [H,P], B [G,N] in the activation dtype, Δ [H] fp32), the
    window inputs, the slot and its three cursors; write the outputs and the window's
    T ring entries; a flush with wp > 0 also writes the folded checkpoint."""
    row = H * P * N * state_bytes
    entry = H * P * act_bytes + G * N * act_bytes + H * 4
    inputs, outputs = _mamba2_io(b, H, P, N, G, T, act_bytes)
    return _bytes(state_read=b * row, state_write=b * row if (flush and wp > 0) else 0, ring_read=b * wp * entry,
                  ring_write=b * T * entry, inputs=inputs, outputs=outputs, indices=4 * b * INT32)


def _gdn_io(b, HV, Hk, K, V, T, act):
    """Window inputs both GDN kernels read (packed q|k|v, a, b; A_log fp32, dt_bias) and o."""
    inputs = b * T * (2 * Hk * K + HV * V) * act + 2 * b * T * HV * act + HV * (4 + act)
    return inputs, b * T * HV * V * act


def gdn_stock_bytes(b: int, HV: int, Hk: int, K: int, V: int, T: int, state_bytes: int,
                    act_bytes: int = 2) -> Dict[str, int]:
    """Stock GDN verify step: read the state, write T snapshots, the state and buffer
    index per row and cu_seqlens [b+1], + the accepted-snapshot scatter."""
    row = HV * V * K * state_bytes
    inputs, outputs = _gdn_io(b, HV, Hk, K, V, T, act_bytes)
    ssu = _bytes(state_read=b * row, snapshot_write=T * b * row, inputs=inputs, outputs=outputs,
                 indices=2 * b * INT32 + (b + 1) * INT32)
    return _sum_bytes(ssu, scatter_bytes(b, row))


def gdn_ours_bytes(b: int, HV: int, Hk: int, K: int, V: int, T: int, wp: int, flush: int, state_bytes: int,
                   act_bytes: int = 2) -> Dict[str, int]:
    """``gdn_verify`` at (wp, flush): read the checkpoint and wp ring entries (d [HV,V]
    in the state dtype, raw k [Hk,K] in the activation dtype, g [HV] fp32), the window
    inputs, slot + cursors; write o and the window's T entries; a flush with wp > 0
    writes the folded checkpoint."""
    row = HV * V * K * state_bytes
    entry = HV * V * state_bytes + Hk * K * act_bytes + HV * 4
    inputs, outputs = _gdn_io(b, HV, Hk, K, V, T, act_bytes)
    return _bytes(state_read=b * row, state_write=b * row if (flush and wp > 0) else 0, ring_read=b * wp * entry,
                  ring_write=b * T * entry, inputs=inputs, outputs=outputs, indices=4 * b * INT32)


def _sum_bytes(*parts: Dict[str, int]) -> Dict[str, int]:
    return _bytes(**{k: sum(p[k] for p in parts) for k in BYTE_KEYS})


def ours_amortised_bytes(per_state: Callable[[int, int], Dict[str, int]], cycle: Sequence[Dict[str, int]],
                         b: int) -> Dict[str, float]:
    """Mean over the cycle's states of ``per_state(wp, flush)``, plus one commit per step."""
    rows = [_sum_bytes(per_state(s["wp"], s["flush"]), commit_bytes(b)) for s in cycle]
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def state_row_bytes(family: str, geom: Dict[str, int], state_bytes: int) -> int:
    if family == "mamba2":
        return geom["H"] * geom["P"] * geom["N"] * state_bytes
    return geom["HV"] * geom["V"] * geom["K"] * state_bytes


def stock_bytes_for(family, geom, b, T, sb) -> Dict[str, int]:
    if family == "mamba2":
        return mamba2_stock_bytes(b, geom["H"], geom["P"], geom["N"], geom["G"], T, sb)
    return gdn_stock_bytes(b, geom["HV"], geom["Hk"], geom["K"], geom["V"], T, sb)


def ours_bytes_fn(family, geom, b, T, sb) -> Callable[[int, int], Dict[str, int]]:
    if family == "mamba2":
        return lambda wp, fl: mamba2_ours_bytes(b, geom["H"], geom["P"], geom["N"], geom["G"], T, wp, fl, sb)
    return lambda wp, fl: gdn_ours_bytes(b, geom["HV"], geom["Hk"], geom["K"], geom["V"], T, wp, fl, sb)


# ---------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------
STOCK_MODULES = {
    "mamba2_ssu": "sglang.kernels.ops.mamba.triton_ops.ssu_dispatch.selective_state_update (backend 'triton')",
    "gdn_verify": "sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent."
                  "fused_sigmoid_gating_delta_rule_update",
    "scatter": "sglang.kernels.ops.mamba.mamba_state_scatter_triton.fused_mamba_state_scatter_with_mask",
}


class Kernels:
    """SGLang's verify kernels and ours (None each with the reason it is missing)."""

    def __init__(self, device: str):
        self.device = device
        self.errors: Dict[str, str] = {}
        self.notes: List[str] = []
        stock = bc.load_stock(device)  # the SSU dispatcher (triton backend) + CPU shims
        self.import_mode = stock.import_mode
        self.notes += stock.notes
        self.ssu = stock.mamba2
        if self.ssu is None:
            self.errors["mamba2_ssu"] = stock.errors.get("mamba2") or str(stock.errors)
        self.gdn_stock = None
        self.scatter = None
        try:
            fs = importlib.import_module("sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent")
            self.gdn_stock = fs.fused_sigmoid_gating_delta_rule_update
        except Exception as e:
            self.errors["gdn_verify"] = f"{type(e).__name__}: {e}"
        try:
            mss = importlib.import_module("sglang.kernels.ops.mamba.mamba_state_scatter_triton")
            if device == "cuda":
                self.scatter = mss.fused_mamba_state_scatter_with_mask
            else:
                self.scatter = _interpreter_scatter(mss)
                self.notes.append("cpu shim: fused_mamba_state_scatter_with_mask refuses non-CUDA tensors; its "
                                  "kernel is launched directly with the wrapper's arguments")
        except Exception as e:
            self.errors["scatter"] = f"{type(e).__name__}: {e}"
        self.mamba2_verify = self.gdn_verify = self.spec_commit = self.spec_reset = None
        try:
            from sglang_replayssm.kernels.spec_cursor import spec_commit, spec_reset, spec_ring_len

            self.spec_commit, self.spec_reset, self.spec_ring_len = spec_commit, spec_reset, spec_ring_len
        except Exception as e:
            self.errors["spec_cursor"] = f"{type(e).__name__}: {e}"
        try:
            from sglang_replayssm.kernels.mamba2_verify import mamba2_verify

            self.mamba2_verify = mamba2_verify
        except Exception as e:
            self.errors["mamba2_verify"] = f"{type(e).__name__}: {e}"
        try:
            from sglang_replayssm.kernels.gdn_verify import gdn_verify

            self.gdn_verify = gdn_verify
        except Exception as e:
            self.errors["ours_gdn_verify"] = f"{type(e).__name__}: {e}"

    def stock_ok(self, family: str) -> bool:
        return self.scatter is not None and (self.ssu if family == "mamba2" else self.gdn_stock) is not None

    def ours_ok(self, family: str) -> bool:
        return self.spec_commit is not None and (
            self.mamba2_verify if family == "mamba2" else self.gdn_verify) is not None

    def info(self) -> Dict[str, Any]:
        return {"import_mode": self.import_mode, "modules": STOCK_MODULES, "errors": self.errors, "notes": self.notes,
                "available": {"mamba2_stock": self.stock_ok("mamba2"), "gdn_stock": self.stock_ok("gdn"),
                              "mamba2_ours": self.ours_ok("mamba2"), "gdn_ours": self.ours_ok("gdn")}}


def _interpreter_scatter(mss) -> Callable:
    """CPU only: SGLang's scatter kernel launched with the arguments its wrapper computes
    (the wrapper raises on non-CUDA tensors; the kernel itself is unchanged)."""
    import torch
    import triton

    def scatter(dst, src, dst_indices_raw, step_indices_raw):
        n = step_indices_raw.shape[0]
        if n == 0:
            return
        elem = dst.numel() // (dst.shape[0] * dst.shape[1])
        mss._fused_mamba_state_scatter_with_mask_kernel[(n, dst.shape[0], triton.cdiv(elem, 1024))](
            src, dst, dst_indices_raw.to(torch.int32).contiguous(), step_indices_raw.to(torch.int32).contiguous(),
            elem, src.stride(0), src.stride(1), src.stride(2), dst.stride(0), dst.stride(1),
            src.shape[1], src.shape[2], dst.shape[1], BLOCK_SIZE=1024)

    return scatter


def ours_launch_info(kern: Kernels, family: str, geom: Dict[str, int], T: int, R: int) -> Dict[str, Any]:
    """Launch parameters our verify kernel resolves for this geometry (defaults + YAML)."""
    try:
        from sglang_replayssm.kernels import common

        if family == "mamba2":
            from sglang_replayssm.kernels.mamba2_verify import MAMBA2_VERIFY_DEFAULT_LAUNCH, verify_geometry_key

            key = verify_geometry_key(geom["H"], geom["P"], geom["N"], geom["G"], R, T)
            cfg = common.launch_config("mamba2_verify", key, MAMBA2_VERIFY_DEFAULT_LAUNCH)
        else:
            from sglang_replayssm.kernels.gdn_verify import gdn_verify_key, gdn_verify_launch_params

            key = gdn_verify_key(geom["HV"], geom["Hk"], geom["K"], geom["V"], R, T)
            cfg = gdn_verify_launch_params(geom["HV"], geom["Hk"], geom["K"], geom["V"], R, T)
        return {"key": key, "config": dict(cfg), "config_file": str(common.config_file())}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


# ---------------------------------------------------------------------------------
# workloads
# ---------------------------------------------------------------------------------
def _bf16_values(shape, gen, device, act, kind, a=0.0, b=1.0):
    """A tensor of bf16-representable values stored in ``act`` (normal(a, b) / uniform(a, b))."""
    import torch

    t = torch.empty(shape, dtype=torch.bfloat16, device=device)
    t = t.normal_(a, b, generator=gen) if kind == "normal" else t.uniform_(a, b, generator=gen)
    return t.to(act)


class _Common(bc.CaseWork):
    """Pool slots, cursors and per-set indices shared by both families.  Slot 0 is the
    null slot (skipped by our kernels); each set (an emulated layer) owns ``batch``
    distinct slots of a random permutation of 1..S-1 (:func:`bench_common.slot_sets`)."""

    def _setup(self, batch, T, R, accept, n_sets, seed, device, with_stock, state_dtype, act_dtype):
        """Sizes, dtypes (``act``, ``sdt``), slots, generator, cursors and per-set indices;
        the family's tensors come after."""
        import torch

        self.b, self.T, self.R, self.accept, self.n_sets = batch, T, R, accept, n_sets
        self.device, self.with_stock = device, with_stock
        self.act, self.sdt = bc.torch_dtype(act_dtype), bc.torch_dtype(state_dtype)
        self.num_slots, self.gen, idx_sets = bc.slot_sets(batch, n_sets, seed, device)
        i32 = dict(dtype=torch.int32, device=device)
        self.wp = torch.zeros(self.num_slots, **i32)
        self.origin = torch.zeros(self.num_slots, **i32)
        self.flush = torch.zeros(self.num_slots, **i32)
        self.sets = []
        for idx in idx_sets:
            self.sets.append(dict(
                idx=idx,
                inter_idx=torch.arange(batch, **i32),            # SGLang: request i owns scratch row i
                last_step=torch.full((batch,), accept - 1, **i32),  # last_correct_step_indices
                accepted=torch.full((batch,), accept, **i32),       # accept_lens
            ))

    def _finish(self, out_dims, state_dims, out_dtype) -> None:
        """The output buffer [b, T, *out_dims] (``out_dtype``, default the activation
        dtype), the stock snapshot buffers (with_stock) and ``state_row_bytes``."""
        import torch

        self.out = torch.empty((self.b, self.T) + tuple(out_dims),
                               dtype=bc.torch_dtype(out_dtype) if out_dtype else self.act, device=self.device)
        if self.with_stock:
            for st in self.sets:  # [num_layers=1, bs+1, T, *state_shape], one per emulated layer
                st["buf"] = torch.zeros((1, self.b + 1, self.T) + tuple(state_dims), dtype=self.sdt,
                                        device=self.device)
        self.state_row_bytes = math.prod(state_dims) * self.state.element_size()

    def _window(self, S, step: Callable[[Any, int], Tuple[Any, Any]]):
        """fp64 sequential reference over the window: ``step(S, t) -> (S, y)`` per token;
        returns (outputs stacked [b, T, ...], the state after each token)."""
        import torch

        ys, Ss = [], []
        for t in range(self.T):
            S, y = step(S, t)
            ys.append(y)
            Ss.append(S)
        return torch.stack(ys, 1), Ss

    def set_cursors(self, wp: int, origin: int, flush: int) -> None:
        """Every slot at one cursor state (all rows in the same phase)."""
        self.wp.fill_(wp)
        self.origin.fill_(origin)
        self.flush.fill_(flush)

    def cursor_states(self, s: int = 0) -> List[Tuple[int, int, int]]:
        rows = self.sets[s]["idx"].long()
        return list(zip(self.wp[rows].tolist(), self.origin[rows].tolist(), self.flush[rows].tolist()))

    def commit_fn(self, kern: Kernels, s: int, cursors=None) -> Callable[[], Any]:
        st = self.sets[s]
        wp, org, fl = cursors if cursors is not None else (self.wp, self.origin, self.flush)
        return lambda: kern.spec_commit(wp, org, fl, st["idx"], st["accepted"], window=self.T, ring_len=self.R)

    def scatter_fn(self, kern: Kernels, s: int, state=None) -> Callable[[], Any]:
        st = self.sets[s]
        dst = (self.state if state is None else state)[None]  # [num_layers=1, slots, ...]
        return lambda: kern.scatter(dst, st["buf"], st["idx"], st["last_step"])


class Mamba2SpecWork(_Common):
    """State pool, ring, cursors and per-set verify inputs for one Mamba2 case, laid out
    as ``MambaMixer2`` hands them to ``selective_state_update`` in target verify."""

    family = "mamba2"

    def __init__(self, geom, batch, T, R, accept, state_dtype, device, n_sets, seed, act_dtype="bf16",
                 out_dtype=None, with_stock=True):
        import torch

        H, P, N, G = geom["H"], geom["P"], geom["N"], geom["G"]
        self.H, self.P, self.N, self.G = H, P, N, G
        self._setup(batch, T, R, accept, n_sets, seed, device, with_stock, state_dtype, act_dtype)
        S, gen, act, sdt = self.num_slots, self.gen, self.act, self.sdt
        self.state = torch.empty((S, H, P, N), dtype=sdt, device=device).normal_(0.0, 0.5, generator=gen)
        self.x_ring = _bf16_values((S, H, R, P), gen, device, act, "normal")
        self.B_ring = _bf16_values((S, G, R, N), gen, device, act, "normal", 0.0, 0.3)
        self.dt_ring = torch.empty((S, H, R), dtype=torch.float32, device=device).uniform_(0.01, 0.2, generator=gen)
        self.A_h = -torch.empty(H, dtype=torch.float32, device=device).uniform_(1.0, 8.0, generator=gen)
        self.D_h = _bf16_values((H,), gen, device, act, "uniform", 0.5, 1.5)
        self.dt_bias_h = _bf16_values((H,), gen, device, act, "uniform", -3.0, -1.0)
        # mamba.py (target verify): A[:, None, None].expand(-1, P, N).float(), D/dt_bias[:, None].expand(-1, P)
        self.A = self.A_h[:, None, None].expand(-1, P, N)
        self.D = self.D_h[:, None].expand(-1, P)
        self.dt_bias = self.dt_bias_h[:, None].expand(-1, P)
        self.conv_dim = H * P + 2 * G * N
        for st in self.sets:
            st["xbc"] = torch.empty((batch * T, self.conv_dim), dtype=act, device=device)
            st["dt_raw"] = torch.empty((batch * T, H), dtype=act, device=device)
            x, Bm, Cm = torch.split(st["xbc"], [H * P, G * N, G * N], dim=-1)
            # hidden_states_d.view(-1, H, P).view(bs, T, H, P); B_d.view(-1, G, N).view(bs, T, G, N);
            # dt_d[:, :, None].expand(-1, -1, P).view(bs, T, H, P)
            st["x"] = x.view(-1, H, P).view(batch, T, H, P)
            st["B"] = Bm.view(-1, G, N).view(batch, T, G, N)
            st["C"] = Cm.view(-1, G, N).view(batch, T, G, N)
            st["dt"] = st["dt_raw"][:, :, None].expand(-1, -1, P).view(batch, T, H, P)
            self.new_inputs(st)
        self._finish((H, P), (H, P, N), out_dtype)

    def new_inputs(self, st) -> None:
        """Fresh window inputs for set ``st`` (in place: the views stay valid)."""
        H, P = self.H, self.P
        xbc = _bf16_values(st["xbc"].shape, self.gen, self.device, self.act, "normal")
        xbc[:, H * P:] *= 0.3
        st["xbc"].copy_(xbc)
        st["dt_raw"].copy_(_bf16_values(st["dt_raw"].shape, self.gen, self.device, self.act, "normal", 0.0, 0.5))

    def stock_fn(self, kern: Kernels, s: int, state=None, out=None) -> Callable[[], Any]:
        st = self.sets[s]
        state = self.state if state is None else state
        out = self.out if out is None else out
        return lambda: kern.ssu(state, st["x"], st["dt"], self.A, st["B"], st["C"], self.D, z=None,
                                dt_bias=self.dt_bias, dt_softplus=True, state_batch_indices=st["idx"], out=out,
                                disable_state_update=True, intermediate_states_buffer=st["buf"][0],
                                cache_steps=self.T, retrieve_parent_token=None,
                                intermediate_state_indices=st["inter_idx"])

    def ours_fn(self, kern: Kernels, s: int, state=None, rings=None, out=None) -> Callable[[], Any]:
        st = self.sets[s]
        state = self.state if state is None else state
        xr, Br, dtr = rings if rings is not None else (self.x_ring, self.B_ring, self.dt_ring)
        out = self.out if out is None else out
        return lambda: kern.mamba2_verify(state, xr, Br, dtr, st["x"], st["dt"], self.A, st["B"], st["C"],
                                          st["idx"], self.wp, self.origin, self.flush, D=self.D, z=None,
                                          dt_bias=self.dt_bias, dt_softplus=True, out=out)

    def rings(self):
        return self.x_ring, self.B_ring, self.dt_ring

    def reference_window(self, S, s: int):
        """fp64 sequential reference of set s's window from states S [b,H,P,N] (fp64):
        returns (outputs [b,T,H,P], state after each token [T, b,H,P,N])."""
        st = self.sets[s]
        dt = st["dt_raw"].view(self.b, self.T, self.H)
        return self._window(S, lambda S, t: bc.mamba2_ref_step(S, st["x"][:, t], dt[:, t], self.A_h, st["B"][:, t],
                                                               st["C"][:, t], self.D_h, self.dt_bias_h))


class GDNSpecWork(_Common):
    """State pool, ring, cursors and per-set verify inputs for one GDN case: one packed
    q|k|v projection per set, split into the [1, bs*T, heads, dim] views SGLang's
    ``torch.split`` path hands ``fused_sigmoid_gating_delta_rule_update``."""

    family = "gdn"

    def __init__(self, geom, batch, T, R, accept, state_dtype, device, n_sets, seed, act_dtype="bf16",
                 out_dtype=None, with_stock=True):
        import torch

        HV, Hk, K, V = geom["HV"], geom["Hk"], geom["K"], geom["V"]
        self.HV, self.Hk, self.K, self.V = HV, Hk, K, V
        self._setup(batch, T, R, accept, n_sets, seed, device, with_stock, state_dtype, act_dtype)
        S, gen, act, sdt = self.num_slots, self.gen, self.act, self.sdt
        self.state = torch.empty((S, HV, V, K), dtype=sdt, device=device).normal_(0.0, 0.1, generator=gen)
        self.d_ring = torch.empty((S, HV, R, V), dtype=sdt, device=device).normal_(0.0, 0.1, generator=gen)
        self.k_ring = _bf16_values((S, Hk, R, K), gen, device, act, "normal")
        self.g_ring = torch.empty((S, HV, R), dtype=torch.float32, device=device).uniform_(-0.3, -0.01,
                                                                                         generator=gen)
        self.A_log = torch.empty(HV, dtype=torch.float32, device=device).uniform_(0.5, 2.0, generator=gen).log_()
        self.dt_bias = _bf16_values((HV,), gen, device, act, "uniform", -3.0, -1.0)
        self.scale = K ** -0.5
        self.width = 2 * Hk * K + HV * V
        i32 = dict(dtype=torch.int32, device=device)
        for st in self.sets:
            st["mq"] = torch.empty((batch * T, self.width), dtype=act, device=device)
            st["a"] = torch.empty((batch * T, HV), dtype=act, device=device)
            st["b"] = torch.empty((batch * T, HV), dtype=act, device=device)
            q, k, v = torch.split(st["mq"], [Hk * K, Hk * K, HV * V], dim=-1)
            st["q"] = q.view(1, batch * T, Hk, K)
            st["k"] = k.view(1, batch * T, Hk, K)
            st["v"] = v.view(1, batch * T, HV, V)
            st["cu"] = torch.arange(batch + 1, **i32) * T  # query_start_loc
            self.new_inputs(st)
        self._finish((HV, V), (HV, V, K), out_dtype)

    def new_inputs(self, st) -> None:
        for name in ("mq", "a", "b"):
            st[name].copy_(_bf16_values(st[name].shape, self.gen, self.device, self.act, "normal"))

    def stock_fn(self, kern: Kernels, s: int, state=None, sink=None) -> Callable[[], Any]:
        st = self.sets[s]
        state = self.state if state is None else state

        def run():
            o = kern.gdn_stock(A_log=self.A_log, a=st["a"], dt_bias=self.dt_bias, softplus_beta=1.0,
                               softplus_threshold=20.0, q=st["q"], k=st["k"], v=st["v"], b=st["b"],
                               initial_state_source=state, initial_state_indices=st["idx"], cu_seqlens=st["cu"],
                               use_qk_l2norm_in_kernel=True, is_kda=False, disable_state_update=True,
                               intermediate_states_buffer=st["buf"][0], intermediate_state_indices=st["inter_idx"],
                               cache_steps=self.T, retrieve_parent_token=None)
            if sink is not None:
                sink.append(o)
            return o

        return run

    def ours_fn(self, kern: Kernels, s: int, state=None, rings=None, out=None) -> Callable[[], Any]:
        st = self.sets[s]
        b, T, HV = self.b, self.T, self.HV
        state = self.state if state is None else state
        dr, kr, gr = rings if rings is not None else (self.d_ring, self.k_ring, self.g_ring)
        out = self.out if out is None else out
        return lambda: kern.gdn_verify(st["mq"].view(b, T, self.width), st["a"].view(b, T, HV),
                                       st["b"].view(b, T, HV), self.A_log, self.dt_bias, state, dr, kr, gr,
                                       st["idx"], self.wp, self.origin, self.flush, scale=self.scale,
                                       use_qk_l2norm=True, round_beta=False, out=out)

    def rings(self):
        return self.d_ring, self.k_ring, self.g_ring

    def reference_window(self, S, s: int):
        """fp64 sequential reference (beta unrounded: b is fp32 in the check)."""
        st = self.sets[s]
        b, T = self.b, self.T
        mq, a, bb = st["mq"].view(b, T, -1), st["a"].view(b, T, -1), st["b"].view(b, T, -1)
        return self._window(S, lambda S, t: bc.gdn_ref_step(S, mq[:, t], a[:, t], bb[:, t], self.A_log, self.dt_bias,
                                                            self.Hk, self.K, self.V, self.scale))


def make_work(family, geom, batch, T, R, accept, state_dtype, device, n_sets, seed, **kw):
    cls = Mamba2SpecWork if family == "mamba2" else GDNSpecWork
    return cls(geom, batch, T, R, accept, state_dtype, device, n_sets, seed, **kw)


# ---------------------------------------------------------------------------------
# correctness: ours vs stock (and both vs fp64) over a reset window + one flush cycle
# ---------------------------------------------------------------------------------
def check_family(family: str, geom: Dict[str, int], kern: Kernels, spec: Dict[str, Any], batch: int, device: str,
                 steps: Optional[int] = None, seed: int = 1234) -> Dict[str, Any]:
    """From a reset, ``steps`` verify windows (default: the reset window, one full flush
    cycle and the window after the flush) at fp32 state: stock = SGLang's verify + the
    accepted-snapshot scatter, ours = our verify + ``spec_commit``, same inputs, both
    writing fp32 outputs (NaN-filled first; our rings are NaN-poisoned).  Every window's
    T outputs must satisfy |ours - stock| <= atol + rtol·|stock| (1e-3 each).  Also
    records both against the fp64 sequential recurrence and our cursors against the
    simulated cycle.  Activations: bf16 values (GDN: held in fp32 tensors, since SGLang's
    GDN kernel writes its output in the activation dtype)."""
    import torch

    T, R, a = spec["T"], spec["R"], spec["accept"]
    states_seq = spec["transient"] + spec["cycle"] + spec["cycle"][:1]
    steps = steps or len(states_seq)
    act = "bf16" if family == "mamba2" else "fp32"
    w = make_work(family, geom, batch, T, R, a, "fp32", device, 1, seed, act_dtype=act, out_dtype="fp32",
                  with_stock=True)
    st = w.sets[0]
    rows = st["idx"].long()
    nan = float("nan")
    state0 = w.state.clone()
    s_stock, s_ours = state0.clone(), state0.clone()
    rings = tuple(torch.full_like(t, nan) for t in w.rings())
    ref = state0[rows].double()
    kern.spec_reset(w.wp, w.origin, w.flush, st["idx"], window=T, ring_len=R)
    exp = (0, 0, int(2 * T > R))
    res: Dict[str, Any] = {"family": family, "geometry": dict(geom), "batch": batch, "state_dtype": "fp32",
                           "act_values": "bf16", "act_container": act, "out_dtype": "fp32", "T": T, "R": R,
                           "accept": a, "steps": steps, "rtol": CHECK_RTOL, "atol": CHECK_ATOL,
                           "ring_poison": "nan", "per_step": []}
    cursors_ok = True
    all_ok = True
    for i in range(steps):
        if i:
            w.new_inputs(st)
        cur = w.cursor_states(0)
        cursors_ok &= all(c == exp for c in cur)
        o_stock = torch.full(w.out.shape, nan, dtype=torch.float32, device=device)
        o_ours = torch.full(w.out.shape, nan, dtype=torch.float32, device=device)
        if family == "mamba2":
            w.stock_fn(kern, 0, state=s_stock, out=o_stock)()
        else:
            o_stock.copy_(w.stock_fn(kern, 0, state=s_stock)().view(o_stock.shape))
        w.scatter_fn(kern, 0, state=s_stock)()
        w.ours_fn(kern, 0, state=s_ours, rings=rings, out=o_ours)()
        w.commit_fn(kern, 0)()
        y_ref, S_ref = w.reference_window(ref, 0)
        ref = S_ref[a - 1]
        exp = commit_rule(*exp, a, T, R)
        diff = (o_ours.double() - o_stock.double()).abs()
        finite = bool(torch.isfinite(o_ours).all()) and bool(torch.isfinite(o_stock).all())
        excess = (diff - (CHECK_ATOL + CHECK_RTOL * o_stock.double().abs())).max().item()
        ok = finite and excess <= 0.0
        all_ok &= ok
        res["per_step"].append({
            "step": i, "wp": cur[0][0], "origin": cur[0][1], "flush": cur[0][2],
            "max_abs_diff_vs_stock": diff.max().item() if finite else None,
            "max_abs_stock": o_stock.abs().max().item() if finite else None,
            "tol_excess": excess if finite else None,
            "ours_rel_err_vs_fp64": bc.rel_err(o_ours, y_ref), "stock_rel_err_vs_fp64": bc.rel_err(o_stock, y_ref),
            "finite": finite, "within_tol": ok})
    first = res["per_step"][0]
    res["first_window_within_tol"] = first["within_tol"]
    res["first_window_max_abs_diff"] = first["max_abs_diff_vs_stock"]
    res["max_abs_diff_vs_stock"] = max((p["max_abs_diff_vs_stock"] or math.inf) for p in res["per_step"])
    res["ours_max_rel_err_vs_fp64"] = max(p["ours_rel_err_vs_fp64"] for p in res["per_step"])
    res["stock_max_rel_err_vs_fp64"] = max(p["stock_rel_err_vs_fp64"] for p in res["per_step"])
    res["flush_steps"] = [p["step"] for p in res["per_step"] if p["flush"]]
    res["cursors_follow_cycle"] = bool(cursors_ok)
    res["passed"] = bool(all_ok and cursors_ok)
    return res


# ---------------------------------------------------------------------------------
# one case
# ---------------------------------------------------------------------------------
def _timed(timer: bc.Timer, fns: Sequence[Callable], steps: int) -> Tuple[float, Dict[str, Any]]:
    """Time a launch sequence; returns µs per (layer) step and the timer's record."""
    t = timer(fns)
    return t["us"] * len(fns) / steps, t


def run_case(family: str, name: str, geom: Dict[str, int], batch: int, sdtype: str, device: str, kern: Kernels,
             timer: bc.Timer, spec: Dict[str, Any], phases: Sequence[int], copy_bw: Optional[float],
             min_launches: int, seed: int, n_sets: Optional[int] = None) -> Dict[str, Any]:
    T, R, a = spec["T"], spec["R"], spec["accept"]
    cycle, Lc = spec["cycle"], spec["length"]
    sb = bc.DTYPE_BYTES[sdtype]
    row = state_row_bytes(family, geom, sb)
    if n_sets is None:
        n_sets = bc.slot_sets_needed(batch, row)
    with_stock = kern.stock_ok(family)
    w = make_work(family, geom, batch, T, R, a, sdtype, device, n_sets, seed, with_stock=with_stock)
    n_launch = max(n_sets, min_launches)
    case = bc.case_header(family, name, geom, sdtype, batch, {"T": T, "R": R, "accept": a, "cycle_length": Lc},
                          w.num_slots, n_sets, row, n_launch,
                          {"stock_snapshot_buffers_MB": (n_sets * (batch + 1) * T * row / 1e6) if with_stock else 0.0})
    if with_stock:
        nb = stock_bytes_for(family, geom, batch, T, sb)
        t_ssu, r_ssu = _timed(timer, [w.stock_fn(kern, i % n_sets) for i in range(n_launch)], n_launch)
        t_sc, r_sc = _timed(timer, [w.scatter_fn(kern, i % n_sets) for i in range(n_launch)], n_launch)
        seq = [f for i in range(n_launch) for f in (w.stock_fn(kern, i % n_sets), w.scatter_fn(kern, i % n_sets))]
        t_tot, r_tot = _timed(timer, seq, n_launch)
        entry = {"name": STOCK_MODULES["mamba2_ssu" if family == "mamba2" else "gdn_verify"] + " + scatter",
                 "t_us": t_tot, "t_ssu_us": t_ssu, "t_scatter_us": t_sc, "bytes": nb["total"], "bytes_breakdown": nb,
                 "GBps": bc.gbps(nb["total"], t_tot), "timing": r_tot, "timing_ssu": r_ssu, "timing_scatter": r_sc}
        entry["bw_fraction"] = report.ratio(entry["GBps"], copy_bw)
        entry["ssu_GBps"] = bc.gbps(nb["total"] - scatter_bytes(batch, row)["total"], t_ssu)
        case["kernels"]["stock"] = entry
    if kern.ours_ok(family):
        bytes_fn = ours_bytes_fn(family, geom, batch, T, sb)
        verify = [w.ours_fn(kern, i % n_sets) for i in range(n_launch)]
        phase_us: Dict[int, float] = {}
        detail: Dict[int, Dict[str, Any]] = {}
        for p in phases:
            c = cycle[p]
            w.set_cursors(c["wp"], c["origin"], c["flush"])
            us, r = _timed(timer, verify, n_launch)
            nb = bytes_fn(c["wp"], c["flush"])["total"]
            phase_us[p] = us
            detail[p] = dict(c, us=us, bytes=nb, GBps=bc.gbps(nb, us), reps=r["reps"], method=r["method"],
                             spread=r.get("spread"))
        reset_phase = {}
        for c in spec["transient"]:
            w.set_cursors(c["wp"], c["origin"], c["flush"])
            us, r = _timed(timer, verify, n_launch)
            reset_phase = dict(c, us=us, bytes=bytes_fn(c["wp"], c["flush"])["total"])
        scratch = (w.wp.clone(), w.origin.clone(), w.flush.clone())
        t_commit, r_commit = _timed(timer, [w.commit_fn(kern, i % n_sets, scratch) for i in range(n_launch)],
                                    n_launch)
        t_verify = bc.amortise(phase_us, Lc)
        # in-order cycle: every emulated layer verifies then commits, Lc steps; the sequence
        # returns every set to the cycle's first (wp, flush), so replays stay in the cycle
        c0 = cycle[0]
        w.set_cursors(c0["wp"], c0["origin"], c0["flush"])
        seq = [f for _ in range(Lc) for i in range(n_launch) for f in (w.ours_fn(kern, i % n_sets),
                                                                       w.commit_fn(kern, i % n_sets))]
        t_cycle, r_cycle = _timed(timer, seq, Lc * n_launch)
        back = {(wp, fl) for wp, _, fl in w.cursor_states(0)}
        amort = ours_amortised_bytes(bytes_fn, cycle, batch)
        t_ours = None if t_verify is None else t_verify + t_commit
        ours = {
            "name": f"sglang_replayssm {family}_verify + spec_commit",
            "phase_us": phase_us, "phases": detail, "reset_phase": reset_phase,
            "t_verify_amort_us": t_verify,
            "t_nonflush_mean_us": statistics.fmean([v for k, v in phase_us.items() if k != Lc - 1])
            if any(k != Lc - 1 for k in phase_us) else None,
            "t_flush_us": phase_us.get(Lc - 1),
            "t_commit_us": t_commit, "commit_bytes": commit_bytes(batch)["total"], "timing_commit": r_commit,
            "t_amort_us": t_ours, "t_cycle_us": t_cycle, "timing_cycle": r_cycle,
            "cycle_cursors_returned": back == {(c0["wp"], c0["flush"])},
            "bytes_amort": amort["total"], "bytes_breakdown_amort": amort,
            "bytes_nonflush_first": bytes_fn(cycle[0]["wp"], cycle[0]["flush"])["total"],
            "bytes_flush": bytes_fn(cycle[-1]["wp"], cycle[-1]["flush"])["total"],
        }
        ours["GBps"] = bc.gbps(amort["total"], t_ours)
        ours["bw_fraction"] = report.ratio(ours["GBps"], copy_bw)
        case["kernels"]["ours"] = ours
    case["finite"] = w.finite()
    del w
    return bc.close_case(case, device, _case_summary)


def _case_summary(case: Dict[str, Any]) -> None:
    ks = case["kernels"]
    st, ours = ks.get("stock", {}), ks.get("ours", {})
    case["t_stock_us"] = st.get("t_us")
    case["t_ours_us"] = ours.get("t_amort_us")
    case["speedup"] = report.ratio(st.get("t_us"), ours.get("t_amort_us"))
    case["speedup_vs_ssu_only"] = report.ratio(st.get("t_ssu_us"), ours.get("t_amort_us"))
    case["speedup_cycle"] = report.ratio(st.get("t_us"), ours.get("t_cycle_us"))
    case["bytes_ratio"] = report.ratio(st.get("bytes"), ours.get("bytes_amort"))
    case["GBps"] = ours.get("GBps")
    case["bw_fraction"] = ours.get("bw_fraction")
    case["stock_bw_fraction"] = st.get("bw_fraction")


# ---------------------------------------------------------------------------------
# summary / outputs
# ---------------------------------------------------------------------------------
def build_summary(cases: List[Dict[str, Any]], geoms: Dict[str, Sequence[str]], headline: Dict[str, str],
                  correctness: List[Dict[str, Any]], check_required: bool = True) -> Dict[str, Any]:
    s: Dict[str, Any] = {
        "headline_geometry": dict(headline),
        "definitions": {
            "speedup": "stock (verify + accepted-snapshot scatter) us / ours (verify amortised over the flush "
                       "cycle + spec_commit) us, per step and layer",
            "speedup_vs_ssu_only": "stock verify kernel alone (no scatter) / ours",
            "bw_fraction": "model bytes / time / measured copy bandwidth",
        },
    }
    checks = [c for c in correctness if "error" not in c]
    s["correctness_passed"] = (bool(checks) and len(checks) == len(correctness)
                               and all(c.get("passed") for c in checks)) if check_required else None
    for _, prefix, dt, bs, c in bc.summary_cells(cases, geoms, headline):
        s[f"{prefix}_verify_speedup_bs{bs}_{dt}"] = c.get("speedup") if c else None
        s[f"{prefix}_verify_speedup_vs_ssu_only_bs{bs}_{dt}"] = c.get("speedup_vs_ssu_only") if c else None
        s[f"{prefix}_verify_bw_fraction_bs{bs}_{dt}"] = c.get("bw_fraction") if c else None
        s[f"{prefix}_stock_bw_fraction_bs{bs}_{dt}"] = c.get("stock_bw_fraction") if c else None
    s["by_geometry"] = bc.by_geometry(cases, ("speedup", "speedup_vs_ssu_only", "speedup_cycle", "t_stock_us",
                                              "t_ours_us", "bw_fraction", "stock_bw_fraction", "bytes_ratio"))
    return s


def _k(c, kernel, key):
    return c["kernels"].get(kernel, {}).get(key)


def markdown_report(result: Dict[str, Any]) -> List[tuple]:
    env = {k: result.get(k) for k in ("git_commit", "sglang_version", "gpu", "torch", "triton", "device", "mode")}
    env["copy bandwidth (GB/s)"] = result.get("copy_bw_GBps")
    sp = result.get("spec", {})
    env["window T / history B / ring R / accept"] = " / ".join(str(sp.get(k)) for k in ("T", "B", "R", "accept"))
    env["correctness passed"] = str(result.get("summary", {}).get("correctness_passed"))
    sections = [("Environment", report.markdown_kv(env))]
    cyc = ", ".join(f"wp={c['wp']}{'*' if c['flush'] else ''}" for c in sp.get("cycle", []))
    sections.append(("Flush cycle", f"{sp.get('formula', '')}.\n\nCycle ({sp.get('length')} steps, * = flush): {cyc}; "
                                    f"transient (first verify after a prefill, not amortised): "
                                    f"{', '.join('wp=' + str(c['wp']) for c in sp.get('transient', []))}."))
    rows = []
    for chk in result.get("correctness", []):
        if "error" in chk:
            rows.append([chk.get("family"), "error: " + str(chk["error"])[:120], "", "", "", "", ""])
            continue
        rows.append([f"{chk['family']} bs{chk['batch']}", str(chk["passed"]),
                     bc.sci(chk.get("first_window_max_abs_diff")), bc.sci(chk.get("max_abs_diff_vs_stock")),
                     bc.sci(chk.get("ours_max_rel_err_vs_fp64")), bc.sci(chk.get("stock_max_rel_err_vs_fp64")),
                     f"{chk['steps']} (flush at {chk.get('flush_steps')})"])
    sections.append((f"Correctness (fp32 state, fp32 outputs; |ours-stock| <= {CHECK_ATOL:g} + {CHECK_RTOL:g}|stock|)",
                     report.markdown_table(["case", "passed", "first window max|Δ|", "all windows max|Δ|",
                                            "ours rel err vs fp64", "stock rel err vs fp64", "windows"], rows,
                                           align=["l", "l", "r", "r", "r", "r", "l"])))
    for fam, title in (("mamba2", "Mamba2 verify"), ("gdn", "GDN verify")):
        frows = []
        fcases = [c for c in result.get("cases", []) if c["family"] == fam]
        with_err = any("error" in c for c in fcases)
        for c in fcases:
            frows.append([c["geometry"], c["state_dtype"], c["batch"], report.fmt(_k(c, "stock", "t_ssu_us"), 1),
                          report.fmt(_k(c, "stock", "t_scatter_us"), 1), report.fmt(c.get("t_stock_us"), 1),
                          report.fmt(_k(c, "ours", "t_nonflush_mean_us"), 1),
                          report.fmt(_k(c, "ours", "t_flush_us"), 1),
                          report.fmt(_k(c, "ours", "t_commit_us"), 1), report.fmt(c.get("t_ours_us"), 1),
                          report.fmt(_k(c, "ours", "t_cycle_us"), 1), report.fmt(c.get("speedup"), 2),
                          report.fmt(c.get("speedup_vs_ssu_only"), 2), report.fmt(c.get("bytes_ratio"), 2),
                          report.fmt(_k(c, "stock", "GBps"), 0), report.fmt(c.get("stock_bw_fraction"), pct=True),
                          report.fmt(c.get("GBps"), 0), report.fmt(c.get("bw_fraction"), pct=True)]
                         + ([f"!! {c['error'][:80]}" if "error" in c else ""] if with_err else []))
        if frows:
            heads = ["geometry", "state", "bs", "stock SSU", "scatter", "stock", "ours non-flush", "ours flush",
                     "commit", "ours", "ours cycle", "speedup", "vs SSU only", "bytes ratio", "stock GB/s",
                     "stock %copy", "ours GB/s", "ours %copy"] + (["error"] if with_err else [])
            sections.append((f"{title} (µs per step and layer; ours amortised over the flush cycle)",
                             report.markdown_table(heads, frows)))
    notes = list(result.get("notes") or []) + list(result.get("fairness_notes") or [])
    return sections + bc.summary_sections(result.get("summary", {}), notes)


def plot_report(result: Dict[str, Any], path) -> bool:
    def series(fam, g, dt, sel):
        return [bc.batch_series(f"vs SSU+scatter {g} {dt}", sel, "speedup", style="-"),
                bc.batch_series(f"vs SSU only {g} {dt}", sel, "speedup_vs_ssu_only", style="--", marker="x")]

    return bc.plot_speedups(result, path, (("mamba2", "Mamba2 spec verify (T=4, accept 3)"),
                                           ("gdn", "GDN spec verify (T=4, accept 3)")),
                            "speedup vs stock (ours amortised)", series, f"R={result.get('spec', {}).get('R')}")


def stdout_table(result: Dict[str, Any]) -> str:
    rows = []
    for c in result.get("cases", []):
        rows.append([c["family"], c["geometry"], c["state_dtype"], c["batch"], report.fmt(c.get("t_stock_us"), 1),
                     report.fmt(c.get("t_ours_us"), 1), report.fmt(_k(c, "ours", "t_cycle_us"), 1),
                     report.fmt(c.get("speedup"), 2), report.fmt(c.get("speedup_vs_ssu_only"), 2),
                     report.fmt(c.get("bw_fraction"), pct=True)])
    return report.text_table(["fam", "geometry", "state", "bs", "stock us", "ours us", "cycle us", "speedup",
                              "vs SSU", "%copy"], rows)


# ---------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="eval/results/spec-kernels-h200.json",
                    help="output JSON path (.md and .png written beside it)")
    ap.add_argument("--quick", action="store_true", help="smoke run: batches 1/32/256, 4 of the cycle states, "
                                                         "shorter timing")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="cpu: Triton interpreter, tiny geometries (harness check only)")
    ap.add_argument("--tiny", action="store_true", help="tiny geometries (default with --device cpu)")
    ap.add_argument("--family", choices=("mamba2", "gdn", "all"), default="all")
    ap.add_argument("--geometries", nargs="*", default=None,
                    help=f"geometry names (default: headline; also {sorted(EXTRA_MAMBA2) + sorted(EXTRA_GDN)})")
    ap.add_argument("--batches", type=int, nargs="*", default=None)
    ap.add_argument("--dtypes", nargs="*", choices=STATE_DTYPES, default=None)
    ap.add_argument("--window", type=int, default=WINDOW, help="verify window T (1 + drafts)")
    ap.add_argument("--history", type=int, default=HISTORY, help="history block B (ring R = B + T)")
    ap.add_argument("--accept", type=int, default=ACCEPT, help="window tokens committed per step")
    ap.add_argument("--all-phases", action="store_true", help="time every cycle state even with --quick")
    ap.add_argument("--check-batch", type=int, default=None, help="batch of the correctness check (8; cpu 2)")
    ap.add_argument("--check-steps", type=int, default=None,
                    help="verify windows in the correctness check (default: reset + one cycle + 1)")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check (exit status ignores it)")
    ap.add_argument("--target-ms", type=float, default=None, help="timed milliseconds per measurement")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="stop starting new cases after this many seconds (default 420 on cuda)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def _select_geometries(args, tiny: bool) -> Tuple[Dict[str, Dict], Dict[str, Dict], Dict[str, str]]:
    m_all = TINY_MAMBA2 if tiny else dict(MAMBA2_GEOMETRIES, **EXTRA_MAMBA2)
    g_all = TINY_GDN if tiny else dict(GDN_GEOMETRIES, **EXTRA_GDN)
    headline = {"mamba2": next(iter(m_all)), "gdn": next(iter(g_all))}
    if args.geometries:
        unknown = set(args.geometries) - set(m_all) - set(g_all)
        if unknown:
            raise ValueError(f"unknown geometries {sorted(unknown)}; known: {sorted(m_all) + sorted(g_all)}")
        m = {k: v for k, v in m_all.items() if k in args.geometries}
        g = {k: v for k, v in g_all.items() if k in args.geometries}
    else:
        m = {headline["mamba2"]: m_all[headline["mamba2"]]}
        g = {headline["gdn"]: g_all[headline["gdn"]]}
    if args.family == "mamba2":
        g = {}
    elif args.family == "gdn":
        m = {}
    return m, g, headline


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.time()
    device = bc.start_device(args.device)
    if device is None:
        return 2
    cpu = device == "cpu"
    tiny = args.tiny or cpu
    try:
        m_geoms, g_geoms, headline = _select_geometries(args, tiny)
        spec = spec_cycle(args.window, args.history + args.window, args.accept)
    except (ValueError, AssertionError) as e:
        bc.log(f"!! {e}")
        return 2
    geoms = {"mamba2": m_geoms, "gdn": g_geoms}
    batches = tuple(args.batches) if args.batches else (CPU_BATCHES if cpu else
                                                        (QUICK_BATCHES if args.quick else BATCHES))
    dtypes = tuple(args.dtypes) if args.dtypes else STATE_DTYPES
    Lc = spec["length"]
    phases = list(range(Lc)) if (args.all_phases or not args.quick) else bc.quick_phases(Lc)
    target_ms = args.target_ms or (10.0 if args.quick else 20.0)
    budget = args.time_budget_s if args.time_budget_s is not None else (420.0 if not cpu else 1e9)
    min_launches = 1 if cpu else 4

    bc.log(f"== bench_spec: device={device} T={spec['T']} B={spec['B']} R={spec['R']} accept={spec['accept']} "
           f"cycle={[c['wp'] for c in spec['cycle']]} (L_c={Lc}) batches={list(batches)} dtypes={list(dtypes)} "
           f"phases={phases} mamba2={list(m_geoms)} gdn={list(g_geoms)}")
    kern = Kernels(device)
    for k, e in kern.errors.items():
        bc.log(f"!! {k} not importable: {e}")
    if kern.spec_commit is not None and kern.spec_ring_len(args.history, args.window) != spec["R"]:
        bc.log("!! spec_ring_len disagrees with R = B + T")
        return 2

    result = bc.result_header(
        device, args.quick, {"spec": spec}, phases=phases, batches=batches, dtypes=dtypes, geometries=geoms,
        stock=kern.info(), ours={fam: ours_launch_info(kern, fam, g, spec["T"], spec["R"])
                                 for fam, gs in geoms.items() for g in list(gs.values())[:1]},
        timing_method="CUDA graph replay, events, median (bench_kernels.Timer)", target_ms=target_ms,
        min_launches=min_launches, fairness_notes=FAIRNESS_NOTES)

    cb = bc.measure_copy_bandwidth(result, device)

    result["correctness"] = []
    if not args.no_check:
        cbatch = args.check_batch or (2 if cpu else 8)
        for fam, gs in geoms.items():
            if not gs:
                continue
            g = next(iter(gs))
            if kern.stock_ok(fam) and kern.ours_ok(fam):
                check = partial(check_family, fam, gs[g], kern, spec, cbatch, device, steps=args.check_steps)
            else:
                check = partial(dict, family=fam, geometry_name=g,
                                error=f"stock or our kernels not importable: {kern.errors}")
            bc.run_check(result, fam, g, check, _check_line,
                         f"-- correctness {fam} {g} bs{cbatch} fp32: ours vs stock over the reset window + one cycle",
                         print_traceback=True)

    plan = [(fam, g, dt, b) for dt in dtypes for fam in ("mamba2", "gdn") for g in geoms[fam] for b in batches]
    timer = bc.Timer(device, target_ms=target_ms)
    bc.run_cases(result, plan,
                 lambda i, fam, g, dt, b: run_case(fam, g, geoms[fam][g], b, dt, device, kern, timer, spec, phases,
                                                   cb["GBps"], min_launches, args.seed + i,
                                                   n_sets=1 if cpu else None),
                 _case_line, device=device, t_start=t_start, budget=budget, warn=_cycle_warning)
    bc.remeasure_copy_bandwidth(result, device)
    bc.note_skips_and_fallbacks(result, timer)
    bad_cycle = [f"{c['family']} {c['state_dtype']} bs{c['batch']}" for c in result["cases"]
                 if _k(c, "ours", "cycle_cursors_returned") is False]
    if bad_cycle:
        result["notes"].append(f"!! cursors not back at the cycle start after the in-order cycle graph: {bad_cycle}")
    result["summary"] = build_summary(result["cases"], {f: list(g) for f, g in geoms.items()}, headline,
                                      result["correctness"], check_required=not args.no_check)
    passed = result["summary"]["correctness_passed"]
    result["valid"] = bool(passed) if not args.no_check else None
    if passed is False:
        result["notes"].insert(0, "!! CORRECTNESS CHECK FAILED (ours vs stock): the timings below are not valid")
    bc.write_outputs(result, args.out, t_start, "Speculative-verify kernel benchmark", markdown_report, plot_report,
                     stdout_table, ("mamba2_verify_speedup_bs256_fp32", "gdn_verify_speedup_bs256_fp32",
                                    "mamba2_verify_speedup_bs1_fp32", "gdn_verify_speedup_bs1_fp32"),
                     headline_tail=f"; correctness passed: {passed}")
    if passed is False:
        bc.log("!! correctness check failed (or could not run): exit 1")
        return 1
    return 0


def _case_line(c: Dict[str, Any]) -> str:
    return (f"stock {report.fmt(c.get('t_stock_us'), 1)} us (SSU {report.fmt(_k(c, 'stock', 't_ssu_us'), 1)}), "
            f"ours {report.fmt(c.get('t_ours_us'), 1)} us (cycle {report.fmt(_k(c, 'ours', 't_cycle_us'), 1)}), "
            f"speedup {report.fmt(c.get('speedup'), 2)}")


def _cycle_warning(c: Dict[str, Any]) -> str:
    return "" if _k(c, "ours", "cycle_cursors_returned") in (None, True) else "  !! CURSORS OFF CYCLE"


def _check_line(r: Dict[str, Any]) -> str:
    if "error" in r:
        return f"!! check failed: {r['error']}"
    return (f"{'ok' if r['passed'] else '!! FAILED'}: first window max|Δ| {bc.sci(r['first_window_max_abs_diff'])}, "
            f"all {r['steps']} windows {bc.sci(r['max_abs_diff_vs_stock'])} (flush at {r['flush_steps']}); "
            f"rel err vs fp64 ours {bc.sci(r['ours_max_rel_err_vs_fp64'])}, "
            f"stock {bc.sci(r['stock_max_rel_err_vs_fp64'])}"
            + ("" if r["cursors_follow_cycle"] else "; !! cursors off the simulated cycle"))


if __name__ == "__main__":
    sys.exit(main())
