"""SGLang's own decode rate beside the client's, and the "client-path bound" flag (issue 24).

The scheduler logs a ``Decode batch, #running-req: N, ... gen throughput (token/s): X`` line every 40 decode
steps; X is the tokens of those steps over the wall time since the previous ``Decode batch`` line.  The decode
rate of a bench run is the median X of the lines its server wrote during the run (the log between two byte
offsets) whose N is at least 90% of the run's full batch: the engine decoding a full batch.  A line whose window
held a prefill (a ``Prefill batch`` line since the previous decode line), and the run's first decode line (its
window began before the run), time more than decoding and are left out; only where no other full-batch line is
left are they used, and the record says so.  With long outputs the median sheds them anyway; a short one (a
speculative run decodes 256 tokens in about 85 steps: two lines a wave, one after the wave's prefills) does not.
The full batch is the run's concurrency, or the server's max running requests where that is lower (a run at
concurrency 256 on a server that admits 102 decodes 102 at a time).

What the client saw at a full batch is ``full batch x 1000 / median inter-token latency (ms)``: SGLang's
bench_serving spreads each streamed chunk's gap evenly over the chunk's tokens, so the median ITL is the
per-token gap a request sees while it decodes, and B concurrent requests receive B / ITL tokens per second.
The median, not TPOT: a request's TPOT (end - first token over its tokens) also holds the prefill steps of
the requests admitted while it decodes (two waves of 1024-token prompts: the second wave's prefills stall
the requests already decoding for seconds), which the scheduler's decode lines leave out; those stalls are
a few long gaps, which the median ignores (eval/results/e2e-h200/decode-nemotron-h-8b-io1024).  Where a
result has no ITL, TPOT is used.  A run is *client-path bound* when the client's rate and SGLang's disagree
by more than 10%: tokens decoded on the GPU did not reach the client at the rate they were decoded (the
tokenizer manager, the detokenizer, the HTTP stream or the benchmark client was the bottleneck), and its
client tok/s is not a measure of the engine.  A capped stream still shows: its chunks arrive late, and their
gaps, spread over their tokens, are the rate the client got.
"""

from __future__ import annotations

import gzip
import math
import re
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

# "Decode batch [123], ..." when SGLang logs forward iterations
DECODE_LINE = re.compile(r"Decode batch(?: \[\d+\])?, #running-req: (\d+),.*?gen throughput \(token/s\): ([0-9.]+)")
# a scheduler prefill line, or a decode line (as DECODE_LINE): in log order for decode_only_lines
_EVENT = re.compile(r"(Prefill batch(?: \[\d+\])?, )|" + DECODE_LINE.pattern)
FULL_BATCH_FRACTION = 0.9    # a log line counts as a full batch from this share of the run's batch up
CLIENT_PATH_TOLERANCE = 0.10  # |client full-batch rate / decode rate - 1| above this flags the run


def decode_lines(text: str) -> List[Tuple[int, float]]:
    """(running requests, gen throughput tok/s) of every scheduler ``Decode batch`` line in ``text``."""
    return [(int(m.group(1)), float(m.group(2))) for m in DECODE_LINE.finditer(text)]


def decode_only_lines(text: str) -> List[Tuple[int, float]]:
    """:func:`decode_lines` without the lines whose window held a prefill (a ``Prefill batch`` line since the
    previous ``Decode batch`` line) and without the first decode line of ``text`` (its window began before it)."""
    out: List[Tuple[int, float]] = []
    seen_decode = prefill_since = False
    for m in _EVENT.finditer(text):
        if m.group(1):  # a prefill
            prefill_since = True
            continue
        if seen_decode and not prefill_since:
            out.append((int(m.group(2)), float(m.group(3))))
        seen_decode, prefill_since = True, False
    return out


def read_log(path: Path) -> str:
    """A server log's text (``.gz`` too)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:
        return f.read()


def log_offset(path: Path) -> int:
    """The log's current size: the start (or end) of a bench run's window."""
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def log_window(path: Path, start: int, end: Optional[int] = None) -> str:
    """What the server wrote to its log between two offsets (``end`` None: up to now)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(-1 if end is None else max(0, end - start))
    except OSError:
        return ""
    return data.decode(errors="replace")


def min_full_batch(batch: int, fraction: float = FULL_BATCH_FRACTION) -> int:
    return max(1, math.ceil(fraction * batch))


