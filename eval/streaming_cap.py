"""Where the client-visible token rate caps (issue 24): per-process CPU of each SGLang server and of the
benchmark client while bench_serving streams, beside the client's tok/s and SGLang's own decode rate.

Above roughly 7-8k streamed tokens/s something on the CPU path caps what a client sees, while the scheduler
decodes faster.  A Python process is one core at most (the GIL): the process whose busiest thread sits near
100% of a core during the run is the cap.  For each server (stock, ours and SGLang-flag variants) and stream
interval this samples, every ``--sample-period`` seconds (psutil), the CPU of

* ``main``: the server's first process (tokenizer manager + HTTP server),
* ``scheduler`` (busy-waits on the GPU: near 100% whatever the load, not a cap by itself),
* ``detokenizer`` (and ``tokenizer_worker`` / other ``sglang::*`` processes when SGLang's options start them),
* ``client``: the bench_serving process (``eval.bench_sweep --serve``, SGLang's own benchmark, imported once),

and records per run the client's output tok/s, the client's rate at a full batch (batch / median per-token ITL) and the
scheduler's decode rate at a full batch (its ``Decode batch`` log lines; eval/ab/decode_rate.py), with the run
flagged client-path bound when those two disagree by more than 10%.

The stream interval is set per request (``sampling_params.stream_interval`` through bench_serving's
``--extra-request-body``): SGLang's ``--stream-interval`` server flag only sets the default of that same field
(``OutputStreamer.accept``), so one server serves every interval.  ``--interval-mode server`` starts one server
per interval with the flag instead.  ``--variant [LABEL=]KIND:FLAGS`` adds a server of arm KIND with extra
SGLang flags (e.g. ``staged:--incremental-streaming-output``, ``staged:--tokenizer-worker-num 2``).

    python -m eval.streaming_cap --model tiny-nemotron-h --arms stock,staged --intervals 1,8 \\
        --extra-intervals 2,4 --variant 'staged:--incremental-streaming-output' --deadline-s 420 --out-dir OUT
    python -m eval.streaming_cap ... --dry-run          # the plan and the command lines

Flags this script does not know go to ``python -m eval.ab``'s parser (the servers' SGLang flags, identical on
every server: ``--server-arg``, ``--mem-fraction-static``, ``--stock-module``, ...).  Servers run one at a time
in plan order; under ``--deadline-s`` a server that no longer fits is skipped and recorded, and the
``--extra-intervals`` run only while the servers still to come keep ``--est-server-s`` each.
Results: ``<out-dir>/streaming-cap-<model>.{json,md}``; server and bench logs under ``--log-dir``.
"""

from __future__ import annotations

import argparse
import atexit
import copy
import json
import math
import os
import re
import shlex
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval import report  # noqa: E402
from eval.ab import decode_rate  # noqa: E402
from eval.ab.common import ROOT, log  # noqa: E402
from eval.ab.plan import ARM_KINDS, Phase, parse_batches  # noqa: E402
from eval.ab.servers import (Server, _stop_all, arm_launch, common_server_flags, env_delta,  # noqa: E402
                             free_port, http_json, launch_cmd, prepare_model, seams_state, server_env,
                             server_pythonpath, conv_verify_state)
from eval.ab.workloads import BenchDriver, bench_serving_argv, trim_bench  # noqa: E402

SCHEMA = "replayssm-streaming-cap/1"
SATURATED_PCT = 90.0  # a thread at this share of one core or more is saturated (a Python process's ceiling)
# the processes one server consists of (SGLang names its children with setproctitle: "sglang::<name>")
ROLE_ORDER = ("main", "detokenizer", "tokenizer_worker", "scheduler", "client")
# the server settings recorded from /server_info (the knobs of the streaming path)
INFO_KEYS = ("version", "stream_interval", "batch_notify_size", "incremental_streaming_output",
             "effective_max_running_requests_per_dp",
             "tokenizer_worker_num", "detokenizer_worker_num", "max_running_requests", "skip_tokenizer_init")


@dataclass
class ServerPlan:
    label: str
    kind: str                        # an eval.ab arm kind: stock, staged, patched, upstream
    flags: List[str]                 # this server's extra SGLang flags (a variant's; --stream-interval by server)
    intervals: List[int]             # stream intervals always measured
    extra_intervals: List[int] = field(default_factory=list)  # measured while time allows
    via: str = "request"             # how the interval is set: per request, or the server flag


