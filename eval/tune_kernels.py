"""Sweep the ReplaySSM kernels' launch parameters per geometry; write a per-GPU YAML.

GPU host (after ``source .sglang-bundle/bootstrap.sh`` is NOT needed: no SGLang here)::

    python3 -m eval.tune_kernels --out $OUT/h200.yaml [--quick] [--budget-s 240]

The output has the layout of ``sglang_replayssm/kernels/configs/<gpu>.yaml``
(``family: {geometry_key: {param: value}}``), and a JSON sidecar (``<out>.json``) with every
measurement.  Copy it to ``sglang_replayssm/kernels/configs/h200.yaml`` after review.

What is swept is read from the kernels, not hard-coded: each kernel module is run
once per geometry with its module-level ``launch_config`` wrapped by a recorder, which
captures every (family, key, defaults) the wrapper asks for and the config it got.
The integer parameters among those defaults are swept over the value lists in
``SWEEP_VALUES`` (block sizes limited to the tensor extent).  String parameters stay as
they are (``dot_precision``: an accuracy choice), except the speed choices
a kernel module advertises for its family (:func:`launch_choices`; ``gdn_decode``:
``flush`` rank1 / dot, ``scores`` pre / inline and ``cast`` bits / cvt, from
``gdn_replay.GDN_LAUNCH_CHOICES``), which are secondary parameters of stage 2
(``--fixed-choices`` keeps them as they are).
A candidate is applied by pointing ``SGLANG_REPLAYSSM_KERNEL_CONFIG`` at a fresh YAML
file holding it (a new path per candidate, so no loader cache can serve a stale
config).

Search: stage 1 = every combination of the primary parameters (block size,
num_warps); stage 2 = for the best ``--refine`` configs, each secondary parameter
(num_stages, bc_num_warps, ...) one at a time.  Every candidate is first checked
against the current config's output and flushed state at a flush and a non-flush
phase (rejected if they differ), then timed.  Objective: the flush-cycle amortised
time (one CUDA graph walking the phases 0..L-1 in order, slot sets rotated as in
``bench_kernels``, with ``bench_common``'s work objects) per batch in ``--batches``, combined as
the geometric mean of t / t_current; lower is better, and a candidate must beat the current config by
``--min-gain`` to replace it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from eval import bench_common as bc
from eval import report

ENV_CONFIG = "SGLANG_REPLAYSSM_KERNEL_CONFIG"

# Values tried per integer launch parameter (filtered per geometry in candidate_values).
SWEEP_VALUES: Dict[str, List[int]] = {
    "BLOCK_M": [16, 32, 64],
    "BV": [16, 32, 64, 128],
    "num_warps": [1, 2, 4, 8],
    "num_stages": [1, 2, 3],
    "bc_num_warps": [1, 2, 4],
}
PRIMARY = ("BLOCK_M", "BV", "num_warps")
QUICK_SWEEP_VALUES: Dict[str, List[int]] = {
    "BLOCK_M": [16, 32],
    "BV": [32, 64],
    "num_warps": [1, 4],
    "num_stages": [1, 2],
    "bc_num_warps": [2],
}


# ---------------------------------------------------------------------------------
# discovery
# ---------------------------------------------------------------------------------
def launch_choices(family: str) -> Dict[str, Tuple[str, ...]]:
    """String launch parameters of ``family`` that are speed choices (the same math), with
    their values, as the kernel module advertises them; {} for families without any."""
    if family == "gdn_decode":
        from sglang_replayssm.kernels.gdn_replay import GDN_LAUNCH_CHOICES

        return {k: tuple(v) for k, v in GDN_LAUNCH_CHOICES.items()}
    return {}


class Recorder:
    """Wraps a module's ``launch_config`` and records each request and its answer."""

    def __init__(self, module):
        self.module = module
        self.orig = module.launch_config
        self.calls: List[Tuple[str, str, Dict[str, Any], Dict[str, Any]]] = []

    def __enter__(self):
        orig = self.orig

        def wrapped(family, key, defaults=None, path=None):
            from sglang_replayssm.kernels.common import family_defaults

            got = orig(family, key, defaults, path)
            used = family_defaults(family) if defaults is None else defaults
            self.calls.append((family, key if isinstance(key, str) else tuple(key), dict(used), dict(got)))
            return got

        self.module.launch_config = wrapped
        return self

    def __exit__(self, *exc):
        self.module.launch_config = self.orig
        return False


