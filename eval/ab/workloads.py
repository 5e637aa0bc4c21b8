"""What each server is put through, one server after another: bench_serving runs (one driver process for
all of them), the parity prompts and the profiled runs, each server's record filled as it goes.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional

from eval.ab import decode_rate, prefix_cache
from eval.ab.common import ROOT, log
from eval.ab.parity import run_parity, run_parity_prefix, run_parity_solo
from eval.ab.plan import Phase, parse_batches
from eval.ab.multiclient import BenchPool
from eval.ab.profile import run_profile
from eval.ab.results import write_partial
from eval.ab.servers import (ARM_SEAMS, GpuMemSampler, ModelSpec, Server, _stop_all, arm_launch, count_retractions,
                             env_delta, free_port, http_json, http_text, launch_cmd, parse_metrics, save_jitcache,
                             seams_state, conv_verify_state, server_env, server_facts)


BENCH_KEYS = (
    "completed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
    "input_throughput", "output_throughput", "total_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p95_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p90_itl_ms", "p95_itl_ms", "p99_itl_ms",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms",
    "concurrency", "accept_length", "max_output_tokens_per_s", "max_concurrent_requests",
    "clients", "per_client",  # eval.ab --clients N: the merged result of N bench_serving processes
)


def bench_serving_argv(base_url: str, model: ModelSpec, batch: int, args, out_file: str) -> List[str]:
    """Arguments of one ``python -m sglang.bench_serving`` run (one batch size)."""
    head = ["--backend", "sglang", "--base-url", base_url, "--model", model.path, "--tokenizer", model.tokenizer]
    tail = ["--max-concurrency", str(batch), "--request-rate", "inf", "--seed", str(args.seed),
            "--warmup-requests", str(args.warmup_requests), "--ready-check-timeout-sec", "30", "--disable-tqdm",
            "--output-file", out_file]
    if getattr(args, "workload", "none") == "shared-prefix":
        # text prompts (the dataset refuses --tokenize-prompt), exact lengths (range ratio 1), the prefix cache
        # flushed after the warm-up so that every run starts cold; --num-prompts is the dataset's own count
        return head + ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", str(args.gsp_groups),
                       "--gsp-prompts-per-group", str(args.gsp_prompts_per_group),
                       "--gsp-system-prompt-len", str(args.gsp_system_len),
                       "--gsp-question-len", str(args.gsp_question_len), "--gsp-output-len", str(args.output_len),
                       "--gsp-range-ratio", "1.0", "--num-prompts", str(args.gsp_groups * args.gsp_prompts_per_group),
                       "--flush-cache"] + tail
    n = max(batch * args.rounds, args.min_prompts)
    return head + ["--dataset-name", "random-ids", "--tokenize-prompt",
                   "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
                   "--random-range-ratio", "1.0", "--num-prompts", str(n)] + tail


def clear_gsp_cache(args, model: ModelSpec) -> List[str]:
    """Remove bench_serving's on-disk generated-shared-prefix dataset for this run's parameters
    (``~/.cache/sglang/benchmark/gen_shared_prefix_<seed>_<G>_<N>_<system>_<question>_<out>_<tokenizer
    class>.pkl``): its key names the tokenizer's class, not its vocabulary, so a file an earlier run wrote
    with another model's synthetic tokenizer would be reused.  The run's first bench writes it afresh and
    every later bench of the run (all arms: one tokenizer) reads the same prompts."""
    d = Path.home() / ".cache" / "sglang" / "benchmark"
    stem = (f"gen_shared_prefix_{args.seed}_{args.gsp_groups}_{args.gsp_prompts_per_group}_{args.gsp_system_len}_"
            f"{args.gsp_question_len}_{args.output_len}_")
    gone = []
    for f in d.glob(stem + "*.pkl") if d.is_dir() else []:
        try:
            f.unlink()
            gone.append(str(f))
        except OSError:
            pass
    return gone


class BenchDriver:
    """``python -m eval.bench_sweep --serve``: SGLang's bench_serving, imported once."""

    def __init__(self, python: str, env: Dict[str, str], log_path: Path):
        from eval import bench_sweep

        self._parse = bench_sweep.parse_event
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.events: "queue.Queue[dict]" = queue.Queue()
        self.proc = subprocess.Popen([python, "-m", "eval.bench_sweep", "--serve"], env=env, cwd=str(ROOT),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.ready: Optional[dict] = None
        self._n = 0

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            ev = self._parse(line)
            if ev is not None:
                self.events.put(ev)
        self.events.put({"event": "eof"})

    def _next(self, timeout: float) -> dict:
        try:
            return self.events.get(timeout=min(3600.0, max(1.0, timeout)))
        except queue.Empty:
            return {"event": "timeout"}

    def wait_ready(self, timeout: float) -> dict:
        if self.ready is None:
            ev = self._next(timeout)
            self.ready = ev if ev.get("event") == "ready" else {"ok": False, "error": f"bench driver: {ev}"}
        return self.ready

    def run(self, argv: List[str], timeout: float) -> dict:
        if not (self.ready or {}).get("ok") or self.proc.poll() is not None:
            return {"ok": False, "error": "bench driver not running"}
        self._n += 1
        self.proc.stdin.write(json.dumps({"id": self._n, "argv": argv}) + "\n")
        self.proc.stdin.flush()
        end = time.time() + timeout
        while time.time() < end:
            ev = self._next(end - time.time())
            if ev.get("event") == "done" and ev.get("id") == self._n:
                return ev
            if ev.get("event") == "eof":
                return {"ok": False, "error": "bench driver exited"}
        self.close(kill=True)
        return {"ok": False, "error": f"bench_serving did not finish in {timeout:.0f} s"}

    def close(self, kill: bool = False) -> None:
        if self.proc.poll() is None and not kill:
            try:
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        self._log.close()


def trim_bench(res: dict) -> dict:
    return {k: res.get(k) for k in BENCH_KEYS if k in res}


class Progress:
    def __init__(self, total: int, enable: bool):
        self.bar = None
        if enable:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc="A/B", unit="step", dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                self.bar = None

    def step(self, what: str, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(what[:40])
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# SGLang's log line once a server's memory pools are allocated (0.5.15-0.5.23)
POOL_MARKERS = ("Memory pool end",)


class PhaseRun:
    """One server of the plan: start, wait for health, measure, stop (``run_phase`` chains them;
    ``--concurrent-start`` starts every server first and measures them one at a time)."""

    def __init__(self, phase: Phase, args, model: ModelSpec, flags: List[str], base_env: Dict[str, str],
                 pythonpath: List[str], logdir: Path):
        self.phase, self.args, self.model, self.logdir = phase, args, model, logdir
        port = free_port(args.host)
        module, extra = arm_launch(args, phase.kind)
        cmd = launch_cmd(args.python, module, flags, args.host, port, extra)
        env = server_env(base_env, args, phase, model, pythonpath)
        log_path = logdir / f"server-{phase.label}.log"
        self.rec: Dict[str, Any] = {"label": phase.label, "phase": asdict(phase), "launcher": module,
                                    "command": shlex.join(cmd), "env": env_delta(env, base_env),
                                    "status": "created", "log": str(log_path)}
        self.server = Server(phase.label, cmd, env, log_path, args.host, port)
        self.sampler: Optional[GpuMemSampler] = None
        self.failed = False

    def start(self) -> None:
        log(f"{self.phase.label}: starting {self.rec['launcher']} on port {self.server.port}")
        self.server.start()
        self.sampler = GpuMemSampler(self.args.gpu_index, pgid=self.server.proc.pid).start()
        self.rec["gpu_mem_baseline_mib"] = self.sampler.baseline
        self.rec["status"] = "started"

    def wait_pools(self, deadline: float) -> None:
        """Wait until this server has sized and allocated its memory pools (SGLang's "Memory pool end" log line;
        or it is healthy, or it exited): SGLang sizes its pools from the GPU memory free at that moment, so a
        server profiling while another allocates miscounts (with extra_buffer: a negative mamba cache size)."""
        left = max(10.0, min(self.args.server_timeout, deadline - time.time()))
        seen = self.server.wait_log(POOL_MARKERS, left)
        self.rec["pools_ready_after_s"] = round(time.time() - self.server.t0, 1)
        log(f"{self.phase.label}: memory pools {'allocated' if seen in POOL_MARKERS else seen or 'not seen'} "
            f"after {self.rec['pools_ready_after_s']} s; starting the next server")

    def wait(self, deadline: float, progress: Progress) -> None:
        try:
            remaining = deadline - time.time()
            self.rec["startup_s"] = round(self.server.wait_ready(min(self.args.server_timeout, max(10.0, remaining))), 1)
            log(f"{self.phase.label}: healthy after {self.rec['startup_s']} s")
            progress.step(f"{self.phase.label} up")
            try:
                self.rec["server_info"] = http_json(self.server.url + "/server_info", timeout=30)
            except Exception as e:  # noqa: BLE001
                self.rec["server_info_error"] = str(e)
            self.rec["facts"] = server_facts(self.rec.get("server_info"))
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        self.failed = True
        self.rec["status"] = "error"
        self.rec["error"] = f"{type(e).__name__}: {e}"
        log(f"{self.phase.label}: ERROR {self.rec['error'][:2000]}")

    def work(self, driver: Optional["BenchDriver"], prompts: List[List[int]], deadline: float,
             progress: Progress) -> None:
        if self.failed:
            return
        args, phase, server, rec = self.args, self.phase, self.server, self.rec
        try:
            if phase.bench:
                self._bench(driver, deadline, progress)
            if phase.parity:
                if time.time() > deadline - args.reserve_s:
                    rec["parity"] = {"skipped": "deadline"}
                else:
                    try:
                        timeout = min(args.parity_timeout, max(10.0, deadline - time.time()))
                        sample = self.logdir / f"generate-sample-{phase.label}.json"
                        if getattr(args, "workload", "none") == "shared-prefix":  # prefix hits, and hit vs cold
                            rec["parity"] = run_parity_prefix(server.url, prompts, args.parity_groups,
                                                              args.parity_tokens, args.parity_topk, timeout, sample)
                        else:
                            rec["parity"] = run_parity(server.url, prompts, args.parity_tokens, args.parity_topk,
                                                       timeout=timeout, sample_path=sample)
                        log(f"{phase.label}: parity {len(prompts)} x {args.parity_tokens} tokens in "
                            f"{rec['parity']['seconds']} s")
                        if args.parity_solo:
                            rec["parity_solo"] = run_parity_solo(server.url, prompts, args, deadline)
                            log(f"{phase.label}: parity one prompt at a time in {rec['parity_solo']['seconds']} s")
                    except Exception as e:  # noqa: BLE001
                        rec["parity"] = {"error": f"{type(e).__name__}: {e}"}
                progress.step(f"{phase.label} parity")
            try:
                rec["server_info_after"] = server_facts(http_json(server.url + "/server_info", timeout=30))
            except Exception:  # noqa: BLE001
                pass
            code, text = http_text(server.url + "/metrics")
            if code == 200:
                rec["metrics"] = parse_metrics(text)
            rec["status"] = "ok"
        except Exception as e:  # noqa: BLE001 - record and continue with the next arm
            self._fail(e)

    def _bench(self, driver: Optional["BenchDriver"], deadline: float, progress: Progress) -> None:
        args, phase, rec = self.args, self.phase, self.rec
        rec["bench"] = []
        if driver is None:
            rec["bench_error"] = "no bench driver"
            return
        ready = driver.wait_ready(max(30.0, deadline - time.time()))
        rec["bench_driver"] = {k: v for k, v in ready.items() if k != "event"}
        for b in parse_batches(args.batch):
            if time.time() > deadline - args.reserve_s:
                rec["bench"].append({"batch": b, "skipped": "deadline"})
                continue
            out_file = str(self.logdir / f"bench-{phase.label}-b{b}.jsonl")
            argv = bench_serving_argv(self.server.url, self.model, b, args, out_file)
            entry = {"batch": b, "command": "python -m sglang.bench_serving " + shlex.join(argv)}
            start = decode_rate.log_offset(self.server.log_path)  # the server log's window of this run
            res = driver.run(argv, timeout=min(args.bench_timeout, max(10.0, deadline - time.time())))
            window = decode_rate.log_window(self.server.log_path, start)
            entry.update(ok=res.get("ok"), seconds=res.get("seconds"), error=res.get("error"))
            try:
                lines = Path(out_file).read_text().strip().splitlines()
                entry["result"] = trim_bench(json.loads(lines[-1])) if lines else None
            except (OSError, ValueError) as e:
                entry["result"] = None
                entry["error"] = entry.get("error") or f"no bench_serving output: {e}"
            # SGLang's own decode rate at a full batch beside the client's, and the client-path flag
            entry["rates"] = rt = decode_rate.rates(window, entry.get("result"), b,
                                                    cap=(rec.get("facts") or {}).get("max_running_requests"),
                                                    judge=getattr(args, "workload", "none") != "shared-prefix")
            # the server's own prefix-cache accounting over the run (its Prefill batch lines; flushed after warm-up)
            entry["prefix_cache"] = pc = prefix_cache.hit_rate(window)
            r = entry.get("result") or {}
            log(f"{phase.label}: batch {b}: {r.get('output_throughput', float('nan')):.1f} tok/s, "
                f"TPOT p50 {r.get('median_tpot_ms', float('nan')):.2f} ms, decode at full batch "
                f"{rt['decode_tok_s'] or float('nan'):.0f} tok/s"
                f"{' (client-path bound)' if rt['client_path_bound'] else ''}"
                + (f", TTFT p50 {r.get('median_ttft_ms', float('nan')):.1f} ms, cache hit rate {pc['hit_rate']:.3f}"
                   if pc["hit_rate"] is not None else "")
                + f" ({'ok' if entry['ok'] else entry.get('error')})")
            rec["bench"].append(entry)
            progress.step(f"{phase.label} b{b}")
        if args.profile_batch:
            rec["profiles"] = []
            for b in parse_batches(args.profile_batch):
                if time.time() > deadline - args.reserve_s:
                    rec["profiles"].append({"batch": b, "skipped": "deadline"})
                else:
                    rec["profiles"].append(self._profile(driver, deadline, b))

    def _profile(self, driver: "BenchDriver", deadline: float, b: int) -> Dict[str, Any]:
        args, label = self.args, self.phase.label
        argv = bench_serving_argv(self.server.url, self.model, b, args,
                                  str(self.logdir / f"bench-{label}-profile-b{b}.jsonl"))
        out = run_profile(self.server.url, driver, argv, self.logdir / f"profile-{label}-b{b}", batch=b,
                          steps=args.profile_steps, delay_s=args.profile_delay_s, deadline=deadline,
                          bench_timeout=args.bench_timeout, spec=self.phase.spec)
        if out.get("trace"):
            out["trace"] = str(Path(out["trace"]).relative_to(self.logdir))
        if "error" not in out:
            d, sp = out.get("decode_steps"), out.get("step_split") or {}
            log(f"{label}: profile at batch {b}: {out['kernel_us_per_step']:.0f} us of kernels per step over "
                f"{out['span_us_per_step']:.0f} us (busy {100 * (out['busy_fraction'] or 0):.0f}%)"
                + (f"; {sp['decode']} whole decode steps of {sp['steps']}: {d['kernel_us_per_step']:.0f} us of "
                   f"kernels over a {d['span_us_per_step']:.0f} us step" if d else ""))
        else:
            log(f"{label}: profile at batch {b}: {out.get('error')}")
        return out

    def finish(self) -> Dict[str, Any]:
        from eval import sync_debug, weights

        rec = self.rec
        rec["shutdown"] = self.server.stop(grace=self.args.shutdown_grace)
        if self.sampler is not None:
            self.sampler.stop()
            rec["peak_gpu_mem_mib"] = self.sampler.peak
            rec["peak_gpu_mem_own_mib"] = self.sampler.peak_own
        try:
            text = self.server.log_path.read_text(errors="replace")
            rec["random_weights_confirmed"] = weights.LOG_MARKER in text
            if getattr(self.args, "sync_debug", False):
                rec["sync_sites"] = sync_debug.last_census(text)
            if getattr(self.args, "pinned_token", None) is not None:  # target and draft: one line each
                rec["pinned_token_models"] = text.count(weights.PIN_MARKER)
            rec["replayssm_active"] = "sglang_replayssm active" in text
            rec["replayssm_seams"] = seams_state(text)
            rec["replayssm_conv_verify"] = conv_verify_state(text)
            rec["retracted_reqs"] = count_retractions(text)
        except OSError:
            pass
        want = ARM_SEAMS.get(self.phase.kind)
        if want is not None and rec.get("replayssm_seams") not in (None, want):
            # e.g. an inherited SGLANG_REPLAYSSM_CONFIG with ``replay_ring: false`` under a staged arm
            rec["status"] = "error"
            rec["error"] = (f"arm kind {self.phase.kind} needs the replay-ring seams "
                            f"{'on' if want else 'off'}, but the server logged replay_ring={rec['replayssm_seams']}")
            log(f"{self.phase.label}: {rec['error']}")
        return rec


def run_phase(phase: Phase, args, model: ModelSpec, flags: List[str], base_env: Dict[str, str],
              pythonpath: List[str], logdir: Path, driver: Optional["BenchDriver"],
              prompts: List[List[int]], deadline: float, progress: Progress) -> Dict[str, Any]:
    pr = PhaseRun(phase, args, model, flags, base_env, pythonpath, logdir)
    try:
        pr.start()
        pr.wait(deadline, progress)
        pr.work(driver, prompts, deadline, progress)
    except Exception as e:  # noqa: BLE001
        pr._fail(e)
    finally:
        pr.finish()
    return pr.rec


def run_servers(run: Dict[str, Any], args, phases: List[Phase], spec_models: Dict[bool, Optional[ModelSpec]],
                flags: Dict[bool, List[str]], base_env: Dict[str, str], pythonpath: List[str], logdir: Path,
                prompts: List[List[int]], deadline: float, partial: Path) -> None:
    """Every server of the plan, one after another (``--concurrent-start``: all started first), appended to
    ``run["phases"]``, with one bench_serving driver for all and a partial result after each server."""
    driver = None
    if any(ph.bench for ph in phases):
        denv = dict(base_env)
        denv["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [x for x in [base_env.get("PYTHONPATH", "")] if x])
        n = getattr(args, "clients", 1) or 1
        driver = BenchDriver(args.python, denv, logdir / "bench_serving.log") if n == 1 else BenchPool(
            n, lambda i: BenchDriver(args.python, denv, logdir / f"bench_serving-client{i}.log"))
    n_steps = sum(1 + (len(parse_batches(args.batch)) if ph.bench else 0) + (1 if ph.parity else 0) for ph in phases)
    progress = Progress(n_steps, enable=not args.no_progress)
    try:
        if args.concurrent_start:
            runs = [PhaseRun(ph, args, spec_models[ph.spec], flags[ph.spec], base_env, pythonpath, logdir)
                    for ph in phases]
            try:
                for i, pr in enumerate(runs):
                    pr.start()
                    if i < len(runs) - 1:  # the next starts once this one holds its memory pools (see below)
                        pr.wait_pools(deadline)
                for pr in runs:
                    pr.wait(deadline, progress)
                if args.save_jitcache:
                    run["jitcache"] = save_jitcache(Path(args.save_jitcache))
                    log(f"jit caches saved: {run['jitcache']}")
                for pr in runs:  # measured one at a time; the others idle
                    pr.work(driver, prompts, deadline, progress)
            finally:
                for pr in runs:
                    run["phases"].append(pr.finish())
            write_partial(partial, run)
        else:
            for i, ph in enumerate(phases):
                left = deadline - time.time()
                if left < args.min_phase_s:
                    run["phases"].append({"label": ph.label, "phase": asdict(ph), "status": "skipped",
                                          "error": f"deadline: {left:.0f} s left"})
                    log(f"{ph.label}: skipped ({left:.0f} s left)")
                    continue
                rec = run_phase(ph, args, spec_models[ph.spec], flags[ph.spec], base_env, pythonpath, logdir,
                                driver, prompts, deadline, progress)
                run["phases"].append(rec)
                if i == 0 and args.save_jitcache:
                    run["jitcache"] = save_jitcache(Path(args.save_jitcache))
                    log(f"jit caches saved: {run['jitcache']}")
                write_partial(partial, run)
    finally:
        progress.close()
        if driver is not None:
            driver.close()
        _stop_all()