def parse_ints(text: str, flag: str, allow_empty: bool = False) -> List[int]:
    if allow_empty and not str(text).strip():
        return []
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if (not vals and not allow_empty) or any(v < 1 for v in vals):
        raise ValueError(f"{flag} takes positive integers, got {text!r}")
    return list(dict.fromkeys(vals))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "variant"


def parse_variant(text: str) -> Tuple[str, str, List[str]]:
    """``[LABEL=]KIND:FLAGS`` -> (label, kind, flags); the label defaults to ``KIND+<flags slug>``."""
    label, eq, rest = text.partition("=")
    if not eq or ":" in label:
        label, rest = "", text
    kind, colon, flags = rest.partition(":")
    kind = kind.strip()
    if not colon or kind not in ARM_KINDS or not flags.strip():
        raise ValueError(f"--variant {text!r}: expected [LABEL=]KIND:FLAGS with KIND one of {', '.join(ARM_KINDS)} "
                         "and some SGLang flags, e.g. 'staged:--incremental-streaming-output'")
    words = shlex.split(flags)
    return (label.strip() or f"{kind}+{_slug(' '.join(w.lstrip('-') for w in words))}"), kind, words


def plan_servers(args) -> List[ServerPlan]:
    """The servers in order: each arm, then each variant; by server, one server per interval."""
    intervals = parse_ints(args.intervals, "--intervals")
    extra = [i for i in parse_ints(args.extra_intervals, "--extra-intervals", allow_empty=True) if i not in intervals]
    v_intervals = parse_ints(args.variant_intervals, "--variant-intervals")
    base: List[Tuple[str, str, List[str], List[int], List[int]]] = []
    seen: Dict[str, int] = {}
    for kind in [a.strip() for a in args.arms.split(",") if a.strip()]:
        if kind not in ARM_KINDS:
            raise ValueError(f"--arms: unknown arm {kind!r}; accepted: {', '.join(ARM_KINDS)}")
        seen[kind] = seen.get(kind, 0) + 1
        base.append((kind if seen[kind] == 1 else f"{kind}-{seen[kind]}", kind, [], intervals, extra))
    for v in args.variant or []:
        label, kind, flags = parse_variant(v)
        base.append((label, kind, flags, v_intervals, []))
    if not base:
        raise ValueError("--arms is empty and no --variant given: nothing to measure")
    labels = [b[0] for b in base]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"two servers share the label {dup[0]!r}: give a --variant its own LABEL=")
    if args.interval_mode == "request":
        return [ServerPlan(label, kind, flags, ivs, ex) for label, kind, flags, ivs, ex in base]
    out = []
    for label, kind, flags, ivs, ex in base:
        for i in ivs:
            out.append(ServerPlan(f"{label}-si{i}", kind, flags + ["--stream-interval", str(i)], [i], [], "server"))
        for i in ex:  # optional servers: run only while time allows (see main)
            out.append(ServerPlan(f"{label}-si{i}", kind, flags + ["--stream-interval", str(i)], [], [i], "server"))
    return out


def ab_args_from(args, passthrough: List[str]):
    """eval.ab's namespace for the servers' flags and the bench command lines (its parser checks them)."""
    from eval.ab.cli import build_parser

    argv = ["--model", args.model, "--batch", str(args.batch), "--input-len", str(args.input_len),
            "--output-len", str(args.output_len), "--rounds", str(args.rounds), "--min-prompts", "1",
            "--warmup-requests", "0", "--no-parity", "--python", args.python, *passthrough]
    return build_parser().parse_args(argv)


def bench_argv(url: str, model, ab_args, batch: int, interval: Optional[int], out_file: str,
               output_len: Optional[int] = None) -> List[str]:
    """bench_serving's arguments for one run; a per-request stream interval goes in the request's
    sampling_params (bench_serving's own defaults repeated: greedy, ignore_eos, the run's output length)."""
    a = copy.copy(ab_args)
    if output_len is not None:
        a.output_len = output_len
    argv = bench_serving_argv(url, model, batch, a, out_file)
    if interval is not None:
        sp = {"temperature": 0.0, "max_new_tokens": a.output_len, "ignore_eos": True, "stream_interval": interval}
        argv += ["--extra-request-body", json.dumps({"sampling_params": sp})]
    return argv


