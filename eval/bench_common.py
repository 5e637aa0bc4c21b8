"""Scaffolding shared by the kernel benchmarks (:mod:`eval.bench_kernels`, standard
decode, :mod:`eval.bench_spec`, speculative verify, and :mod:`eval.tune_kernels`, the
launch-config search), so that no benchmark script imports another.

What lives here is what the scripts do the same way; what they measure and how they
summarise it stays in each script:

* environment: :func:`git_commit`, :func:`sglang_version`, :func:`pick_device` /
  :func:`start_device`, :func:`log`, :func:`progress`;
* timing: :class:`Timer` (CUDA-graph replays, median), :func:`copy_bandwidth` (the
  device-to-device reference every ``bw_fraction`` is a fraction of), the L2-defeat
  rule :func:`slot_sets_needed`, :func:`gbps`;
* workloads: :func:`slot_sets` (pool size, generator, disjoint slot sets) and
  :class:`CaseWork` (the ``finite()`` check of a case's outputs and touched state);
* one run: :func:`result_header`, :func:`measure_copy_bandwidth` /
  :func:`remeasure_copy_bandwidth`, :func:`run_check`, :func:`run_cases` (deadline,
  skip records, exception capture), :func:`case_header` / :func:`close_case` (one
  case's record, its summary and the memory release), :func:`note_skips_and_fallbacks`,
  :func:`write_outputs` (JSON, Markdown, PNG, stdout, wall time);
* summaries and reports: :func:`find_case`, :func:`summary_cells`, :func:`by_geometry`,
  :func:`summary_sections`, :func:`plot_speedups`, :func:`batch_series`, :func:`sci`,
  :func:`slug`, :func:`rel_err`, :func:`torch_dtype`;
* the models and decode cases: the geometries (``MAMBA2_GEOMETRIES``, ``GDN_GEOMETRIES``
  and the CPU ones), ``BUFFER_LEN``, :func:`quick_phases`, :func:`amortise` (flush-cycle
  time per step), the ring cursors :func:`phase_wpos` / :func:`mixed_wpos`, SGLang's
  stock kernels (:func:`load_stock`, with its CPU-interpreter shims), the decode work
  objects :class:`Mamba2Work` / :class:`GDNWork` and the fp64 references
  :func:`mamba2_ref_step` / :func:`gdn_ref_step`.

torch and triton are imported inside the functions that need them, so the pure parts
import on any box.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
import types
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from eval import report

# ---------------------------------------------------------------------------------
# settings both benchmarks share
# ---------------------------------------------------------------------------------
STATE_DTYPES = ("fp32", "bf16")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
L2_BYTES = 60 * 10**6          # H200 L2 as given in the brief (50 MiB physical)
TOUCH_FACTOR = 4               # touched state per replay >= TOUCH_FACTOR * L2
MAX_SETS = 256
ACT_DTYPE = "bf16"             # activation dtype of every case
CPU_NOTE = "CPU interpreter run: times are NOT performance numbers; it checks the harness only."


# ---------------------------------------------------------------------------------
# small pure helpers
# ---------------------------------------------------------------------------------
def gbps(nbytes: Optional[float], t_us: Optional[float]) -> Optional[float]:
    """GB/s (1e9 bytes per second) from bytes and microseconds."""
    if not (report.is_number(nbytes) and report.is_number(t_us)) or t_us <= 0:
        return None
    return nbytes / (t_us * 1e-6) / 1e9


def slot_sets_needed(batch: int, state_row_bytes: int, l2_bytes: int = L2_BYTES,
                     factor: int = TOUCH_FACTOR, max_sets: int = MAX_SETS) -> int:
    """Disjoint slot sets to rotate so that one replay touches >= factor·L2 of state."""
    per_set = max(1, batch * state_row_bytes)
    return int(min(max_sets, max(1, math.ceil(factor * l2_bytes / per_set))))


def slug(name: str) -> str:
    """A geometry name as a summary-key fragment: ``qwen3.5-122b`` -> ``qwen3_5_122b``."""
    return name.replace("-", "_").replace(".", "_")


def sci(x) -> str:
    """``x`` in 2-digit scientific notation, or the report's missing mark."""
    return f"{x:.2e}" if report.is_number(x) else report.MISSING


