"""Hardware counters of the verify and decode kernels (Nsight Compute): where the copy-bandwidth gap goes.

The benchmarks (bench_kernels, bench_spec) time each kernel and divide model bytes by the time; they cannot say
why a kernel sits at 74% of copy bandwidth where another sits at 96%.  This module profiles one launch per
*region* (a kernel at one cursor phase, SGLang's kernel beside it, and an elementwise device copy as the 100% mark)
under ``ncu`` and reduces the counters to a table: the DRAM bytes each launch really moved (against the model's), the
DRAM throughput, the warps resident and eligible, the issue rate and the warp-stall reasons.

Two subcommands:

* ``run`` -- the program ``ncu`` profiles (``--profile-from-start off``): builds each region's inputs with the
  benchmarks' own work objects, compiles every launch once, then wraps each region's launch in
  ``cudaProfilerStart``/``Stop`` with a marker kernel first (``_ncu_region_marker``), and writes a manifest (the
  regions in order, with their model bytes).  ``--device cpu`` runs every region once on tiny geometries in the
  Triton interpreter, without a profiler (what the tests do).
* ``summarize`` -- reads ncu's raw CSV page (``ncu --import rep --csv --page raw --print-units base``) and the
  manifest, splits the rows into regions at the marker kernels, and writes JSON + Markdown.

GPU host: ``eval/gpu_ncu.sh`` runs both (and packs ncu's source page per kernel for the stalled instructions).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

MARKER = "_ncu_region_marker"
KINDS = ("verify", "decode")
FAMILIES = ("mamba2", "gdn")
# the regions of a default run: the keys (eval/results/*-h200.json summary), batch 256 unless named
DEFAULT_REGIONS = ("verify:mamba2:fp32:256", "verify:gdn:fp32:256", "decode:mamba2:bf16:256",
                   "decode:gdn:fp32:256", "decode:gdn:fp32:32")
COPY_BYTES = 1 << 30  # one elementwise device copy of 1 GiB (read + write 2 GiB): the run's 100% mark

# the counters the summary reads from ncu's raw page (a missing one is reported as None, never an error)
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "dram_pct_peak": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "registers": "launch__registers_per_thread",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "occupancy_theoretical_pct": "sm__maximum_warps_per_active_cycle_pct",
    "occupancy_achieved_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "warps_active_per_scheduler": "smsp__warps_active.avg.per_cycle_active",
    "warps_eligible_per_scheduler": "smsp__warps_eligible.avg.per_cycle_active",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "instructions": "smsp__inst_executed.sum",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "l1_hit_pct": "l1tex__t_sector_hit_rate.pct",
}
# warp-stall reasons, cycles per issued instruction (WarpStateStats section)
STALL_RE = re.compile(r"^smsp__average_warps?_issue_stalled_(\w+?)_per_issue_active\.ratio$")
# what the gpu script passes to ncu: the sections that hold METRICS and the stall reasons
SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables", "LaunchStats", "Occupancy",
            "SchedulerStats", "WarpStateStats", "SourceCounters")
# METRICS the sections may not collect, asked for by name (gpu_ncu.sh passes those `ncu --query-metrics` knows)
EXTRA_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "smsp__warps_eligible.avg.per_cycle_active",
                 "smsp__warps_active.avg.per_cycle_active", "smsp__inst_executed.sum", "lts__t_sector_hit_rate.pct",
                 "l1tex__t_sector_hit_rate.pct")


# ---------------------------------------------------------------------------------
# regions
# ---------------------------------------------------------------------------------
def parse_region(spec: str) -> Dict[str, Any]:
    """``kind:family:dtype:batch`` (e.g. ``verify:mamba2:fp32:256``) -> dict; ValueError names what is wrong."""
    parts = spec.split(":")
    if len(parts) != 4:
        raise ValueError(f"region {spec!r}: expected kind:family:dtype:batch, e.g. verify:mamba2:fp32:256")
    kind, family, dtype, batch = parts
    if kind not in KINDS:
        raise ValueError(f"region {spec!r}: kind must be one of {KINDS}, got {kind!r}")
    if family not in FAMILIES:
        raise ValueError(f"region {spec!r}: family must be one of {FAMILIES}, got {family!r}")
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"region {spec!r}: state dtype must be fp32 or bf16, got {dtype!r}")
    try:
        b = int(batch)
    except ValueError:
        b = 0
    if b < 1:
        raise ValueError(f"region {spec!r}: batch must be a positive integer, got {batch!r}")
    return {"kind": kind, "family": family, "dtype": dtype, "batch": b}


def _geometry(family: str, tiny: bool) -> Tuple[str, Dict[str, int]]:
    from eval import bench_common as bc

    table = (bc.CPU_MAMBA2_GEOMETRIES if family == "mamba2" else bc.CPU_GDN_GEOMETRIES) if tiny else (
        {"nemotron-h-8b": bc.MAMBA2_GEOMETRIES["nemotron-h-8b"]} if family == "mamba2"
        else {"qwen3-next-80b": bc.GDN_GEOMETRIES["qwen3-next-80b"]})
    name = next(iter(table))
    return name, dict(table[name])


NOTHING = lambda: None  # noqa: E731  (a launch with nothing to set up)


def _verify_launches(r: Dict[str, Any], device: str, tiny: bool, seed: int) -> Tuple[Any, List[Tuple]]:
    """(the work object, [(name, info, prepare, launch)]) for ours at the cycle's last non-flush and its flush phase,
    then SGLang's verify. ``prepare`` sets the rows' cursors (its fill kernels stay outside the profiled range)."""
    from eval import bench_common as bc
    from eval import bench_spec as bs

    gname, geom = _geometry(r["family"], tiny)
    T, accept = bs.WINDOW, bs.ACCEPT
    R = bs.HISTORY + T
    spec = bs.spec_cycle(T, R, accept)
    kern = bs.Kernels(device)
    sb = bc.DTYPE_BYTES[r["dtype"]]
    w = bs.make_work(r["family"], geom, r["batch"], T, R, accept, r["dtype"], device, 1, seed,
                     with_stock=kern.stock_ok(r["family"]))
    base = {"geometry": gname, "T": T, "R": R, "accept": accept}
    out = []
    if kern.ours_ok(r["family"]):
        nbytes = bs.ours_bytes_fn(r["family"], geom, r["batch"], T, sb)
        fn = w.ours_fn(kern, 0)
        for name, c in (("ours-nonflush", spec["cycle"][-2] if len(spec["cycle"]) > 1 else spec["transient"][0]),
                        ("ours-flush", spec["cycle"][-1])):
            out.append((name, dict(base, cursors=c, model_bytes=nbytes(c["wp"], c["flush"])["total"]),
                        lambda c=c: w.set_cursors(c["wp"], c["origin"], c["flush"]), fn))
    if kern.stock_ok(r["family"]):
        nb = bs.stock_bytes_for(r["family"], geom, r["batch"], T, sb)
        ssu = nb["total"] - bs.scatter_bytes(r["batch"], w.state_row_bytes)["total"]
        out.append(("stock", dict(base, model_bytes=ssu, note="SGLang's verify kernel with its T snapshot writes "
                                  "(the accepted-snapshot scatter is not in this launch)"),
                    NOTHING, w.stock_fn(kern, 0)))
    return w, out


def _decode_launches(r: Dict[str, Any], device: str, tiny: bool, seed: int) -> Tuple[Any, List[Tuple]]:
    """(the work object, [(name, info, prepare, launch)]) for ours at phase L-2 (non-flush), L-1 (flush) and mixed
    (batch >= L), then SGLang's (each phase has its own cursor tensor: nothing to prepare)."""
    from eval import bench_common as bc
    from eval import bench_kernels as bk

    gname, geom = _geometry(r["family"], tiny)
    L = bc.CPU_BUFFER_LEN if tiny else bc.BUFFER_LEN
    b, sb = r["batch"], bc.DTYPE_BYTES[r["dtype"]]
    stock = bc.load_stock(device)
    ours = bk.load_ours()
    if r["family"] == "mamba2":
        w = bc.Mamba2Work(geom, b, L, r["dtype"], device, 1, seed)
        nbytes = lambda ph: bk.mamba2_replay_bytes(b, w.H, w.P, w.N, w.G, L, ph, sb)  # noqa: E731
        stock_fn, stock_bytes = stock.mamba2, bk.mamba2_stock_bytes(b, w.H, w.P, w.N, w.G, sb)
    else:
        w = bc.GDNWork(geom, b, L, r["dtype"], device, 1, seed, with_upstream=False)
        nbytes = lambda ph: bk.gdn_replay_bytes(b, w.HV, w.Hk, w.K, w.V, L, ph, sb)  # noqa: E731
        stock_fn, stock_bytes = stock.gdn, bk.gdn_stock_bytes(b, w.HV, w.Hk, w.K, w.V, sb)
    base = {"geometry": gname, "L": L}
    out = []
    if ours.get(r["family"]) is not None:
        phases = [("ours-nonflush", L - 2), ("ours-flush", L - 1)]
        if b >= L:
            phases.append(("ours-mixed", L))
        for name, ph in phases:
            mb = bk.mixed_bytes(nbytes, L, b) if ph == L else nbytes(ph)["total"]
            out.append((name, dict(base, phase=ph, model_bytes=int(mb)), NOTHING, w.ours_fn(ours[r["family"]], 0, ph)))
    if stock_fn is not None:
        out.append(("stock", dict(base, model_bytes=stock_bytes["total"]), NOTHING, w.stock_fn(stock_fn, 0)))
    return w, out


