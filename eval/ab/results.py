"""The result: the run's record (environment, flags, plan), each later arm compared with the first, the
result names, and the files (a partial JSON after each server; JSON/Markdown/PNG via eval/ab_report.py).
"""

from __future__ import annotations

import math
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from eval.ab import decode_rate
from eval.ab.common import ROOT, SCHEMA, log
from eval.ab.parity import compare_parity, prefix_parity, slim_outputs
from eval.ab.plan import Phase, parse_batches
from eval.ab.servers import ModelSpec, arm_launch, recorded_env


def git_commit() -> str:
    c = os.environ.get("GIT_COMMIT")
    if c:
        return c
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=str(ROOT), capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def dist_version(name: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def gpu_info() -> Dict[str, Any]:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=15)
        rows = [x.strip() for x in r.stdout.strip().splitlines() if x.strip()]
        if r.returncode == 0 and rows:
            name, drv, mem = [s.strip() for s in rows[0].split(",")]
            return {"name": name, "driver": drv, "memory_mib": float(mem), "count": len(rows)}
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return {"name": "none", "driver": None, "memory_mib": None, "count": 0}


def visible_gpus() -> Optional[int]:
    """The GPUs this process can use (``CUDA_VISIBLE_DEVICES`` applies): torch's count, 0 without CUDA, None where
    the harness's interpreter has no torch (unknown)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return None


def run_record(args, argv: Optional[List[str]], phases: List[Phase], model0: ModelSpec,
               flags: Dict[bool, List[str]], prompts: List[List[int]], t_start: float) -> Dict[str, Any]:
    """The result's header: what ran where, with which flags (``phases`` is filled as the servers finish)."""
    from eval import entry_points

    run: Dict[str, Any] = {
        "schema": SCHEMA, "kind": "ab", "git_commit": git_commit(),
        "sglang_version": dist_version("sglang"), "sglang_replayssm_version": entry_points.package_version(),
        "gpu": gpu_info(), "visible_gpus": visible_gpus(), "tp_size": getattr(args, "tp", 1) or 1,
        "python": sys.version.split()[0], "host": socket.gethostname(),
        "env_inherited": recorded_env(dict(os.environ)),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "model": {"name": model0.name, "builtin": model0.builtin, "source": model0.source, "notes": model0.notes, "size": model0.size,
                  "config": model0.config},
        "flags": {"argv": sys.argv[1:] if argv is None else list(argv), "harness": vars(args).copy(),
                  "server_flags": flags[phases[0].spec], "server_flags_spec": flags.get(True),
                  "launchers": {k: shlex.join([m, *x]) for k in dict.fromkeys(p.kind for p in phases)
                                for m, x in [arm_launch(args, k)]},
                  "patched_extra": args.patched_arg or []},
        "bench": {"tool": "sglang.bench_serving", "dataset": "random-ids (token ids, --tokenize-prompt)",
                  "batches": parse_batches(args.batch), "input_len": args.input_len, "output_len": args.output_len,
                  "prompts_per_batch": f"max(batch x {args.rounds}, {args.min_prompts})",
                  "workload": getattr(args, "workload", "none"),
                  # SGLang's --stream-interval on every server (1: its default) and bench_serving processes per run
                  "stream_interval": getattr(args, "stream_interval", 0) or 1, "clients": getattr(args, "clients", 1),
                  "radix_cache": getattr(args, "radix_cache", "off")},
        "parity_setup": {"prompts": args.parity_prompts, "prompt_lens": [len(x) for x in prompts],
                         "tokens": args.parity_tokens, "topk": args.parity_topk, "near_tie_tol": args.near_tie_tol,
                         "greedy": True},
        "phases": [],
    }
    if getattr(args, "workload", "none") == "shared-prefix":
        n = args.gsp_groups * args.gsp_prompts_per_group
        run["bench"].update(
            dataset=f"generated-shared-prefix ({args.gsp_groups} groups x {args.gsp_prompts_per_group} prompts, text, "
                    "prefix cache flushed after warm-up)",
            input_len=args.gsp_system_len + args.gsp_question_len, prompts_per_batch=n,
            gsp={"groups": args.gsp_groups, "prompts_per_group": args.gsp_prompts_per_group,
                 "system_len": args.gsp_system_len, "question_len": args.gsp_question_len})
        run["parity_setup"].update(groups=args.parity_groups, shared_prefix=True)
    run["flags"]["harness"].pop("render", None)
    return run