def full_batch_rate(lines: List[Tuple[int, float]], batch: int,
                    fraction: float = FULL_BATCH_FRACTION) -> Tuple[Optional[float], int]:
    """(median gen throughput of the lines with at least ``fraction`` x ``batch`` running requests, how many
    lines that was); (None, 0) when the batch never filled (too few prompts, a lower --max-running-requests)."""
    lo = min_full_batch(batch, fraction)
    vals = [x for n, x in lines if n >= lo]
    return (statistics.median(vals) if vals else None), len(vals)


def positive_int(x: Any) -> bool:
    """A usable batch or running-request count (an int above 0, not a bool)."""
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def full_batch(batch: int, cap: Optional[int] = None) -> int:
    """The requests a run decodes at once when full: its concurrency, or the server's max running requests
    (``cap``) where that is lower."""
    return min(batch, cap) if positive_int(cap) else batch


def client_full_batch_rate(bench: Optional[Dict[str, Any]], batch: int) -> Optional[float]:
    """Tokens per second the client received while the batch was full: full batch x 1000 / median inter-token
    latency (ms, per token), or / median TPOT where the result has no ITL."""
    key = client_rate_source(bench)
    return batch * 1000.0 / bench[key] if key and positive_int(batch) else None


def client_rate_source(bench: Optional[Dict[str, Any]]) -> Optional[str]:
    """Which of bench_serving's latencies :func:`client_full_batch_rate` reads: ``median_itl_ms``, else
    ``median_tpot_ms``, else None (neither is a positive number)."""
    for key in ("median_itl_ms", "median_tpot_ms"):
        ms = (bench or {}).get(key)
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0:
            return key
    return None


def check(client_rate: Optional[float], decode_rate: Optional[float],
          tolerance: float = CLIENT_PATH_TOLERANCE) -> Tuple[Optional[float], Optional[bool]]:
    """(client / decode, client-path bound?): None, None when either rate is missing."""
    if not client_rate or not decode_rate:
        return None, None
    r = client_rate / decode_rate
    return r, abs(r - 1.0) > tolerance


# why a run's rates are recorded but not judged (``rates(..., judge=False)``)
NOT_JUDGED = ("this workload prefills new prompts while others decode all through the run: the scheduler's decode "
              "lines and the client's token gaps see different mixes of prefill and decode steps, so the two rates "
              "differ whatever the client path does")


def rates(log_text: str, bench: Optional[Dict[str, Any]], batch: int, cap: Optional[int] = None,
          judge: bool = True) -> Dict[str, Any]:
    """A bench run's two rates side by side (its server log window and bench_serving's result) and the flag;
    ``cap``: the server's max running requests (the full batch where it is below ``batch``); ``judge`` False (a
    workload that prefills while it decodes, e.g. shared-prefix): no flag, the reason recorded instead."""
    full = full_batch(batch, cap)
    lines = decode_lines(log_text)
    decode, n = full_batch_rate(decode_only_lines(log_text), full)
    _, n_any = full_batch_rate(lines, full)
    fallback = decode is None and n_any > 0
    if fallback:  # every full-batch line held a prefill or opened the run: the rate is theirs, and said so
        decode, n = full_batch_rate(lines, full)
    client_fb = client_full_batch_rate(bench, full)
    ratio, bound = check(client_fb, decode)
    out = {"client_tok_s": (bench or {}).get("output_throughput"), "client_full_batch_tok_s": client_fb,
           "client_rate_from": client_rate_source(bench), "decode_tok_s": decode, "decode_lines": n,
           "decode_lines_full_batch": n_any, "decode_lines_all": len(lines), "full_batch": full,
           "min_running": min_full_batch(full), "client_to_decode": ratio, "client_path_bound": bound}
    if fallback:
        out["decode_rate_note"] = ("no full-batch decode line without a prefill in its window: the rate is the "
                                   "median of all full-batch lines and includes prefill time")
    if not judge:
        out.update(client_path_bound=None, client_path_not_judged=NOT_JUDGED)
    return out


def rejudge(recorded: Optional[Dict[str, Any]], bench: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """A bench run's recorded rates (:func:`rates`) with the client's side and the flag worked out again by the rule
    of now from its bench_serving result (a run recorded under an older rule); the recorded rates unchanged where
    there is no decode rate, no full batch (runs recorded before it was), no bench latency, or the run is not
    judged."""
    if not recorded or recorded.get("decode_tok_s") is None or recorded.get("client_path_not_judged"):
        return recorded
    client = client_full_batch_rate(bench, recorded.get("full_batch"))
    if client is None:
        return recorded
    ratio, bound = check(client, recorded["decode_tok_s"])
    return dict(recorded, client_full_batch_tok_s=client, client_rate_from=client_rate_source(bench),
                client_to_decode=ratio, client_path_bound=bound)