def discover(family: str, geom: Dict[str, int], L: int, device: str, dtypes: Sequence[str] = ("fp32",)
             ) -> List[Dict[str, Any]]:
    """(family, key, defaults, current) of every launch config the kernel wrapper asks
    for at this geometry, found by running it once (batch 2) under a Recorder.

    The wrappers ask with keys most specific first (``<geometry>_S<state dtype>``, then
    ``<geometry>``): a tuning objective over one state dtype writes the dtype-specific key,
    one over several dtypes the shared geometry key."""
    import importlib

    modname = {"mamba2": "sglang_replayssm.kernels.mamba2_replay", "gdn": "sglang_replayssm.kernels.gdn_replay"}[family]
    mod = importlib.import_module(modname)
    # a fresh config path: no loader cache answers for a previous call
    tmp = Path(tempfile.mkdtemp(prefix="tune-discover-")) / "empty.yaml"
    tmp.write_text("{}\n")
    prev = os.environ.get(ENV_CONFIG)
    current_file = _current_config_file()
    # keep the config in force: copy it when it exists, else an empty mapping
    if current_file is not None and current_file.is_file():
        tmp.write_text(current_file.read_text())
    os.environ[ENV_CONFIG] = str(tmp)
    try:
        with Recorder(mod) as rec:
            dt = dtypes[0]
            if family == "mamba2":
                w = bc.Mamba2Work(geom, 2, L, dt, device, 1, seed=11)
                w.ours_fn(mod.mamba2_replay_decode, 0, L - 1)()
            else:
                w = bc.GDNWork(geom, 2, L, dt, device, 1, seed=11, with_upstream=False)
                w.ours_fn(mod.gdn_replay_decode, 0, L - 1)()
    finally:
        if prev is None:
            os.environ.pop(ENV_CONFIG, None)
        else:
            os.environ[ENV_CONFIG] = prev
    seen: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for fam, key, defaults, got in rec.calls:
        if not isinstance(key, str):
            key = key[0] if len(dtypes) == 1 else key[-1]
        seen[(fam, key)] = {"family": fam, "key": key, "defaults": defaults, "current": got}
    return list(seen.values())


def _current_config_file() -> Optional[Path]:
    try:
        from sglang_replayssm.kernels import common

        return common.config_file()
    except Exception:
        return None


def candidate_values(param: str, default: Any, geom: Dict[str, int], sweep: Dict[str, List[int]],
                     choices: Optional[Dict[str, Sequence[str]]] = None) -> List[Any]:
    """Values to try for one parameter: the sweep list (block sizes limited to the
    extent they tile) plus the current value; a string parameter listed in ``choices``
    gets its listed values (current one included, listed order); other non-integer
    parameters stay fixed."""
    if isinstance(default, str) and choices and param in choices:
        vals = list(choices[param])
        return vals if default in vals else vals + [default]
    if isinstance(default, bool) or not isinstance(default, int) or param not in sweep:
        return [default]
    vals = list(sweep[param])
    extent = {"BLOCK_M": geom.get("P"), "BV": geom.get("V")}.get(param)
    if extent:
        cap = 1 << max(0, (extent - 1).bit_length())
        vals = [v for v in vals if v <= max(cap, 16)]
    if default not in vals:
        vals.append(default)
    return sorted(set(vals))