def finish_record(run: Dict[str, Any], t_start: float) -> None:
    """The end time, and SGLang's version from the servers where the harness's interpreter has no SGLang."""
    run["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run["wall_s"] = round(time.time() - t_start, 1)
    if run.get("sglang_version") is None:  # None, or a record from before it was kept
        run["sglang_version"] = next((((p.get("facts") or {}).get("version")) for p in run["phases"]
                                      if (p.get("facts") or {}).get("version")), None)


def comparisons(phases: List[Dict[str, Any]]) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    arms = [p for p in phases if p["phase"]["role"] == "arm"]
    return [(arms[0], b) for b in arms[1:]]


def compare(a: Dict[str, Any], b: Dict[str, Any], phases: List[Dict[str, Any]], args) -> Dict[str, Any]:
    """Summary of arm ``b`` against arm ``a``."""
    from eval import ab_report

    ba, bb = ab_report.bench_rows(a), ab_report.bench_rows(b)
    rows = {}
    for bs in sorted(set(ba) & set(bb)):
        ra, rb = ba[bs], bb[bs]

        def rat(num, den):
            x, y = num, den
            return (x / y) if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y else None

        qa, qb = ab_report.rates_rows(a).get(bs, {}), ab_report.rates_rows(b).get(bs, {})
        rows[bs] = {
            "throughput_ratio": rat(rb.get("output_throughput"), ra.get("output_throughput")),
            "tpot_speedup": rat(ra.get("median_tpot_ms"), rb.get("median_tpot_ms")),
            "itl_p99_ratio": rat(rb.get("p99_itl_ms"), ra.get("p99_itl_ms")),
            # SGLang's own decode rate at a full batch (its scheduler log), arm over baseline, beside the
            # client's ratio; a run whose client rate disagrees with it is client-path bound (eval/ab/decode_rate.py)
            "decode_rate_ratio": rat(qb.get("decode_tok_s"), qa.get("decode_tok_s")),
            # the batch each decode rate was read at: the concurrency, or the server's running cap below it
            "decode_full_batch": {a["label"]: qa.get("full_batch", bs), b["label"]: qb.get("full_batch", bs)},
            "client_path_bound": {a["label"]: qa.get("client_path_bound"), b["label"]: qb.get("client_path_bound")},
            "ttft_p50_ratio": rat(rb.get("median_ttft_ms"), ra.get("median_ttft_ms")),
            "ttft_p99_ratio": rat(rb.get("p99_ttft_ms"), ra.get("p99_ttft_ms")),
        }
        ha, hb = prefix_rows(a).get(bs, {}).get("hit_rate"), prefix_rows(b).get(bs, {}).get("hit_rate")
        if ha is not None or hb is not None:  # the servers' prefix-cache hit rates (their Prefill batch lines)
            rows[bs].update(cache_hit_rate={a["label"]: ha, b["label"]: hb}, hit_rate_ratio=rat(hb, ha))
    ratios = [r["throughput_ratio"] for r in rows.values() if r["throughput_ratio"]]
    bound = [f"{lab} at batch {bs}" for bs, r in rows.items() for lab, f in r["client_path_bound"].items() if f]
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
    out: Dict[str, Any] = {
        "a": a["label"], "b": b["label"], "by_batch": rows,
        "throughput_ratio_geomean": geo,
        "throughput_ratio_min": min(ratios) if ratios else None,
        "throughput_ratio_max": max(ratios) if ratios else None,
        "max_running_requests": {a["label"]: (a.get("facts") or {}).get("max_running_requests"),
                                 b["label"]: (b.get("facts") or {}).get("max_running_requests")},
        "peak_gpu_mem_mib": {x["label"]: x.get("peak_gpu_mem_own_mib") or x.get("peak_gpu_mem_mib") for x in (a, b)},
        "accept_length": {a["label"]: (a.get("server_info_after") or {}).get("avg_spec_accept_length"),
                          b["label"]: (b.get("server_info_after") or {}).get("avg_spec_accept_length")},
        "status": {a["label"]: a.get("status"), b["label"]: b.get("status")},
        "random_weights_confirmed": bool(a.get("random_weights_confirmed") and b.get("random_weights_confirmed"))
        if args.random_weights else None,
        "replayssm_active": {a["label"]: a.get("replayssm_active"), b["label"]: b.get("replayssm_active")},
        "retracted_reqs": {a["label"]: a.get("retracted_reqs"), b["label"]: b.get("retracted_reqs")},
        "client_path_bound_runs": len(bound),
    }
    pa, pb = a.get("parity") or {}, b.get("parity") or {}
    if "outputs" in pa and "outputs" in pb:
        out["parity"] = compare_parity(pa["outputs"], pb["outputs"], args.near_tie_tol, args.parity_tokens)
    else:
        out["parity"] = {"skipped": pa.get("skipped") or pb.get("skipped") or pa.get("error") or pb.get("error")
                         or "no parity outputs (simulated acceptance or --no-parity)"}
    pp = {arm["label"]: prefix_parity(arm.get("parity") or {}, args.near_tie_tol, args.parity_tokens) for arm in (a, b)}
    if any(pp.values()):  # each server's prefix-hit requests against the same requests on a flushed cache
        out["prefix_parity"] = pp
    sa, sb = a.get("parity_solo") or {}, b.get("parity_solo") or {}
    if "outputs" in pa and "outputs" in sa:  # the engine's own batch sensitivity: the noise floor
        out["parity_noise_floor"] = dict(compare_parity(pa["outputs"], sa["outputs"], args.near_tie_tol,
                                                        args.parity_tokens), what=f"{a['label']} batched vs solo")
    if "outputs" in sa and "outputs" in sb:
        out["parity_solo"] = compare_parity(sa["outputs"], sb["outputs"], args.near_tie_tol, args.parity_tokens)
    ref = next((p for p in phases if p["phase"]["role"] == "reference"), None)
    if ref is not None and "outputs" in (ref.get("parity") or {}):
        sp = {}
        for arm in (a, b):
            src = next((p for p in phases
                        if p["phase"]["role"] == "spec-parity" and p["phase"]["kind"] == arm["phase"]["kind"]), arm)
            if "outputs" in (src.get("parity") or {}):
                sp[arm["label"]] = dict(compare_parity(ref["parity"]["outputs"], src["parity"]["outputs"],
                                                       args.near_tie_tol, args.parity_tokens),
                                        spec_server=src["label"])
        out["spec_vs_nonspec"] = sp
    par = out["parity"]
    noise = args.noise_band
    parts = []
    if geo is not None:
        parts.append(f"throughput ratio {b['label']}/{a['label']} geomean {geo:.3f} "
                     f"(min {out['throughput_ratio_min']:.3f}, max {out['throughput_ratio_max']:.3f})"
                     + (" within the noise band" if abs(geo - 1) <= noise else ""))
    for name, pr in (("parity", par), ("solo parity", out.get("parity_solo") or {}),
                     ("noise floor", out.get("parity_noise_floor") or {})):
        if "exact" in pr:
            parts.append(f"{name} exact" if pr["exact"] else
                         f"{name}: {pr['mismatches']} mismatching prompt(s), {len(pr['near_ties'])} near-tie(s), "
                         f"max |dlogprob| {pr['max_abs_dlogprob']:.3g}")
    hits = [(bs, r["cache_hit_rate"]) for bs, r in rows.items() if r.get("cache_hit_rate")]
    if hits:
        parts.append("prefix cache hit rate " + ", ".join(
            f"batch {bs}: " + " vs ".join(f"{lab} {report_num(h)}" for lab, h in hr.items()) for bs, hr in hits))
    for lab, pr in (out.get("prefix_parity") or {}).items():
        if pr:
            parts.append(f"{lab} hit vs cold " + ("exact" if pr["exact"] else
                         f"{pr['mismatches']} mismatching prompt(s), max |dlogprob| {pr['max_abs_dlogprob']:.3g}"))
    if bound:
        parts.append("client-path bound (client rate and SGLang's decode rate disagree by more than "
                     f"{decode_rate.CLIENT_PATH_TOLERANCE:.0%}): " + ", ".join(bound))
    out["verdict"] = "; ".join(parts) if parts else "no comparable numbers"
    return out


def prefix_rows(arm: Dict[str, Any]) -> Dict[int, Dict[str, Any]]:
    """batch -> the server's prefix-cache accounting over that bench run (``eval/ab/prefix_cache.py``)."""
    return {int(e["batch"]): e["prefix_cache"] for e in (arm or {}).get("bench", []) if e.get("prefix_cache")}


def report_num(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) else "n/a"


def slim_phase(rec: Dict[str, Any]) -> Dict[str, Any]:
    q = dict(rec)
    for key in ("parity", "parity_solo"):
        par = q.get(key)
        if isinstance(par, dict) and "outputs" in par:
            q[key] = dict(par, outputs=slim_outputs(par["outputs"]))
            if par.get("cold_outputs"):
                q[key]["cold_outputs"] = slim_outputs(par["cold_outputs"])
    return q


def build_result(run: Dict[str, Any], a: Dict[str, Any], b: Dict[str, Any], args) -> Dict[str, Any]:
    summary = compare(a, b, run["phases"], args)
    extra = [p for p in run["phases"] if p["phase"]["role"] != "arm"]
    res = {k: v for k, v in run.items() if k != "phases"}
    res.update(comparison=f"{a['phase']['kind']}-vs-{b['phase']['kind']}",
               arms={a["label"]: slim_phase(a), b["label"]: slim_phase(b)},
               extra_servers={p["label"]: slim_phase(p) for p in extra}, summary=summary)
    other = [p["label"] for p in run["phases"]
             if p["phase"]["role"] == "arm" and p["label"] not in (a["label"], b["label"])]
    if other:
        res["note_shared_baseline"] = (f"arm {a['label']} is the baseline shared with the other comparison(s) of this "
                                       f"run (arms {', '.join(other)}); all arms ran one after another on one GPU")
    return res


def model_tag(name: str, args) -> str:
    """The model's part of the result names: its name, with ``-tp<N>`` under tensor parallelism (so a TP run
    never writes over a single-GPU one)."""
    tp = getattr(args, "tp", 1) or 1
    return f"{name}-tp{tp}" if tp > 1 else name


def result_stem(model: str, spec: str, a_kind: str, b_kind: str, tag: Optional[str]) -> str:
    parts = ["ab", model] + ([spec] if spec != "none" else []) + [f"{a_kind}-vs-{b_kind}"] + ([tag] if tag else [])
    return "-".join(parts)


def write_results(run: Dict[str, Any], args, model0: ModelSpec, out_dir: Path, stem0: str,
                  partial: Path) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """One result per comparison (or the single arm's numbers alone), then the partial file goes; returns the
    compared pairs."""
    from eval import ab_report

    written = []
    pairs = comparisons(run["phases"])
    name = model_tag(model0.name, args)
    stems: set = set()
    for a, b in pairs:
        res = build_result(run, a, b, args)
        stem = result_stem(name, args.spec, a["phase"]["kind"], b["phase"]["kind"], args.tag)
        if stem in stems or b["phase"].get("kernel_config"):
            # a second arm of one kind (staged,staged) or a launch-config variant (staged@FILE): its label
            stem = result_stem(name, args.spec, a["label"], b["label"], args.tag)
        n = 2
        while stem in stems:  # labels are unique, but a label may equal an earlier kind-named stem
            stem = result_stem(name, args.spec, a["label"], f"{b['label']}-{n}", args.tag)
            n += 1
        stems.add(stem)
        written += ab_report.write_all(res, out_dir, stem)
        log(f"{res['comparison']}: {res['summary']['verdict']}")
    if not pairs:  # one arm: its numbers alone
        arms = [p for p in run["phases"] if p["phase"]["role"] == "arm"]
        if arms:
            res = {k: v for k, v in run.items() if k != "phases"}
            res.update(comparison=f"{arms[0]['phase']['kind']}-only", arms={arms[0]["label"]: slim_phase(arms[0])},
                       extra_servers={p["label"]: slim_phase(p) for p in run["phases"][1:]},
                       summary={"a": arms[0]["label"], "b": None, "verdict": "single arm: no comparison"})
            written += ab_report.write_all(res, out_dir, f"{stem0}-{arms[0]['phase']['kind']}-only")
    if partial.exists():
        partial.unlink()
    for w in written:
        log(f"wrote {w}")
    return pairs


def write_partial(path: Path, run: Dict[str, Any]) -> None:
    """The run so far, parity outputs included (``python -m eval.ab --finish`` writes the results from it when the
    run is stopped before it does)."""
    from eval import report

    report.write_json(path, run)