# --------------------------------------------------------------------------------
# per-process CPU sampling
# --------------------------------------------------------------------------------
def role_of(cmdline: Sequence[str], pid: int, server_pid: int, client_pid: Optional[int]) -> str:
    """What a process of the run is, from its pid and the title SGLang gives its children."""
    if pid == client_pid:
        return "client"
    if pid == server_pid:
        return "main"
    m = re.search(r"sglang::([A-Za-z_]+)", " ".join(cmdline))
    if not m:
        return "other"
    name = m.group(1)
    for r in ("scheduler", "tokenizer_worker", "detokenizer_router", "detokenizer"):
        if name.startswith(r):
            return r
    return name


class CpuSampler:
    """CPU use of the server's process tree and the client, every ``period`` seconds, until ``stop``.

    Per process: the share of one core it used over the period (user + system, all threads) and that of its
    busiest thread.  Children are looked up on every tick (SGLang may start some late)."""

    def __init__(self, server_pid: int, client_pid: Optional[int], period: float = 0.5):
        import psutil

        self.psutil = psutil
        self.server_pid, self.client_pid, self.period = server_pid, client_pid, period
        self.procs: Dict[int, Any] = {}
        self.info: Dict[int, Dict[str, Any]] = {}
        self.prev: Dict[int, Tuple[float, float, Dict[int, float]]] = {}
        self.samples: List[Dict[str, Any]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self.t0 = 0.0

    def _tree(self) -> List[Any]:
        ps = self.psutil
        out = []
        for pid in (self.server_pid, self.client_pid):
            if pid is None:
                continue
            try:
                p = self.procs.get(pid) or ps.Process(pid)
                out.append(p)
                if pid == self.server_pid:
                    out += p.children(recursive=True)
            except (ps.NoSuchProcess, ps.AccessDenied):
                continue
        return out

    def _tick(self) -> None:
        ps = self.psutil
        t_tick = time.monotonic()
        cpu, top = {}, {}
        for p in self._tree():
            pid = p.pid
            try:
                if pid not in self.procs:
                    self.procs[pid] = p
                    cmd = p.cmdline()
                    self.info[pid] = {"pid": pid, "role": role_of(cmd, pid, self.server_pid, self.client_pid),
                                      "cmdline": " ".join(cmd)[:160]}
                p = self.procs[pid]
                now = time.monotonic()  # per process: the tree walk above takes a while on a busy host
                t = p.cpu_times()
                total = t.user + t.system
                threads = {th.id: th.user_time + th.system_time for th in p.threads()}
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                continue
            prev = self.prev.get(pid)
            if prev is not None and now - prev[0] < self.period / 4:
                continue  # too short a span for the clock-tick resolution of the CPU times (stop's last tick)
            self.prev[pid] = (now, total, threads)
            if prev is None:
                continue
            dt = now - prev[0]
            cpu[pid] = 100.0 * (total - prev[1]) / dt
            deltas = [v - prev[2][k] for k, v in threads.items() if k in prev[2]]
            top[pid] = 100.0 * max(deltas, default=0.0) / dt
        if cpu:
            self.samples.append({"t": round(t_tick - self.t0, 2), "host_pct": ps.cpu_percent(None),
                                 "cpu": {str(k): round(v, 1) for k, v in cpu.items()},
                                 "top_thread": {str(k): round(v, 1) for k, v in top.items()}})

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self._tick()
            except Exception as e:  # noqa: BLE001 - sampling must never break the run
                log(f"cpu sampler: {type(e).__name__}: {e}")

    def start(self) -> "CpuSampler":
        self.t0 = time.monotonic()
        self.psutil.cpu_percent(None)
        self._tick()  # the baseline
        self._t.start()
        return self

    def stop(self) -> Dict[str, Any]:
        self._stop.set()
        self._t.join(timeout=10)
        self._tick()
        return summarize(self.samples, self.info)


def _stats(vals: List[float]) -> Dict[str, Optional[float]]:
    if not vals:
        return {"mean": None, "p50": None, "max": None}
    return {"mean": round(statistics.fmean(vals), 1), "p50": round(statistics.median(vals), 1),
            "max": round(max(vals), 1)}


def summarize(samples: List[Dict[str, Any]], info: Dict[int, Dict[str, Any]]) -> Dict[str, Any]:
    """Per process and per role (the busiest process of the role in each sample): the CPU share of one core
    (mean, median, max over the samples) and that of the busiest thread; the hottest non-scheduler role and
    the saturated roles (busiest thread's median at SATURATED_PCT or more)."""
    procs = {}
    for pid, meta in info.items():
        k = str(pid)
        vals = [s["cpu"][k] for s in samples if k in s["cpu"]]
        tops = [s["top_thread"][k] for s in samples if k in s["top_thread"]]
        if vals:
            procs[k] = dict(meta, cpu_pct=_stats(vals), top_thread_pct=_stats(tops))
    roles: Dict[str, Dict[str, Any]] = {}
    for role in sorted({m["role"] for m in info.values()}, key=lambda r: ((ROLE_ORDER + (r,)).index(r), r)):
        pids = [str(p) for p, m in info.items() if m["role"] == role]
        vals = [max(s["cpu"][k] for k in pids if k in s["cpu"]) for s in samples if any(k in s["cpu"] for k in pids)]
        tops = [max(s["top_thread"][k] for k in pids if k in s["top_thread"]) for s in samples
                if any(k in s["top_thread"] for k in pids)]
        if vals:
            roles[role] = {"processes": len(pids), "cpu_pct": _stats(vals), "top_thread_pct": _stats(tops)}
    cand = {r: v for r, v in roles.items() if r not in ("scheduler", "other")}
    hottest = max(cand, key=lambda r: cand[r]["cpu_pct"]["p50"] or 0.0) if cand else None
    saturated = [r for r, v in roles.items() if (v["top_thread_pct"]["p50"] or 0.0) >= SATURATED_PCT]
    host = [s["host_pct"] for s in samples if s.get("host_pct") is not None]
    return {"samples": len(samples), "roles": roles, "processes": procs, "hottest": hottest,
            "saturated": saturated, "host_pct": _stats(host),
            "series": [{"t": s["t"], **{f"{info[int(k)]['role']}:{k}": v for k, v in s["cpu"].items()}}
                       for s in samples]}


# --------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------
def _find_keys(obj: Any, keys: Sequence[str], out: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    out = {} if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in keys and k not in out and not isinstance(v, (dict, list)):
                out[k] = v
            else:
                _find_keys(v, keys, out)
    elif isinstance(obj, list):
        for v in obj:
            _find_keys(v, keys, out)
    return out


class Runner:
    def __init__(self, args, ab_args, model, flags: List[str], base_env: Dict[str, str], pythonpath: List[str],
                 logdir: Path, deadline: float):
        self.args, self.ab, self.model, self.flags = args, ab_args, model, flags
        self.base_env, self.pythonpath, self.logdir, self.deadline = base_env, pythonpath, logdir, deadline
        self.driver: Optional[BenchDriver] = None
        self.driver_starts = 0

    def left(self) -> float:
        return self.deadline - time.time()

    def ensure_driver(self) -> Optional[BenchDriver]:
        """The bench_serving process (a new one if a timed-out run killed the last)."""
        if self.driver is not None and self.driver.proc.poll() is None:
            return self.driver
        if self.driver is not None:
            self.driver.close(kill=True)
        env = dict(self.base_env)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [x for x in [self.base_env.get("PYTHONPATH", "")] if x])
        self.driver_starts += 1
        self.driver = BenchDriver(self.args.python, env, self.logdir / f"bench_serving-{self.driver_starts}.log")
        return self.driver

    def server_cmd(self, sp: ServerPlan, port: int) -> List[str]:
        module, extra = arm_launch(self.ab, sp.kind)
        return launch_cmd(self.args.python, module, [*self.flags, *sp.flags], self.ab.host, port, extra)

    def bench(self, server: Server, sp: ServerPlan, interval: Optional[int], tag: str,
              output_len: Optional[int] = None, sample: bool = True) -> Dict[str, Any]:
        """One bench_serving run: the CPU sampler and the server log's window around it."""
        b = int(self.args.batch)
        out_file = self.logdir / f"bench-{sp.label}-{tag}.jsonl"
        argv = bench_argv(server.url, self.model, self.ab, b, interval if sp.via == "request" else None,
                          str(out_file), output_len)
        entry: Dict[str, Any] = {"server": sp.label, "kind": sp.kind, "interval": interval, "interval_via": sp.via,
                                 "batch": b, "command": "python -m sglang.bench_serving " + shlex.join(argv)}
        driver = self.ensure_driver()
        ready = driver.wait_ready(max(30.0, self.left()))
        if not ready.get("ok"):
            entry.update(ok=False, error=f"bench driver not ready: {ready.get('error')}")
            return entry
        start = decode_rate.log_offset(server.log_path)
        sampler = CpuSampler(server.proc.pid, driver.proc.pid, self.args.sample_period).start() if sample else None
        try:
            res = driver.run(argv, timeout=min(self.args.bench_timeout, max(10.0, self.left())))
        finally:
            cpu = sampler.stop() if sampler else None
        window = decode_rate.log_window(server.log_path, start)
        entry.update(ok=bool(res.get("ok")), seconds=res.get("seconds"), error=res.get("error"))
        try:
            lines = out_file.read_text().strip().splitlines()
            entry["result"] = trim_bench(json.loads(lines[-1])) if lines else None
        except (OSError, ValueError) as e:
            entry["result"] = None
            entry["error"] = entry["error"] or f"no bench_serving output: {e}"
        if entry["result"] is None:
            entry["ok"] = False
        entry["rates"] = decode_rate.rates(window, entry["result"], b)
        if cpu is not None:
            entry["cpu"] = cpu
        return entry

    def serve(self, sp: ServerPlan, later: int) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
        """Start one server, warm it, measure its intervals, stop it; ``later``: servers still to come."""
        args = self.args
        port = free_port(self.ab.host)
        cmd = self.server_cmd(sp, port)
        env = server_env(self.base_env, self.ab, Phase(sp.label, sp.kind, False, None, True, False), self.model,
                         self.pythonpath)
        server = Server(sp.label, cmd, env, self.logdir / f"server-{sp.label}.log", self.ab.host, port)
        rec: Dict[str, Any] = {"label": sp.label, "kind": sp.kind, "flags": sp.flags, "interval_via": sp.via,
                               "command": shlex.join(cmd), "env": env_delta(env, self.base_env),
                               "log": server.log_path.name, "status": "started"}
        runs: List[Dict[str, Any]] = []
        log(f"{sp.label}: starting on port {port}: {' '.join(sp.flags) or '(no extra flags)'}")
        self.ensure_driver()  # imports bench_serving while the server starts
        try:
            server.start()
            rec["startup_s"] = round(server.wait_ready(min(args.server_timeout, max(10.0, self.left()))), 1)
            log(f"{sp.label}: healthy after {rec['startup_s']} s")
            try:
                rec["server_info"] = _find_keys(http_json(server.url + "/server_info", timeout=30), INFO_KEYS)
            except Exception as e:  # noqa: BLE001
                rec["server_info_error"] = f"{type(e).__name__}: {e}"
            if args.warmup_output_len > 0:
                w = self.bench(server, sp, (sp.intervals + sp.extra_intervals)[0], "warmup",
                               output_len=args.warmup_output_len, sample=False)
                rec["warmup"] = {"ok": w.get("ok"), "seconds": w.get("seconds"), "error": w.get("error")}
            for i in sp.intervals + sp.extra_intervals:
                optional = i in sp.extra_intervals
                need = args.reserve_s + (later * args.est_server_s if optional else 0.0)
                if self.left() < need:
                    runs.append({"server": sp.label, "kind": sp.kind, "interval": i, "interval_via": sp.via,
                                 "batch": int(args.batch), "skipped": f"deadline: {self.left():.0f} s left, "
                                 f"{need:.0f} s kept for the rest"})
                    log(f"{sp.label}: interval {i} skipped ({self.left():.0f} s left)")
                    continue
                e = self.bench(server, sp, i, f"si{i}")
                runs.append(e)
                r, c = e.get("rates") or {}, e.get("cpu") or {}
                log(f"{sp.label}: interval {i}: client {report.fmt(r.get('client_tok_s'), 0)} tok/s, at full batch "
                    f"{report.fmt(r.get('client_full_batch_tok_s'), 0)}, decode {report.fmt(r.get('decode_tok_s'), 0)}"
                    f" tok/s; hottest {c.get('hottest')} "
                    f"{report.fmt(((c.get('roles') or {}).get(c.get('hottest')) or {}).get('cpu_pct', {}).get('p50'), 0)}"
                    f"%, saturated {c.get('saturated')} ({'ok' if e.get('ok') else e.get('error')})")
            rec["status"] = "ok" if all(x.get("ok") or x.get("skipped") for x in runs) else "error"
        except Exception as e:  # noqa: BLE001 - ServerError and anything else: recorded, the next server runs
            rec.update(status="error", error=f"{type(e).__name__}: {e}"[:3000])
            log(f"{sp.label}: ERROR {rec['error'][:1500]}")
        finally:
            rec["shutdown"] = server.stop(grace=args.shutdown_grace)
            try:
                text = server.log_path.read_text(errors="replace")
                rec["replayssm_seams"] = seams_state(text)
                rec["replayssm_conv_verify"] = conv_verify_state(text)
            except OSError:
                pass
        if sp.kind == "staged" and rec.get("replayssm_seams") not in (None, True):
            rec.update(status="error", error=f"arm kind staged needs the replay-ring seams on, the server logged "
                                            f"replay_ring={rec.get('replayssm_seams')}")
        return rec, runs

    def close(self) -> None:
        if self.driver is not None:
            self.driver.close()


def render_markdown(res: Dict[str, Any]) -> str:
    """The table the lead copies: one row per (server, interval)."""
    setup = res["setup"]
    head = ["server", "interval", "client tok/s", "client at full batch", "decode tok/s (scheduler)",
            "client / decode", "client-path bound", *[f"{r} CPU %" for r in ROLE_ORDER], "hottest (busiest thread %)",
            "saturated"]
    rows = []
    for e in res["runs"]:
        if e.get("skipped"):
            rows.append([e["server"], e["interval"], "skipped"] + ["—"] * (len(head) - 3))
            continue
        r, c = e.get("rates") or {}, e.get("cpu") or {}
        roles = c.get("roles") or {}

        def pct(role: str, key: str = "cpu_pct") -> str:
            v = ((roles.get(role) or {}).get(key) or {})
            return f"{report.fmt(v.get('p50'), 0)} (max {report.fmt(v.get('max'), 0)})" if v else "—"

        hot = c.get("hottest")
        rows.append([e["server"], f"{e['interval']} ({e['interval_via']})", report.fmt(r.get("client_tok_s"), 0),
                     report.fmt(r.get("client_full_batch_tok_s"), 0), report.fmt(r.get("decode_tok_s"), 0),
                     report.fmt(r.get("client_to_decode"), 2),
                     {True: "**yes**", False: "no"}.get(r.get("client_path_bound"), "—"),
                     *[pct(role) for role in ROLE_ORDER],
                     f"{hot} ({pct(hot, 'top_thread_pct')})" if hot else "—", ", ".join(c.get("saturated") or []) or "—"])
    servers = [[s["label"], s["kind"], " ".join(s.get("flags") or []) or "—", s.get("status"),
                report.fmt(s.get("startup_s"), 0), json.dumps(s.get("server_info") or {}, sort_keys=True)]
               for s in res["servers"]]
    what = (f"Model `{setup['model']}`, batch {setup['batch']} (bench_serving --max-concurrency), "
            f"{setup['prompts']} prompts of {setup['input_len']} random token ids, {setup['output_len']} output "
            f"tokens each, streaming; SGLang {res.get('sglang_version')}, commit {res.get('git_commit')}, "
            f"{(res.get('gpu') or {}).get('name')}, {res.get('host_cpus')} CPUs.\n\n"
            "CPU % is the share of one core (p50 over the run's samples every "
            f"{setup['sample_period_s']} s, and the max); a Python process's busiest thread at ~100% is a cap. "
            "The scheduler busy-waits on the GPU and sits near 100% at any load. *client at full batch* is "
            "batch / median per-token ITL, *decode* the median `gen throughput` of the scheduler's `Decode batch` "
            "lines "
            f"with at least {decode_rate.FULL_BATCH_FRACTION:.0%} of the batch running; a run is client-path bound "
            f"when they disagree by more than {decode_rate.CLIENT_PATH_TOLERANCE:.0%}.")
    return "\n".join([
        f"# Streaming cap: {setup['model']}", "", what, "",
        report.markdown_table(head, rows), "", "## Servers", "",
        report.markdown_table(["server", "arm", "extra SGLang flags", "status", "startup s", "settings (/server_info)"],
                              servers), ""])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.streaming_cap", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-nemotron-h", help="built-in geometry or model dir (as eval.ab)")
    p.add_argument("--arms", default="stock,staged", help="eval.ab arm kinds, one server each, in order")
    p.add_argument("--variant", action="append", metavar="[LABEL=]KIND:FLAGS",
                   help="one more server: arm KIND with extra SGLang flags, e.g. 'staged:--incremental-streaming-"
                        "output' or 'tw2=staged:--tokenizer-worker-num 2' (repeatable; after the arms)")
    p.add_argument("--intervals", default="1,8", help="stream intervals measured on every arm")
    p.add_argument("--extra-intervals", default="2,4",
                   help="stream intervals measured on the arms only while the deadline allows ('' for none)")
    p.add_argument("--variant-intervals", default="1,8", help="stream intervals measured on every --variant")
    p.add_argument("--interval-mode", choices=("request", "server"), default="request",
                   help="request: sampling_params.stream_interval per request (one server per arm); server: "
                        "SGLang's --stream-interval flag (one server per arm and interval)")
    p.add_argument("--batch", type=int, default=256, help="bench_serving --max-concurrency")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=1, help="waves: prompts = batch x rounds")
    p.add_argument("--warmup-output-len", type=int, default=16,
                   help="one unsampled run of batch prompts with this many output tokens after each start (0: none)")
    p.add_argument("--sample-period", type=float, default=0.5, help="seconds between CPU samples")
    p.add_argument("--deadline-s", type=float, default=0.0, help="stop starting work after this many seconds")
    p.add_argument("--reserve-s", type=float, default=15.0, help="kept for stopping and writing under a deadline")
    p.add_argument("--min-server-s", type=float, default=75.0,
                   help="skip a server when less than this is left before the deadline")
    p.add_argument("--est-server-s", type=float, default=100.0,
                   help="time one later server needs (start + runs): --extra-intervals run only while this is kept "
                        "for each server still to come")
    p.add_argument("--server-timeout", type=float, default=420.0)
    p.add_argument("--bench-timeout", type=float, default=300.0)
    p.add_argument("--shutdown-grace", type=float, default=15.0)
    p.add_argument("--python", default=sys.executable, help="interpreter for the servers and bench_serving")
    p.add_argument("--out-dir", default=str(ROOT / "eval" / "results"))
    p.add_argument("--log-dir", default=None, help="server and bench logs (default: <out-dir>/logs-streaming-cap)")
    p.add_argument("--tag", default=None, help="suffix of the result names")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the command lines, start nothing")
    return p


