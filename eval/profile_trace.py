"""GPU kernel time per forward step from a torch-profiler trace of an SGLang server.

``python -m eval.ab --profile-batch B`` asks each server for a trace (SGLang's ``/start_profile`` with
``activities: ["GPU"]``, ``num_steps`` forward steps, started a moment into a batch-B benchmark so the batch
is full); this module reads the Chrome trace it writes (``*.trace.json.gz``) and reduces it to what the A/B
needs to say where a step's time goes:

* ``span_us``: first kernel start to last kernel end, ``kernel_us``: the summed kernel time (memcpy and
  memset included), ``busy_fraction`` = kernel_us / span_us (well below 1: the GPU waits on the host);
* ``by_group``: kernel time per forward step in coarse groups (SSM, conv, attention, GEMM, MoE, norm, ...)
  matched on kernel names, ours and SGLang's; ``top``: the largest kernels by time per step.

Kernels inside CUDA graphs are traced one by one (CUPTI records graph kernel nodes).  The whole-window numbers
divide by the number of steps asked for, and a window can hold prefill steps in one arm and none in the other
(a faster arm reaches its next wave of arrivals sooner), so they are not comparable on their own.  Hence also
``decode_steps``: the window is cut into whole forward steps at the kernel that ends every step (the greedy
sampler's argmax: eval.ab serves with ``--sampling-backend pytorch`` and greedy requests), a step with any
prefill kernel (chunked scan, chunked GDN, ragged prefill attention) is a prefill step, and the rest are
summarised per decode step, with each step's wall time (step end to step end, host gaps included).

    python -m eval.profile_trace TRACE.json.gz [--steps N] [--vs OTHER.json.gz]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

# (group, pattern on the kernel name), first match wins; "other" catches the rest
GROUPS: Tuple[Tuple[str, str], ...] = (
    # ours are named _mamba2_*/_gdn_* from the start (SGLang's fused_gdn_gating, fused_qkv_split_gdn_prefill are not)
    ("ssm replay (ours)", r"^_(mamba2|gdn)_\w*kernel|^_spec_commit|^_reset_cursor|^_decode_cursor"),
    ("ssm stock", r"selective_scan|selective_state|gated_delta|delta_rule|fused_recurrent|_chunk_(state|scan|cumsum)"
                  r"|_state_passing|_bmm_chunk|replay_state"),
    ("conv1d", r"conv1d"),
    ("attention", r"flashinfer|BatchDecode|BatchPrefill|PrefillWith|DecodeWith|attention|_fwd_kernel|_fwd_grouped"
                  r"|decode_attn|merge_state|kv_indices"),
    ("moe", r"moe|topk|expert|router"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|sm90_|matmul|splitK|splitk"),
    ("norm", r"norm"),
    ("sampling / logits", r"sampl|softmax|argmax|logit|top_k|top_p|penalt"),
    ("memcpy / memset", r"^Memcpy|^Memset|memcpy|memset"),
)
KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
DECODE_WALL = "step wall (step end to step end)"
# the kernel that ends every forward step (greedy sampling under --sampling-backend pytorch), and the kernels only
# a prefill (extend) step runs: SGLang's chunked Mamba2 scan, its chunked GDN (fla) kernels, the ragged prefill
# attention.  flashinfer's BatchPrefillWithPagedKVCache also serves decode (tensor-core decode): not a marker.
STEP_END = r"ArgMax"
PREFILL = (r"_chunk_(state|scan|cumsum)|_state_passing|_bmm_chunk|causal_conv1d_fwd|(^|[^A-Za-z])chunk_"
           r"|recompute_w_u|gdn_prefill|RaggedParams")


def load_events(path: Path) -> List[Dict[str, Any]]:
    """The trace's complete events (``ph: X``) on the GPU: kernels, memcpy, memset."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    events = doc.get("traceEvents", doc) if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in KERNEL_CATS]


def group_of(name: str) -> str:
    for group, pat in GROUPS:
        if re.search(pat, name, flags=re.IGNORECASE):
            return group
    return "other"