def torch_dtype(name: str):
    """The torch dtype of ``fp32`` / ``bf16`` / ``fp16``."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def rel_err(a, ref) -> float:
    """Relative L2 error ``|a - ref| / |ref|`` in fp64 (the absolute norm when ref is 0)."""
    import torch

    den = torch.linalg.vector_norm(ref.double()).item()
    num = torch.linalg.vector_norm(a.double() - ref.double()).item()
    return num / den if den > 0 else num


# ---------------------------------------------------------------------------------
# environment
# ---------------------------------------------------------------------------------
def git_commit() -> str:
    """``$GIT_COMMIT`` when set (the GPU host's copy may have no .git), else HEAD, else "unknown"."""
    env = os.environ.get("GIT_COMMIT")
    if env:
        return env.strip()
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except Exception:
        pass
    return "unknown"


def sglang_version() -> Optional[str]:
    """SGLang's version from its distribution metadata, else from ``sglang/version.py``."""
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        pass
    try:
        spec = importlib.util.find_spec("sglang")
        if spec and spec.submodule_search_locations:
            vfile = Path(list(spec.submodule_search_locations)[0]) / "version.py"
            if vfile.is_file():
                ns: Dict[str, Any] = {}
                exec(vfile.read_text(), ns)
                return ns.get("__version__")
    except Exception:
        pass
    return None


def progress(iterable, total: int, desc: str):
    """tqdm bar when available and stderr is a terminal; else the bare iterable."""
    try:
        if sys.stderr.isatty():
            from tqdm import tqdm

            return tqdm(iterable, total=total, desc=desc)
    except Exception:
        pass
    return iterable


def log(msg: str) -> None:
    """Print a progress line now (stdout, flushed)."""
    print(msg, flush=True)


def pick_device(requested: Optional[str]) -> str:
    """cuda when present (or asked for), else cpu with Triton's interpreter switched on."""
    device = requested
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    return device


def start_device(requested: Optional[str]) -> Optional[str]:
    """:func:`pick_device`; None (after saying why) when cuda is asked for but torch sees none."""
    device = pick_device(requested)
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        log("!! --device cuda but torch sees no CUDA device")
        return None
    return device


def release_device_memory(device: str, synchronize: bool = False) -> None:
    """On cuda: (wait for the device, then) hand the allocator's cached blocks back."""
    if device == "cuda":
        import torch

        if synchronize:
            torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------
class Timer:
    """Per-launch time of a sequence of launches (µs, median over replays).

    CUDA: every launch runs once (compile + warm-up), the sequence is captured into
    one CUDA graph, replayed a few times, then timed with events around each replay;
    the per-replay count adapts to ``target_ms``.  Falls back to
    ``triton.testing.do_bench`` (median) if capture fails.  CPU: one wall-clock pass
    (interpreter; only the harness logic is meaningful)."""

    def __init__(self, device: str, target_ms: float = 25.0, min_reps: int = 5, max_reps: int = 200):
        self.device = device
        self.target_ms = target_ms
        self.min_reps = min_reps
        self.max_reps = max_reps
        self.fallbacks: List[str] = []

    def __call__(self, fns: Sequence[Callable[[], Any]]) -> Dict[str, Any]:
        import torch

        n = len(fns)
        if n == 0:
            raise ValueError("nothing to time")
        if self.device == "cpu":
            for f in fns[:1]:
                f()
            t0 = time.perf_counter()
            for f in fns:
                f()
            return {"us": (time.perf_counter() - t0) * 1e6 / n, "reps": 1, "launches": n,
                    "method": "cpu-wallclock (Triton interpreter: not a speed number)"}
        for f in fns:
            f()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for f in fns:
                    f()
            torch.cuda.synchronize()
        except Exception as e:
            del graph
            torch.cuda.synchronize()
            self.fallbacks.append(f"{type(e).__name__}: {e}")
            import triton.testing

            def seq():
                for f in fns:
                    f()

            ms = triton.testing.do_bench(seq, warmup=10, rep=max(20, int(self.target_ms)), return_mode="median")
            return {"us": ms * 1e3 / n, "reps": None, "launches": n, "method": "do_bench-median"}
        for _ in range(2):
            graph.replay()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        est = max(s.elapsed_time(e), 1e-3)
        reps = int(min(self.max_reps, max(self.min_reps, math.ceil(self.target_ms / est))))
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for a, b in evs:
            a.record()
            graph.replay()
            b.record()
        torch.cuda.synchronize()
        times = sorted(a.elapsed_time(b) for a, b in evs)
        med = statistics.median(times)
        del graph
        return {"us": med * 1e3 / n, "reps": reps, "launches": n, "method": "cuda-graph-median",
                "spread": (times[-1] - times[0]) / med if med > 0 else None}


def copy_bandwidth(device: str, nbytes: Optional[int] = None, warmup_s: float = 0.5) -> Dict[str, Any]:
    """Device-to-device copy bandwidth: (bytes read + bytes written) / time.

    The GPU idles at low clocks (345 MHz SM seen on the H200 here) until work arrives:
    copies run for ``warmup_s`` before the timed replays, or the first measurement of
    the run comes out ~35% low."""
    import torch

    if nbytes is None:
        nbytes = 2 * 2**30 if device == "cuda" else 32 * 2**20
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_(-1, 1)
    dst = torch.empty_like(src)
    if device == "cuda":
        t_end = time.time() + warmup_s
        while time.time() < t_end:
            for _ in range(8):
                dst.copy_(src)
            torch.cuda.synchronize()
    moved = 2 * src.numel() * 4
    if device == "cpu":
        t = Timer(device)([lambda: dst.copy_(src)])
        ok = bool(torch.equal(dst, src))
        return {"bytes_per_copy": nbytes, "copy_us": t["us"], "GBps": gbps(moved, t["us"]), "verified": ok,
                "timing": t}
    # Eager launches timed with events.  Not a CUDA graph: a captured D2D memcpy becomes a
    # graph memcpy node, which ran at ~2.77 TB/s here against ~4.3 TB/s eager.
    variants = {"memcpy (copy_)": lambda: dst.copy_(src),
                "elementwise kernel (mul by 1 into dst)": lambda: torch.mul(src, 1.0, out=dst)}
    per = {}
    for name, fn in variants.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(20)]
        for a, b in evs:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        us = statistics.median(a.elapsed_time(b) for a, b in evs) * 1e3
        per[name] = {"us": us, "GBps": gbps(moved, us)}
    ok = bool(torch.equal(dst, src))
    del src, dst
    torch.cuda.empty_cache()
    best = max(per, key=lambda k: per[k]["GBps"] or 0.0)
    return {"bytes_per_copy": nbytes, "copy_us": per[best]["us"], "GBps": per[best]["GBps"], "verified": ok,
            "method": f"max of eager variants ({best}), median of 20 event-timed launches", "variants": per}


# ---------------------------------------------------------------------------------
# workloads
# ---------------------------------------------------------------------------------
def slot_sets(batch: int, n_sets: int, seed: int, device: str) -> Tuple[int, Any, List[Any]]:
    """Pool layout of one case: (S, generator, slot index sets).

    S = max(2b+1, n_sets·b+1) slots; the case's tensors draw from a ``device``
    generator seeded with ``seed``; ``n_sets`` disjoint int32 index sets of ``batch``
    slots each (one per graph launch / emulated layer) come from a random permutation
    of 1..S-1 (slot 0 is the null slot), drawn from a CPU generator seeded ``seed + 1``
    so that the device generator's stream does not depend on them."""
    import torch

    S = max(2 * batch + 1, n_sets * batch + 1)
    gen = torch.Generator(device=device).manual_seed(seed)
    perm = torch.randperm(S - 1, generator=torch.Generator().manual_seed(seed + 1)) + 1
    return S, gen, [perm[s * batch:(s + 1) * batch].to(torch.int32).to(device) for s in range(n_sets)]


