"""Issue-level summaries of end-to-end A/B runs (``python -m eval.ab`` result JSONs).

    python -m eval.e2e_summary eval/results/e2e-h200 --out-dir eval/results

reads every ``ab-*.json`` (or ``ab-*.json.gz``) under the given directories and writes

* ``parity-decode-h200.{json,md,png}``: greedy parity of the replay server (arm kind ``staged``)
  against stock SGLang, non-speculative runs, next to the same statistics for the comparisons
  that measure SGLang's own sensitivity (the *references*): stock vs stock, stock vs SGLang's
  own replay kernel (``upstream``), stock batched vs stock one prompt at a time, stock
  speculative vs non-speculative;
* ``e2e-decode-h200.{json,md,png}``: decode speed of the real geometries (tiny models are
  launch-bound and are not used for speed);
* ``e2e-spec-h200.{json,md}``: speculative (NEXTN) runs: accept length, parity of the replay
  server against stock under the same simulated acceptance, and speculative vs non-speculative;
* ``e2e-tree-h200.{json,md}``: EAGLE runs (``--spec eagle``: separate draft model, chains and trees), issue 20's
  keys; those runs are not in ``e2e-spec-h200``;
* ``e2e-prefix-h200.{json,md,png}``: prefix caching (``--workload shared-prefix`` runs): cache hit rate,
  TTFT, SGLang's decode rate and hit-vs-cold greedy parity of our launcher against stock (and upstream).

Every number is read from the result files; each entry names the file it came from.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import statistics
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from eval import ab_report, models, report
from eval.ab import decode_rate
from eval.ab.presets import STANDARD_DECODE
from eval.ab.servers import conv_verify_state

# the model each family's decode targets are measured on (the headline geometries)
TARGET_MODELS = {"mamba2": "nemotron-h-8b", "gdn": "qwen3-next-80b-a3b-e64"}
DECODE_STEP_KEYS = ("nemotron_h_decode_step_speedup_bs256", "nemotron_h_decode_step_speedup_bs1",
                    "gdn_decode_step_speedup_bs256", "upstream_decode_step_speedup_bs256")
# not targets either: SGLang's own decode throughput at a full batch (its scheduler log, see steady_decode_rates)
STEADY_KEYS = ("nemotron_h_steady_decode_speedup_bs256", "nemotron_h_steady_decode_speedup_bs1",
               "gdn_steady_decode_speedup_bs256", "gdn_steady_vs_upstream_bs256")
DECODE_TARGETS = {"nemotron_h_speedup_bs256": 1.4, "nemotron_h_speedup_bs1": 0.98,
                  "gdn_speedup_bs256": 1.25, "gdn_vs_upstream_bs256": 1.05}
SPEED_KEYS = ("spec_vs_stock_spec", "spec_vs_stock_nonspec", "capacity_ratio")  # spec_speed row keys the targets read
SHORT = {"spec_vs_stock_spec": "vs spec", "spec_vs_stock_nonspec": "vs non-spec", "capacity_ratio": "capacity"}
SPEC_TARGETS = {"spec_vs_stock_spec_bs256": 1.9, "spec_vs_stock_nonspec_bs256": 1.5, "capacity_ratio": 3.0,
                "greedy_mismatches": 0}
# the workload the decode targets have been measured on since the first run (eval.ab's defaults: input 128,
# output 256, two waves of `batch` requests); a run with another workload is listed apart, never a target
STANDARD_WORKLOAD = {"input_len": 128, "output_len": 256, "rounds": 2, "stream_interval": 1}
WORKLOAD_KEYS = ("nemotron_h_other_workload_speedup_bs256", "gdn_other_workload_speedup_bs256")
# issue 24's standard decode workload (eval.ab --workload standard-decode: 1024 in / 1024 out, two waves, batch 256
# and 1) and its targets: bench_serving's ratio, SGLang's own decode rate at a full batch (its scheduler log), and
# client_path_bound_runs, the runs the summary keys read whose client rate disagrees with that decode rate by more
# than 10% (eval/ab/decode_rate.py), goal 0
IO1024_WORKLOAD = dict(STANDARD_DECODE)
IO1024_TARGETS = {"nemotron_h_speedup_bs256_io1024": 1.5, "nemotron_h_decode_rate_speedup_bs256_io1024": 1.6,
                  "nemotron_h_speedup_bs1_io1024": 0.99, "gdn_vs_upstream_bs256_io1024": 1.05}
PARITY_MAX_DLOGPROB = 0.05  # the decode issue's bound at fp32 state
STOCK_KINDS = ("stock", "upstream")


def load_results(dirs: Iterable[Path]) -> List[Tuple[Path, Dict[str, Any]]]:
    out = []
    for d in dirs:
        d = Path(d)
        files = [d] if d.is_file() else sorted([*d.rglob("ab-*.json"), *d.rglob("ab-*.json.gz")])
        for f in files:
            res = report.read_json(f)
            if isinstance(res, dict) and res.get("kind") == "ab" and "summary" in res:
                out.append((f, res))
    return out


def provenance(results, files: Iterable[str]) -> Dict[str, Any]:
    """Which code, SGLang and GPU produced the numbers of a summary: ``git_commit`` is the commit
    of the runs (comma-joined when they differ), ``sources`` names each run file with its own."""
    used = set(files)
    src = [{"file": str(f), "git_commit": res.get("git_commit"), "sglang_version": res.get("sglang_version"),
            "gpu": (res.get("gpu") or {}).get("name")} for f, res in results if str(f) in used]

    def joined(key: str) -> Optional[str]:
        vals = sorted({str(x[key]) for x in src if x[key] is not None})
        return ", ".join(vals) if vals else None

    return {"git_commit": joined("git_commit"), "sglang_version": joined("sglang_version"), "gpu": joined("gpu"),
            "sources": src}


def _kinds(res: Dict[str, Any]) -> Tuple[str, str]:
    s, arms = res["summary"], res.get("arms", {})
    return ((arms.get(s.get("a")) or {}).get("phase", {}).get("kind", "?"),
            (arms.get(s.get("b")) or {}).get("phase", {}).get("kind", "?"))


def _harness(res: Dict[str, Any]) -> Dict[str, Any]:
    return (res.get("flags") or {}).get("harness") or {}


def _geometry(res: Dict[str, Any]) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """(name, size, family) of a result's model: from the result, else from the built-in registry."""
    m = res.get("model") or {}
    name, size, family = m.get("name"), m.get("size"), m.get("family")
    if (size is None or family is None) and m.get("builtin") and name in models.names():
        g = models.get(name)
        size, family = size or g.size, family or g.family
    return name, size, family


def _ssm_state(h: Dict[str, Any]) -> str:
    """The SSM state dtype the run's servers were given (``--mamba-ssm-dtype`` in --server-arg), else "default"
    (the model config's; fp32 for the built-in geometries)."""
    words = " ".join(h.get("server_arg") or []).split()
    for i, w in enumerate(words):
        if w.startswith("--mamba-ssm-dtype"):
            v = w.split("=", 1)[1] if "=" in w else (words[i + 1] if i + 1 < len(words) else "")
            return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(v, v or "default")
    return "default"


def _fp32_state(e: Dict[str, Any]) -> bool:
    """A run (parity entry or speed row) at an fp32 SSM state: the issue's targets are for one."""
    return e.get("ssm_state", "default") in ("default", "fp32")


def _run_workload(res: Dict[str, Any]) -> Dict[str, Any]:
    """A run's bench workload: input / output tokens and waves (its harness flags) and the stream interval every
    server streamed at (eval.ab records SGLang's default as 1; results from before it recorded one streamed at 1)."""
    h = _harness(res)
    w = {k: h.get(k, v) for k, v in STANDARD_WORKLOAD.items() if k != "stream_interval"}
    w["stream_interval"] = int((res.get("bench") or {}).get("stream_interval") or h.get("stream_interval") or 1)
    return w


def _setup(res: Dict[str, Any]) -> Dict[str, Any]:
    h = _harness(res)
    name, size, family = _geometry(res)
    return {"model": name, "size": size, "family": family, "ssm_state": _ssm_state(h), "cuda_graph": h.get("cuda_graph"),
            "workload": _run_workload(res),
            "radix_cache": h.get("radix_cache", "off"), "spec": h.get("spec"), "sim_acc_len": h.get("sim_acc_len"),
            "spec_topk": h.get("spec_topk") or 1, "spec_draft_tokens": h.get("spec_draft_tokens"),
            "pinned_token": h.get("pinned_token"),
            "git_commit": res.get("git_commit"), "sglang_version": res.get("sglang_version"),
            "gpu": (res.get("gpu") or {}).get("name")}


def _parity_entry(par: Dict[str, Any], src: Path, what: str, setup: Dict[str, Any]) -> Dict[str, Any]:
    return {"what": what, "file": str(src), **setup,
            "prompts": par.get("prompts"), "tokens_per_prompt": par.get("tokens_per_prompt"),
            "tokens_compared": par.get("tokens_compared"), "token_mismatches": par.get("mismatches"),
            "near_ties": len(par.get("near_ties") or []), "identical_prompts": par.get("identical_prompts"),
            "first_divergence": par.get("first_divergence"), "max_abs_logprob_diff": par.get("max_abs_dlogprob"),
            "max_abs_logprob_diff_topk": par.get("max_abs_dlogprob_topk"), "dlogprob_hist": par.get("dlogprob_hist"),
            "divergence_gaps": [[d.get("gap_a"), d.get("gap_b")] for d in par.get("mismatch_details") or []]}


