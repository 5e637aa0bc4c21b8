"""GPU kernel time per forward step from a torch-profiler trace of an SGLang server.

``python -m eval.ab --profile-batch B`` asks each server for a trace (SGLang's ``/start_profile`` with
``activities: ["GPU"]``, ``num_steps`` forward steps, started a moment into a batch-B benchmark so the batch
is full); this module reads the Chrome trace it writes (``*.trace.json.gz``) and reduces it to what the A/B
needs to say where a step's time goes:

* ``span_us``: first kernel start to last kernel end, ``kernel_us``: the summed kernel time (memcpy and
  memset included), ``busy_fraction`` = kernel_us / span_us (well below 1: the GPU waits on the host);
* ``by_group``: kernel time per forward step in coarse groups (SSM, conv, attention, GEMM, MoE, norm, ...)
  matched on kernel names, ours and SGLang's; ``top``: the largest kernels by time per step.

Kernels inside CUDA graphs are traced one by one (CUPTI records graph kernel nodes).  Per-step numbers divide
by the number of steps asked for; the profiled window can start inside a step, so compare arms traced the
same way rather than reading a per-step figure as exact.

    python -m eval.profile_trace TRACE.json.gz [--steps N] [--vs OTHER.json.gz]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

# (group, pattern on the kernel name), first match wins; "other" catches the rest
GROUPS: Tuple[Tuple[str, str], ...] = (
    ("ssm replay (ours)", r"_mamba2_|_gdn_|_spec_commit|_reset_cursor"),
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


def summarize_file(path: Path, steps: int, top: int = 25) -> Dict[str, Any]:
    return {"trace": Path(path).name, **summarize(load_events(Path(path)), steps, top)}


def compare_groups(a: Dict[str, Any], b: Dict[str, Any]) -> List[List[Any]]:
    """Rows [group, a us/step, b us/step, b - a] over the groups either summary has, largest first,
    then the totals (kernel time and span per step)."""
    ga, gb = a.get("by_group") or {}, b.get("by_group") or {}
    groups = sorted(set(ga) | set(gb), key=lambda g: -max(ga.get(g, 0.0), gb.get(g, 0.0)))
    rows = [[g, ga.get(g, 0.0), gb.get(g, 0.0), gb.get(g, 0.0) - ga.get(g, 0.0)] for g in groups]
    for key, label in (("kernel_us_per_step", "all kernels"), ("span_us_per_step", "span (first to last kernel)")):
        if a.get(key) is not None and b.get(key) is not None:
            rows.append([label, a[key], b[key], b[key] - a[key]])
    return rows


def find_trace(directory: Path) -> Optional[Path]:
    """The newest ``*.trace.json.gz`` under ``directory`` (SGLang names it ``<profile id>-TP-0.trace.json.gz``)."""
    found = sorted((p for p in Path(directory).rglob("*.trace.json*") if p.name.endswith((".json", ".json.gz"))),
                   key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _table(heads: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    from eval import report

    return report.text_table(list(heads), [[report.fmt(x, 1) if isinstance(x, float) else x for x in r] for r in rows])


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.profile_trace", description=__doc__.split("\n\n")[0])
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
    if args.vs:
        b = summarize_file(Path(args.vs), args.steps, args.top)
        out["b"] = b
        rows = compare_groups(a, b)
        out["groups"] = rows
        print(_table(["group", a["trace"][:30], b["trace"][:30], "difference"], rows))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