class CaseWork:
    """Base of a case's work object: ``out`` (the output buffer), ``state`` (the pool)
    and ``sets`` (per-set inputs, each with its slot indices ``idx``)."""

    def finite(self) -> bool:
        """Output buffer and the first set's state rows all finite."""
        import torch

        rows = self.sets[0]["idx"].long()
        return bool(torch.isfinite(self.out).all()) and bool(torch.isfinite(self.state[rows]).all())


# ---------------------------------------------------------------------------------
# one run
# ---------------------------------------------------------------------------------
def result_header(device: str, quick: bool, cycle: Dict[str, Any], *, phases: Sequence[int],
                  batches: Sequence[int], dtypes: Sequence[str], geometries: Dict[str, Any], stock: Dict[str, Any],
                  ours: Dict[str, Any], timing_method: str, target_ms: float, min_launches: int,
                  fairness_notes: List[str]) -> Dict[str, Any]:
    """The result dict before any measurement: environment (commit, SGLang, GPU,
    versions), mode, the run's settings (``cycle``: the script's cursor-cycle fields,
    then phases, batches, dtypes, geometries, the L2-defeat rule), kernel import and
    launch info, timing settings (``timing_method`` on cuda), notes (the CPU warning
    on cpu) and empty ``cases`` / ``skipped``."""
    import torch
    import triton

    cpu = device == "cpu"
    result: Dict[str, Any] = {
        "git_commit": git_commit(),
        "sglang_version": sglang_version(),
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
        "device": device,
        "mode": "cpu-interpreter" if cpu else ("quick" if quick else "full"),
    }
    result.update(cycle)
    result.update({
        "phases_timed": phases,
        "batches": list(batches),
        "state_dtypes": list(dtypes),
        "act_dtype": ACT_DTYPE,
        "geometries": geometries,
        "l2_bytes_assumed": L2_BYTES,
        "touch_factor": TOUCH_FACTOR,
        "stock": stock,
        "ours": ours,
        "timing": {"method": "cpu wall clock" if cpu else timing_method,
                   "target_ms": target_ms, "min_launches_per_graph": min_launches},
        "notes": [CPU_NOTE] if cpu else [],
        "fairness_notes": fairness_notes,
        "cases": [],
        "skipped": [],
    })
    return result