def stage1_candidates(current: Dict[str, Any], geom, sweep) -> List[Dict[str, Any]]:
    prim = [p for p in current if p in PRIMARY]
    grids = [candidate_values(p, current[p], geom, sweep) for p in prim]
    out = []
    for combo in itertools.product(*grids):
        c = dict(current)
        c.update(zip(prim, combo))
        out.append(c)
    return out


def stage2_candidates(bases: Sequence[Dict[str, Any]], current: Dict[str, Any], geom, sweep,
                      choices: Optional[Dict[str, Sequence[str]]] = None) -> List[Dict[str, Any]]:
    sec = [p for p in current if p not in PRIMARY]
    out = []
    for base in bases:
        for p in sec:
            for v in candidate_values(p, current[p], geom, sweep, choices):
                if v != base[p]:
                    c = dict(base)
                    c[p] = v
                    out.append(c)
    return out


# ---------------------------------------------------------------------------------
# YAML
# ---------------------------------------------------------------------------------
def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def yaml_text(tables: Dict[str, Dict[str, Dict[str, Any]]], header: Sequence[str] = ()) -> str:
    """``family: {key: {param: value}}`` as block YAML with flow-style leaves."""
    lines = [f"# {h}" if h else "#" for h in header]
    if lines:
        lines.append("")
    for fam in sorted(tables):
        lines.append(f"{fam}:")
        for key in sorted(tables[fam]):
            params = ", ".join(f"{p}: {_yaml_scalar(v)}" for p, v in tables[fam][key].items())
            lines.append(f"  {key}: {{{params}}}")
        lines.append("")
    return "\n".join(lines) + ("\n" if not lines or lines[-1] else "")


def load_yaml(path) -> Dict[str, Any]:
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping")
    return data


