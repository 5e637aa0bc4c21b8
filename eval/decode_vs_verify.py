"""Decode kernels vs the verify kernels run at T = 1, side by side (one GPU run of each benchmark).

Reads a decode benchmark (``eval.bench_kernels`` JSON) and a verify benchmark run with one window token and one
accepted token per step (``eval.bench_spec --window 1 --accept 1 --history L``, so the spec ring flushes every L
steps like the decode ring), matches their cases by family, geometry, state dtype and batch, and writes
``<out>.json`` / ``<out>.md``: per case both per-layer step times (amortised over the flush cycle) and the
ratio verify / decode. The verdict rule is the issue's: when every matched case is within ``--tolerance``
(default 3%), decode can be served as a T = 1 verify and the decode kernels removed; otherwise both families stay.

    python -m eval.decode_vs_verify --decode eval/results/kernels-h200.json \\
        --verify eval/results/decode-vs-verify-h200-verify-t1.json --out eval/results/decode-vs-verify-h200.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tabulate import tabulate

Key = Tuple[str, str, str, int]


def _cases(result: Dict[str, Any]) -> Dict[Key, Dict[str, Any]]:
    return {(c["family"], c["geometry"], c["state_dtype"], int(c["batch"])): c for c in result.get("cases", [])}


def _spec_t1(result: Dict[str, Any], where: str) -> Dict[str, Any]:
    spec = result.get("spec") or {}
    if spec.get("T") != 1 or spec.get("accept") != 1:
        raise ValueError(f"{where}: not a T = 1 verify run (spec T={spec.get('T')!r}, accept={spec.get('accept')!r}); "
                         "run eval.bench_spec --window 1 --accept 1 --history L")
    return spec


def compare(decode: Dict[str, Any], verify: Dict[str, Any], tolerance: float = 0.03,
            batches: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Matched rows, and the summary: worst verify/decode ratio and the verdict."""
    spec = _spec_t1(verify, "verify result")
    if decode.get("L") is not None and spec.get("length") not in (None, decode["L"]):
        raise ValueError(f"flush cycles differ: decode L={decode['L']}, verify cycle length {spec.get('length')}; "
                         "give bench_spec --history equal to the decode L")
    dcases, vcases = _cases(decode), _cases(verify)
    rows: List[Dict[str, Any]] = []
    for key in sorted(set(dcases) & set(vcases)):
        if batches and key[3] not in batches:
            continue
        td, tv = dcases[key].get("t_ours_us"), vcases[key].get("t_ours_us")
        if td is None or tv is None:
            continue
        fam, geom, dt, bs = key
        rows.append({"family": fam, "geometry": geom, "state_dtype": dt, "batch": bs,
                     "t_decode_us": td, "t_verify_t1_us": tv, "verify_over_decode": tv / td,
                     "t_stock_decode_us": dcases[key].get("t_stock_us")})
    if not rows:
        raise ValueError("no case appears in both results with a time (family, geometry, state dtype, batch)")
    worst = max(rows, key=lambda r: r["verify_over_decode"])
    within = all(abs(r["verify_over_decode"] - 1.0) <= tolerance for r in rows)
    summary = {
        "cases": len(rows),
        "tolerance": tolerance,
        "max_verify_over_decode": worst["verify_over_decode"],
        "max_at": {k: worst[k] for k in ("family", "geometry", "state_dtype", "batch")},
        "min_verify_over_decode": min(r["verify_over_decode"] for r in rows),
        "all_within_tolerance": within,
        "verdict": ("serve decode as a T = 1 verify (every case within tolerance)" if within else
                    "keep both kernel families (verify at T = 1 is outside tolerance in at least one case)"),
    }
    by_family = {}
    for fam in sorted({r["family"] for r in rows}):
        fr = [r for r in rows if r["family"] == fam]
        by_family[fam] = {"max_verify_over_decode": max(r["verify_over_decode"] for r in fr),
                          "min_verify_over_decode": min(r["verify_over_decode"] for r in fr)}
    summary["by_family"] = by_family
    return {"rows": rows, "summary": summary}


def markdown(result: Dict[str, Any]) -> str:
    s = result["summary"]
    table = [[r["family"], r["geometry"], r["state_dtype"], r["batch"], f"{r['t_decode_us']:.1f}",
              f"{r['t_verify_t1_us']:.1f}", f"{r['verify_over_decode']:.3f}"] for r in result["rows"]]
    head = ["family", "geometry", "state", "batch", "decode µs", "verify T=1 µs", "verify / decode"]
    commit = result.get("git_commit") or "?"
    runs = "one GPU run" if isinstance(commit, str) else \
        f"decode at {result.get('decode_commit') or '?'}, verify at {result.get('verify_commit') or '?'}: two runs"
    commit = commit[:10] if isinstance(commit, str) else ", ".join(c[:10] for c in commit)
    lines = [f"# Decode vs verify at T = 1 ({result.get('gpu', '?')}, commit {commit})",
             "",
             "Per layer and step, amortised over the flush cycle (decode: `eval.bench_kernels`, ring L; verify: "
             f"`eval.bench_spec --window 1 --accept 1 --history L`, plus its commit), {runs}.",
             "", tabulate(table, head, tablefmt="github"), "",
             f"Verify / decode ranges {s['min_verify_over_decode']:.3f} to {s['max_verify_over_decode']:.3f} "
             f"(worst: {s['max_at']['family']} {s['max_at']['state_dtype']} batch {s['max_at']['batch']}); "
             f"tolerance {s['tolerance']:.0%}: **{s['verdict']}**.", ""]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decode", required=True, help="eval.bench_kernels JSON")
    ap.add_argument("--verify", required=True, help="eval.bench_spec JSON run with --window 1 --accept 1")
    ap.add_argument("--out", required=True, help="output JSON (a .md is written beside it)")
    ap.add_argument("--tolerance", type=float, default=0.03, help="relative difference called 'the same' (0.03)")
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 32, 256], help="batches compared (1 32 256)")
    args = ap.parse_args(argv)
    decode = json.loads(Path(args.decode).read_text())
    verify = json.loads(Path(args.verify).read_text())
    try:
        res = compare(decode, verify, args.tolerance, args.batches)
    except ValueError as e:
        ap.error(str(e))
    commits = {decode.get("git_commit"), verify.get("git_commit")}
    res = {"git_commit": decode.get("git_commit") if len(commits) == 1 else sorted(c or "?" for c in commits),
           "decode_commit": decode.get("git_commit"), "verify_commit": verify.get("git_commit"),
           "gpu": decode.get("gpu"), "decode_source": args.decode, "verify_source": args.verify, **res}
    out = Path(args.out)
    out.write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