def case_header(family: str, name: str, geom: Dict[str, int], sdtype: str, batch: int, cycle: Dict[str, Any],
                num_slots: int, n_sets: int, row: int, launches: int,
                extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A case record before timing: what it is (``cycle``: the script's cycle fields),
    its pool (``row`` bytes of state per slot) and how much state one graph replay
    touches (``launches`` launches of ``batch`` rows), ``extra`` fields, empty ``kernels``."""
    return {
        "family": family, "geometry": name, "shape": dict(geom), "state_dtype": sdtype, "act_dtype": ACT_DTYPE,
        "batch": batch, **cycle, "num_slots": num_slots, "slot_sets": n_sets,
        "launches_per_graph": launches,
        "touched_state_MB_per_graph": launches * batch * row / 1e6,
        "pool_state_MB": num_slots * row / 1e6, **(extra or {}), "kernels": {},
    }


def measure_copy_bandwidth(result: Dict[str, Any], device: str) -> Dict[str, Any]:
    """The run's reference bandwidth, measured first: ``copy_bw`` / ``copy_bw_GBps``."""
    log("-- copy bandwidth")
    cb = copy_bandwidth(device)
    result["copy_bw"] = cb
    result["copy_bw_GBps"] = cb["GBps"]
    log(f"   copy {cb['bytes_per_copy'] / 2**30:.2f} GiB: {report.fmt(cb['GBps'], 0)} GB/s (read+write)")
    return cb


def remeasure_copy_bandwidth(result: Dict[str, Any], device: str) -> Dict[str, Any]:
    """The copy bandwidth again after the cases (``copy_bw_end``); a note when it beats
    the start value by more than 5% (the start value, which every ``bw_fraction``
    uses, was then measured at low clocks)."""
    cb, cb_end = result["copy_bw"], copy_bandwidth(device, warmup_s=0.1)
    result["copy_bw_end"] = cb_end
    if report.is_number(cb_end["GBps"]) and report.is_number(cb["GBps"]) and cb_end["GBps"] > 1.05 * cb["GBps"]:
        result["notes"].append(f"copy bandwidth at the end ({cb_end['GBps']:.0f} GB/s) exceeds the start "
                               f"({cb['GBps']:.0f} GB/s) by >5%: bw_fraction values use the start value")
    return cb_end


def note_skips_and_fallbacks(result: Dict[str, Any], timer: Timer) -> None:
    """Say how many cases the time budget skipped; note CUDA-graph capture failures."""
    if result["skipped"]:
        log(f"!! {len(result['skipped'])} cases skipped: time budget")
    if timer.fallbacks:
        result["notes"].append(f"CUDA graph capture failed {len(timer.fallbacks)}x, do_bench used: "
                               f"{timer.fallbacks[0]}")


def run_check(result: Dict[str, Any], family: str, geometry_name: str, check: Callable[[], Dict[str, Any]],
              describe: Callable[[Dict[str, Any]], str], announce: str, print_traceback: bool = False) -> None:
    """Log ``announce``, run one correctness check and append its record, tagged with
    ``geometry_name``, to ``result["correctness"]`` (an exception becomes a record
    with ``error``); log ``describe(record)``."""
    log(announce)
    try:
        r = check()
        r["geometry_name"] = geometry_name
    except Exception as e:
        if print_traceback:
            traceback.print_exc()
        r = {"family": family, "geometry_name": geometry_name, "error": f"{type(e).__name__}: {e}"}
    result["correctness"].append(r)
    log("   " + describe(r))


Case = Tuple[str, str, str, int]  # (family, geometry name, state dtype, batch)


def run_cases(result: Dict[str, Any], plan: Sequence[Case],
              run_one: Callable[[int, str, str, str, int], Dict[str, Any]], describe: Callable[[Dict[str, Any]], str],
              *, device: str, t_start: float, budget: float,
              warn: Optional[Callable[[Dict[str, Any]], str]] = None) -> None:
    """Run ``run_one(i, family, geometry, dtype, batch)`` for every case of ``plan`` into
    ``result["cases"]`` (each with its ``wall_s``).  Once ``budget`` seconds have passed
    since ``t_start`` the remaining cases go to ``result["skipped"]``; an exception
    becomes a case record with ``error`` (traceback printed, CUDA caches emptied).
    One line per case: ``describe(case)``, then flags (non-finite, ``warn(case)``, the
    error) and the wall time."""
    log(f"-- {len(plan)} cases")
    for i, (fam, g, dt, b) in enumerate(progress(plan, len(plan), "cases")):
        if time.time() - t_start > budget:
            result["skipped"].append({"family": fam, "geometry": g, "state_dtype": dt, "batch": b,
                                      "reason": f"time budget {budget:.0f}s spent"})
            continue
        t0 = time.time()
        try:
            c = run_one(i, fam, g, dt, b)
        except Exception as e:
            traceback.print_exc()
            c = {"family": fam, "geometry": g, "state_dtype": dt, "batch": b, "kernels": {},
                 "error": f"{type(e).__name__}: {e}"}
            release_device_memory(device, synchronize=True)
        c["wall_s"] = time.time() - t0
        result["cases"].append(c)
        log(f"[{i + 1}/{len(plan)}] {fam} {g} {dt} bs{b}: " + describe(c)
            + ("" if c.get("finite", True) else "  !! NON-FINITE")
            + (warn(c) if warn else "")
            + (f"  !! {c['error']}" if "error" in c else "") + f"  [{c['wall_s']:.1f}s]")


def close_case(case: Dict[str, Any], device: str, summarize: Callable[[Dict[str, Any]], None]) -> Dict[str, Any]:
    """End of a case whose work object the caller has dropped: ``summarize(case)``, then
    the freed pool goes back to the device.  Returns ``case``."""
    summarize(case)
    release_device_memory(device)
    return case


def write_outputs(result: Dict[str, Any], out, t_start: float, title: str,
                  markdown_report: Callable[[Dict[str, Any]], List[tuple]],
                  plot_report: Callable[[Dict[str, Any], Path], bool],
                  stdout_table: Callable[[Dict[str, Any]], str], headline_keys: Sequence[str],
                  headline_tail: str = "") -> None:
    """Stamp ``wall_s``; write ``<out>`` (JSON), ``<out>.md`` (``title (gpu)``) and
    ``<out>.png``; print the short table, the headline summary values and the total time."""
    result["wall_s"] = time.time() - t_start
    out = Path(out)
    report.write_json(out, result)
    md = out.with_suffix(".md")
    report.write_markdown(md, f"{title} ({result['gpu']})", markdown_report(result))
    png = out.with_suffix(".png")
    drew = plot_report(result, png)
    log(f"-- wrote {out}, {md}" + (f", {png}" if drew else " (no plot: matplotlib missing or no data)"))
    log(stdout_table(result))
    hs = result["summary"]
    log("headline: " + ", ".join(f"{k}={report.fmt(hs.get(k), 3)}" for k in headline_keys) + headline_tail)
    log(f"total {result['wall_s']:.0f}s")


# ---------------------------------------------------------------------------------
# summaries and reports
# ---------------------------------------------------------------------------------
def find_case(cases: Sequence[Dict[str, Any]], family: str, geom: str, dtype: str,
              batch: int) -> Optional[Dict[str, Any]]:
    """The case of (family, geometry, state dtype, batch), or None."""
    for c in cases:
        if c["family"] == family and c["geometry"] == geom and c["state_dtype"] == dtype and c["batch"] == batch:
            return c
    return None


def summary_cells(cases: Sequence[Dict[str, Any]], geoms: Dict[str, Sequence[str]], headline: Dict[str, str],
                  batches: Sequence[int] = (1, 256)) -> Iterator[Tuple[str, str, str, int, Optional[Dict[str, Any]]]]:
    """(family, key prefix, dtype, batch, case or None) for the flat summary keys:
    Mamba2 then GDN, each geometry, each state dtype, batches 1 and 256.  The prefix is
    the family for its headline geometry, else ``<family>_<slug(geometry)>``."""
    for fam in ("mamba2", "gdn"):
        for g in geoms.get(fam, ()):
            prefix = fam if g == headline.get(fam) else f"{fam}_{slug(g)}"
            for dt in STATE_DTYPES:
                for bs in batches:
                    yield fam, prefix, dt, bs, find_case(cases, fam, g, dt, bs)


def by_geometry(cases: Sequence[Dict[str, Any]], keys: Sequence[str],
                extra: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None) -> Dict[str, Any]:
    """family -> geometry -> dtype -> str(batch) -> {key: case value} (+ ``extra(case)``)."""
    by: Dict[str, Any] = {}
    for c in cases:
        d = by.setdefault(c["family"], {}).setdefault(c["geometry"], {}).setdefault(c["state_dtype"], {})
        d[str(c["batch"])] = {k: c.get(k) for k in keys}
        if extra is not None:
            d[str(c["batch"])].update(extra(c))
    return by


def summary_sections(summary: Dict[str, Any], notes: Sequence[str]) -> List[tuple]:
    """The Markdown report's tail: the flat summary values, then the notes (if any)."""
    summ = {k: v for k, v in summary.items() if not isinstance(v, dict)}
    sections = [("Summary", report.markdown_kv(summ))]
    if notes:
        sections.append(("Notes", "\n".join(f"- {n}" for n in notes)))
    return sections


def batch_series(label: str, sel: Sequence[Dict[str, Any]], key: str, **style) -> Dict[str, Any]:
    """A plot series of ``case[key]`` against batch over the cases ``sel``."""
    return {"label": label, "x": [c["batch"] for c in sel], "y": [c.get(key) for c in sel], **style}


def plot_speedups(result: Dict[str, Any], path, families: Sequence[Tuple[str, str]], ylabel: str,
                  series: Callable[[str, str, str, List[Dict[str, Any]]], List[Dict[str, Any]]],
                  run_label: str) -> bool:
    """One panel per family of ``families`` ((family, title)) with cases: speedup vs
    batch (log2 axis, a line at 1), ``series(family, geometry, dtype, cases by batch)``
    per geometry and state dtype; suptitle gpu, ``run_label``, commit.  False when
    nothing was drawn."""
    panels = []
    for fam, title in families:
        cs = [c for c in result.get("cases", []) if c["family"] == fam]
        if not cs:
            continue
        fam_series: List[Dict[str, Any]] = []
        for g in dict.fromkeys(c["geometry"] for c in cs):
            for dt in STATE_DTYPES:
                sel = sorted((c for c in cs if c["geometry"] == g and c["state_dtype"] == dt), key=lambda c: c["batch"])
                if not sel:
                    continue
                fam_series += series(fam, g, dt, sel)
        panels.append({"title": title, "xlabel": "batch", "ylabel": ylabel, "xlog2": True,
                       "hline": 1.0, "series": fam_series})
    sup = f"{result.get('gpu')}  {run_label}  commit {str(result.get('git_commit'))[:10]}"
    return report.plot_panels(path, panels, suptitle=sup)


# ---------------------------------------------------------------------------------
# geometries and run settings (the decode benchmark's; the verify benchmark and the tuner time the same models)
# ---------------------------------------------------------------------------------
MAMBA2_GEOMETRIES: Dict[str, Dict[str, int]] = {
    "nemotron-h-8b": dict(H=128, P=64, N=128, G=8),
    "nemotron-h-large": dict(H=256, P=64, N=128, G=8),
}
GDN_GEOMETRIES: Dict[str, Dict[str, int]] = {
    "qwen3-next-80b": dict(HV=32, Hk=16, K=128, V=128),
    "qwen3.5-122b": dict(HV=64, Hk=16, K=128, V=128),
}
# --device cpu: tiny shapes the interpreter gets through in seconds (GDN K >= 32
# because upstream's kernel splits K in two tl.dot chunks of >= 16).
CPU_MAMBA2_GEOMETRIES = {"tiny-mamba2": dict(H=4, P=16, N=16, G=2)}
CPU_GDN_GEOMETRIES = {"tiny-gdn": dict(HV=4, Hk=2, K=32, V=32)}
BUFFER_LEN = 16
CPU_BUFFER_LEN = 4


def quick_phases(L: int) -> List[int]:
    """Phases timed in --quick mode: w = 0, L/2, L-2 (non-flush) and L-1 (flush)."""
    return sorted({0, L // 2, max(L - 2, 0), L - 1})


def amortise(phase_times: Dict[int, float], L: int) -> Optional[float]:
    """Flush-cycle time per step from per-phase times.

    t = ((L-1)·mean(non-flush phases timed) + t_flush) / L.  With every phase timed
    this is the plain mean; with a subset it extrapolates the non-flush mean.  With
    L == 1 every step flushes.  None when the flush phase or every non-flush phase
    is missing."""
    vals = {int(w): t for w, t in phase_times.items() if report.is_number(t)}
    flush = vals.get(L - 1)
    if flush is None:
        return None
    if L == 1:
        return flush
    nonflush = [t for w, t in vals.items() if w != L - 1]
    if not nonflush:
        return None
    return ((L - 1) * statistics.fmean(nonflush) + flush) / L


# ---------------------------------------------------------------------------------
# ring cursors of the work objects
# ---------------------------------------------------------------------------------
MIXED_ORDERS = ("modulo", "flush-first", "flush-last")
MIXED_ORDER = "modulo"  # --mixed-order


def mixed_wpos(batch: int, L: int, device, order: Optional[str] = None):
    """The cursor of the mixed launch (phase index L of the work objects): row i at phase i % L, so a batch of
    at least L rows mixes every phase, 1/L of them flushing, as desynchronised requests do in a server.
    ``order`` (default MIXED_ORDER, --mixed-order) arranges the same phases: "modulo" as above, "flush-first"
    sorted by phase descending (the flush rows' programs launch first within each head), "flush-last" ascending
    (they launch last)."""
    import torch

    order = order or MIXED_ORDER
    if order not in MIXED_ORDERS:
        raise ValueError(f"mixed order must be one of {MIXED_ORDERS}, got {order!r}")
    w = torch.arange(batch, dtype=torch.int32) % L
    if order != "modulo":
        w = torch.sort(w, descending=order == "flush-first").values
    return w.to(device)


def phase_wpos(batch: int, L: int, device) -> list:
    """The cursors the work objects launch with: index w < L puts every row at phase w, index L is the mixed
    launch's (:func:`mixed_wpos`)."""
    import torch

    return [torch.full((batch,), w, dtype=torch.int32, device=device) for w in range(L)] + [
        mixed_wpos(batch, L, device)]


# ---------------------------------------------------------------------------------
# stock SGLang kernels
# ---------------------------------------------------------------------------------
STOCK_MODULES = {
    "mamba2": "sglang.kernels.ops.mamba.triton_ops.ssu_dispatch.selective_state_update "
              "(backend 'triton' -> sglang.kernels.ops.mamba.triton_ops.mamba_ssm.selective_state_update)",
    "gdn": "sglang.kernels.ops.attention.fla.fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode",
    "gdn_upstream": "sglang.kernels.ops.attention.fla.fused_recurrent_linear_replayssm."
                    "fused_recurrent_gdn_replayssm_decode",
}


class Stock:
    """SGLang's kernels, or None each with the reason it could not be imported."""

    def __init__(self):
        self.mamba2: Optional[Callable] = None
        self.gdn: Optional[Callable] = None
        self.gdn_upstream: Optional[Callable] = None
        self.errors: Dict[str, str] = {}
        self.import_mode = "none"
        self.notes: List[str] = []

    def info(self) -> Dict[str, Any]:
        return {
            "import_mode": self.import_mode,
            "modules": STOCK_MODULES,
            "available": {k: getattr(self, k) is not None for k in ("mamba2", "gdn", "gdn_upstream")},
            "errors": self.errors,
            "notes": self.notes,
            "mamba2_launch": "BLOCK_SIZE_M=4, num_warps=4 (SGLang's table for 64 < dstate <= 128), "
                             "grid (cdiv(P,4), batch, H), TIE_HDIM, PDL (USE_GDC/launch_pdl) on sm90+",
            "gdn_launch": "BK=next_pow2(K), BV=min(next_pow2(V), 32), num_warps=1, num_stages=3, grid (V/BV, batch*HV)",
            "gdn_upstream_launch": "BV=min(next_pow2(V), 64), nk=2 (BKT=K/2), BC=max(16, next_pow2(L)), "
                                   "num_warps=1, num_stages=3, grid (V/BV, batch, HV), HAS_FORCE_FLUSH",
        }


def _light_sglang_import() -> None:
    """CPU-only fallback: make ``sglang.kernels.ops...`` importable without running the
    package ``__init__`` files (they pull in the whole server stack: torchvision,
    msgspec, IPython, einops, ...).  The kernel files themselves are loaded unchanged;
    only ``is_arch_support_pdl`` (False without CUDA) and ``torch_release`` (used by
    fla/utils.py) are provided by stubs."""
    import torch

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed")
    root = Path(list(spec.submodule_search_locations)[0])
    for mod in list(sys.modules):
        if mod == "sglang" or mod.startswith("sglang."):
            del sys.modules[mod]
    packages = ["sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.mamba",
                "sglang.kernels.ops.mamba.triton_ops", "sglang.kernels.ops.attention",
                "sglang.kernels.ops.attention.fla", "sglang.kernels.jit", "sglang.kernels.jit.utils",
                "sglang.srt", "sglang.srt.utils"]
    for name in packages:
        m = types.ModuleType(name)
        m.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = m
    sys.modules["sglang.kernels.jit.utils"].is_arch_support_pdl = lambda: False
    common = types.ModuleType("sglang.srt.utils.common")
    common.torch_release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    sys.modules["sglang.srt.utils.common"] = common


def _import_stock_kernels(stock: Stock) -> None:
    try:
        disp = importlib.import_module("sglang.kernels.ops.mamba.triton_ops.ssu_dispatch")
        try:
            disp.initialize_mamba_selective_state_update_backend(types.SimpleNamespace(
                mamba_backend="triton", enable_mamba_cache_stochastic_rounding=False, mamba_cache_philox_rounds=0))
            stock.mamba2 = disp.selective_state_update
        except Exception as e:  # the dispatcher moved: call the Triton kernel it wraps
            stock.notes.append(f"ssu_dispatch init failed ({e!r}); calling mamba_ssm.selective_state_update")
            raise ImportError(str(e))
    except Exception as e:
        try:
            ms = importlib.import_module("sglang.kernels.ops.mamba.triton_ops.mamba_ssm")
            stock.mamba2 = partial(ms.selective_state_update, enable_stochastic_rounding=False, cache_philox_rounds=0)
            stock.notes.append(f"mamba2 via mamba_ssm directly (dispatcher import: {e!r})")
        except Exception as e2:
            stock.errors["mamba2"] = f"{type(e2).__name__}: {e2}"
    try:
        fr = importlib.import_module("sglang.kernels.ops.attention.fla.fused_recurrent")
        stock.gdn = fr.fused_recurrent_gated_delta_rule_packed_decode
    except Exception as e:
        stock.errors["gdn"] = f"{type(e).__name__}: {e}"
    try:
        up = importlib.import_module("sglang.kernels.ops.attention.fla.fused_recurrent_linear_replayssm")
        stock.gdn_upstream = up.fused_recurrent_gdn_replayssm_decode
    except Exception as e:
        stock.errors["gdn_upstream"] = f"{type(e).__name__}: {e}"


def _cpu_interpreter_shims(stock: Stock) -> None:
    """Two CPU-interpreter-only adapters; the kernels' math is untouched.

    * ``mamba_ssm.selective_state_update`` enters ``torch.cpu.device(...)``, which
      torch does not provide: give ``torch.cpu`` a no-op ``device`` context.
    * fla's ``fused_recurrent`` calls ``exp`` bound at import to ``tl.exp``; the
      interpreter only patches names it reaches through ``tl``, so the bare alias
      raises "Did you forget to add @triton.jit": rebind it to a jit wrapper of tl.exp.
    """
    import contextlib

    import torch

    if not hasattr(torch.cpu, "device"):
        torch.cpu.device = lambda index=None: contextlib.nullcontext()
        stock.notes.append("cpu shim: torch.cpu.device = nullcontext (mamba_ssm wrapper)")
    mod = sys.modules.get("sglang.kernels.ops.attention.fla.fused_recurrent")
    if mod is not None and getattr(mod, "exp", None) is not None:
        import triton
        import triton.language

        # the interpreter looks for ``tl`` among the jit function's globals
        globals()["tl"] = triton.language

        @triton.jit
        def _interp_exp(x):
            return tl.exp(x)

        mod.exp = _interp_exp
        stock.notes.append("cpu shim: fla fused_recurrent.exp -> jit wrapper of tl.exp (interpreter)")


def load_stock(device: str, allow_light: bool = True) -> Stock:
    """Import SGLang's kernels the way the server does; on a CPU box whose venv lacks
    SGLang's runtime dependencies, fall back to :func:`_light_sglang_import`."""
    stock = Stock()
    try:
        importlib.import_module("sglang")
        stock.import_mode = "normal"
        _import_stock_kernels(stock)
    except Exception as e:
        stock.errors["sglang"] = f"{type(e).__name__}: {e}"
    missing = [k for k in ("mamba2", "gdn", "gdn_upstream") if getattr(stock, k) is None]
    if missing and device == "cpu" and allow_light:
        first_errors = dict(stock.errors)
        stock.errors = {}
        try:
            _light_sglang_import()
            stock.import_mode = "light (CPU only: sglang package __init__ files skipped)"
            _import_stock_kernels(stock)
            stock.notes.append(f"normal import failed: {first_errors}")
        except Exception as e:
            stock.errors = dict(first_errors, light=f"{type(e).__name__}: {e}")
    if device == "cpu":
        try:
            _cpu_interpreter_shims(stock)
        except Exception as e:
            stock.notes.append(f"cpu shims failed: {e!r}")
    if stock.errors:
        msg = "; ".join(f"{k}: {v}" for k, v in stock.errors.items())
        log("!! SGLang stock kernels not (all) importable -> those baselines are skipped.\n"
            f"!!   {msg}\n"
            "!!   On the GPU host run `source .sglang-bundle/bootstrap.sh` first "
            "(SGLang 0.5.17 bundle, see shared/device/README.md).")
    return stock


# ---------------------------------------------------------------------------------
# decode workloads
# ---------------------------------------------------------------------------------
def _work_common(work, batch, L, n_sets, seed, state_dtype, act_dtype, device):
    """Fields every case's work object shares; returns (act dtype, state dtype, generator,
    slots, the per-set slot indices) (see :func:`bench_common.slot_sets`)."""
    work.L, work.b, work.n_sets = L, batch, n_sets
    work.num_slots, gen, idx_sets = slot_sets(batch, n_sets, seed, device)
    return torch_dtype(act_dtype), torch_dtype(state_dtype), gen, work.num_slots, idx_sets


class Mamba2Work(CaseWork):
    """Pool, rings and per-set inputs for one Mamba2 case, laid out as SGLang's
    MambaMixer2 hands them to the decode kernel."""

    def __init__(self, geom: Dict[str, int], batch: int, L: int, state_dtype: str, device: str,
                 n_sets: int, seed: int, act_dtype: str = "bf16"):
        import torch

        H, P, N, G = geom["H"], geom["P"], geom["N"], geom["G"]
        self.H, self.P, self.N, self.G = H, P, N, G
        act, sdt, gen, S, idx_sets = _work_common(self, batch, L, n_sets, seed, state_dtype, act_dtype, device)
        self.state = torch.empty((S, H, P, N), dtype=sdt, device=device).normal_(0.0, 0.5, generator=gen)
        self.x_ring = torch.empty((S, H, L, P), dtype=act, device=device).normal_(0.0, 1.0, generator=gen)
        self.B_ring = torch.empty((S, G, L, N), dtype=act, device=device).normal_(0.0, 0.3, generator=gen)
        self.dt_ring = torch.empty((S, H, L), dtype=torch.float32, device=device).uniform_(0.01, 0.2, generator=gen)
        A = -torch.empty(H, dtype=torch.float32, device=device).uniform_(1.0, 8.0, generator=gen)
        D = torch.empty(H, dtype=act, device=device).uniform_(0.5, 1.5, generator=gen)
        dt_bias = torch.empty(H, dtype=act, device=device).uniform_(-3.0, -1.0, generator=gen)
        # SGLang (mamba.py forward_decode): A[:, None, None].expand(-1, P, N).float(),
        # dt_bias / D [:, None].expand(-1, P), dt[:, :, None].expand(-1, -1, P).
        self.A = A[:, None, None].expand(-1, P, N)
        self.D = D[:, None].expand(-1, P)
        self.dt_bias = dt_bias[:, None].expand(-1, P)
        self.A_h, self.D_h, self.dt_bias_h = A, D, dt_bias
        self.sets = []
        conv_dim = H * P + 2 * G * N
        for idx in idx_sets:
            xbc = torch.empty((batch, conv_dim), dtype=act, device=device).normal_(0.0, 1.0, generator=gen)
            xbc[:, H * P:] *= 0.3
            x, Bm, Cm = torch.split(xbc, [H * P, G * N, G * N], dim=-1)
            dt_raw = torch.empty((batch, H), dtype=act, device=device).normal_(0.0, 0.5, generator=gen)
            self.sets.append(dict(idx=idx, x=x.view(batch, H, P), B=Bm.view(batch, G, N), C=Cm.view(batch, G, N),
                                  dt=dt_raw[:, :, None].expand(-1, -1, P), dt_h=dt_raw, xbc=xbc))
        self.wpos = phase_wpos(batch, L, device)
        self.out = torch.empty((batch, H, P), dtype=act, device=device)
        self.state_row_bytes = H * P * N * self.state.element_size()

    def stock_fn(self, fn, s: int) -> Callable[[], Any]:
        st = self.sets[s]
        return lambda: fn(self.state, st["x"], st["dt"], self.A, st["B"], st["C"], self.D, z=None,
                          dt_bias=self.dt_bias, dt_softplus=True, state_batch_indices=st["idx"], out=self.out)

    def ours_fn(self, fn, s: int, w: int) -> Callable[[], Any]:
        st = self.sets[s]
        wp = self.wpos[w]
        return lambda: fn(self.state, self.x_ring, self.B_ring, self.dt_ring, st["x"], st["dt"], self.A, st["B"],
                          st["C"], st["idx"], wp, D=self.D, z=None, dt_bias=self.dt_bias, dt_softplus=True,
                          out=self.out)


class GDNWork(CaseWork):
    """Pool, rings (ours and upstream's) and per-set inputs for one GDN case."""

    def __init__(self, geom: Dict[str, int], batch: int, L: int, state_dtype: str, device: str,
                 n_sets: int, seed: int, act_dtype: str = "bf16", with_upstream: bool = True):
        import torch

        HV, Hk, K, V = geom["HV"], geom["Hk"], geom["K"], geom["V"]
        self.HV, self.Hk, self.K, self.V = HV, Hk, K, V
        act, sdt, gen, S, idx_sets = _work_common(self, batch, L, n_sets, seed, state_dtype, act_dtype, device)
        self.state = torch.empty((S, HV, V, K), dtype=sdt, device=device).normal_(0.0, 0.1, generator=gen)
        self.d_ring = torch.empty((S, HV, L, V), dtype=sdt, device=device).normal_(0.0, 0.1, generator=gen)
        self.k_ring = torch.empty((S, Hk, L, K), dtype=act, device=device).normal_(0.0, 1.0, generator=gen)
        self.g_ring = torch.empty((S, HV, L), dtype=torch.float32, device=device).uniform_(-0.3, -0.01, generator=gen)
        if with_upstream:
            # upstream's decode ring (memory_pool.py): d and k in the SSM dtype, g fp32
            self.up_d = torch.empty((S, HV, L, V), dtype=sdt, device=device).normal_(0.0, 0.1, generator=gen)
            self.up_k = torch.empty((S, Hk, L, K), dtype=sdt, device=device).normal_(0.0, 0.1, generator=gen)
            self.up_g = torch.empty((S, HV, L), dtype=torch.float32, device=device).uniform_(-0.3, -0.01,
                                                                                            generator=gen)
        self.A_log = torch.empty(HV, dtype=torch.float32, device=device).uniform_(0.5, 2.0, generator=gen).log_()
        self.dt_bias = torch.empty(HV, dtype=act, device=device).uniform_(-3.0, -1.0, generator=gen)
        self.scale = K ** -0.5
        width = 2 * Hk * K + HV * V
        self.sets = []
        for idx in idx_sets:
            mq = torch.empty((batch, width), dtype=act, device=device).normal_(0.0, 1.0, generator=gen)
            a = torch.empty((batch, HV), dtype=act, device=device).normal_(0.0, 1.0, generator=gen)
            bb = torch.empty((batch, HV), dtype=act, device=device).normal_(0.0, 1.0, generator=gen)
            self.sets.append(dict(idx=idx, mq=mq, a=a, b=bb))
        self.wpos = phase_wpos(batch, L, device)
        self.force_flush = torch.zeros((batch,), dtype=torch.int32, device=device)
        self.out = torch.empty((batch, 1, HV, V), dtype=act, device=device)
        self.state_row_bytes = HV * V * K * self.state.element_size()

    def stock_fn(self, fn, s: int) -> Callable[[], Any]:
        st = self.sets[s]
        return lambda: fn(mixed_qkv=st["mq"], a=st["a"], b=st["b"], A_log=self.A_log, dt_bias=self.dt_bias,
                          scale=self.scale, initial_state=self.state, out=self.out, ssm_state_indices=st["idx"],
                          use_qk_l2norm_in_kernel=True)

    def upstream_fn(self, fn, s: int, w: int) -> Callable[[], Any]:
        st = self.sets[s]
        wp = self.wpos[w]
        return lambda: fn(mixed_qkv=st["mq"], a=st["a"], b=st["b"], A_log=self.A_log, dt_bias=self.dt_bias,
                          scale=self.scale, initial_state=self.state, d_cache=self.up_d, k_cache=self.up_k,
                          g_cache=self.up_g, out=self.out, ssm_state_indices=st["idx"], write_pos=wp,
                          force_flush=self.force_flush, use_qk_l2norm_in_kernel=True)

    def ours_fn(self, fn, s: int, w: int) -> Callable[[], Any]:
        st = self.sets[s]
        wp = self.wpos[w]
        return lambda: fn(st["mq"], st["a"], st["b"], self.A_log, self.dt_bias, self.state, self.d_ring,
                          self.k_ring, self.g_ring, st["idx"], wp, scale=self.scale, use_qk_l2norm=True,
                          out=self.out)


# ---------------------------------------------------------------------------------
# fp64 references (independent of every kernel under test)
# ---------------------------------------------------------------------------------
def _softplus64(x):
    import torch

    return torch.where(x <= 20.0, torch.log1p(torch.exp(torch.clamp(x, max=20.0))), x)


def mamba2_ref_step(S, x, dt, A, B, C, D, dt_bias):
    """One Mamba2 decode step in fp64. S [b,H,P,N] (updated copy returned), x [b,H,P],
    dt [b,H], A/D/dt_bias [H], B/C [b,G,N]. Returns (S_new, y)."""
    import torch

    H, G = x.shape[1], B.shape[1]
    delta = _softplus64(dt.double() + dt_bias.double()[None])
    dA = torch.exp(A.double()[None] * delta)
    Bh = B.double().repeat_interleave(H // G, dim=1)
    Ch = C.double().repeat_interleave(H // G, dim=1)
    xd = x.double()
    S = S * dA[..., None, None] + delta[..., None, None] * xd[..., :, None] * Bh[..., None, :]
    y = (S * Ch[:, :, None, :]).sum(-1) + D.double()[None, :, None] * xd
    return S, y


def gdn_ref_step(S, mq, a, b, A_log, dt_bias, Hk, K, V, scale):
    """One GDN decode step in fp64 (beta rounded to b's dtype, as SGLang's kernel).
    S [b,HV,V,K]. Returns (S_new, o [b,HV,V])."""
    import torch

    bsz, HV = a.shape
    m = mq.double()
    q = m[:, :Hk * K].view(bsz, Hk, K)
    k = m[:, Hk * K:2 * Hk * K].view(bsz, Hk, K)
    v = m[:, 2 * Hk * K:].view(bsz, HV, V)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * scale
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    rep = HV // Hk
    qh, kh = q.repeat_interleave(rep, 1), k.repeat_interleave(rep, 1)
    g = -torch.exp(A_log.double())[None] * _softplus64(a.double() + dt_bias.double()[None])
    beta = torch.sigmoid(b.float()).to(b.dtype).double()
    S = S * torch.exp(g)[..., None, None]
    d = beta[..., None] * (v - (S * kh[:, :, None, :]).sum(-1))
    S = S + d[..., :, None] * kh[:, :, None, :]
    o = (S * qh[:, :, None, :]).sum(-1)
    return S, o