class CandidateFiles:
    """A fresh YAML file per candidate; applies it through the env override."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="tune-cand-"))
        self.n = 0
        self.prev = os.environ.get(ENV_CONFIG)

    def apply(self, tables: Dict[str, Dict[str, Dict[str, Any]]]) -> Path:
        self.n += 1
        p = self.dir / f"cand{self.n:05d}.yaml"
        p.write_text(yaml_text(tables))
        os.environ[ENV_CONFIG] = str(p)
        return p

    def restore(self):
        if self.prev is None:
            os.environ.pop(ENV_CONFIG, None)
        else:
            os.environ[ENV_CONFIG] = self.prev


# ---------------------------------------------------------------------------------
# measuring one candidate
# ---------------------------------------------------------------------------------
class FamilyTuner:
    """Workloads of one (family, geometry): timing and agreement checks per candidate."""

    def __init__(self, family: str, geom: Dict[str, int], L: int, device: str, batches: Sequence[int],
                 dtypes: Sequence[str], timer: bc.Timer, min_launches: int):
        import importlib

        self.family, self.geom, self.L, self.device = family, geom, L, device
        self.timer, self.min_launches = timer, min_launches
        if family == "mamba2":
            self.fn = importlib.import_module("sglang_replayssm.kernels.mamba2_replay").mamba2_replay_decode
        else:
            self.fn = importlib.import_module("sglang_replayssm.kernels.gdn_replay").gdn_replay_decode
        self.works = []
        for dt in dtypes:
            for b in batches:
                row = self._row_bytes(dt)
                n_sets = 2 if device == "cpu" else bc.slot_sets_needed(b, row)
                self.works.append((dt, b, n_sets))
        self.check_batch = 4

    def _row_bytes(self, dt: str) -> int:
        g, sb = self.geom, bc.DTYPE_BYTES[dt]
        return g["H"] * g["P"] * g["N"] * sb if self.family == "mamba2" else g["HV"] * g["V"] * g["K"] * sb

    def _work(self, b: int, dt: str, n_sets: int, seed: int):
        if self.family == "mamba2":
            return bc.Mamba2Work(self.geom, b, self.L, dt, self.device, n_sets, seed)
        return bc.GDNWork(self.geom, b, self.L, dt, self.device, n_sets, seed, with_upstream=False)

    def _launch(self, w, s: int, phase: int):
        return w.ours_fn(self.fn, s, phase)

    def reference_outputs(self) -> Dict[int, Tuple[Any, Any]]:
        """Output and state of the current config at a non-flush and the flush phase."""
        return self._probe()

    def _probe(self) -> Dict[int, Tuple[Any, Any]]:
        out = {}
        for phase in (self.L // 2, self.L - 1):
            w = self._work(self.check_batch, "fp32", 1, seed=77)
            self._launch(w, 0, phase)()
            rows = w.sets[0]["idx"].long()
            out[phase] = (w.out.float().clone(), w.state[rows].float().clone())
            del w
        return out

    def agrees(self, ref: Dict[int, Tuple[Any, Any]], tol: float = 1e-2) -> Tuple[bool, str]:
        import torch

        try:
            got = self._probe()
        except Exception as e:
            return False, f"{type(e).__name__}: {str(e)[:200]}"
        for phase, (o_ref, s_ref) in ref.items():
            o, s = got[phase]
            for name, a, r in (("out", o, o_ref), ("state", s, s_ref)):
                if not bool(torch.isfinite(a).all()):
                    return False, f"{name} not finite at phase {phase}"
                den = torch.linalg.vector_norm(r).item() or 1.0
                err = torch.linalg.vector_norm(a - r).item() / den
                if err > tol:
                    return False, f"{name} rel diff {err:.2e} at phase {phase}"
        return True, ""

    def time_cycle(self) -> Dict[str, float]:
        """Amortised µs per step for each (dtype, batch): one graph over the phases in order."""
        import torch

        res = {}
        for i, (dt, b, n_sets) in enumerate(self.works):
            w = self._work(b, dt, n_sets, seed=100 + i)
            n = self.L * max(1, math.ceil(max(n_sets, self.min_launches) / self.L))
            t = self.timer([self._launch(w, j % n_sets, j % self.L) for j in range(n)])
            res[f"{dt}_bs{b}"] = t["us"]
            del w
            if self.device == "cuda":
                torch.cuda.empty_cache()
        return res


def geomean_ratio(times: Dict[str, float], base: Dict[str, float]) -> Optional[float]:
    logs = [math.log(times[k] / base[k]) for k in base if k in times and times[k] > 0 and base[k] > 0]
    if not logs or len(logs) != len(base):
        return None
    return math.exp(statistics.fmean(logs))


def tune_one(family: str, gname: str, geom: Dict[str, int], L: int, device: str, args, sweep, timer: bc.Timer,
             cand_files: CandidateFiles, deadline: float) -> Dict[str, Any]:
    """Tune every launch family the kernel asks for at this geometry."""
    found = discover(family, geom, L, device, args.dtypes)
    tuner = FamilyTuner(family, geom, L, device, args.batches, args.dtypes, timer, 2 if device == "cpu" else 4)
    out: Dict[str, Any] = {"family": family, "geometry": gname, "shape": geom, "L": L, "tuned": {}, "fixed": []}
    for entry in found:
        fam, key, current = entry["family"], entry["key"], entry["current"]
        if not any(isinstance(v, int) and not isinstance(v, bool) for v in current.values()):
            out["fixed"].append({"family": fam, "key": key, "current": current})
            continue
        bc.log(f"-- {gname} {fam} [{key}] current {current}")
        cand_files.apply({fam: {key: current}})
        ref = tuner.reference_outputs()
        base = tuner.time_cycle()
        rec: Dict[str, Any] = {"key": key, "defaults": entry["defaults"], "current": current,
                               "current_us": base, "candidates": []}
        best, best_score = dict(current), 1.0

        def try_many(cands: List[Dict[str, Any]]):
            nonlocal best, best_score
            for c in cands:
                if c == current or any(c == r["config"] for r in rec["candidates"]):
                    continue
                if len(rec["candidates"]) >= args.max_candidates or time.time() > deadline:
                    rec["stopped"] = "max candidates" if len(rec["candidates"]) >= args.max_candidates else "budget"
                    return
                cand_files.apply({fam: {key: c}})
                ok, why = tuner.agrees(ref)
                r: Dict[str, Any] = {"config": c, "ok": ok}
                if not ok:
                    r["rejected"] = why
                else:
                    try:
                        r["us"] = tuner.time_cycle()
                        r["score"] = geomean_ratio(r["us"], base)
                    except Exception as e:
                        r["ok"] = False
                        r["rejected"] = f"{type(e).__name__}: {str(e)[:200]}"
                rec["candidates"].append(r)
                s = r.get("score")
                bc.log(f"   {compact(c)} -> " + (f"{s:.3f}x current" if s else f"rejected: {r.get('rejected')}"))
                if s is not None and s < best_score:
                    best, best_score = dict(c), s

        try_many(stage1_candidates(current, geom, sweep))
        ranked = sorted((r for r in rec["candidates"] if r.get("score")), key=lambda r: r["score"])
        bases = [dict(best)] + [r["config"] for r in ranked if r["config"] != best][:max(0, args.refine - 1)]
        choices = {} if args.fixed_choices else launch_choices(fam)
        try_many(stage2_candidates(bases, current, geom, sweep, choices))
        if best_score > 1.0 - args.min_gain:
            best, best_score = dict(current), 1.0
        rec["best"] = best
        rec["best_score_vs_current"] = best_score
        best_us = base if best == current else next(r["us"] for r in rec["candidates"] if r["config"] == best)
        rec["best_us"] = best_us
        out["tuned"][fam] = rec
        bc.log(f"   best {compact(best)} ({best_score:.3f}x current)")
    cand_files.restore()
    return out


CHOICE_NAMES = ("flush", "scores", "cast")  # string speed choices shown by compact()


def compact(cfg: Dict[str, Any]) -> str:
    """'BLOCK_M=16 nw=1 ns=1' style summary of the integer parameters (and the string speed
    choices, e.g. 'flush=dot')."""
    short = {"num_warps": "nw", "num_stages": "ns", "bc_num_warps": "bcw"}
    return " ".join(f"{short.get(k, k)}={v}" for k, v in cfg.items()
                    if (isinstance(v, int) and not isinstance(v, bool)) or (k in CHOICE_NAMES and isinstance(v, str)))


def tables_from(results: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    tables: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for res in results:
        for fam, rec in res.get("tuned", {}).items():
            tables.setdefault(fam, {})[rec["key"]] = dict(rec["best"])
    return tables


# ---------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="YAML to write (JSON sidecar beside it)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="cpu: interpreter, tiny shapes")
    ap.add_argument("--family", choices=("mamba2", "gdn", "all"), default="all")
    ap.add_argument("--geometries", nargs="*", default=None)
    ap.add_argument("--batches", type=int, nargs="*", default=None, help="objective batches (default 8 64 256)")
    ap.add_argument("--dtypes", nargs="*", choices=bc.STATE_DTYPES, default=None, help="state dtypes (default fp32)")
    ap.add_argument("--L", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="small sweep (2 values per parameter), batch 64 only")
    ap.add_argument("--refine", type=int, default=2, help="stage-2 bases (best configs of stage 1)")
    ap.add_argument("--max-candidates", type=int, default=60, help="per (family, geometry)")
    ap.add_argument("--min-gain", type=float, default=0.02, help="required gain over the current config")
    ap.add_argument("--budget-s", type=float, default=None, help="stop trying candidates after this (default 240)")
    ap.add_argument("--base", default=None, help="existing YAML to start from (tuned entries replace its keys)")
    ap.add_argument("--target-ms", type=float, default=None)
    ap.add_argument("--fixed-choices", action="store_true",
                    help="keep the string speed choices (gdn_decode flush / scores / cast) as they are")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    device = bc.pick_device(args.device)
    import torch
    import triton

    cpu = device == "cpu"
    L = args.L or (bc.CPU_BUFFER_LEN if cpu else bc.BUFFER_LEN)
    m_geoms = bc.CPU_MAMBA2_GEOMETRIES if cpu else bc.MAMBA2_GEOMETRIES
    g_geoms = bc.CPU_GDN_GEOMETRIES if cpu else bc.GDN_GEOMETRIES
    if args.geometries:
        m_geoms = {k: v for k, v in m_geoms.items() if k in args.geometries}
        g_geoms = {k: v for k, v in g_geoms.items() if k in args.geometries}
    plan = [("mamba2", k, v) for k, v in m_geoms.items() if args.family in ("mamba2", "all")]
    plan += [("gdn", k, v) for k, v in g_geoms.items() if args.family in ("gdn", "all")]
    if args.batches is None:
        args.batches = [2] if cpu else ([64] if args.quick else [8, 64, 256])
    if args.dtypes is None:
        args.dtypes = ["fp32"]
    sweep = QUICK_SWEEP_VALUES if (args.quick or cpu) else SWEEP_VALUES
    budget = args.budget_s if args.budget_s is not None else (1e9 if cpu else 240.0)
    deadline = t0 + budget
    timer = bc.Timer(device, target_ms=args.target_ms or (5.0 if args.quick else 10.0), min_reps=3)
    cand_files = CandidateFiles()
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    bc.log(f"== tune_kernels on {gpu}: {[(f, g) for f, g, _ in plan]} batches {args.batches} dtypes {args.dtypes} "
           f"L={L} budget {budget:.0f}s")
    results = []
    for fam, gname, geom in plan:
        try:
            results.append(tune_one(fam, gname, geom, L, device, args, sweep, timer, cand_files, deadline))
        except Exception as e:
            import traceback

            traceback.print_exc()
            results.append({"family": fam, "geometry": gname, "error": f"{type(e).__name__}: {e}"})
        finally:
            cand_files.restore()
    tables = tables_from(results)
    if args.base:
        base = load_yaml(args.base)
        for fam, entries in tables.items():
            base.setdefault(fam, {}).update(entries)
        tables = base
    commit = bc.git_commit()
    header = [f"Tuned launch parameters for {gpu}, written by eval/tune_kernels.py",
              f"{_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, commit {commit}, "
              f"torch {torch.__version__}, triton {triton.__version__}",
              f"objective: flush-cycle amortised time (L={L}), geomean over state {args.dtypes} x batch {args.batches}",
              "Keys as the kernels ask for them (mamba2_replay.geometry_key / gdn_launch_params)."]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml_text(tables, header))
    side = out.with_suffix(".json")
    report.write_json(side, {"gpu": gpu, "git_commit": commit, "torch": torch.__version__,
                             "triton": triton.__version__, "device": device, "L": L, "batches": args.batches,
                             "dtypes": args.dtypes, "sweep": sweep, "results": results, "tables": tables,
                             "timer_fallbacks": timer.fallbacks, "wall_s": time.time() - t0})
    rows = []
    for res in results:
        for fam, rec in res.get("tuned", {}).items():
            rows.append([res["geometry"], fam, compact(rec["current"]), compact(rec["best"]),
                         report.fmt(rec.get("best_score_vs_current"), 3), len(rec["candidates"])])
        if "error" in res:
            rows.append([res["geometry"], res["family"], "error", res["error"][:60], "—", 0])
    bc.log(f"-- wrote {out} and {side}")
    bc.log(report.text_table(["geometry", "family", "current", "best", "t/t_current", "tried"], rows))
    bc.log(f"total {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
