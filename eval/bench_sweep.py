"""Run ``sglang.bench_serving`` several times from one Python process.

``python -m sglang.bench_serving ARGS`` imports transformers and half of ``sglang.srt``
(10-30 s) before it sends a request.  The A/B harness runs it for every batch size of every
server, so it keeps one process that has imported it and runs SGLang's own command-line
entry (``cli_main``: the same argument parser, the same code) once per job, with
``sys.argv`` set to the job's arguments.  Each job is exactly
``python -m sglang.bench_serving <argv>``.

    python -m eval.bench_sweep --serve           # jobs as JSON lines on stdin
    python -m eval.bench_sweep -- ARGS...        # one run (same as sglang.bench_serving)

Protocol (``--serve``): the driver prints ``@@BENCH_SWEEP {"event": "ready", ...}`` once
imported, then reads ``{"argv": [...], "id": ...}`` per line and answers
``@@BENCH_SWEEP {"event": "done", "id": ..., "ok": bool, "seconds": s, "error": ...}``.
Everything else on stdout/stderr is bench_serving's own output.

``bench_serving`` imports HF ``datasets`` at module level (for the MMMU dataset only); the
offline GPU bundle does not ship it.  When it cannot be imported, ``eval/_shims`` (a
``datasets`` module whose ``load_dataset`` raises) is put on ``sys.path`` and the ready
event says ``"datasets_shim": true``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import List, Optional

PREFIX = "@@BENCH_SWEEP "
SHIM_DIR = Path(__file__).resolve().parent / "_shims"


def emit(obj) -> None:
    sys.stdout.flush()
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def parse_event(line: str) -> Optional[dict]:
    line = line.rstrip("\n")
    if not line.startswith(PREFIX):
        return None
    try:
        return json.loads(line[len(PREFIX):])
    except ValueError:
        return None


def need_datasets_shim() -> bool:
    return importlib.util.find_spec("datasets") is None


def load_cli():
    """Import SGLang's bench_serving entry; returns (cli_main, info)."""
    shim = need_datasets_shim()
    if shim:
        sys.path.insert(0, str(SHIM_DIR))
    t0 = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        try:
            from sglang.benchmark.serving import cli_main  # 0.5.17 location
            module = "sglang.benchmark.serving"
        except ImportError:
            from sglang.bench_serving import cli_main  # older layout
            module = "sglang.bench_serving"
    return cli_main, {"module": module, "import_s": round(time.time() - t0, 2), "datasets_shim": shim}


def run_job(cli_main, argv: List[str]) -> dict:
    t0 = time.time()
    old = sys.argv
    sys.argv = ["sglang.bench_serving"] + list(argv)
    try:
        cli_main()
        ok, err = True, None
    except SystemExit as e:  # argparse errors, "server not ready" exits
        ok, err = (e.code in (0, None)), f"SystemExit({e.code})"
    except BaseException as e:  # noqa: BLE001 - report, keep serving
        ok, err = False, f"{type(e).__name__}: {e}\n" + traceback.format_exc(limit=6)
    finally:
        sys.argv = old
    return {"ok": ok, "seconds": round(time.time() - t0, 2), "error": err}


def serve() -> int:
    try:
        cli_main, info = load_cli()
    except BaseException as e:  # noqa: BLE001
        emit({"event": "ready", "ok": False, "error": f"{type(e).__name__}: {e}",
              "traceback": traceback.format_exc(limit=12)})
        return 1
    emit(dict(info, event="ready", ok=True, pid=os.getpid()))
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            job = json.loads(line)
        except ValueError:
            emit({"event": "done", "ok": False, "error": f"bad job line: {line[:200]}"})
            continue
        if job.get("quit"):
            break
        res = run_job(cli_main, job["argv"])
        emit(dict(res, event="done", id=job.get("id")))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve"]:
        return serve()
    if argv[:1] == ["--"]:
        argv = argv[1:]
    cli_main, info = load_cli()
    print(f"bench_sweep: {info}", file=sys.stderr)
    res = run_job(cli_main, argv)
    if res["error"]:
        print(res["error"], file=sys.stderr)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