def parity_entries(results) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """(replay-vs-stock entries, reference entries) of the non-speculative runs (plus the
    stock spec-vs-nonspec references of the speculative runs)."""
    ours, refs = [], []
    for f, res in results:
        s, setup = res["summary"], _setup(res)
        ka, kb = _kinds(res)
        par = s.get("parity") or {}
        spec = setup["spec"] not in (None, "none")
        if "mismatches" in par and ka == "stock" and not spec:
            if kb == "staged":
                e = _parity_entry(par, f, "staged vs stock", setup)
                # retraction + re-prefill exercised (SGLang's test hook or memory pressure): per server
                e["retracted_reqs"] = {k: a.get("retracted_reqs") for k, a in (res.get("arms") or {}).items()}
                ours.append(e)
            elif kb in ("stock", "upstream", "patched"):
                refs.append(_parity_entry(par, f, f"{kb} vs stock", setup))
        nf = s.get("parity_noise_floor") or {}
        if "mismatches" in nf and ka == "stock":
            refs.append(_parity_entry(nf, f, "stock batched vs stock one prompt at a time", setup))
        for label, p in (s.get("spec_vs_nonspec") or {}).items():
            if "mismatches" in p and label == s.get("a") and ka == "stock":
                refs.append(_parity_entry(p, f, "stock speculative vs stock non-speculative", setup))
    return ours, refs


def _agg(entries: List[Dict[str, Any]]) -> Dict[str, Any]:
    return {"runs": len(entries), "tokens_compared": sum(e["tokens_compared"] or 0 for e in entries),
            "token_mismatches": sum(e["token_mismatches"] or 0 for e in entries),
            "near_ties": sum(e["near_ties"] for e in entries),
            "max_abs_logprob_diff": max((e["max_abs_logprob_diff"] or 0.0 for e in entries), default=None)}


def parity_summary(results) -> Dict[str, Any]:
    """Totals over every staged-vs-stock run; the target (no mismatch, max |Δlogprob| within bound) is judged on
    the fp32-state runs (the issue's bound is for an fp32 state), the others are summarised by state dtype."""
    ours, refs = parity_entries(results)
    fp32 = [e for e in ours if _fp32_state(e)]
    summary = _agg(ours)
    summary["by_family"] = {fam: _agg([e for e in ours if e["family"] == fam])
                            for fam in sorted({e["family"] for e in ours})}
    summary["by_state"] = {st: _agg([e for e in ours if e["ssm_state"] == st])
                           for st in sorted({e["ssm_state"] for e in ours})}
    summary["references"] = {w: _agg([e for e in refs if e["what"] == w]) for w in sorted({e["what"] for e in refs})}
    summary["target_max_abs_logprob_diff"] = PARITY_MAX_DLOGPROB
    summary["fp32_state"] = _agg(fp32)
    summary["target_met"] = bool(fp32) and summary["fp32_state"]["token_mismatches"] == 0 and \
        (summary["fp32_state"]["max_abs_logprob_diff"] or 0) <= PARITY_MAX_DLOGPROB
    return {"schema": "replayssm-e2e-parity/1", **provenance(results, (e["file"] for e in ours + refs)),
            "summary": summary, "runs": ours, "references": refs}


def _bs_row(res: Dict[str, Any], label: str) -> Dict[int, Dict[str, Any]]:
    return ab_report.bench_rows((res.get("arms") or {}).get(label))


def _ts(started: Any) -> float:
    """A run's ``started`` (UTC, as eval.ab writes it) as a timestamp; 0 when unreadable (sorts first)."""
    try:
        return _dt.datetime.strptime(str(started), "%Y-%m-%dT%H:%M:%SZ").timestamp()
    except ValueError:
        return 0.0


def _decode_steps(res: Dict[str, Any], label: str) -> Dict[int, float]:
    """batch -> the arm's profiled decode-step wall time (µs), where the run profiled it."""
    out = {}
    for p in ((res.get("arms") or {}).get(label) or {}).get("profiles") or []:
        d = p.get("decode_steps") or {}
        if d.get("span_us_per_step"):
            out[int(p["batch"])] = d["span_us_per_step"]
    return out


def steady_decode_rates(log: Path) -> Dict[int, float]:
    """SGLang's own decode throughput at a full batch, per batch size: the median "gen throughput" of the
    scheduler's ``Decode batch`` log lines (one per 40 decode steps) that report exactly that many running
    requests. Unlike bench_serving's output tokens/s it leaves out the prefill steps, the ramp up and down and
    the client's gaps between waves of requests, which cost both servers the same seconds. As eval.ab reads a run
    (eval/ab/decode_rate.py): lines whose window held a prefill, and the log's first line, are left out, unless no
    other line reports that batch."""
    text = decode_rate.read_log(log)
    clean: Dict[int, List[float]] = {}
    every: Dict[int, List[float]] = {}
    for n, x in decode_rate.decode_only_lines(text):
        clean.setdefault(n, []).append(x)
    for n, x in decode_rate.decode_lines(text):
        every.setdefault(n, []).append(x)
    return {bs: statistics.median(clean.get(bs) or v) for bs, v in every.items()}


def arm_decode_rate(recorded: Optional[Dict[str, Any]], bench: Optional[Dict[str, Any]], steady: Optional[float],
                    bs: int) -> Tuple[Optional[float], Optional[bool]]:
    """(SGLang's decode rate at a full batch, client-path bound?) of one arm at one batch: the rate as eval.ab
    recorded it (its server log's window of the run, lines from 90% of the batch up), else from the whole server
    log beside the result (lines at exactly the batch); the flag judged here, by eval/ab/decode_rate.py's rule of
    now, against the client's rate from the bench result (runs recorded under an older rule are re-judged), the
    recorded flag where the bench result is missing."""
    if recorded and recorded.get("decode_tok_s") is not None:
        now = decode_rate.rejudge(dict(recorded, full_batch=recorded.get("full_batch", bs)), bench)
        return now["decode_tok_s"], None if now.get("client_path_not_judged") else now.get("client_path_bound")
    if steady is None:
        return None, None
    return steady, decode_rate.check(decode_rate.client_full_batch_rate(bench, bs), steady)[1]


def _run_log_dir(result_file: Path) -> Optional[Path]:
    """The run's log folder as eval.ab names it, ``logs-<result name up to the arms>`` (``logs-ab-<model>[-<spec>]
    [-<tag>]``): the longest such folder name that the result file's name starts with."""
    name = result_file.name
    dirs = [d for d in result_file.parent.glob("logs-*") if d.is_dir() and name.startswith(d.name[len("logs-"):] + "-")]
    return max(dirs, key=lambda d: len(d.name)) if dirs else None


def _server_log(result_file: Path, label: str) -> Optional[Path]:
    """The arm's server log beside the result, or in the run's own ``logs-ab-*`` folder (as eval.ab writes it)."""
    for d in [result_file.parent, _run_log_dir(result_file)]:
        for name in (f"server-{label}.log.gz", f"server-{label}.log"):
            if d is not None and (d / name).exists():
                return d / name
    return None


def capped_decode_rate(result_file: Path, arm: Dict[str, Any], bs: Any) -> Optional[float]:
    """SGLang's decode rate at a full batch for a run whose concurrency ``bs`` exceeded the server's max running
    requests, recorded before eval.ab took that cap as the full batch (it then recorded none, and no
    ``full_batch``): the median of the arm's whole server log's lines with at least 90% of the cap running. Only
    the arm's one measured batch above the cap fills them; with two such batches the lines cannot be told apart,
    and none is given."""
    cap = (arm.get("facts") or {}).get("max_running_requests")
    if not decode_rate.positive_int(bs) or not decode_rate.positive_int(cap) or bs <= cap:
        return None
    entries = [e for e in arm.get("bench") or [] if e.get("result")]
    entry = next((e for e in entries if e.get("batch") == bs), None)
    if entry is None or "full_batch" in (entry.get("rates") or {}):  # not measured, or recorded with the cap
        return None
    if sum(1 for e in entries if decode_rate.positive_int(e.get("batch")) and e["batch"] > cap) != 1:
        return None
    lg = _server_log(Path(result_file), arm.get("label", ""))
    if lg is None:
        return None
    text = decode_rate.read_log(lg)  # as steady_decode_rates: lines without a prefill in their window, if any
    clean = decode_rate.full_batch_rate(decode_rate.decode_only_lines(text), cap)[0]
    return clean if clean is not None else decode_rate.full_batch_rate(decode_rate.decode_lines(text), cap)[0]


def _shared_prefix(res: Dict[str, Any]) -> bool:
    """A prefix-caching run (eval.ab --workload shared-prefix): summarised in e2e-prefix-h200 only; its speeds mix
    in the prefill of newly admitted prompts and are no decode or speculative figure."""
    return (res.get("bench") or {}).get("workload") == "shared-prefix"