def check_args(args) -> None:
    if args.batch < 1 or args.input_len < 1 or args.output_len < 2 or args.rounds < 1:
        raise ValueError("--batch, --input-len and --rounds take positive integers and --output-len 2 or more, got "
                         f"{args.batch}, {args.input_len}, {args.rounds}, {args.output_len}")
    if args.sample_period <= 0:
        raise ValueError(f"--sample-period takes a positive number of seconds, got {args.sample_period}")


def main(argv: Optional[List[str]] = None) -> int:
    args, passthrough = build_parser().parse_known_args(argv)
    try:
        check_args(args)
        plan = plan_servers(args)
        ab_args = ab_args_from(args, passthrough)
        parse_batches(ab_args.batch)
    except ValueError as e:
        print(f"python -m eval.streaming_cap: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # eval.ab's parser rejected a flag this script passed on to it
        if e.code in (0, None):
            raise
        print(f"python -m eval.streaming_cap: error: flags it does not know go to python -m eval.ab's parser, "
              f"which rejected {shlex.join(passthrough)!r} (see the message above)", file=sys.stderr)
        return 2
    try:
        import psutil  # noqa: F401
    except ImportError:
        print("python -m eval.streaming_cap: error: psutil is not importable by this interpreter (SGLang needs it "
              "too: run it with the servers' --python)", file=sys.stderr)
        return 2
    t0 = time.time()
    deadline = t0 + args.deadline_s if args.deadline_s > 0 else math.inf
    workdir = Path(tempfile.mkdtemp(prefix="replayssm-streaming-cap-"))
    model = prepare_model(ab_args, workdir, False)
    flags = common_server_flags(ab_args, model, False)
    pythonpath = server_pythonpath(ab_args, workdir)
    base_env = dict(os.environ)
    out_dir = Path(args.out_dir)
    logdir = Path(args.log_dir) if args.log_dir else out_dir / "logs-streaming-cap"
    stem = "-".join(["streaming-cap", model.name] + ([args.tag] if args.tag else []))
    runner = Runner(args, ab_args, model, flags, base_env, pythonpath, logdir, deadline)
    if args.dry_run:
        for sp in plan:
            print(f"# {sp.label} ({sp.kind}): intervals {sp.intervals} + if time {sp.extra_intervals} via {sp.via}")
            env = env_delta(server_env(base_env, ab_args, Phase(sp.label, sp.kind, False, None, True, False), model,
                                       pythonpath), base_env)
            print("  env: " + " ".join(f"{k}={v}" for k, v in env.items()))
            print("  " + shlex.join(runner.server_cmd(sp, 30000)))
            for i in sp.intervals + sp.extra_intervals:
                print("  python -m sglang.bench_serving " + shlex.join(bench_argv(
                    "http://127.0.0.1:30000", model, ab_args, args.batch, i if sp.via == "request" else None,
                    f"bench-{sp.label}-si{i}.jsonl")))
        return 0

    from eval.ab.results import dist_version, git_commit, gpu_info

    atexit.register(_stop_all)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: (_stop_all(), sys.exit(130)))
    logdir.mkdir(parents=True, exist_ok=True)
    res: Dict[str, Any] = {
        "schema": SCHEMA, "kind": "streaming-cap", "git_commit": git_commit(), "sglang_version": dist_version("sglang"),
        "gpu": gpu_info(), "host_cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "setup": {"model": model.name, "batch": args.batch, "prompts": args.batch * args.rounds,
                  "input_len": args.input_len, "output_len": args.output_len, "sample_period_s": args.sample_period,
                  "full_batch_fraction": decode_rate.FULL_BATCH_FRACTION,
                  "client_path_tolerance": decode_rate.CLIENT_PATH_TOLERANCE, "saturated_pct": SATURATED_PCT,
                  "server_flags": flags, "argv": sys.argv[1:] if argv is None else list(argv)},
        "plan": [asdict(sp) for sp in plan], "servers": [], "runs": []}
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    try:
        for n, sp in enumerate(plan):
            later = len(plan) - n - 1
            optional = not sp.intervals  # a server of --extra-intervals only (--interval-mode server)
            need = args.min_server_s + (later * args.est_server_s if optional else 0.0)
            if runner.left() < need:
                res["servers"].append({"label": sp.label, "kind": sp.kind, "flags": sp.flags, "status": "skipped",
                                       "error": f"deadline: {runner.left():.0f} s left"})
                log(f"{sp.label}: skipped ({runner.left():.0f} s left)")
                continue
            rec, runs = runner.serve(sp, later)
            res["servers"].append(rec)
            res["runs"] += runs
            report.write_json(json_path, res)  # partial results after each server (a killed call keeps them)
            md_path.write_text(render_markdown(res))
    finally:
        runner.close()
        _stop_all()
    res["sglang_version"] = res["sglang_version"] or next(
        (s.get("server_info", {}).get("version") for s in res["servers"] if s.get("server_info")), None)
    res["wall_s"] = round(time.time() - t0, 1)
    report.write_json(json_path, res)
    md_path.write_text(render_markdown(res))
    log(f"wrote {json_path} and {md_path} ({res['wall_s']} s)")
    print(md_path.read_text(), flush=True)
    bad = [s for s in res["servers"] if s.get("status") == "error"] + \
          [r for r in res["runs"] if not r.get("skipped") and not r.get("ok")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
