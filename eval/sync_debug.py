"""Host-sync census of SGLang server processes (A/B harness, test only): ``eval.ab --sync-debug``.

A host sync in the decode loop (a ``.item()``, ``.tolist()``, ``bool(tensor)``, ``nonzero`` on a CUDA tensor)
makes the CPU wait for the GPU, so SGLang's overlap scheduler can no longer prepare the next batch while the
current one runs: at small batches the step then costs CPU time plus GPU time instead of the larger of the two.
With ``REPLAYSSM_EVAL_SYNC_DEBUG=1`` every spawned SGLang process turns on PyTorch's sync debug mode
(``torch.cuda.set_sync_debug_mode("warn")``) and counts the warnings it raises by call site (the Python line
that made the synchronizing call).  Every ``REPORT_EVERY_S`` seconds in which the counts changed, the process
prints one line to its log (the server log the harness keeps)::

    replayssm-eval: host syncs by call site (pid N, cumulative): file.py:123 x4567, other.py:89 x12

so the sites that fire once per decode step stand out by their counts; comparing the stock and the replay
server's lines shows which syncs one of them adds.  Syncs PyTorch does not see (Triton launches, explicit
``torch.cuda.synchronize``) are not counted.  Registered beside the random-weights hook (eval/entry_points.py);
inert unless the variable is set, and never in the launcher process.
"""

from __future__ import annotations

import os
import time
import warnings
from collections import Counter
from typing import Dict, Optional

ENV = "REPLAYSSM_EVAL_SYNC_DEBUG"
MARKER = "replayssm-eval: host syncs by call site"
REPORT_EVERY_S = 10.0
TOP = 12  # call sites per report line
SYNC_TEXT = "synchronizing CUDA operation"  # PyTorch's warning text under set_sync_debug_mode("warn")

_counts: Counter = Counter()
_state = {"last_report": 0.0, "reported": None}


def enabled(env: Optional[Dict[str, str]] = None) -> bool:
    return (os.environ if env is None else env).get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def report_line(counts: Counter, pid: int) -> str:
    sites = ", ".join(f"{site} x{n}" for site, n in counts.most_common(TOP))
    more = len(counts) - min(len(counts), TOP)
    return f"{MARKER} (pid {pid}, cumulative): {sites}" + (f" (+{more} more sites)" if more > 0 else "")


def note(site: str, now: Optional[float] = None, out=print) -> None:
    """Count one sync at ``site`` ("file.py:line"); print the cumulative report when it is due."""
    _counts[site] += 1
    now = time.monotonic() if now is None else now
    if now - _state["last_report"] >= REPORT_EVERY_S:
        _state["last_report"] = now
        snapshot = tuple(_counts.most_common(TOP))
        if snapshot != _state["reported"]:
            _state["reported"] = snapshot
            out(report_line(_counts, os.getpid()), flush=True)


def last_census(log_text: str) -> Dict[str, Dict[str, int]]:
    """Per process (pid), the call-site counts of its last census line in a server log."""
    out: Dict[str, Dict[str, int]] = {}
    for line in log_text.splitlines():
        i = line.find(MARKER + " (pid ")
        if i < 0:
            continue
        head, _, body = line[i + len(MARKER) + 6:].partition(", cumulative): ")
        sites = {}
        for part in body.split(" (+")[0].split(", "):
            site, _, n = part.rpartition(" x")
            if site and n.isdigit():
                sites[site] = int(n)
        out[head.strip()] = sites
    return out


def _showwarning(original):
    def show(message, category, filename, lineno, file=None, line=None):
        if SYNC_TEXT in str(message):
            note(f"{filename}:{lineno}")
            return None
        return original(message, category, filename, lineno, file, line)

    show._replayssm_sync = True  # type: ignore[attr-defined]
    return show


def install() -> None:
    """Turn on PyTorch's sync warnings in this process and count them by call site (idempotent)."""
    import torch

    if not getattr(warnings.showwarning, "_replayssm_sync", False):
        warnings.showwarning = _showwarning(warnings.showwarning)
        # every occurrence reaches showwarning (the default filter would show each site once)
        warnings.filterwarnings("always", message=f".*{SYNC_TEXT}.*")
    # the flag itself, without torch.cuda.set_sync_debug_mode's CUDA initialisation: plugins load before SGLang
    # picks the process's device, and a context made now would sit on device 0
    setter = getattr(torch._C, "_cuda_set_sync_debug_mode", None)
    if setter is not None:
        setter(1)  # 1: warn
    else:  # pragma: no cover - a torch without the private setter
        torch.cuda.set_sync_debug_mode("warn")


def register() -> None:
    """Entry point (group ``sglang.srt.plugins``): inert unless REPLAYSSM_EVAL_SYNC_DEBUG=1; spawned SGLang
    processes only (the launcher serves no batch)."""
    if not enabled():
        return
    import multiprocessing

    if multiprocessing.parent_process() is None:
        return
    install()