def _marker_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _ncu_region_marker(ptr, idx):
        tl.store(ptr, idx)

    return _ncu_region_marker


def run(regions: Sequence[str], manifest_path: Path, device: str, seed: int = 0, copy: bool = True) -> Dict:
    """Profile each region's launches once (the caller is ``ncu --profile-from-start off``). The manifest is
    rewritten after every region, so a run cut short (ncu's time limit) still names what it profiled; a region
    group that fails to build (e.g. out of memory) is recorded as skipped and the run goes on."""
    import torch

    from eval import bench_common as bc

    specs = [parse_region(s) for s in regions]  # every spec checked before any work
    tiny = device == "cpu"
    marker = _marker_kernel()
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    manifest: Dict[str, Any] = {"git_commit": bc.git_commit(), "device": device,
                                "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)",
                                "marker": MARKER, "regions": [], "skipped": []}

    def save() -> None:
        manifest_path.parent.mkdir(parents=True, exist_ok=True)
        manifest_path.write_text(json.dumps(manifest, indent=1))

    def profiled(label: str, info: Dict[str, Any], prepare: Callable, launch: Callable) -> None:
        prepare()
        launch()  # compile (and a first pass over the data) outside the profiled range
        prepare()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        marker[(1,)](flag, len(manifest["regions"]))  # the region's entry goes with its marker, whatever follows
        manifest["regions"].append(dict(info, label=label))
        save()
        try:
            launch()
            if device == "cuda":
                torch.cuda.synchronize()
        finally:
            if device == "cuda":
                torch.cuda.profiler.stop()
        bc.log(f"   profiled {label}")

    if copy:
        n = (1 << 20) if tiny else COPY_BYTES
        src = torch.empty(n // 4, dtype=torch.float32, device=device).normal_()
        dst = torch.empty_like(src)
        # an elementwise kernel (dst = src * 1): a same-dtype copy_ is a cudaMemcpy, which ncu does not profile
        profiled("copy", {"kind": "copy", "model_bytes": 2 * n}, NOTHING, lambda: torch.mul(src, 1.0, out=dst))
        del src, dst
    for r in specs:
        build = _verify_launches if r["kind"] == "verify" else _decode_launches
        tag = f"{r['kind']}/{r['family']}/{r['dtype']}/b{r['batch']}"
        bc.log(f"-- {tag}")
        w = launches = None
        try:
            w, launches = build(r, device, tiny, seed)
            if not launches:
                manifest["skipped"].append({"region": tag, "why": "neither our kernel nor SGLang's is importable"})
            for name, info, prepare, launch in launches:
                profiled(f"{tag}/{name}", dict(r, **info, impl=name), prepare, launch)
        except Exception as e:  # noqa: BLE001 -- one failed group must not lose the others
            manifest["skipped"].append({"region": tag, "why": f"{type(e).__name__}: {e}"[:500]})
            bc.log(f"!! {tag}: {type(e).__name__}: {e}")
        del w, launches
        if device == "cuda":
            torch.cuda.empty_cache()
    save()
    return manifest


# ---------------------------------------------------------------------------------
# summary of ncu's raw page
# ---------------------------------------------------------------------------------
def _number(v: Any) -> Optional[float]:
    """A CSV cell as a float (thousands separators dropped); None for empty / n/a / text."""
    if v is None:
        return None
    s = str(v).strip().replace(",", "")
    if not s or s.lower() in ("n/a", "nan", "-"):
        return None
    try:
        x = float(s)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def read_raw_csv(text: str) -> List[Dict[str, str]]:
    """ncu's ``--csv --page raw`` output -> one dict per profiled kernel, in launch order.  ncu's own log lines
    (``==PROF==`` ...) before the header are skipped; the units row under the header is dropped."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    rows = list(csv.reader(lines))
    if not rows:
        return []
    header = rows[0]
    if "Kernel Name" not in header:
        raise ValueError("not an ncu raw CSV page: no 'Kernel Name' column in the header")
    body = rows[1:]
    id_col = header.index("ID") if "ID" in header else None
    if body and id_col is not None and _number(body[0][id_col]) is None:
        body = body[1:]  # the units row
    return [dict(zip(header, r)) for r in body if len(r) == len(header)]


def split_regions(rows: List[Dict[str, str]], n_regions: int) -> Tuple[List[List[Dict[str, str]]], List[str]]:
    """The kernels of each region (the rows after its marker, up to the next); problems as text."""
    problems: List[str] = []
    groups: List[List[Dict[str, str]]] = []
    before = 0
    for r in rows:
        if MARKER in r.get("Kernel Name", ""):
            groups.append([])
        elif groups:
            groups[-1].append(r)
        else:
            before += 1
    if before:
        problems.append(f"{before} kernel(s) profiled before the first marker (ignored)")
    if len(groups) != n_regions:
        problems.append(f"{len(groups)} markers in the profile, {n_regions} regions in the manifest: "
                        "regions past the shorter list are unlabelled or missing")
    for i, g in enumerate(groups):
        if not g:
            problems.append(f"region {i}: no kernel after its marker")
    return groups, problems


def kernel_counters(row: Dict[str, str]) -> Dict[str, Any]:
    """METRICS and the stall reasons of one kernel row (None for a counter the profile lacks)."""
    k: Dict[str, Any] = {"kernel": row.get("Kernel Name", "")}
    for key, metric in METRICS.items():
        k[key] = _number(row.get(metric))
    stalls = {}
    for col, val in row.items():
        m = STALL_RE.match(col)
        if m and not m.group(1).endswith("not_issued"):
            x = _number(val)
            if x is not None:
                stalls[m.group(1)] = x
    k["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1]))
    if k["duration_ns"] and k["dram_read_bytes"] is not None and k["dram_write_bytes"] is not None:
        k["dram_GBps"] = (k["dram_read_bytes"] + k["dram_write_bytes"]) / k["duration_ns"]
    else:
        k["dram_GBps"] = None
    return k


def summarize(csv_text: str, manifest: Dict[str, Any]) -> Dict[str, Any]:
    """Per region: its kernels' counters, the region's DRAM bytes against its model bytes, and GB/s as a fraction of
    the copy region's (the run's 100% mark)."""
    rows = read_raw_csv(csv_text)
    regions = manifest.get("regions", [])
    groups, problems = split_regions(rows, len(regions))
    out_regions = []
    for i, g in enumerate(groups):
        info = dict(regions[i]) if i < len(regions) else {"label": f"unlabelled-{i}"}
        kernels = [kernel_counters(r) for r in g]
        dur = [k["duration_ns"] for k in kernels]
        rd = [k["dram_read_bytes"] for k in kernels]
        wr = [k["dram_write_bytes"] for k in kernels]
        tot = {"duration_us": sum(dur) / 1e3 if kernels and None not in dur else None,
               "dram_bytes": sum(rd) + sum(wr) if kernels and None not in rd + wr else None}
        tot["dram_GBps"] = tot["dram_bytes"] / (tot["duration_us"] * 1e3) if tot["dram_bytes"] and tot[
            "duration_us"] else None
        mb = info.get("model_bytes")
        tot["dram_over_model"] = tot["dram_bytes"] / mb if tot["dram_bytes"] and mb else None
        tot["model_GBps"] = mb / (tot["duration_us"] * 1e3) if mb and tot["duration_us"] else None
        out_regions.append(dict(info, kernels=kernels, **tot))
    copy = next((r for r in out_regions if r.get("kind") == "copy"), None)
    ref = copy.get("dram_GBps") if copy else None
    for r in out_regions:
        r["dram_fraction_of_copy"] = r["dram_GBps"] / ref if ref and r.get("dram_GBps") else None
        r["model_fraction_of_copy"] = r["model_GBps"] / ref if ref and r.get("model_GBps") else None
    return {"git_commit": manifest.get("git_commit"), "gpu": manifest.get("gpu"), "copy_dram_GBps": ref,
            "problems": problems, "skipped": manifest.get("skipped", []), "regions": out_regions}


def _f(x: Any, nd: int = 1) -> str:
    return "–" if x is None else (f"{x:,.{nd}f}" if isinstance(x, float) else str(x))


def markdown(summary: Dict[str, Any]) -> str:
    """One table row per kernel (a region's pre-kernels on their own rows), then the problems."""
    from tabulate import tabulate

    head = ["region", "kernel", "µs", "DRAM GB", "model GB", "DRAM/model", "GB/s", "of copy", "model of copy", "regs",
            "occ. th/ach %", "eligible/active", "issue %", "top stalls (cycles/instr)"]
    rows = []
    for r in summary["regions"]:
        for j, k in enumerate(r["kernels"]):
            first = j == 0
            stalls = ", ".join(f"{n} {v:.1f}" for n, v in list(k["stalls"].items())[:3])
            dram = (k["dram_read_bytes"] or 0) + (k["dram_write_bytes"] or 0) if k["dram_GBps"] else None
            rows.append([
                r.get("label", "?") if first else "", k["kernel"][:40], _f(k["duration_ns"] and k["duration_ns"] / 1e3),
                _f(dram and dram / 1e9, 3), _f(r.get("model_bytes") and r["model_bytes"] / 1e9, 3) if first else "",
                _f(r.get("dram_over_model"), 2) if first else "", _f(k["dram_GBps"], 0),
                _f(r.get("dram_fraction_of_copy"), 3) if first else "",
                _f(r.get("model_fraction_of_copy"), 3) if first else "", _f(k["registers"], 0),
                f"{_f(k['occupancy_theoretical_pct'], 0)}/{_f(k['occupancy_achieved_pct'], 0)}",
                f"{_f(k['warps_eligible_per_scheduler'], 2)}/{_f(k['warps_active_per_scheduler'], 2)}",
                _f(k["issue_active_pct"], 0), stalls or "–"])
    lines = [f"# Nsight Compute counters ({summary.get('gpu')}, commit {summary.get('git_commit')})", "",
             "One profiled launch per region (ncu kernel replay, clocks as found). `DRAM GB`: bytes the launch "
             "read and wrote in DRAM; `model GB`: the benchmark's unique-byte model of the region; `of copy`: the "
             "region's DRAM GB/s over the elementwise copy's in the same run "
             f"({_f(summary.get('copy_dram_GBps'), 0)} GB/s); `model of copy`: model bytes over the region's time, "
             "over the same (the benchmarks' bandwidth fraction, here from one launch).", "",
             tabulate(rows, head, tablefmt="github"), ""]
    if summary["problems"] or summary["skipped"]:
        lines += ["## Problems", ""] + [f"- {p}" for p in summary["problems"]] + [
            f"- skipped {s['region']}: {s['why']}" for s in summary["skipped"]] + [""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.ncu_profile", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="profile each region once (run under ncu --profile-from-start off)")
    r.add_argument("--regions", nargs="*", default=list(DEFAULT_REGIONS),
                   help="kind:family:dtype:batch, kind verify|decode (default: %(default)s)")
    r.add_argument("--manifest", required=True, type=Path, help="where the region list (JSON) is written")
    r.add_argument("--device", choices=("cuda", "cpu"), default=None, help="cpu: tiny geometries, interpreter")
    r.add_argument("--no-copy", action="store_true", help="leave out the copy reference region")
    r.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("summarize", help="ncu raw CSV + manifest -> JSON and Markdown")
    s.add_argument("--csv", required=True, type=Path, help="ncu --import REP --csv --page raw --print-units base")
    s.add_argument("--manifest", required=True, type=Path)
    s.add_argument("--out", required=True, type=Path, help="JSON path (the .md beside it)")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        from eval import bench_common as bc

        try:
            specs = [parse_region(x) for x in args.regions]
        except ValueError as e:
            ap.error(str(e))
        device = bc.pick_device(args.device)
        run([f"{x['kind']}:{x['family']}:{x['dtype']}:{x['batch']}" for x in specs], args.manifest, device,
            args.seed, copy=not args.no_copy)
        return 0
    for p in (args.csv, args.manifest):
        if not p.is_file():
            ap.error(f"{p}: no such file")
    summary = summarize(args.csv.read_text(errors="replace"), json.loads(args.manifest.read_text()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    md = markdown(summary)
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 1 if summary["problems"] or summary["skipped"] else 0


if __name__ == "__main__":
    sys.exit(main())