def summarize(events: Iterable[Dict[str, Any]], steps: int, top: int = 25) -> Dict[str, Any]:
    """Kernel time per step by group and by kernel name (``steps`` >= 1 forward steps in the window)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    events = list(events)
    if not events:
        return {"steps": steps, "kernels": 0, "span_us": 0.0, "kernel_us": 0.0, "busy_fraction": None,
                "by_group": {}, "top": []}
    start = min(float(e["ts"]) for e in events)
    end = max(float(e["ts"]) + float(e.get("dur", 0.0)) for e in events)
    total: Dict[str, float] = defaultdict(float)
    calls: Dict[str, int] = defaultdict(int)
    for e in events:
        total[e["name"]] += float(e.get("dur", 0.0))
        calls[e["name"]] += 1
    by_group: Dict[str, float] = defaultdict(float)
    for name, us in total.items():
        by_group[group_of(name)] += us
    kernel_us = sum(total.values())
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:top]
    return {"steps": steps, "kernels": len(events), "span_us": end - start, "kernel_us": kernel_us,
            "busy_fraction": kernel_us / (end - start) if end > start else None,
            "span_us_per_step": (end - start) / steps, "kernel_us_per_step": kernel_us / steps,
            "by_group": {g: us / steps for g, us in sorted(by_group.items(), key=lambda kv: -kv[1])},
            "top": [{"name": n, "group": group_of(n), "us_per_step": us / steps, "calls_per_step": calls[n] / steps}
                    for n, us in ranked]}


def split_steps(events: Iterable[Dict[str, Any]], step_end: str = STEP_END,
                prefill: str = PREFILL) -> List[Tuple[str, float, List[Dict[str, Any]]]]:
    """The window's whole forward steps as (kind, wall_us, events): a step is every event that starts after one
    step-end kernel ends, up to the end of the next one; the partial steps before the first and after the last
    step-end kernel are dropped.  kind is "prefill" when a kernel of the step matches ``prefill``, else "decode"."""
    evs = sorted(events, key=lambda e: float(e["ts"]))
    end_re, pre_re = re.compile(step_end), re.compile(prefill, flags=re.IGNORECASE)
    ends = [float(e["ts"]) + float(e.get("dur", 0.0)) for e in evs if end_re.search(e["name"])]
    steps: List[List[Dict[str, Any]]] = [[] for _ in range(max(0, len(ends) - 1))]
    for e in evs:
        i = bisect.bisect_left(ends, float(e["ts"]))  # the first step end at or after this event's start
        if 1 <= i < len(ends):
            steps[i - 1].append(e)
    return [("prefill" if any(pre_re.search(e["name"]) for e in st) else "decode", ends[i + 1] - ends[i], st)
            for i, st in enumerate(steps)]


SPEC_UNSPLIT = "not split: a speculative step runs the sampler's argmax more than once"


def unsplit(p: Dict[str, Any]) -> None:
    """Drop a profile's step split (a speculative server: draft, verify and draft-extend each sample)."""
    p.pop("decode_steps", None)
    p["step_split"] = {"skipped": SPEC_UNSPLIT}


def decode_step_summary(events: Iterable[Dict[str, Any]], top: int = 25) -> Dict[str, Any]:
    """How the window splits into steps, and (when it holds any) the decode steps alone: kernel time per decode
    step by group, ``span_us_per_step`` the mean step wall time, ``busy_fraction`` kernel time over wall time."""
    split = split_steps(events)
    dec = [(wall, st) for kind, wall, st in split if kind == "decode"]
    out: Dict[str, Any] = {"step_split": {
        "step_end": STEP_END, "steps": len(split), "decode": len(dec), "prefill": len(split) - len(dec),
        "prefill_wall_us": [wall for kind, wall, _ in split if kind == "prefill"]}}
    if dec:
        wall = sum(w for w, _ in dec)
        d = summarize([e for _, st in dec for e in st], len(dec), top)
        d.update(span_us=wall, span_us_per_step=wall / len(dec),
                 busy_fraction=d["kernel_us"] / wall if wall > 0 else None)
        out["decode_steps"] = d
    return out


def summarize_file(path: Path, steps: int, top: int = 25) -> Dict[str, Any]:
    events = load_events(Path(path))
    return {"trace": Path(path).name, **summarize(events, steps, top), **decode_step_summary(events, top)}


def reduce_trace(path: Path, steps: int, top: int = 25, spec: bool = False) -> Dict[str, Any]:
    """What eval.ab records of one trace: :func:`summarize_file`, an ``error`` when it holds no GPU kernel,
    and no step split for a speculative server (:func:`unsplit`)."""
    out = summarize_file(path, steps, top)
    if out["kernels"] == 0:
        out["error"] = f"no GPU kernel events in {Path(path).name}"
    if spec:
        unsplit(out)
    return out


def compare_groups(a: Dict[str, Any], b: Dict[str, Any],
                   span_label: str = "span (first to last kernel)") -> List[List[Any]]:
    """Rows [group, a us/step, b us/step, b - a] over the groups either summary has, largest first,
    then the totals (kernel time and span per step; ``span_label`` names the latter: a decode-step summary's
    span is its mean step wall time)."""
    ga, gb = a.get("by_group") or {}, b.get("by_group") or {}
    groups = sorted(set(ga) | set(gb), key=lambda g: -max(ga.get(g, 0.0), gb.get(g, 0.0)))
    rows = [[g, ga.get(g, 0.0), gb.get(g, 0.0), gb.get(g, 0.0) - ga.get(g, 0.0)] for g in groups]
    for key, label in (("kernel_us_per_step", "all kernels"), ("span_us_per_step", span_label)):
        if a.get(key) is not None and b.get(key) is not None:
            rows.append([label, a[key], b[key], b[key] - a[key]])
    return rows