def decode_speed(results) -> Dict[str, Any]:
    rows, noise = [], []
    for f, res in results:
        setup = _setup(res)
        if setup["size"] != "real" or setup["spec"] not in (None, "none") or _shared_prefix(res):
            continue
        ka, kb = _kinds(res)
        s = res["summary"]
        if ka != "stock":
            continue
        a, b = _bs_row(res, s["a"]), _bs_row(res, s["b"])
        pa, pb = _decode_steps(res, s["a"]), _decode_steps(res, s["b"])
        # an arm served with its own launch configs (eval.ab staged@FILE) is a variant, not "staged"
        cfg = (((res.get("arms") or {}).get(s["b"]) or {}).get("phase") or {}).get("kernel_config")
        arm = f"{kb}@{Path(cfg).name}" if cfg else kb
        rates = {}  # label -> {batch: steady tok/s} (the server log beside the result: server-<label>.log[.gz])
        for lab in (s["a"], s["b"]):
            lg = _server_log(Path(f), lab)
            rates[lab] = steady_decode_rates(lg) if lg else {}
        recorded = {lab: ab_report.rates_rows((res.get("arms") or {}).get(lab)) for lab in (s["a"], s["b"])}
        for bs in sorted(set(a) & set(b)):
            steady = {lab: r.get(bs) for lab, r in rates.items()}
            da, fa = arm_decode_rate(recorded[s["a"]].get(bs), a[bs], steady[s["a"]], bs)
            db, fb = arm_decode_rate(recorded[s["b"]].get(bs), b[bs], steady[s["b"]], bs)
            fba, fbb = ((recorded[lab].get(bs) or {}).get("full_batch", bs) for lab in (s["a"], s["b"]))
            rows.append({"model": setup["model"], "family": setup["family"], "arm": arm, "batch": bs,
                         "ssm_state": setup["ssm_state"], "run_started": res.get("started"),
                         "workload": setup["workload"],
                         "stock_tok_s": a[bs].get("output_throughput"), "arm_tok_s": b[bs].get("output_throughput"),
                         "throughput_ratio": report.ratio(b[bs].get("output_throughput"),
                                                          a[bs].get("output_throughput")),
                         "tpot_speedup": report.ratio(a[bs].get("median_tpot_ms"), b[bs].get("median_tpot_ms")),
                         # the profiled decode steps' wall time, stock over arm (eval/profile_trace.py)
                         "decode_step_speedup": report.ratio(pa.get(bs), pb.get(bs)) if bs in pa and bs in pb else None,
                         "stock_steady_tok_s": steady[s["a"]], "arm_steady_tok_s": steady[s["b"]],
                         "steady_decode_speedup": report.ratio(steady[s["b"]], steady[s["a"]]),
                         # SGLang's decode rate at a full batch and the client-path flag (either arm's run)
                         "stock_decode_tok_s": da, "arm_decode_tok_s": db,
                         # two servers capped at different running requests decode different batches: no ratio
                         "full_batch": {"stock": fba, "arm": fbb},
                         "decode_rate_speedup": report.ratio(db, da) if fba == fbb else None,
                         "client_path_bound": True if (fa or fb) else (False if fa is False and fb is False else None),
                         "file": str(f)})
        if kb == "stock":
            noise.append({"model": setup["model"], "workload": setup["workload"],
                          "geomean": s.get("throughput_ratio_geomean"), "min": s.get("throughput_ratio_min"),
                          "max": s.get("throughput_ratio_max"), "file": str(f)})

    rows.sort(key=lambda r: (_ts(r["run_started"]), r["model"], r["arm"], r["batch"]))
    sources: Dict[str, str] = {}
    used: Dict[str, List[Dict[str, Any]]] = {}  # summary key -> the rows it read

    def target_row(r: Dict[str, Any], family: str, arm: str, bs: int, standard: bool = True,
                   workload: Optional[Dict[str, Any]] = None) -> bool:
        """A row the targets may read: the family's headline model, the packaged launch configs (no
        @FILE variant), an fp32 state (the model default of the built-in geometries), the standard
        workload (``standard=False``: any workload but that and the io1024 one; ``workload``: exactly that one)."""
        w = r.get("workload", STANDARD_WORKLOAD)
        if workload is not None:
            same = w == workload
        else:  # "other workloads": neither the standard one nor the io1024 one its own keys read
            same = (w == STANDARD_WORKLOAD) if standard else w not in (STANDARD_WORKLOAD, IO1024_WORKLOAD)
        return (r["family"], r["arm"], r["batch"]) == (family, arm, bs) and r["model"] == TARGET_MODELS[family] \
            and _fp32_state(r) and same

    def latest(family: str, arm: str, bs: int, key: str, standard: bool = True,
               workload: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
        """The latest run (by start time) of the family's arm at this batch that measured ``key``."""
        return next((r for r in reversed(rows) if target_row(r, family, arm, bs, standard, workload)
                     and r.get(key) is not None), None)

    def pick(name: str, family: str, arm: str, bs: int, key: str = "throughput_ratio",
             standard: bool = True, workload: Optional[Dict[str, Any]] = None) -> Optional[float]:
        r = latest(family, arm, bs, key, standard, workload)
        if r is not None:
            sources[name] = r["file"]
            used[name] = [r]
        return r[key] if r else None

    def vs_upstream(name: str, bs: int, key: str = "arm_tok_s",
                    workload: Optional[Dict[str, Any]] = None) -> Optional[float]:
        # the latest run with both our arm and the upstream arm at this batch (same stock baseline)
        for ours in reversed(rows):
            if not target_row(ours, "gdn", "staged", bs, workload=workload) or ours.get(key) is None:
                continue
            up = next((r for r in rows if target_row(r, "gdn", "upstream", bs, workload=workload)
                       and r["run_started"] == ours["run_started"] and r.get(key) is not None), None)
            if up is not None:
                sources[name] = ours["file"]
                used[name] = [ours, up]
                return report.ratio(ours[key], up[key])
        return None

    summary = {"nemotron_h_speedup_bs256": pick("nemotron_h_speedup_bs256", "mamba2", "staged", 256),
               "nemotron_h_speedup_bs1": pick("nemotron_h_speedup_bs1", "mamba2", "staged", 1),
               "gdn_speedup_bs256": pick("gdn_speedup_bs256", "gdn", "staged", 256),
               "gdn_vs_upstream_bs256": vs_upstream("gdn_vs_upstream_bs256", 256),
               "upstream_speedup_bs256": pick("upstream_speedup_bs256", "gdn", "upstream", 256),
               # not targets: the profiled decode steps alone (prefill steps and the run's ramp left out)
               "nemotron_h_decode_step_speedup_bs256": pick("nemotron_h_decode_step_speedup_bs256", "mamba2",
                                                            "staged", 256, "decode_step_speedup"),
               "nemotron_h_decode_step_speedup_bs1": pick("nemotron_h_decode_step_speedup_bs1", "mamba2", "staged",
                                                          1, "decode_step_speedup"),
               "gdn_decode_step_speedup_bs256": pick("gdn_decode_step_speedup_bs256", "gdn", "staged", 256,
                                                     "decode_step_speedup"),
               "upstream_decode_step_speedup_bs256": pick("upstream_decode_step_speedup_bs256", "gdn", "upstream",
                                                          256, "decode_step_speedup"),
               "nemotron_h_steady_decode_speedup_bs256": pick("nemotron_h_steady_decode_speedup_bs256", "mamba2",
                                                              "staged", 256, "steady_decode_speedup"),
               "nemotron_h_steady_decode_speedup_bs1": pick("nemotron_h_steady_decode_speedup_bs1", "mamba2",
                                                            "staged", 1, "steady_decode_speedup"),
               "gdn_steady_decode_speedup_bs256": pick("gdn_steady_decode_speedup_bs256", "gdn", "staged", 256,
                                                       "steady_decode_speedup"),
               "gdn_steady_vs_upstream_bs256": vs_upstream("gdn_steady_vs_upstream_bs256", 256, "arm_steady_tok_s"),
               # not targets: bench_serving's ratio on a workload other than the standard one (e.g. one wave of
               # 1024-token outputs, eval.ab --rounds 1 --output-len 1024)
               "nemotron_h_other_workload_speedup_bs256": pick("nemotron_h_other_workload_speedup_bs256", "mamba2",
                                                               "staged", 256, standard=False),
               "gdn_other_workload_speedup_bs256": pick("gdn_other_workload_speedup_bs256", "gdn", "staged", 256,
                                                        standard=False),
               # the standard decode workload (eval.ab --workload standard-decode)
               "nemotron_h_speedup_bs256_io1024": pick("nemotron_h_speedup_bs256_io1024", "mamba2", "staged", 256,
                                                       workload=IO1024_WORKLOAD),
               "nemotron_h_decode_rate_speedup_bs256_io1024": pick(
                   "nemotron_h_decode_rate_speedup_bs256_io1024", "mamba2", "staged", 256, "decode_rate_speedup",
                   workload=IO1024_WORKLOAD),
               "nemotron_h_speedup_bs1_io1024": pick("nemotron_h_speedup_bs1_io1024", "mamba2", "staged", 1,
                                                     workload=IO1024_WORKLOAD),
               "gdn_vs_upstream_bs256_io1024": vs_upstream("gdn_vs_upstream_bs256_io1024", 256,
                                                           workload=IO1024_WORKLOAD),
               "noise_floor_stock_vs_stock": noise}
    read = list({(r["file"], r["arm"], r["batch"]): r for rs in used.values() for r in rs}.values())
    flagged = [r for r in read if r.get("client_path_bound")]
    summary["client_path_bound_runs"] = len(flagged)
    summary["client_path_bound_list"] = [f"{Path(r['file']).parent.name}/{Path(r['file']).name}: {r['arm']} vs "
                                         f"stock at batch {r['batch']}" for r in flagged]
    summary["sources"] = sources
    summary["targets"] = {**DECODE_TARGETS, **IO1024_TARGETS, "client_path_bound_runs": 0}
    summary["met"] = {k: (summary[k] is not None and summary[k] >= t)
                      for k, t in {**DECODE_TARGETS, **IO1024_TARGETS}.items()}
    # no flagged run among those read, once the standard decode workload has been measured
    summary["met"]["client_path_bound_runs"] = summary["client_path_bound_runs"] == 0 and any(
        summary[k] is not None for k in IO1024_TARGETS)
    return {"schema": "replayssm-e2e-decode/1", **provenance(results, (r["file"] for r in rows)),
            "metric": "output tokens/s ratio, arm / stock, same run", "summary": summary, "by_batch": rows}


def arms_by_run(results) -> Dict[Tuple[Any, Any], Dict[str, Dict[str, Any]]]:
    """Every arm of every harness run, keyed by (model, start time): a run with three arms is
    spread over two result files (each later arm against the first)."""
    runs: Dict[Tuple[Any, Any], Dict[str, Dict[str, Any]]] = {}
    for f, res in results:
        if _shared_prefix(res):
            continue
        setup, s = _setup(res), res["summary"]
        for label in (s.get("a"), s.get("b")):
            arm = (res.get("arms") or {}).get(label)
            if arm is None:
                continue
            runs.setdefault((setup["model"], res.get("started")), {})[label] = {
                "kind": arm["phase"].get("kind"), "spec": bool(arm["phase"].get("spec")),
                "bench": _bs_row(res, label), "max_running_requests": (s.get("max_running_requests") or {}).get(label),
                "accept_length": (s.get("accept_length") or {}).get(label), "setup": setup, "file": str(f),
                "rates": ab_report.rates_rows(arm), "conv_verify": _conv_verify(arm, Path(f), label)}
    return runs


def _conv_verify(arm: Dict[str, Any], f: Path, label: str) -> Any:
    """Whether the arm's server ran the conv1d verify kernel: its record, or for runs recorded before the record
    said, the plugin's line in the server log committed beside the result (None when neither says)."""
    if arm.get("replayssm_conv_verify") is not None:
        return arm["replayssm_conv_verify"]
    for log_file in (f.parent / f"server-{label}.log.gz", f.parent / f"server-{label}.log"):
        if log_file.is_file():
            opener = gzip.open if log_file.suffix == ".gz" else open
            with opener(log_file, "rt", errors="replace") as fh:
                return conv_verify_state(fh.read())
    return None


# the draft algorithms of issue 20's EAGLE summary (separate draft model, chains and trees); the others (NEXTN/MTP)
# are the speculative summary's
EAGLE_SPECS = ("eagle", "eagle3")


def _eagle(setup: Dict[str, Any]) -> bool:
    return str(setup.get("spec") or "").lower() in EAGLE_SPECS


def _spec_decode_rates(ours: Dict[str, Any], stock: Optional[Dict[str, Any]], bs,
                       nospec: Optional[Dict[str, Any]] = None, same_run: bool = True) -> Dict[str, Any]:
    """SGLang's own decode rate at a full batch (its scheduler log) of the replay arm, the stock spec arm and the
    run's own stock non-spec arm at batch ``bs``, the batch each was read at (a server's running cap where that is
    below ``bs``) and whether the client path bounded the run (eval/ab/decode_rate.py); and the replay arm's
    decode rate over the non-spec arm's (``spec_vs_stock_nonspec_decode``: same run only, None otherwise)."""
    out = {}
    for name, arm in (("staged", ours), ("stock", stock), ("stock_nonspec", nospec if same_run else None)):
        r = ((arm or {}).get("rates") or {}).get(bs) or {}
        out[f"{name}_decode_tok_s"] = r.get("decode_tok_s")
        out[f"{name}_decode_full_batch"] = r.get("full_batch")
        out[f"{name}_client_path_bound"] = r.get("client_path_bound")
    out["spec_vs_stock_nonspec_decode"] = report.ratio(out["staged_decode_tok_s"], out["stock_nonspec_decode_tok_s"])
    return out


def spec_speed(results, eagle: bool = False) -> List[Dict[str, Any]]:
    """Per run and batch: replay spec vs stock spec, vs stock non-spec, and the capacity ratio (max
    running requests, same memory settings).  The non-spec baseline is the run's own ``stock:nospec``
    arm; a run without one borrows the nearest-in-time one of another run of the same model and
    flags (``stock_nonspec_file`` names it, ``nonspec_same_run`` says which).  A run of the replay arm
    against ``stock:nospec`` alone gives the non-spec ratio only.

    Each target reads each model's latest run that measured it (``latest_for`` lists the targets a
    row is current for): the non-spec ratio prefers runs with their own baseline over borrowed ones,
    so a later stock-vs-staged run does not displace a same-run non-spec measurement with a borrowed
    one.  Earlier rows stay in the table as history (``latest`` False when current for nothing)."""
    runs = arms_by_run(results)

    def find(arms, kind, spec):  # an arm that was skipped or failed (nothing measured) is no baseline
        return next((a for a in arms.values() if a["kind"] == kind and a["spec"] == spec
                     and any((b or {}).get("output_throughput") for b in a["bench"].values())), None)

    def borrowed_nospec(model, started):
        cands = [(abs(_ts(st) - _ts(started)), find(arms, "stock", False))
                 for (m, st), arms in runs.items() if m == model and find(arms, "stock", False) is not None]
        return min(cands, key=lambda c: c[0])[1] if cands else None

    rows = []
    for (model, started), arms in runs.items():
        ours, stock, nospec = find(arms, "staged", True), find(arms, "stock", True), find(arms, "stock", False)
        if ours is None or (stock is None and nospec is None) or _eagle(ours["setup"]) != eagle:
            continue
        same_run = nospec is not None
        nospec = nospec or borrowed_nospec(model, started)
        setup = ours["setup"]
        cap = report.ratio(ours["max_running_requests"], stock["max_running_requests"]) if stock else None
        for bs in sorted(ours["bench"]):
            thr = lambda arm: (arm["bench"].get(bs) or {}).get("output_throughput") if arm else None
            rows.append({"model": model, "family": setup["family"], "size": setup["size"], "batch": bs,
                         "spec": setup["spec"], "spec_topk": setup["spec_topk"],
                         "spec_draft_tokens": setup["spec_draft_tokens"],
                         "sim_acc_len": setup["sim_acc_len"], "staged_tok_s": thr(ours), "stock_spec_tok_s": thr(stock),
                         "stock_nonspec_tok_s": thr(nospec),
                         "spec_vs_stock_spec": report.ratio(thr(ours), thr(stock)),
                         "spec_vs_stock_nonspec": report.ratio(thr(ours), thr(nospec)),
                         "stock_spec_vs_stock_nonspec": report.ratio(thr(stock), thr(nospec)),
                         "max_running_staged": ours["max_running_requests"],
                         "max_running_stock": stock["max_running_requests"] if stock else None,
                         "capacity_ratio": cap, "file": ours["file"], "started": started,
                         # the conv1d verify kernel in the replay arm (None: neither its record nor a log says)
                         "staged_conv_verify": ours.get("conv_verify"),
                         **_spec_decode_rates(ours, stock, bs, nospec, same_run),
                         "stock_nonspec_file": nospec["file"] if nospec else None, "nonspec_same_run": same_run})
    for r in rows:
        r["latest_for"] = []
    for key in SPEED_KEYS:
        for model, topk in {(r["model"], r["spec_topk"]) for r in rows}:
            cands = [r for r in rows if r["model"] == model and r["spec_topk"] == topk and r[key] is not None]
            if key == "spec_vs_stock_nonspec" and any(r["nonspec_same_run"] for r in cands):
                cands = [r for r in cands if r["nonspec_same_run"]]
            if cands:
                last = max(str(r["started"]) for r in cands)
                for r in cands:
                    if str(r["started"]) == last:
                        r["latest_for"].append(key)
    for r in rows:
        r["latest"] = bool(r["latest_for"])
    return rows


def spec_summary(results, eagle: bool = False) -> Dict[str, Any]:
    """The NEXTN/MTP summary (``eagle`` False) or the runs of the EAGLE summary (True: :func:`eagle_summary`)."""
    runs = []
    for f, res in results:
        setup = _setup(res)
        if setup["spec"] in (None, "none") or _eagle(setup) != eagle or _shared_prefix(res):
            continue
        s = res["summary"]
        if s.get("b") is None:  # one arm, compared with nothing (e.g. a profiled run of our server alone)
            continue
        ka, kb = _kinds(res)
        if kb in STOCK_KINDS:  # the stock:nospec baseline of a spec run: speed only (spec_speed)
            continue
        svn = s.get("spec_vs_nonspec") or {}
        par = s.get("parity") or {}
        runs.append({**setup, "file": str(f), "started": res.get("started"), "arms": f"{kb} vs {ka}",
                     "accept_length": s.get("accept_length"),
                     "max_running_requests": s.get("max_running_requests"),
                     "parity_same_simulated_acceptance": _parity_entry(par, f, f"{kb} vs {ka}", setup)
                     if "mismatches" in par else par,
                     "spec_vs_nonspec": {k: _parity_entry(v, f, f"{k} speculative vs stock non-speculative", setup)
                                         for k, v in svn.items() if "mismatches" in v},
                     # servers that never came up (their log is in the run's folder)
                     "server_errors": {k: str(a.get("error") or "").split(";")[0]
                                       for k, a in {**(res.get("arms") or {}), **(res.get("extra_servers") or {})}.items()
                                       if a.get("status") == "error"}})
    # greedy spec vs non-spec: the latest replay-server run of each model and draft algorithm that compared
    # them (earlier runs are history, so a repeated run does not count its mismatches twice)
    latest: Dict[Tuple[Any, Any], Dict[str, Any]] = {}
    for r in runs:
        key = (r["model"], r["spec"], r["spec_topk"])
        seen = latest.get(key)
        # a pinned-token run's greedy tokens are one token by construction: its logprobs count (pinned_path_runs)
        if r["spec_vs_nonspec"] and r["arms"].startswith("staged vs") and r.get("pinned_token") is None and \
                (seen is None or str(r["started"] or "") >= str(seen["started"] or "")):
            latest[key] = r
    for r in runs:
        r["greedy_target_run"] = latest.get((r["model"], r["spec"], r["spec_topk"])) is r
    ours = [r["spec_vs_nonspec"].get(r["arms"].split(" vs ")[0]) for r in latest.values()]
    stock = [r["spec_vs_nonspec"].get(r["arms"].split(" vs ")[1]) for r in latest.values()]
    speed = spec_speed(results, eagle=eagle)
    real256 = [r for r in speed if r["size"] == "real" and r["batch"] == 256]

    def worst(key: str) -> Optional[float]:  # the lowest over the real geometries, each model's latest run for key
        vals = [r[key] for r in real256 if key in r["latest_for"]]
        return min(vals) if vals else None

    by_model = {k: {r["model"]: r[k] for r in real256 if k in r["latest_for"]} for k in SPEED_KEYS}
    # SGLang's decode rates of the rows the non-spec ratio reads (the client's ratio also holds the prefills)
    by_model["spec_vs_stock_nonspec_decode"] = {r["model"]: r["spec_vs_stock_nonspec_decode"] for r in real256
                                               if "spec_vs_stock_nonspec" in r["latest_for"]
                                               and r.get("spec_vs_stock_nonspec_decode") is not None}
    summary = {"spec_vs_stock_spec_bs256": worst("spec_vs_stock_spec"),
               "spec_vs_stock_nonspec_bs256": worst("spec_vs_stock_nonspec"),
               "capacity_ratio": worst("capacity_ratio"),
               "greedy_mismatches": sum(e["token_mismatches"] for e in ours if e) if any(ours) else None,
               "stock_greedy_mismatches": sum(e["token_mismatches"] for e in stock if e) if any(stock) else None,
               "bs256_by_model": by_model,
               "targets": SPEC_TARGETS}
    if not real256:
        summary["not_measured"] = "bs256 speed and capacity need a speculative A/B on a real geometry (not run yet)"
    return {"schema": "replayssm-e2e-spec/1", **provenance(results, [r["file"] for r in speed + runs]),
            "summary": summary, "speed": speed, "runs": runs}


# ---------------------------------------------------------------------------------------------
def _retracted(e: Dict[str, Any]) -> str:
    r = e.get("retracted_reqs") or {}
    vals = [v for v in r.values() if v is not None]
    return " / ".join(f"{k} {v}" for k, v in r.items()) if vals else "—"


def _parity_rows(entries: List[Dict[str, Any]]) -> List[List[Any]]:
    return [[e["what"], e["model"], e.get("ssm_state", "default"), e["cuda_graph"], e["radix_cache"],
             f"{e['prompts']} x {e['tokens_per_prompt']}",
             e["tokens_compared"], e["token_mismatches"], e["near_ties"], report.fmt(e["max_abs_logprob_diff"], 3),
             _retracted(e), f"{Path(e['file']).parent.name}/{Path(e['file']).name}"] for e in entries]


def _source_section(doc: Dict[str, Any]) -> Tuple[str, str]:
    return ("Source", report.markdown_kv({"git commit of the runs": doc.get("git_commit") or "—",
                                          "SGLang": doc.get("sglang_version") or "—", "GPU": doc.get("gpu") or "—",
                                          "run files": str(len(doc.get("sources", [])))}))


PARITY_HEAD = ["comparison", "model", "state", "graphs", "radix", "prompts x tokens", "tokens compared", "mismatches",
               "near-ties", "max |Δlogprob|", "retracted requests", "file"]


def write_parity(doc: Dict[str, Any], out_dir: Path) -> List[Path]:
    s = doc["summary"]
    paths = [report.write_json(out_dir / "parity-decode-h200.json", doc)]
    refs = "\n".join(f"- {w}: {v['token_mismatches']} mismatches over {v['tokens_compared']} tokens compared, "
                     f"max |Δlogprob| {report.fmt(v['max_abs_logprob_diff'], 3)}" for w, v in s["references"].items())
    paths.append(report.write_markdown(out_dir / "parity-decode-h200.md", "Decode parity on the H200", [
        _source_section(doc),
        ("Summary", report.markdown_kv({**{k: s[k] for k in ("runs", "tokens_compared", "token_mismatches",
                                                              "near_ties", "max_abs_logprob_diff")},
                                         **{f"{st} state": f"{v['runs']} runs, {v['token_mismatches']} mismatches over "
                                                           f"{v['tokens_compared']} tokens, max |Δlogprob| "
                                                           f"{report.fmt(v['max_abs_logprob_diff'], 3)}"
                                            for st, v in s.get("by_state", {}).items()},
                                         "target_met (fp32 state)": s["target_met"]})),
        ("Replay server vs stock", report.markdown_table(PARITY_HEAD, _parity_rows(doc["runs"]))),
        ("References: SGLang against itself", refs + "\n\n" + report.markdown_table(PARITY_HEAD,
                                                                                  _parity_rows(doc["references"]))),
    ]))
    hist = [e for e in doc["runs"] + doc["references"] if e.get("dlogprob_hist")]
    if hist:
        labels = hist[0]["dlogprob_hist"]["labels"]
        series = [{"label": f"{e['what']} ({e['model']})",
                   "y": [c / max(1, sum(e["dlogprob_hist"]["counts"])) for c in e["dlogprob_hist"]["counts"]]}
                  for e in hist]
        if report.plot_panels(out_dir / "parity-decode-h200.png", [
                {"kind": "bar", "title": "chosen-token |Δlogprob| before the first divergence",
                 "xlabel": "|Δlogprob| bin", "ylabel": "fraction of compared tokens", "categories": labels,
                 "series": series}]):
            paths.append(out_dir / "parity-decode-h200.png")
    return paths


def _workload_label(w: Optional[Dict[str, Any]]) -> str:
    """"128/256 x2": input and output tokens per request and waves of ``batch`` requests (eval.ab --rounds)."""
    w = w or STANDARD_WORKLOAD
    si = int(w.get("stream_interval") or 1)
    return f"{w['input_len']}/{w['output_len']} x{w['rounds']}" + (f", stream interval {si}" if si != 1 else "")


def write_decode(doc: Dict[str, Any], out_dir: Path) -> List[Path]:
    s = doc["summary"]
    paths = [report.write_json(out_dir / "e2e-decode-h200.json", doc)]
    src = s.get("sources", {})
    rows = [[k, report.fmt(s[k], 3), t, "yes" if s["met"][k] else "no",
             Path(src[k]).parent.name if k in src else "—"] for k, t in DECODE_TARGETS.items()]
    steps = [[k, report.fmt(s.get(k), 3), Path(src[k]).parent.name if k in src else "—"]
             for k in DECODE_STEP_KEYS if s.get(k) is not None]
    steady = [[k, report.fmt(s.get(k), 3), Path(src[k]).parent.name if k in src else "—"]
              for k in STEADY_KEYS if s.get(k) is not None]
    by_file = {r["file"]: r.get("workload") or {} for r in doc["by_batch"]}
    other = [[k, report.fmt(s.get(k), 3), ", ".join(f"{n} {v}" for n, v in by_file.get(src.get(k), {}).items()),
              Path(src[k]).parent.name if k in src else "—"] for k in WORKLOAD_KEYS if s.get(k) is not None]
    brows = [[r["model"], r["arm"], r["batch"], r.get("run_started") or "—", report.fmt(r["stock_tok_s"], 0),
              report.fmt(r["arm_tok_s"], 0), report.fmt(r["throughput_ratio"], 3), report.fmt(r["tpot_speedup"], 3),
              report.fmt(r.get("decode_step_speedup"), 3), report.fmt(r.get("steady_decode_speedup"), 3),
              report.fmt(r.get("decode_rate_speedup"), 3),
              {True: "**yes**", False: "no"}.get(r.get("client_path_bound"), "—"), _workload_label(r.get("workload"))]
             for r in doc["by_batch"]]
    io = [[k, report.fmt(s.get(k), 3), t, "yes" if s["met"].get(k) else "no",
           Path(src[k]).parent.name if k in src else "—"] for k, t in IO1024_TARGETS.items()]
    io.append(["client_path_bound_runs", str(s.get("client_path_bound_runs")), "0",
               "yes" if s["met"].get("client_path_bound_runs") else "no", "runs the keys above read"])
    flagged = "\n".join(f"- {x}" for x in s.get("client_path_bound_list") or []) or "- none"
    noise = "\n".join(f"- {n['model']} ({_workload_label(n.get('workload'))}): stock vs stock geomean "
                      f"{report.fmt(n['geomean'], 3)} (min {report.fmt(n['min'], 3)}, max {report.fmt(n['max'], 3)}; "
                      f"{Path(n['file']).parent.name})"
                      for n in s["noise_floor_stock_vs_stock"]) or "- none"
    paths.append(report.write_markdown(out_dir / "e2e-decode-h200.md", "End-to-end decode speed on the H200", [
        _source_section(doc),
        ("Targets (each from the latest run that measured it on the standard workload)",
         report.markdown_table(["metric", "measured", "target", "met", "run"], rows)),
        ("Profiled decode steps (not targets)",
         "Stock's decode-step wall time over the arm's, from the torch-profiler window of `eval.ab --profile-batch` "
         "(eval/profile_trace.py: whole forward steps without a prefill kernel). The throughput ratio also holds "
         "the run's prefill steps and its ramp up and down, which cost both servers alike.\n\n"
         + (report.markdown_table(["metric", "measured", "run"], steps) if steps else "- none profiled")),
        ("Steady decode at a full batch (not targets)",
         "The arm's over stock's median `gen throughput` of SGLang's own `Decode batch` log lines (one per 40 "
         "decode steps) that report exactly the batch's running requests, from the server logs beside each result. "
         "It leaves out prefill steps, the ramp and the benchmark client's gaps between waves of requests, which "
         "cost both servers the same seconds and dilute bench_serving's ratio.\n\n"
         + (report.markdown_table(["metric", "measured", "run"], steady) if steady else "- no server logs")),
        ("Standard decode workload (eval.ab --workload standard-decode)",
         "bench_serving random ids, " + _workload_label(IO1024_WORKLOAD) + " (input/output tokens x waves of "
         "`batch` requests), batch 256 and 1; the latest such run of each key. *decode rate* is SGLang's own "
         "median `gen throughput` at a full batch (the scheduler's `Decode batch` lines with at least 90% of the "
         "batch running, during the run). A run is *client-path bound* when the client's rate at a full batch "
         "(batch / median per-token ITL) and that decode rate disagree by more than 10% (eval/ab/decode_rate.py): its "
         "client-side ratio does not measure the engine.\n\n"
         + report.markdown_table(["metric", "measured", "target", "met", "run"], io)
         + "\n\nClient-path bound among the runs the summary keys read:\n\n" + flagged),
        ("Other workloads (not targets)",
         "bench_serving's output-token ratio on runs whose workload is not the standard one ("
         + ", ".join(f"{n} {v}" for n, v in STANDARD_WORKLOAD.items()) + "), the latest of each family at batch 256. "
         "The targets read only standard-workload runs, and the standard decode workload's runs (1024/1024 x2) "
         "have their own keys above.\n\n"
         + (report.markdown_table(["metric", "measured", "workload", "run"], other) if other else "- none")),
        ("Noise floor", noise),
        ("By batch (sglang.bench_serving output tokens/s; TPOT p50)",
         report.markdown_table(["model", "arm", "batch", "run started", "stock tok/s", "arm tok/s",
                                "throughput ratio", "TPOT speedup", "profiled decode-step speedup",
                                "steady decode speedup", "decode-rate speedup", "client-path bound",
                                "workload (in/out x waves)"], brows)),
    ]))
    series = []
    for key in dict.fromkeys((r["model"], r["arm"]) for r in doc["by_batch"]):
        pts = [r for r in doc["by_batch"] if (r["model"], r["arm"]) == key]
        series.append({"label": f"{key[1]} / stock, {key[0]}", "x": [r["batch"] for r in pts],
                       "y": [r["throughput_ratio"] for r in pts], "style": ":" if key[1] == "stock" else "-"})
    if report.plot_panels(out_dir / "e2e-decode-h200.png", [
            {"title": "decode throughput vs stock SGLang (H200)", "xlabel": "concurrent requests",
             "ylabel": "output tok/s ratio", "xlog2": True, "hline": 1.0, "series": series}]):
        paths.append(out_dir / "e2e-decode-h200.png")
    return paths


def write_spec(doc: Dict[str, Any], out_dir: Path) -> List[Path]:
    s = doc["summary"]
    paths = [report.write_json(out_dir / "e2e-spec-h200.json", doc)]
    rows = []
    for r in doc["runs"]:
        p = r["parity_same_simulated_acceptance"]
        acc = " / ".join(f"{k} {report.fmt(v, 2)}" for k, v in (r["accept_length"] or {}).items())
        rows.append([r["model"], r["arms"], r["sim_acc_len"], acc,
                     p.get("token_mismatches") if isinstance(p, dict) else None,
                     report.fmt(p.get("max_abs_logprob_diff"), 3) if isinstance(p, dict) else None,
                     "; ".join([f"{k}: {v['token_mismatches']} mismatches, first at {v['first_divergence']}"
                                for k, v in r["spec_vs_nonspec"].items()]
                               + (["counted in greedy_mismatches (the model's latest with this draft)"]
                                  if r.get("greedy_target_run") else [])
                               + ([f"servers failed to start: {', '.join(r['server_errors'])} "
                                   f"({Path(r['file']).parent.name})"] if r.get("server_errors") else []))])
    speed = [[r["model"], f"{r.get('started', '—')}{'' if r.get('latest', True) else ' (superseded)'}",
              Path(r["file"]).parent.name, r["batch"], report.fmt(r["staged_tok_s"], 0), report.fmt(r["stock_spec_tok_s"], 0),
              report.fmt(r["stock_nonspec_tok_s"], 0) + ("" if r.get("nonspec_same_run", True) or
                                                          r["stock_nonspec_tok_s"] is None else " (other run)"),
              report.fmt(r["spec_vs_stock_spec"], 3), report.fmt(r["spec_vs_stock_nonspec"], 3),
              report.fmt(r.get("spec_vs_stock_nonspec_decode"), 3),
              f"{report.fmt(r['capacity_ratio'], 2)} ({r.get('max_running_staged')} / {r.get('max_running_stock')})"
              if r["capacity_ratio"] is not None else "—",
              ", ".join(SHORT[k] for k in r.get("latest_for", [])) or "—"]
             for r in doc["speed"]]
    tgt = [[k, report.fmt(s.get(k), 3), t] for k, t in SPEC_TARGETS.items()]
    paths.append(report.write_markdown(out_dir / "e2e-spec-h200.md", "Speculative decoding (NEXTN) on the H200", [
        _source_section(doc),
        ("Summary", report.markdown_kv({k: v for k, v in s.items() if k not in ("targets", "bs256_by_model")})),
        ("Batch 256 by model (the run each ratio is read from: `targets read` below)",
         report.markdown_table(["model"] + list(SPEED_KEYS) + ["spec_vs_stock_nonspec_decode"],
                               [[m] + [report.fmt(s["bs256_by_model"].get(k, {}).get(m), 3)
                                       for k in SPEED_KEYS + ("spec_vs_stock_nonspec_decode",)]
                                for m in dict.fromkeys(m for v in s["bs256_by_model"].values() for m in v)])),
        ("Targets (the lowest over the real geometries, each model's latest run that measured the ratio)",
         report.markdown_table(["metric", "measured", "target"], tgt)),
        ("Speed (output tokens/s, simulated acceptance; tiny models are launch-bound and not used for the targets; "
         "each target reads each model's latest run that measured it, preferring a same-run non-spec baseline "
         "(`targets read`); superseded runs are earlier code or launch configs, kept as history)",
         report.markdown_table(["model", "run started", "folder", "batch", "replay spec", "stock spec", "stock non-spec", "vs stock spec",
                                "vs stock non-spec", "vs non-spec, SGLang's decode rates (same run)",
                                "capacity ratio (max running)", "targets read"], speed)
         if speed else "not run yet"),
        ("Runs", report.markdown_table(["model", "arms", "simulated accept", "accept length",
                                        "mismatches (same simulated acceptance)", "max |Δlogprob|",
                                        "spec vs non-spec greedy (greedy_mismatches sums each model's latest run)"],
                                       rows)),
    ]))
    series = []
    for model in dict.fromkeys(r["model"] for r in doc["speed"]):
        for key, style in (("spec_vs_stock_spec", "-"), ("spec_vs_stock_nonspec", "--")):
            pts = [r for r in doc["speed"] if r["model"] == model and key in r.get("latest_for", [key])]
            series.append({"label": f"{key.replace('_', ' ')}, {model}", "x": [r["batch"] for r in pts],
                           "y": [r[key] for r in pts], "style": style})
    if series and report.plot_panels(out_dir / "e2e-spec-h200.png", [
            {"title": "speculative decoding vs stock SGLang (H200)", "xlabel": "concurrent requests",
             "ylabel": "output tok/s ratio", "xlog2": True, "hline": 1.0, "series": series}]):
        paths.append(out_dir / "e2e-spec-h200.png")
    return paths


# issue 19's prefix-caching targets (eval.ab --workload shared-prefix); ttft ratios are ours / theirs (lower is better)
PREFIX_TARGETS = {"defaults_launch_ok": 1, "prefix_hit_rate_vs_stock": 0.98, "ttft_p50_vs_stock": 1.05,
                  "ttft_p50_vs_upstream": 0.8, "decode_rate_speedup_prefix_bs256": 1.5,
                  "prefix_parity_max_abs_logprob_diff": 0.1}
PREFIX_PARITY_MODEL = "tiny-nemotron-h"   # hit-vs-cold parity is read on the tiny Mamba2 model


# a shared-prefix bench entry's figures: (section, field) of eval.ab's per-batch record
PREFIX_METRICS = {"hit_rate": ("prefix_cache", "hit_rate"), "ttft_p50_ms": ("result", "median_ttft_ms"),
                  "decode_rate": ("rates", "decode_tok_s")}


def _prefix_figures(arm: Optional[Dict[str, Any]], bs) -> Dict[str, Any]:
    """PREFIX_METRICS of an arm's bench entry at batch ``bs`` (None where the arm or the figure is missing)."""
    entry = next((e for e in (arm or {}).get("bench") or [] if e.get("batch") == bs), {})
    out = {}
    for k, (sec, field) in PREFIX_METRICS.items():
        part = entry.get(sec)
        out[k] = part.get(field) if isinstance(part, dict) else None
    return out


def _prefix_arm_figures(f: Path, arm: Optional[Dict[str, Any]], bs) -> Dict[str, Any]:
    out = _prefix_figures(arm, bs)
    if out["decode_rate"] is None and arm:
        out["decode_rate"] = capped_decode_rate(f, arm, bs)
    return out


def prefix_runs(results) -> List[Dict[str, Any]]:
    """One row per (shared-prefix run, arm kind other than stock, batch): each arm against the run's stock arm
    (and, for our arms, against the same run's upstream arm, which eval.ab writes to another result file)."""
    rows = []
    upstream_of: Dict[Tuple[Any, Any], Dict[str, Any]] = {}  # (model, started) -> upstream arm
    for f, res in results:
        if _shared_prefix(res):
            for label, arm in (res.get("arms") or {}).items():
                if (arm.get("phase") or {}).get("kind") == "upstream":
                    upstream_of[(_setup(res)["model"], res.get("started"))] = dict(arm, label=label)
    for f, res in results:
        if not _shared_prefix(res):
            continue
        bench = res["bench"]
        setup = _setup(res)
        by_kind: Dict[str, Dict[str, Any]] = {}
        for label, arm in (res.get("arms") or {}).items():
            by_kind.setdefault((arm.get("phase") or {}).get("kind", "?"), dict(arm, label=label))
        stock = by_kind.get("stock") or {}
        up = upstream_of.get((setup["model"], res.get("started")), by_kind.get("upstream"))
        pp = (res.get("summary") or {}).get("prefix_parity") or {}
        for kind, arm in by_kind.items():
            if kind == "stock":
                continue
            for bs in [e.get("batch") for e in arm.get("bench") or []] or [None]:
                ours, ref = _prefix_arm_figures(f, arm, bs), _prefix_arm_figures(f, stock, bs)
                ups = _prefix_figures(up, bs)
                rows.append({
                    "file": str(f), "model": setup["model"], "family": setup["family"], "started": res.get("started"),
                    "git_commit": res.get("git_commit"), "radix_cache": bench.get("radix_cache"), "arm": kind,
                    "status": arm.get("status"), "stock_status": stock.get("status"),
                    "command": arm.get("command"), "batch": bs, "spec": setup["spec"] or "none",
                    "max_running": (arm.get("facts") or {}).get("max_running_requests"),
                    "stock_max_running": (stock.get("facts") or {}).get("max_running_requests"),
                    "hit_rate": ours["hit_rate"], "stock_hit_rate": ref["hit_rate"],
                    "hit_rate_vs_stock": report.ratio(ours["hit_rate"], ref["hit_rate"]),
                    "ttft_p50_ms": ours["ttft_p50_ms"], "stock_ttft_p50_ms": ref["ttft_p50_ms"],
                    "ttft_p50_vs_stock": report.ratio(ours["ttft_p50_ms"], ref["ttft_p50_ms"]),
                    "ttft_p50_vs_upstream": report.ratio(ours["ttft_p50_ms"], ups["ttft_p50_ms"])
                    if kind != "upstream" else None,
                    "decode_rate": ours["decode_rate"], "stock_decode_rate": ref["decode_rate"],
                    "decode_rate_vs_stock": report.ratio(ours["decode_rate"], ref["decode_rate"]),
                    "parity_max_abs_dlogprob": (pp.get(arm["label"]) or {}).get("max_abs_dlogprob"),
                    "stock_parity_max_abs_dlogprob": (pp.get(stock.get("label")) or {}).get("max_abs_dlogprob"),
                    "parity_mismatches": (pp.get(arm["label"]) or {}).get("mismatches"),
                    "stock_parity_mismatches": (pp.get(stock.get("label")) or {}).get("mismatches"),
                })
    return rows


def _latest(rows: List[Dict[str, Any]], **match) -> List[Dict[str, Any]]:
    """The rows of the latest run (by start time) whose fields equal ``match``."""
    hits = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    if not hits:
        return []
    last = max(_ts(r["started"]) for r in hits)
    return [r for r in hits if _ts(r["started"]) == last]


def prefix_summary(results) -> Dict[str, Any]:
    """Issue 19's summary keys, each read from the latest run of the model it names (None: not measured)."""
    rows = prefix_runs(results)
    ours = [r for r in rows if r["arm"] == "staged"]
    s: Dict[str, Any] = {}
    defaults = {}
    for model in TARGET_MODELS.values():
        latest = _latest(ours, model=model, radix_cache="default")
        defaults[model] = None if not latest else int(all(r["status"] == "ok" for r in latest))
    s["defaults_launch_ok"] = None if any(v is None for v in defaults.values()) else int(all(defaults.values()))
    s["defaults_launch_by_model"] = defaults
    hit = [r["hit_rate_vs_stock"] for m in TARGET_MODELS.values() for r in _latest(ours, model=m)
           if r["hit_rate_vs_stock"] is not None]
    s["prefix_hit_rate_vs_stock"] = min(hit) if hit else None
    m8 = _latest(ours, model=TARGET_MODELS["mamba2"])
    ttft = [r["ttft_p50_vs_stock"] for r in m8 if r["ttft_p50_vs_stock"] is not None]
    s["ttft_p50_vs_stock"] = max(ttft) if ttft else None
    ups = [r["ttft_p50_vs_upstream"] for r in _latest(ours, model=TARGET_MODELS["gdn"])
           if r["ttft_p50_vs_upstream"] is not None]
    s["ttft_p50_vs_upstream"] = max(ups) if ups else None
    full = [r for r in m8 if r["batch"] == 256 and r["decode_rate_vs_stock"] is not None]
    s["decode_rate_speedup_prefix_bs256"] = full[0]["decode_rate_vs_stock"] if full else None
    tiny = _latest([r for r in ours if r["parity_max_abs_dlogprob"] is not None], model=PREFIX_PARITY_MODEL)
    s["prefix_parity_max_abs_logprob_diff"] = tiny[0]["parity_max_abs_dlogprob"] if tiny else None
    s["prefix_parity_max_abs_logprob_diff_stock"] = tiny[0]["stock_parity_max_abs_dlogprob"] if tiny else None
    s["targets"] = dict(PREFIX_TARGETS)
    used = {r["file"] for r in rows}
    return {"kind": "e2e-prefix-summary", **provenance(results, used), "summary": s, "runs": rows}


def write_prefix(doc: Dict[str, Any], out_dir: Path) -> List[Path]:
    s = doc["summary"]
    paths = [report.write_json(out_dir / "e2e-prefix-h200.json", doc)]
    goal = {"defaults_launch_ok": "= 1", "prefix_hit_rate_vs_stock": ">= 0.98", "ttft_p50_vs_stock": "<= 1.05",
            "ttft_p50_vs_upstream": "<= 0.8", "decode_rate_speedup_prefix_bs256": ">= 1.5",
            "prefix_parity_max_abs_logprob_diff": "<= 0.1"}
    tgt = [[k, report.fmt(s.get(k), 3), goal[k]] for k in PREFIX_TARGETS]

    def status(r: Dict[str, Any]) -> str:
        measured = any(r.get(k) is not None for k in ("hit_rate", "ttft_p50_ms", "decode_rate"))
        return r["status"] if measured or r["status"] != "ok" else "ok, nothing measured"

    def running(r: Dict[str, Any]) -> str:
        return f"{r.get('max_running') or '—'} / {r.get('stock_max_running') or '—'}"

    rows = [[r["model"], r["arm"], r["radix_cache"], r.get("spec", "none"), r["batch"], running(r), status(r),
             report.fmt(r["hit_rate"], 3),
             report.fmt(r["stock_hit_rate"], 3), report.fmt(r["ttft_p50_ms"], 0), report.fmt(r["stock_ttft_p50_ms"], 0),
             report.fmt(r["decode_rate_vs_stock"], 3), report.fmt(r["parity_max_abs_dlogprob"], 3),
             report.fmt(r["stock_parity_max_abs_dlogprob"], 3), f"{Path(r['file']).parent.name} ({r['git_commit']})"]
            for r in doc["runs"]]
    paths.append(report.write_markdown(out_dir / "e2e-prefix-h200.md", "Prefix caching on the H200", [
        _source_section(doc),
        ("Targets (each read from the latest run of the model it names; — : not measured yet)",
         report.markdown_table(["metric", "measured", "goal"], tgt)),
        ("Runs (`--workload shared-prefix`; ratios are ours over stock's)",
         report.markdown_table(["model", "arm", "radix", "spec", "batch", "max running (arm / stock)", "status",
                                "hit rate", "stock hit rate", "TTFT p50 ms", "stock TTFT p50 ms",
                                "decode rate vs stock", "hit-vs-cold max |Δlogprob|", "stock's", "folder (commit)"],
                               rows)
         + "\n\nThe decode rate is SGLang's own (its scheduler's `Decode batch` lines) at a full batch: the batch, or "
         "each server's max running requests where that is lower (eval/ab/decode_rate.py)."
         if rows else "not run yet"),
    ]))
    runs = [r for r in doc["runs"] if r["arm"] == "staged"]
    if runs and report.plot_panels(out_dir / "e2e-prefix-h200.png", [
            {"title": "prefix caching, ours / stock (H200)", "kind": "bar", "xrotation": 15,
             "categories": [f"{r['model']} b{r['batch']}" for r in runs],
             "series": [{"label": "cache hit rate", "y": [r["hit_rate_vs_stock"] for r in runs]},
                        {"label": "TTFT p50", "y": [r["ttft_p50_vs_stock"] for r in runs]},
                        {"label": "decode rate", "y": [r["decode_rate_vs_stock"] for r in runs]}],
             "ylabel": "ratio", "hline": 1.0}]):
        paths.append(out_dir / "e2e-prefix-h200.png")
    return paths


# issue 20's EAGLE targets: Nemotron-H-8B with the separate dummy-weight EAGLE draft, a tree of topk 4 / 8 draft
# tokens and a chain (topk 1) at batch 64; greedy excess = ours minus stock's own spec-vs-non-spec mismatches (trees)
EAGLE_TARGETS = {"tree_vs_stock_tree_bs64": 1.5, "tree_capacity_ratio": 4.0, "eagle_chain_vs_stock_bs64": 1.5,
                 "tree_greedy_excess_mismatches": 0}
EAGLE_MODEL = "nemotron-h-8b"
EAGLE_TREE_TOPK = 4


def eagle_summary(results) -> Dict[str, Any]:
    """Issue 20's keys from the EAGLE runs (``--spec eagle``), each from the model's latest run of that shape."""
    doc = spec_summary(results, eagle=True)
    speed = doc["speed"]

    def pick(topk: int, key: str, batch: Optional[int] = None) -> Optional[float]:
        rows = [r for r in speed if r["model"] == EAGLE_MODEL and r["spec_topk"] == topk and key in r["latest_for"]
                and r[key] is not None and (batch is None or r["batch"] == batch)]
        return rows[0][key] if rows else None

    tree_runs = [r for r in doc["runs"] if r.get("greedy_target_run") and (r.get("spec_topk") or 1) > 1]
    ours = [r["spec_vs_nonspec"].get(r["arms"].split(" vs ")[0]) for r in tree_runs]
    stock = [r["spec_vs_nonspec"].get(r["arms"].split(" vs ")[1]) for r in tree_runs]
    excess = None
    if tree_runs and all(ours) and all(stock):
        excess = sum(e["token_mismatches"] for e in ours) - sum(e["token_mismatches"] for e in stock)
    paths = pinned_path_runs(doc["runs"])
    summary = {"tree_vs_stock_tree_bs64": pick(EAGLE_TREE_TOPK, "spec_vs_stock_spec", 64),
               "tree_capacity_ratio": pick(EAGLE_TREE_TOPK, "capacity_ratio"),
               "eagle_chain_vs_stock_bs64": pick(1, "spec_vs_stock_spec", 64),
               "tree_greedy_excess_mismatches": excess,
               "tree_greedy_mismatches": sum(e["token_mismatches"] for e in ours) if tree_runs and all(ours) else None,
               "tree_stock_greedy_mismatches": sum(e["token_mismatches"] for e in stock)
               if tree_runs and all(stock) else None,
               # not a target: the latest pinned-token tree run's top-k |dlogprob| spec vs non-spec, ours - stock's
               "tree_path_topk_dlogprob_excess": paths[-1]["topk_dlogprob_excess"] if paths else None,
               "targets": dict(EAGLE_TARGETS)}
    return {**doc, "schema": "replayssm-e2e-tree/1", "summary": summary, "pinned_paths": paths}


def pinned_path_runs(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Tree runs with a pinned greedy token (eval.ab --pinned-token, no simulated acceptance): the drafts are
    accepted along real tree paths, so each arm's speculative top-k logprobs against stock's non-speculative ones
    show whether its verify computed the accepted path's outputs as sequential decoding does.  Per run, oldest
    first: each arm's accept length, token mismatches (0 by construction) and max |dlogprob| (chosen token,
    top-k), and ours minus stock's top-k figure."""
    out = []
    for r in sorted(runs, key=lambda r: str(r.get("started") or "")):
        if r.get("pinned_token") is None or (r.get("spec_topk") or 1) <= 1 or not r["spec_vs_nonspec"]:
            continue
        ours_label, stock_label = r["arms"].split(" vs ")
        ours, stock = r["spec_vs_nonspec"].get(ours_label), r["spec_vs_nonspec"].get(stock_label)
        acc = r.get("accept_length") or {}
        row = {"model": r["model"], "spec_topk": r["spec_topk"], "spec_draft_tokens": r["spec_draft_tokens"],
               "pinned_token": r["pinned_token"], "file": r["file"], "started": r["started"],
               "accept_length": {k: acc.get(k) for k in (ours_label, stock_label)}}
        for name, e in (("ours", ours), ("stock", stock)):
            row[f"{name}_token_mismatches"] = (e or {}).get("token_mismatches")
            row[f"{name}_max_dlogprob"] = (e or {}).get("max_abs_logprob_diff")
            row[f"{name}_max_dlogprob_topk"] = (e or {}).get("max_abs_logprob_diff_topk")
        a, b = row["ours_max_dlogprob_topk"], row["stock_max_dlogprob_topk"]
        row["topk_dlogprob_excess"] = a - b if a is not None and b is not None else None
        out.append(row)
    return out


def write_eagle(doc: Dict[str, Any], out_dir: Path) -> List[Path]:
    s = doc["summary"]
    paths = [report.write_json(out_dir / "e2e-tree-h200.json", doc)]
    goal = {"tree_vs_stock_tree_bs64": ">= 1.5", "tree_capacity_ratio": ">= 4", "eagle_chain_vs_stock_bs64": ">= 1.5",
            "tree_greedy_excess_mismatches": "<= 0"}
    tgt = [[k, report.fmt(s.get(k), 3), goal[k]] for k in EAGLE_TARGETS]
    def decode(r, arm):  # SGLang's decode rate, with the batch it was read at when that is not the run's
        rate, at = r.get(f"{arm}_decode_tok_s"), r.get(f"{arm}_decode_full_batch")
        if rate is None:
            return "—"
        return report.fmt(rate, 0) + (f" (at {at})" if at not in (None, r["batch"]) else "") + \
            (" *" if r.get(f"{arm}_client_path_bound") else "")

    speed = [[r["model"], r["spec_topk"], r["spec_draft_tokens"] or "—", r["batch"],
              report.fmt(r["sim_acc_len"], 1) if r.get("sim_acc_len") else "no (real drafts)",
              report.fmt(r["staged_tok_s"], 0),
              report.fmt(r["stock_spec_tok_s"], 0), report.fmt(r["spec_vs_stock_spec"], 3),
              decode(r, "staged"), decode(r, "stock"),
              f"{report.fmt(r['capacity_ratio'], 2)} ({r.get('max_running_staged')} / {r.get('max_running_stock')})"
              if r["capacity_ratio"] is not None else "—", f"{Path(r['file']).parent.name}"] for r in doc["speed"]]
    runs = [[r["model"], r.get("spec_topk"), r["arms"],
             "; ".join(f"{k}: {v['token_mismatches']} mismatches" for k, v in r["spec_vs_nonspec"].items()),
             "counted" if r.get("greedy_target_run") else ""] for r in doc["runs"] if r["spec_vs_nonspec"]]
    paths.append(report.write_markdown(out_dir / "e2e-tree-h200.md", "EAGLE speculation (separate draft, chains and "
                                       "trees) on the H200", [
        _source_section(doc),
        ("Targets (— : not measured yet)", report.markdown_table(["metric", "measured", "goal"], tgt)),
        ("Speed (output tokens/s; acceptance simulated where a length is given, else the draft model's own)",
         "Both servers of a run get the same flags. The client's output tok/s (replay, stock, vs stock) sits beside "
         "SGLang's own decode rate at a full batch (its scheduler log; *at N*: read at the server's running cap N, "
         "below the concurrency; \\*: the client's rate at a full batch is more than 10% off it, "
         "eval/ab/decode_rate.py). Max running requests are each server's own: stock keeps SGLang's speculative "
         "default of 48 (its memory solve reserves a full SSM state per draft node); ours, since 613b089, is solved "
         "from memory and capped at the decode CUDA-graph batch (the tiny runs at 848245c kept 48).\n\n" +
         report.markdown_table(["model", "topk", "draft tokens", "batch", "simulated accept", "replay", "stock",
                                "vs stock", "replay decode", "stock decode",
                                "capacity ratio (max running)", "folder"], speed) if speed else "not run yet"),
        ("Greedy spec vs non-spec (tiny models, no simulation)",
         report.markdown_table(["model", "topk", "arms", "mismatches", "in the key"], runs) if runs else "not run yet"),
        ("Tree paths (pinned greedy token: `eval.ab --pinned-token`, drafts accepted along real tree paths)",
         "Every greedy pick is one token by construction (eval/weights.py `pin_argmax_`), so the tokens cannot "
         "differ; the top-k logprobs depend on every layer's output along the accepted path. Each arm's speculative "
         "run against stock's non-speculative one.\n\n" +
         report.markdown_table(["model", "topk", "draft tokens", "accept length (ours / stock)",
                                "max |Δlogprob| top-k, ours", "stock", "ours - stock", "folder"],
                               [[p["model"], p["spec_topk"], p["spec_draft_tokens"],
                                 " / ".join(report.fmt(v, 2) for v in p["accept_length"].values()),
                                 report.fmt(p["ours_max_dlogprob_topk"], 4), report.fmt(p["stock_max_dlogprob_topk"], 4),
                                 report.fmt(p["topk_dlogprob_excess"], 4), Path(p["file"]).parent.name]
                                for p in doc.get("pinned_paths") or []])
         if doc.get("pinned_paths") else "not run yet"),
    ]))
    pts = [r for r in doc["speed"] if r["spec_vs_stock_spec"] is not None and r.get("latest_for")]
    if pts and report.plot_panels(out_dir / "e2e-tree-h200.png", [
            {"title": "EAGLE, separate draft: ours / stock SGLang (H200)",
             "kind": "bar", "ylabel": "ratio", "hline": 1.0,
             "categories": [f"{r['model']}\ntopk {r['spec_topk']}, batch {r['batch']}" for r in pts],
             "series": [{"label": "client output tok/s", "y": [r["spec_vs_stock_spec"] for r in pts]},
                        {"label": "max running requests", "y": [r["capacity_ratio"] for r in pts]}]}]):
        paths.append(out_dir / "e2e-tree-h200.png")
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="result directories or ab-*.json[.gz] files")
    p.add_argument("--out-dir", default="eval/results")
    args = p.parse_args(argv)
    results = load_results(Path(x) for x in args.inputs)
    if not results:
        p.error(f"no eval.ab result JSON under {args.inputs}")
    out = Path(args.out_dir)
    written = write_parity(parity_summary(results), out) + write_decode(decode_speed(results), out) \
        + write_spec(spec_summary(results), out) + write_prefix(prefix_summary(results), out) \
        + write_eagle(eagle_summary(results), out)
    for w in written:
        print(f"wrote {w}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
