"""bench_serving from several client processes against one server (``python -m eval.ab --clients N``).

One bench_serving process is one Python event loop: above some thousands of streamed tokens per second its own
parsing (SGLang's non-incremental stream resends the whole output so far in every event) may be what caps the
measured rate.  ``BenchPool`` splits each run over N processes (``eval.bench_sweep --serve``, each imported
once): client i gets about concurrency/N of the run's concurrency and the same share of its prompts (the same
number of waves) and its own prompt seed, all start together, and their per-request records
(``--output-details``) are merged into one result with bench_serving's own metrics: output tokens/s over the
union of the clients' benchmark windows, TTFT / TPOT / ITL / end-to-end percentiles over every request.  The
merged result is written as the last line of the run's ``--output-file``, so a caller reads it as it would read
one client's; each client's own line goes to ``<output-file>.client<i>``.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np


def split(batch: int, prompts: int, n: int) -> List[Tuple[int, int]]:
    """(concurrency, prompts) of each of ``n`` clients: the concurrency split as evenly as it goes and the prompts
    in proportion to it (each client runs the same number of waves)."""
    if n < 1 or n > batch:
        raise ValueError(f"--clients {n}: every client needs at least one concurrent request; use --clients "
                         f"between 1 and the smallest --batch ({batch})")
    conc = [batch // n + (1 if i < batch % n else 0) for i in range(n)]
    share = [prompts * c // batch for c in conc]
    for i in range(prompts - sum(share)):
        share[i % n] += 1
    return list(zip(conc, share))


def _set(argv: List[str], flag: str, value: str) -> List[str]:
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def _get(argv: Sequence[str], flag: str, default: Optional[str] = None) -> Optional[str]:
    return argv[argv.index(flag) + 1] if flag in argv else default


def client_argvs(argv: Sequence[str], n: int) -> List[List[str]]:
    """Each client's bench_serving arguments: its share of ``--max-concurrency`` and ``--num-prompts``, seed
    ``--seed`` + i (distinct prompts, the same on every server), its own output file, per-request details."""
    batch, prompts = int(_get(argv, "--max-concurrency")), int(_get(argv, "--num-prompts"))
    seed, out = int(_get(argv, "--seed", "0")), _get(argv, "--output-file")
    res = []
    for i, (c, k) in enumerate(split(batch, prompts, n)):
        a = _set(_set(_set(list(argv), "--max-concurrency", str(c)), "--num-prompts", str(k)), "--seed", str(seed + i))
        a = _set(a, "--output-file", f"{out}.client{i}")
        res.append(a + (["--output-details"] if "--output-details" not in a else []))
    return res


def _pct(vals: List[float], q: float) -> Optional[float]:
    return float(np.percentile(vals, q)) if vals else None


def merge(results: List[Dict[str, Any]], windows: List[Tuple[float, float]], batch: int) -> Dict[str, Any]:
    """One bench_serving result from the clients' results with ``--output-details`` and their benchmark windows
    (wall-clock start, end).  Per request, as bench_serving computes it: TPOT = (latency - TTFT) / (output
    tokens - 1), latency = TTFT + the inter-token gaps; failed requests (a non-empty error) are left out."""
    ttfts, tpots, itls, lats = [], [], [], []
    for r in results:
        errors = r.get("errors") or [""] * len(r.get("ttfts") or [])
        for ttft, itl, n, err in zip(r.get("ttfts") or [], r.get("itls") or [], r.get("output_lens") or [], errors):
            if err or not n:
                continue
            lat = ttft + sum(itl or [])
            ttfts.append(ttft)
            lats.append(lat)
            itls += list(itl or [])
            if n > 1:
                tpots.append((lat - ttft) / (n - 1))
    t0, t1 = min(w[0] for w in windows), max(w[1] for w in windows)
    dur = t1 - t0
    tot = {k: sum(r.get(k) or 0 for r in results) for k in ("completed", "total_input_tokens", "total_output_tokens")}

    def ms(vals: List[float], q: float) -> Optional[float]:
        v = _pct(vals, q)
        return None if v is None else 1000.0 * v

    def mean_ms(vals: List[float]) -> Optional[float]:
        return 1000.0 * float(np.mean(vals)) if vals else None

    out: Dict[str, Any] = dict(tot, duration=dur, clients=len(results), max_concurrency=batch,
                               request_throughput=tot["completed"] / dur, input_throughput=tot["total_input_tokens"] / dur,
                               output_throughput=tot["total_output_tokens"] / dur,
                               total_throughput=(tot["total_input_tokens"] + tot["total_output_tokens"]) / dur,
                               concurrency=sum(lats) / dur if lats else None,
                               mean_ttft_ms=mean_ms(ttfts), median_ttft_ms=ms(ttfts, 50), p90_ttft_ms=ms(ttfts, 90),
                               p99_ttft_ms=ms(ttfts, 99), mean_tpot_ms=mean_ms(tpots), median_tpot_ms=ms(tpots, 50),
                               p90_tpot_ms=ms(tpots, 90), p95_tpot_ms=ms(tpots, 95), p99_tpot_ms=ms(tpots, 99),
                               mean_itl_ms=mean_ms(itls), median_itl_ms=ms(itls, 50), p90_itl_ms=ms(itls, 90),
                               p95_itl_ms=ms(itls, 95), p99_itl_ms=ms(itls, 99), mean_e2e_latency_ms=mean_ms(lats),
                               median_e2e_latency_ms=ms(lats, 50), p99_e2e_latency_ms=ms(lats, 99))
    return out


class BenchPool:
    """N bench_serving driver processes used as one (``BenchDriver``'s interface: ``wait_ready``, ``run``,
    ``close``): each run is split over them, started together and merged."""

    def __init__(self, n: int, make_driver):
        self.drivers = [make_driver(i) for i in range(n)]
        self.ready: Optional[dict] = None

    def wait_ready(self, timeout: float) -> dict:
        if self.ready is None:
            end = time.time() + timeout
            evs = [d.wait_ready(max(1.0, end - time.time())) for d in self.drivers]
            bad = [e for e in evs if not e.get("ok")]
            self.ready = bad[0] if bad else dict(evs[0], clients=len(self.drivers),
                                                  pids=[d.proc.pid for d in self.drivers])
        return self.ready

    @property
    def pids(self) -> List[int]:
        return [d.proc.pid for d in self.drivers]

    def run(self, argv: List[str], timeout: float) -> dict:
        argvs = client_argvs(argv, len(self.drivers))
        out_file = Path(_get(argv, "--output-file"))
        done: List[Optional[dict]] = [None] * len(self.drivers)
        ends: List[float] = [0.0] * len(self.drivers)
        t0 = time.time()

        def one(i: int) -> None:
            done[i] = self.drivers[i].run(argvs[i], timeout)
            ends[i] = time.time()

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(self.drivers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        errors = [f"client {i}: {d.get('error')}" for i, d in enumerate(done) if not (d or {}).get("ok")]
        results = []
        for i in range(len(self.drivers)):
            try:
                lines = Path(_get(argvs[i], "--output-file")).read_text().strip().splitlines()
                results.append(json.loads(lines[-1]))
            except (OSError, ValueError, IndexError) as e:
                errors.append(f"client {i}: no bench_serving output: {e}")
        if errors:
            return {"ok": False, "seconds": round(time.time() - t0, 2), "error": "; ".join(errors)}
        windows = [(e - float(r["duration"]), e) for r, e in zip(results, ends)]
        merged = merge(results, windows, int(_get(argv, "--max-concurrency")))
        merged["per_client"] = [{k: r.get(k) for k in ("max_concurrency", "completed", "duration", "output_throughput",
                                                         "median_tpot_ms", "median_ttft_ms")} for r in results]
        with open(out_file, "a") as f:
            f.write(json.dumps(merged) + "\n")
        return {"ok": True, "seconds": round(time.time() - t0, 2), "error": None}

    def close(self, kill: bool = False) -> None:
        for d in self.drivers:
            d.close(kill=kill)

    @property
    def proc(self):
        """The first client's process (liveness checks: ``proc.poll()``)."""
        return self.drivers[0].proc