def step_line(s: Dict[str, Any]) -> str:
    """One line on a summary's step split (and its decode steps' kernel time and wall time)."""
    sp = s.get("step_split") or {}
    d = s.get("decode_steps")
    if sp.get("skipped"):
        return f"{s.get('trace', 'trace')}: {sp['skipped']}"
    if not sp.get("steps"):
        return f"{s.get('trace', 'trace')}: no whole steps found (no two {STEP_END} kernels)"
    line = f"{s.get('trace', 'trace')}: {sp['steps']} whole steps, {sp['decode']} decode, {sp['prefill']} prefill"
    if d:
        line += (f"; per decode step {d['kernel_us_per_step']:.0f} us of kernels over {d['span_us_per_step']:.0f} us "
                 f"(busy {100 * (d['busy_fraction'] or 0):.0f}%)")
    return line


def find_trace(directory: Path) -> Optional[Path]:
    """The newest ``*.trace.json.gz`` under ``directory`` (SGLang names it ``<profile id>-TP-0.trace.json.gz``)."""
    found = sorted((p for p in Path(directory).rglob("*.trace.json*") if p.name.endswith((".json", ".json.gz"))),
                   key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _table(heads: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    from eval import report

    return report.text_table(list(heads), [[report.fmt(x, 1) if isinstance(x, float) else x for x in r] for r in rows])


def rereduce(res: Dict[str, Any], logs: Path, top: int = 25) -> int:
    """Reduce an eval.ab result's profiles again from their traces under ``logs`` (the run's log directory, where
    each profile's ``trace`` path is relative to), in place; returns how many were redone.  A trace that is not
    there leaves its profile as it was."""
    done = 0
    for arm in (res.get("arms") or {}).values():
        spec = bool((arm.get("phase") or {}).get("spec"))
        for p in arm.get("profiles") or []:
            rel = p.get("trace")
            hits = [Path(logs) / rel] if rel else []
            hits += sorted(Path(logs).rglob(Path(rel).name)) if rel else []
            trace = next((h for h in hits if h.is_file()), None)
            if trace is None:
                continue
            keep = {k: p[k] for k in ("batch", "steps", "delay_s", "bench_ok", "start_profile") if k in p}
            p.clear()
            p.update(keep, **reduce_trace(trace, int(keep.get("steps") or 1), top, spec))
            p["trace"] = rel
            done += 1
    return done


def main(argv: Optional[List[str]] = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--rereduce"]:
        return _rereduce_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m eval.profile_trace", description=__doc__.split("\n\n")[0])
    ap.epilog = ("python -m eval.profile_trace --rereduce RESULT.json[.gz] LOGS_DIR [--out FILE]: reduce an eval.ab "
                 "result's profiles again from the traces under the run's log directory (after a change here)")
    ap.add_argument("trace", help="torch-profiler Chrome trace (.json or .json.gz) of an SGLang server")
    ap.add_argument("--steps", type=int, default=1, help="forward steps in the traced window (per-step division)")
    ap.add_argument("--vs", default=None, help="a second trace of the same number of steps: per-group differences")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default=None, help="write the summary (and the comparison) here")
    args = ap.parse_args(argv)
    a = summarize_file(Path(args.trace), args.steps, args.top)
    out: Dict[str, Any] = {"a": a}
    print(f"{a['trace']}: {a['kernels']} GPU events, kernel time {a['kernel_us']:.0f} us over a span of "
          f"{a['span_us']:.0f} us (busy {100 * (a['busy_fraction'] or 0):.1f}%)")
    print(_table(["kernel", "group", "us/step", "calls/step"],
                 [[t["name"][:80], t["group"], t["us_per_step"], t["calls_per_step"]] for t in a["top"]]))
    print(step_line(a))
    if args.vs:
        b = summarize_file(Path(args.vs), args.steps, args.top)
        out["b"] = b
        print(step_line(b))
        rows = compare_groups(a, b)
        out["groups"] = rows
        print("whole window:")
        print(_table(["group", a["trace"][:30], b["trace"][:30], "difference"], rows))
        if a.get("decode_steps") and b.get("decode_steps"):
            out["decode_groups"] = compare_groups(a["decode_steps"], b["decode_steps"], DECODE_WALL)
            print("decode steps only:")
            print(_table(["group", a["trace"][:30], b["trace"][:30], "difference"], out["decode_groups"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def _rereduce_main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.profile_trace --rereduce",
                                 description="Reduce an eval.ab result's profiles again from the run's traces.")
    ap.add_argument("result", help="eval.ab result JSON (.json or .json.gz)")
    ap.add_argument("logs", help="the run's log directory (the profiles' trace paths are relative to it)")
    ap.add_argument("--out", default=None, help="write here (default: over the result)")
    args = ap.parse_args(argv)
    from eval import report

    res = report.read_json(args.result)
    n = rereduce(res, Path(args.logs))
    out = args.out or args.result
    report.write_json(out, res)
    print(f"{n} profile(s) reduced again from their traces; wrote {out}")
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
