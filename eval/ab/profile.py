"""Profiled runs: one bench_serving run with SGLang's torch profiler on for a window of forward steps, the
trace reduced by eval/profile_trace.py to kernel time per step.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Dict, List

from eval.ab.servers import http_post


def run_profile(url: str, driver, bench_argv: List[str], tdir: Path, *, batch: int, steps: int, delay_s: float,
                deadline: float, bench_timeout: float, spec: bool = False) -> Dict[str, Any]:
    """One bench_serving run (``bench_argv``, at concurrency ``batch``) with SGLang's torch profiler on for
    ``steps`` forward steps, started ``delay_s`` into the run (GPU kernels only, no stacks), then the trace
    reduced by eval/profile_trace.py.  The run's throughput is not a speed result (the profiler perturbs it)."""
    from eval import profile_trace

    tdir.mkdir(parents=True, exist_ok=True)
    out: Dict[str, Any] = {"batch": batch, "steps": steps, "delay_s": delay_s}
    req = {"output_dir": str(tdir.resolve()), "num_steps": steps, "activities": ["GPU"],
           "with_stack": False, "record_shapes": False, "profile_by_stage": False}
    posted: Dict[str, Any] = {}

    def start() -> None:
        time.sleep(delay_s)
        try:
            code, text = http_post(url + "/start_profile", req, timeout=max(10.0, deadline - time.time()))
            if code != 200:
                posted["error"] = f"/start_profile answered {code}: {text[:200]}"
        except Exception as e:  # noqa: BLE001 - recorded below
            posted["error"] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=start, daemon=True)
    t.start()
    res = driver.run(bench_argv, timeout=min(bench_timeout, max(10.0, deadline - time.time())))
    t.join(timeout=max(1.0, min(120.0, deadline - time.time())))
    out.update(bench_ok=res.get("ok"), start_profile=posted.get("error") or "ok")
    until = min(time.time() + 60.0, deadline)
    while True:  # SGLang writes the trace after the last traced step
        trace = profile_trace.find_trace(tdir)
        if trace is not None or time.time() >= until or "error" in posted:
            break
        time.sleep(1.0)
    if trace is None:
        out["error"] = posted.get("error") or f"no trace under {tdir}"
        return out
    for _ in range(5):  # the exporter may still be writing it
        try:
            reduced = profile_trace.reduce_trace(trace, steps, spec=spec)
            out.pop("error", None)
            out.update(reduced, trace=str(trace))
            break
        except (OSError, ValueError, EOFError) as e:
            out["error"] = f"unreadable trace {trace.name}: {type(e).__name__}: {e}"
            time.sleep(2.0)
    return out
