"""A/B harness: stock SGLang vs ``sglang_replayssm`` on real SGLang servers.

One command starts, one after another and with identical SGLang flags,

* ``python -m sglang.launch_server ...``            (arm ``stock``)
* ``python -m sglang_replayssm.launch_server ...``  (arm ``staged``: the replay path, the launcher's default;
  arm ``patched`` adds ``--replayssm-staged false``, the launch checks over SGLang's own kernels)

waits for ``/health``, drives each with SGLang's own ``sglang.bench_serving`` (token-id
prompts: ``--dataset-name random-ids --tokenize-prompt``; one run per batch size with
``--max-concurrency B``), sends the same greedy parity prompts (N generated tokens, top-k
logprobs) to every server, records ``/server_info`` (max running requests, memory, spec
accept length), ``/metrics`` and the GPU's peak memory (``nvidia-smi``), and stops each
server (SIGTERM to its process group, SIGKILL after a grace period), also on failure.

    python -m eval.ab --model nemotron-h-8b --batch 1,32,128,256
    python -m eval.ab --model tiny-nemotron-h --arms stock,stock,staged    # + noise floor
    python -m eval.ab --model tiny-qwen3-next --spec nextn --sim-acc-len 2.5
    python -m eval.ab --render eval/results/ab-....json                   # re-draw md/png
    python -m eval.ab --list-models

``--arms`` lists the servers in order; every later arm is compared with the first one
(``stock,stock,staged`` gives ``stock-vs-stock``, the noise floor, and
``stock-vs-staged``).  Results: ``<out-dir>/ab-<model>[-<spec>]-<a>-vs-<b>.{json,md,png}`` (the arms'
kinds; a launch-config variant or a second comparison of the same kinds is named by the arms' labels,
e.g. ``stock-vs-staged-sf`` or ``stock-vs-staged-2``).

Models: a built-in geometry (``eval/models.py``; ``--load-format dummy`` with scaled random
weights from ``eval/weights.py``, the same seed on every server) or a model directory.
The harness writes the plugin entry points it needs (``eval/entry_points.py``) into a
temporary directory on the servers' ``PYTHONPATH``, so no ``pip install`` is needed.

Speculative decoding (``--spec nextn``; ``eagle`` with ``--spec-draft-model``): speed runs
use ``SGLANG_SIMULATE_ACC_LEN`` when ``--sim-acc-len`` is given (controlled acceptance).
Simulated acceptance replaces target tokens, so parity then runs on extra servers without
simulation: each arm with spec, and a non-spec stock reference (spec vs non-spec greedy
equality).
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import queue
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "replayssm-ab/1"

STOCK_MODULE = "sglang.launch_server"
PATCHED_MODULE = "sglang_replayssm.launch_server"
# stock: plain SGLang; patched: our launcher with ``--replayssm-staged false`` (the launch checks only,
# SGLang's own SSM kernels); staged: our launcher as users run it (its default: the replay-ring seams,
# decode and verify); upstream: plain SGLang with its own GDN replay kernel (``--enable-linear-replayssm``)
ARM_KINDS = ("stock", "patched", "staged", "upstream")
STOCK_KINDS = ("stock", "upstream")  # plain SGLang launcher, no replayssm plugin
SPEC_ALGOS = {"none": None, "nextn": "NEXTN", "eagle": "EAGLE"}
BENCH_KEYS = (
    "completed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
    "input_throughput", "output_throughput", "total_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p95_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p90_itl_ms", "p95_itl_ms", "p99_itl_ms",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms",
    "concurrency", "accept_length", "max_output_tokens_per_s", "max_concurrent_requests",
)
METRIC_NAMES = ("spec_accept_length", "spec_accept_rate", "num_running_reqs", "gen_throughput",
                "token_usage", "num_queue_reqs", "generation_tokens_total", "prompt_tokens_total")
DLOGPROB_BINS = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
DLOGPROB_LABELS = ("0", "≤1e-6", "≤1e-5", "≤1e-4", "≤1e-3", "≤1e-2", "≤0.1", ">0.1")


def log(msg: str) -> None:
    print(f"[ab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------
@dataclass
class Phase:
    label: str                  # unique: "stock", "stock-2", "patched", "patched-spec-parity", ...
    kind: str                   # one of ARM_KINDS
    spec: bool                  # speculative flags on
    sim_acc_len: Optional[float]
    bench: bool
    parity: bool
    role: str = "arm"           # "arm" | "spec-parity" | "reference"
    kernel_config: Optional[str] = None  # this arm's kernel launch-config YAML (patched/staged ``@FILE``)


def parse_arms(text: str) -> List[Tuple[str, str, bool, Optional[str]]]:
    """``"stock,stock,patched"`` -> [("stock", "stock", False, None), ("stock-2", "stock", False, None),
    ("patched", "patched", False, None)].  A ``:nospec`` suffix (``stock:nospec``) runs that arm without
    the speculative flags of a ``--spec`` run (label ``stock-nospec``): the non-speculative
    baseline measured in the same run.  A patched or staged arm may end in ``@FILE``: that server runs
    with FILE as its kernel launch-config YAML (``SGLANG_REPLAYSSM_KERNEL_CONFIG``; label
    ``staged-<file stem>``), so launch variants are compared inside the server in one run."""
    items = [a.strip() for a in text.split(",") if a.strip()]
    if not items:
        raise ValueError("--arms is empty")
    out, seen = [], {}
    for item in items:
        head, at, cfg = item.partition("@")
        kind, _, mod = head.partition(":")
        if kind not in ARM_KINDS or mod not in ("", "nospec") or (at and not cfg):
            raise ValueError(f"unknown arm {item!r}; accepted: {', '.join(ARM_KINDS)}, each optionally with "
                             ":nospec, and patched or staged with @<kernel launch-config YAML>")
        if cfg and kind in STOCK_KINDS:
            raise ValueError(f"arm {item!r}: a kernel launch-config file (@FILE) applies to patched and staged "
                             "arms only (stock servers do not run the replay kernels)")
        if cfg and not Path(cfg).is_file():
            raise ValueError(f"arm {item!r}: kernel launch-config file {cfg!r} not found")
        base = f"{kind}-nospec" if mod else kind
        if cfg:
            base += "-" + (re.sub(r"[^A-Za-z0-9]+", "-", Path(cfg).stem).strip("-") or "config")
        seen[base] = seen.get(base, 0) + 1
        label = base if seen[base] == 1 else f"{base}-{seen[base]}"
        while label in {o[0] for o in out}:  # e.g. staged,staged,staged@2.yaml: "staged-2" twice
            seen[base] += 1
            label = f"{base}-{seen[base]}"
        out.append((label, kind, bool(mod), str(Path(cfg).resolve()) if cfg else None))
    return out


def arm_launch(args, kind: str) -> Tuple[str, List[str]]:
    """The launcher module and the launcher-only flags of one arm kind."""
    if kind in STOCK_KINDS:
        return args.stock_module, (["--enable-linear-replayssm"] if kind == "upstream" else [])
    extra = [x for e in (args.patched_arg or []) for x in shlex.split(e)]
    return args.patched_module, extra + (["--replayssm-staged", "false"] if kind == "patched" else [])


def parse_batches(text: str, flag: str = "--batch") -> List[int]:
    try:
        b = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not b or any(x < 1 for x in b):
        raise ValueError(f"{flag} takes positive integers, got {text!r}")
    return sorted(set(b))


def plan_phases(args) -> List[Phase]:
    spec = args.spec != "none"
    sim = args.sim_acc_len if spec and args.sim_acc_len else None
    # a whole accept length under "match-expected" accepts the same draft tokens on every server,
    # so simulated runs are comparable token for token (multi-token accepts, rollback, flushes)
    repeatable = sim is None or (float(sim).is_integer() and args.sim_acc_method == "match-expected")
    phases = [Phase(label, kind, spec and not nospec, None if nospec else sim, bench=not args.no_bench,
                    parity=(not args.no_parity) and repeatable and not (spec and nospec), kernel_config=cfg)
              for label, kind, nospec, cfg in parse_arms(args.arms)]
    if spec and not args.no_parity and args.spec_parity:
        if sim is not None:
            for kind in dict.fromkeys(p.kind for p in phases if p.spec):
                phases.append(Phase(f"{kind}-spec-parity", kind, True, None, bench=False, parity=True,
                                    role="spec-parity"))
        phases.append(Phase("stock-nospec-reference", "stock", False, None, bench=False, parity=True,
                            role="reference"))
    return phases


# ---------------------------------------------------------------------------------
# command lines
# ---------------------------------------------------------------------------------
@dataclass
class ModelSpec:
    name: str
    path: str                   # directory passed as --model-path
    tokenizer: str              # directory with the (synthetic) tokenizer
    builtin: bool
    config: Dict[str, Any] = field(default_factory=dict)
    size: str = "real"
    source: str = ""
    notes: str = ""
    attention_backend: Optional[str] = None
    server_flags: Tuple[str, ...] = ()
    spec_server_flags: Tuple[str, ...] = ()
    env: Dict[str, str] = field(default_factory=dict)


def prepare_model(args, workdir: Path, spec: bool) -> ModelSpec:
    from eval import models

    if args.model in models.GEOMETRIES:
        g = models.get(args.model)
        path = models.materialize(args.model, root=workdir, spec=spec)
        return ModelSpec(g.name, path, path, True, g.config_json(spec=spec), g.size, g.source, g.notes,
                         g.attention_backend, g.server_flags, g.spec_server_flags, dict(g.env))
    d = Path(args.model)
    if not (d / "config.json").is_file():
        raise SystemExit(f"--model {args.model!r}: neither a built-in geometry ({', '.join(models.names())}) "
                         "nor a directory with config.json")
    cfg = json.loads((d / "config.json").read_text())
    tok = str(d)
    if not any((d / f).exists() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        tdir = Path(tempfile.mkdtemp(prefix="replayssm-ab-tok-", dir=workdir))
        models.write_tokenizer(tdir, int(cfg["vocab_size"]))
        tok = str(tdir)
    return ModelSpec(d.name, str(d), tok, False, cfg, "real", f"model directory {d}")


def common_server_flags(args, model: ModelSpec, spec: bool) -> List[str]:
    """SGLang flags shared by every arm of a run (the port is added per server)."""
    f = ["--model-path", model.path]
    if model.tokenizer != model.path:
        f += ["--tokenizer-path", model.tokenizer]
    load_format = args.load_format or ("dummy" if model.builtin else None)
    if load_format:
        f += ["--load-format", load_format]
    backend = args.attention_backend or model.attention_backend
    if backend:
        f += ["--attention-backend", backend]
    mem = args.mem_fraction_static or (0.25 if model.builtin and model.size == "tiny" else 0.85)
    # radix on: SGLang's no_buffer mamba strategy (extra_buffer bypasses the replay ring and is
    # rejected by the patched launcher; SGLang picks it by default for some models), which
    # SGLang 0.5.17 runs only without the overlap scheduler
    f += ["--sampling-backend", args.sampling_backend] + (
        ["--disable-radix-cache"] if args.radix_cache == "off" else
        ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"])
    f += ["--mem-fraction-static", str(mem),
          "--context-length", str(args.context_length), "--random-seed", str(args.seed),
          "--enable-metrics"]
    if args.max_running_requests:
        f += ["--max-running-requests", str(args.max_running_requests)]
    if args.cuda_graph == "off":
        f += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    else:
        f += ["--cuda-graph-max-bs-decode", str(args.cuda_graph_max_bs or max(parse_batches(args.batch)))]
        if args.prefill_graph == "off":
            f += ["--cuda-graph-backend-prefill", "disabled"]
    f += list(model.server_flags)
    if spec:
        algo = SPEC_ALGOS[args.spec]
        n = args.spec_steps
        f += ["--speculative-algorithm", algo, "--speculative-num-steps", str(n),
              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(n + 1)]
        if args.spec_draft_model:
            f += ["--speculative-draft-model-path", args.spec_draft_model]
        elif args.spec == "eagle":
            raise SystemExit("--spec eagle needs --spec-draft-model (built-in geometries ship NEXTN/MTP drafts)")
        f += list(model.spec_server_flags)
    for extra in args.server_arg or []:
        f += shlex.split(extra)
    return f


def launch_cmd(python: str, module: str, flags: Sequence[str], host: str, port: int,
               extra: Sequence[str] = ()) -> List[str]:
    return [python, "-m", module, *flags, "--host", host, "--port", str(port), *extra]


def bench_serving_argv(base_url: str, model: ModelSpec, batch: int, args, out_file: str) -> List[str]:
    """Arguments of one ``python -m sglang.bench_serving`` run (one batch size)."""
    n = max(batch * args.rounds, args.min_prompts)
    return ["--backend", "sglang", "--base-url", base_url, "--model", model.path, "--tokenizer", model.tokenizer,
            "--dataset-name", "random-ids", "--tokenize-prompt",
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--random-range-ratio", "1.0", "--num-prompts", str(n), "--max-concurrency", str(batch),
            "--request-rate", "inf", "--seed", str(args.seed), "--warmup-requests", str(args.warmup_requests),
            "--ready-check-timeout-sec", "30", "--disable-tqdm", "--output-file", out_file]


def server_env(base: Dict[str, str], args, phase: Phase, model: ModelSpec, pythonpath: Sequence[str]) -> Dict[str, str]:
    from eval import weights

    env = dict(base)
    if phase.kind in STOCK_KINDS:  # plain SGLang: the replayssm plugin must stay inert
        for k in [k for k in env if k.startswith("SGLANG_REPLAYSSM_")]:
            env.pop(k)
    elif phase.kind == "staged":  # the launcher's default (seams on), whatever the caller exported
        env.pop("SGLANG_REPLAYSSM_STAGED", None)
    if phase.kernel_config:  # this arm's launch configs, over any inherited file
        env["SGLANG_REPLAYSSM_KERNEL_CONFIG"] = phase.kernel_config
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *(x for x in [base.get("PYTHONPATH", "")] if x)])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(model.env)
    if args.random_weights:
        env[weights.ENABLE_ENV] = "1"
        env[weights.SEED_ENV] = str(args.weight_seed)
    else:
        env.pop(weights.ENABLE_ENV, None)
    for k in ("SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_METHOD", "SGLANG_SIMULATE_ACC_TOKEN_MODE"):
        env.pop(k, None)
    if phase.spec and phase.sim_acc_len is not None:
        env["SGLANG_SIMULATE_ACC_LEN"] = str(phase.sim_acc_len)
        env["SGLANG_SIMULATE_ACC_METHOD"] = args.sim_acc_method
        env["SGLANG_SIMULATE_ACC_TOKEN_MODE"] = args.sim_acc_token_mode
    if args.test_retract:
        # SGLang's own retraction test hook: one running request is retracted (and later re-prefilled)
        # every N forward passes, on every server alike
        env["SGLANG_TEST_RETRACT"] = "1"
        env["SGLANG_TEST_RETRACT_INTERVAL"] = str(args.test_retract)
    return env


# settings inherited from the caller's environment that change what a server does (recorded per run)
RECORDED_ENV_PREFIXES = ("SGLANG_REPLAYSSM_", "SGLANG_TEST_", "SGLANG_FLASHINFER_WORKSPACE_SIZE")
_RETRACTED = re.compile(r"#retracted_reqs: (\d+)")


def recorded_env(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(RECORDED_ENV_PREFIXES)}


# the replay-ring seams each arm kind must run with (eval.ab checks the servers' own log line)
ARM_SEAMS = {"staged": True, "patched": False}
_SEAMS_LINE = re.compile(r"sglang_replayssm active \(pid \d+\):.*?\bstaged=(True|False)\b")


def seams_state(log_text: str) -> Any:
    """True / False when every SGLang process of the server logged that state of the replay-ring seams,
    ``"mixed"`` when they disagree, None when no process logged it (plain SGLang, stand-in servers)."""
    found = {m.group(1) == "True" for m in _SEAMS_LINE.finditer(log_text)}
    return None if not found else found.pop() if len(found) == 1 else "mixed"


def count_retractions(log_text: str) -> int:
    """Requests SGLang's scheduler retracted, summed over its "#retracted_reqs: N" log lines."""
    return sum(int(m) for m in _RETRACTED.findall(log_text))


def env_delta(env: Dict[str, str], base: Dict[str, str]) -> Dict[str, str]:
    """What the harness set or changed for a server (for the record)."""
    return {k: v for k, v in sorted(env.items()) if base.get(k) != v and k != "PYTHONPATH"}


# ---------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------
def http_json(url: str, payload: Optional[dict] = None, timeout: float = 30.0) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode() or "null")


def http_post(url: str, payload: dict, timeout: float = 30.0) -> Tuple[int, str]:
    """POST a JSON body; (status, reply text) -- SGLang's /start_profile answers in plain text."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def http_text(url: str, timeout: float = 10.0) -> Tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, ""


_PORTS_GIVEN: "set[int]" = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port, never the same one twice in this process (servers may start together)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port
    raise RuntimeError("no free port")


# ---------------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------------
_LIVE: "set[Server]" = set()


def _stop_all(*_a) -> None:
    for s in list(_LIVE):
        s.stop(grace=10)


class ServerError(RuntimeError):
    pass


class Server:
    """One SGLang server process (own session/process group), its log and lifecycle."""

    def __init__(self, label: str, cmd: List[str], env: Dict[str, str], log_path: Path, host: str, port: int):
        self.label, self.cmd, self.env, self.log_path = label, cmd, env, Path(log_path)
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"
        self.proc: Optional[subprocess.Popen] = None
        self._log = None
        self.t0 = 0.0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self._log.write("+ " + shlex.join(self.cmd) + "\n")
        self._log.flush()
        self.t0 = time.time()
        self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=str(ROOT), stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        _LIVE.add(self)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float) -> float:
        """Poll ``/health`` until 200; returns seconds since start."""
        end = time.time() + timeout
        while time.time() < end:
            if not self.alive():
                raise ServerError(f"{self.label}: server exited (rc={self.proc.returncode}) before it was "
                                  f"healthy; last log lines:\n{self.tail()}")
            code, _ = http_text(self.url + "/health", timeout=5)
            if code == 200:
                return time.time() - self.t0
            time.sleep(1.0)
        raise ServerError(f"{self.label}: not healthy after {timeout:.0f} s; last log lines:\n{self.tail()}")

    def stop(self, grace: float = 30.0) -> Dict[str, Any]:
        res: Dict[str, Any] = {"stopped": False}
        if self.proc is None:
            return res
        t = time.time()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace)
                res["how"] = "SIGTERM"
            except subprocess.TimeoutExpired:
                res["how"] = "SIGKILL"
        # reap what the server left in its group (scheduler/detokenizer children)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        res.update(stopped=True, rc=self.proc.returncode, seconds=round(time.time() - t, 1))
        if self._log:
            self._log.close()
            self._log = None
        _LIVE.discard(self)
        return res


class GpuMemSampler:
    """Peak GPU memory while a server runs (nvidia-smi polling; None without nvidia-smi).

    ``peak`` is the whole GPU's ``memory.used``; ``peak_own`` sums the compute processes in
    the server's process group (its scheduler), which stays right when servers share a GPU.
    """

    def __init__(self, index: Optional[str], pgid: Optional[int] = None, period: float = 0.5):
        self.index, self.pgid, self.period = index, pgid, period
        self.peak: Optional[float] = None
        self.peak_own: Optional[float] = None
        self.baseline: Optional[float] = self.read()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _smi(self, query: List[str]) -> List[str]:
        cmd = ["nvidia-smi", *query, "--format=csv,noheader,nounits"]
        if self.index is not None:
            cmd += ["-i", str(self.index)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            return [x.strip() for x in r.stdout.strip().splitlines() if x.strip()] if r.returncode == 0 else []
        except (OSError, subprocess.SubprocessError):
            return []

    def read(self) -> Optional[float]:
        out = self._smi(["--query-gpu=memory.used"])
        try:
            return float(out[0]) if out else None
        except ValueError:
            return None

    def read_own(self) -> Optional[float]:
        if self.pgid is None:
            return None
        total, found = 0.0, False
        for row in self._smi(["--query-compute-apps=pid,used_memory"]):
            try:
                pid, mem = [int(float(x)) for x in row.split(",")[:2]]
                if os.getpgid(pid) == self.pgid:
                    total += mem
                    found = True
            except (ValueError, ProcessLookupError, PermissionError, OSError):
                continue
        return total if found else None

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            v = self.read()
            if v is not None:
                self.peak = v if self.peak is None else max(self.peak, v)
            o = self.read_own()
            if o is not None:
                self.peak_own = o if self.peak_own is None else max(self.peak_own, o)

    def start(self) -> "GpuMemSampler":
        if self.baseline is not None and not self._t.is_alive():
            self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._t.is_alive():
            self._t.join(timeout=15)


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


# ---------------------------------------------------------------------------------
# parity
# ---------------------------------------------------------------------------------
def parity_prompts(n: int, vocab: int, seed: int) -> List[List[int]]:
    """Deterministic random token-id prompts of varied length (ids 3..vocab-1)."""
    rng = random.Random(seed)
    lengths = [7, 33, 64, 100, 128, 200, 257, 300]
    return [[rng.randrange(3, vocab) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def _top_dict(entry) -> Dict[int, float]:
    out: Dict[int, float] = {}
    for item in entry or []:
        if item and len(item) >= 2 and item[1] is not None and item[0] is not None:
            out[int(item[1])] = float(item[0])
    return out


def parse_generate_output(item: dict) -> Dict[str, Any]:
    """tokens, chosen-token logprobs and top-k dicts from one ``/generate`` result."""
    meta = item.get("meta_info", {}) or {}
    otl = meta.get("output_token_logprobs") or []
    tokens = [int(t[1]) for t in otl] if otl else [int(t) for t in item.get("output_ids", [])]
    lps = [None if t[0] is None else float(t[0]) for t in otl] if otl else [None] * len(tokens)
    top = [_top_dict(e) for e in (meta.get("output_top_logprobs") or [])]
    out = {"tokens": tokens, "logprobs": lps, "top": top}
    if "spec_accept_length" in meta:
        out["spec_accept_length"] = meta["spec_accept_length"]
    return out


def run_parity(url: str, prompts: List[List[int]], n_tokens: int, topk: int, timeout: float,
               sample_path: Optional[Path] = None) -> Dict[str, Any]:
    payload = {"input_ids": prompts,
               "sampling_params": {"temperature": 0.0, "max_new_tokens": n_tokens, "ignore_eos": True},
               "return_logprob": True, "top_logprobs_num": topk}
    t0 = time.time()
    res = http_json(url + "/generate", payload, timeout=timeout)
    if isinstance(res, dict):
        res = [res]
    if sample_path is not None and res:  # a short raw sample of the server's answer, for the tests
        try:
            sample_path.write_text(json.dumps(_truncate_generate(res[0], 8), indent=1))
        except OSError:
            pass
    outs = [parse_generate_output(r) for r in res]
    return {"seconds": round(time.time() - t0, 2), "outputs": outs}


def run_parity_solo(url: str, prompts: List[List[int]], args, deadline: float) -> Dict[str, Any]:
    """The parity prompts again, one request at a time: the same tokens through a batch of one.
    Stock batched vs stock solo is the noise floor of the serving engine itself (GEMM tilings
    and reduction orders change with the batch; with the radix cache on, the repeats also hit
    the prefixes cached by the batched run)."""
    t0, outs = time.time(), []
    for pr in prompts:
        res = run_parity(url, [pr], args.parity_tokens, args.parity_topk,
                         timeout=min(args.parity_timeout, max(10.0, deadline - time.time())))
        outs += res["outputs"]
    return {"seconds": round(time.time() - t0, 2), "outputs": outs}


def _truncate_generate(item: dict, n: int) -> dict:
    out = {k: v for k, v in item.items() if k != "meta_info"}
    if isinstance(out.get("output_ids"), list):
        out["output_ids"] = out["output_ids"][:n]
    if isinstance(out.get("text"), str):
        out["text"] = " ".join(out["text"].split()[:n])
    meta = dict(item.get("meta_info") or {})
    for k in ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs", "input_top_logprobs"):
        if isinstance(meta.get(k), list):
            meta[k] = meta[k][:n]
    out["meta_info"] = meta
    return out


def slim_outputs(outs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """What the result JSON keeps of a parity run: tokens and chosen-token logprobs (8 digits)."""
    return [{"tokens": o["tokens"], "logprobs": [None if x is None else float(f"{x:.8g}") for x in o["logprobs"]]}
            for o in outs]


def _bin_index(d: float) -> int:
    if d == 0.0:
        return 0
    for i, edge in enumerate(DLOGPROB_BINS[1:], start=1):
        if d <= edge:
            return i
    return len(DLOGPROB_BINS)


def compare_parity(ref: List[Dict[str, Any]], other: List[Dict[str, Any]], near_tie_tol: float,
                   expected_tokens: Optional[int] = None) -> Dict[str, Any]:
    """Token-by-token comparison of two parity runs (same prompts, greedy).

    Per prompt, tokens are compared up to the first divergence (after it the sequences
    condition on different text).  A divergence where each side's top-2 gap between the two
    tokens is <= ``near_tie_tol`` is a logged near-tie, not a mismatch.  |Δlogprob| is taken
    over the common prefix, for the chosen token and for top-k tokens present on both sides.
    """
    hist = [0] * len(DLOGPROB_LABELS)
    max_d = 0.0
    max_dk = 0.0
    compared = identical = mismatches = 0
    near, diverged, first = [], [], []
    missing_lp = 0
    for p, (a, b) in enumerate(zip(ref, other)):
        ta, tb = a["tokens"], b["tokens"]
        n = min(len(ta), len(tb))
        div = next((i for i in range(n) if ta[i] != tb[i]), None)
        if div is None and len(ta) != len(tb):
            div = n
        upto = n if div is None else min(div, n)
        compared += upto
        for i in range(upto):
            la = a["logprobs"][i] if i < len(a["logprobs"]) else None
            lb = b["logprobs"][i] if i < len(b["logprobs"]) else None
            if la is None or lb is None:
                missing_lp += 1
                continue
            d = abs(la - lb)
            max_d = max(max_d, d)
            hist[_bin_index(d)] += 1
            if i < len(a["top"]) and i < len(b["top"]):
                for tok in set(a["top"][i]) & set(b["top"][i]):
                    max_dk = max(max_dk, abs(a["top"][i][tok] - b["top"][i][tok]))
        first.append(div)
        if div is None:
            identical += 1
            continue
        rec = {"prompt": p, "pos": div}
        if div < n:
            ta_i, tb_i = ta[div], tb[div]
            topa = a["top"][div] if div < len(a["top"]) else {}
            topb = b["top"][div] if div < len(b["top"]) else {}
            gap_a = topa.get(ta_i, math.inf) - topa.get(tb_i, -math.inf)
            gap_b = topb.get(tb_i, math.inf) - topb.get(ta_i, -math.inf)
            rec.update(a_token=ta_i, b_token=tb_i, gap_a=gap_a if math.isfinite(gap_a) else None,
                       gap_b=gap_b if math.isfinite(gap_b) else None)
            if math.isfinite(gap_a) and math.isfinite(gap_b) and gap_a <= near_tie_tol and gap_b <= near_tie_tol:
                rec["kind"] = "near-tie"
                near.append(rec)
                continue
        else:
            rec["kind"] = "length"
        rec.setdefault("kind", "mismatch")
        mismatches += 1
        diverged.append(rec)
    total = sum(len(a["tokens"]) for a in ref)
    exact = (mismatches == 0 and not near and identical == len(ref) == len(other) and max_d == 0.0 and max_dk == 0.0
             and (expected_tokens is None or all(len(a["tokens"]) == expected_tokens for a in ref + other)))
    return {
        "prompts": len(ref), "tokens_per_prompt": expected_tokens, "tokens_total": total,
        "tokens_compared": compared, "identical_prompts": identical, "mismatches": mismatches,
        "near_ties": near, "mismatch_details": diverged, "first_divergence": first,
        "max_abs_dlogprob": max_d, "max_abs_dlogprob_topk": max_dk,
        "dlogprob_hist": {"labels": list(DLOGPROB_LABELS), "counts": hist}, "missing_logprobs": missing_lp,
        "near_tie_tol": near_tie_tol, "exact": exact,
    }


# ---------------------------------------------------------------------------------
# server facts
# ---------------------------------------------------------------------------------
def parse_metrics(text: str, names: Sequence[str] = METRIC_NAMES) -> Dict[str, float]:
    """Sum of each ``sglang:<name>`` sample over its label sets (Prometheus text format)."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("sglang:"):
            continue
        try:
            key, val = line.rsplit(None, 1)
            v = float(val)
        except ValueError:
            continue
        base = key[len("sglang:"):].split("{", 1)[0]
        if base in names and math.isfinite(v):
            out[base] = out.get(base, 0.0) + v
    return out


def server_facts(info: Optional[dict]) -> Dict[str, Any]:
    """The numbers the report needs from ``/server_info``."""
    if not isinstance(info, dict):
        return {}
    states = info.get("internal_states") or [{}]
    st = states[0] if states else {}
    mem = st.get("memory_usage") or {}
    return {
        "version": info.get("version"),
        "max_running_requests": st.get("effective_max_running_requests_per_dp", info.get("max_running_requests")),
        "max_total_num_tokens": info.get("max_total_num_tokens"),
        "token_capacity": mem.get("token_capacity"),
        "memory_usage": mem,
        "avg_spec_accept_length": st.get("avg_spec_accept_length"),
        "attention_backend": info.get("attention_backend"),
        "cuda_graph_max_bs": info.get("cuda_graph_max_bs_decode", info.get("cuda_graph_max_bs")),
    }


def trim_bench(res: dict) -> dict:
    return {k: res.get(k) for k in BENCH_KEYS if k in res}


# ---------------------------------------------------------------------------------
# environment facts
# ---------------------------------------------------------------------------------
def git_commit() -> str:
    c = os.environ.get("GIT_COMMIT")
    if c:
        return c
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=str(ROOT), capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def dist_version(name: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def gpu_info() -> Dict[str, Any]:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=15)
        rows = [x.strip() for x in r.stdout.strip().splitlines() if x.strip()]
        if r.returncode == 0 and rows:
            name, drv, mem = [s.strip() for s in rows[0].split(",")]
            return {"name": name, "driver": drv, "memory_mib": float(mem), "count": len(rows)}
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return {"name": "none", "driver": None, "memory_mib": None, "count": 0}


# Triton's text IRs: a cache hit loads only a kernel's metadata .json and its .cubin (and the launcher .so), so
# these are debugging dumps, about 4/5 of the cache; leaving them out keeps the carried bundle under the limit.
TRITON_IR_SUFFIXES = (".llir", ".ptx", ".ttir", ".ttgir", ".source")


def save_jitcache(dest: Path) -> Dict[str, Any]:
    """Tarballs of ``$SGLANG_CACHE_ROOT/{triton}`` (without its text IRs) and ``{flashinfer,tvm-ffi}``
    (bundle README).  FlashInfer's object files stay: its ninja build recompiles a missing one."""
    root = Path(os.environ.get("SGLANG_CACHE_ROOT", "/tmp/sglang-cache"))
    out: Dict[str, Any] = {"root": str(root)}
    if not root.is_dir():
        out["error"] = "no cache root"
        return out
    dest.mkdir(parents=True, exist_ok=True)
    for fname, parts in (("jit-triton.tgz", ["triton"]), ("jit-other.tgz", ["flashinfer", "tvm-ffi"])):
        present = [p for p in parts if (root / p).is_dir()]
        if not present:
            continue
        path = dest / fname
        with tarfile.open(path, "w:gz") as tf:
            for p in present:
                tf.add(str(root / p), arcname=p, filter=_jitcache_member)
        out[fname] = round(path.stat().st_size / 2**20, 2)
    return out


def _jitcache_member(info: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
    top = info.name.split("/", 1)[0]
    return None if top == "triton" and info.isfile() and info.name.endswith(TRITON_IR_SUFFIXES) else info


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


# ---------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------
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
                        rec["parity"] = run_parity(server.url, prompts, args.parity_tokens, args.parity_topk,
                                                   timeout=min(args.parity_timeout, max(10.0, deadline - time.time())),
                                                   sample_path=self.logdir / f"generate-sample-{phase.label}.json")
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
            res = driver.run(argv, timeout=min(args.bench_timeout, max(10.0, deadline - time.time())))
            entry.update(ok=res.get("ok"), seconds=res.get("seconds"), error=res.get("error"))
            try:
                lines = Path(out_file).read_text().strip().splitlines()
                entry["result"] = trim_bench(json.loads(lines[-1])) if lines else None
            except (OSError, ValueError) as e:
                entry["result"] = None
                entry["error"] = entry.get("error") or f"no bench_serving output: {e}"
            r = entry.get("result") or {}
            log(f"{phase.label}: batch {b}: {r.get('output_throughput', float('nan')):.1f} tok/s, "
                f"TPOT p50 {r.get('median_tpot_ms', float('nan')):.2f} ms "
                f"({'ok' if entry['ok'] else entry.get('error')})")
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
        from eval import weights

        rec = self.rec
        rec["shutdown"] = self.server.stop(grace=self.args.shutdown_grace)
        if self.sampler is not None:
            self.sampler.stop()
            rec["peak_gpu_mem_mib"] = self.sampler.peak
            rec["peak_gpu_mem_own_mib"] = self.sampler.peak_own
        try:
            text = self.server.log_path.read_text(errors="replace")
            rec["random_weights_confirmed"] = weights.LOG_MARKER in text
            rec["replayssm_active"] = "sglang_replayssm active" in text
            rec["replayssm_seams"] = seams_state(text)
            rec["retracted_reqs"] = count_retractions(text)
        except OSError:
            pass
        want = ARM_SEAMS.get(self.phase.kind)
        if want is not None and rec.get("replayssm_seams") not in (None, want):
            # e.g. an inherited SGLANG_REPLAYSSM_CONFIG with ``staged: false`` under a staged arm
            rec["status"] = "error"
            rec["error"] = (f"arm kind {self.phase.kind} needs the replay-ring seams "
                            f"{'on' if want else 'off'}, but the server logged staged={rec['replayssm_seams']}")
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


def comparisons(phases: List[Dict[str, Any]]) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    arms = [p for p in phases if p["phase"]["role"] == "arm"]
    return [(arms[0], b) for b in arms[1:]]


def compare(a: Dict[str, Any], b: Dict[str, Any], phases: List[Dict[str, Any]], args) -> Dict[str, Any]:
    """Summary of arm ``b`` against arm ``a``."""
    from eval import ab_report

    ba, bb = ab_report.bench_rows(a), ab_report.bench_rows(b)
    rows = {}
    for bs in sorted(set(ba) & set(bb)):
        ra, rb = ba[bs], bb[bs]

        def rat(num, den):
            x, y = num, den
            return (x / y) if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y else None

        rows[bs] = {
            "throughput_ratio": rat(rb.get("output_throughput"), ra.get("output_throughput")),
            "tpot_speedup": rat(ra.get("median_tpot_ms"), rb.get("median_tpot_ms")),
            "itl_p99_ratio": rat(rb.get("p99_itl_ms"), ra.get("p99_itl_ms")),
        }
    ratios = [r["throughput_ratio"] for r in rows.values() if r["throughput_ratio"]]
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
    out: Dict[str, Any] = {
        "a": a["label"], "b": b["label"], "by_batch": rows,
        "throughput_ratio_geomean": geo,
        "throughput_ratio_min": min(ratios) if ratios else None,
        "throughput_ratio_max": max(ratios) if ratios else None,
        "max_running_requests": {a["label"]: (a.get("facts") or {}).get("max_running_requests"),
                                 b["label"]: (b.get("facts") or {}).get("max_running_requests")},
        "peak_gpu_mem_mib": {x["label"]: x.get("peak_gpu_mem_own_mib") or x.get("peak_gpu_mem_mib") for x in (a, b)},
        "accept_length": {a["label"]: (a.get("server_info_after") or {}).get("avg_spec_accept_length"),
                          b["label"]: (b.get("server_info_after") or {}).get("avg_spec_accept_length")},
        "status": {a["label"]: a.get("status"), b["label"]: b.get("status")},
        "random_weights_confirmed": bool(a.get("random_weights_confirmed") and b.get("random_weights_confirmed"))
        if args.random_weights else None,
        "replayssm_active": {a["label"]: a.get("replayssm_active"), b["label"]: b.get("replayssm_active")},
        "retracted_reqs": {a["label"]: a.get("retracted_reqs"), b["label"]: b.get("retracted_reqs")},
    }
    pa, pb = a.get("parity") or {}, b.get("parity") or {}
    if "outputs" in pa and "outputs" in pb:
        out["parity"] = compare_parity(pa["outputs"], pb["outputs"], args.near_tie_tol, args.parity_tokens)
    else:
        out["parity"] = {"skipped": pa.get("skipped") or pb.get("skipped") or pa.get("error") or pb.get("error")
                         or "no parity outputs (simulated acceptance or --no-parity)"}
    sa, sb = a.get("parity_solo") or {}, b.get("parity_solo") or {}
    if "outputs" in pa and "outputs" in sa:  # the engine's own batch sensitivity: the noise floor
        out["parity_noise_floor"] = dict(compare_parity(pa["outputs"], sa["outputs"], args.near_tie_tol,
                                                        args.parity_tokens), what=f"{a['label']} batched vs solo")
    if "outputs" in sa and "outputs" in sb:
        out["parity_solo"] = compare_parity(sa["outputs"], sb["outputs"], args.near_tie_tol, args.parity_tokens)
    ref = next((p for p in phases if p["phase"]["role"] == "reference"), None)
    if ref is not None and "outputs" in (ref.get("parity") or {}):
        sp = {}
        for arm in (a, b):
            src = next((p for p in phases
                        if p["phase"]["role"] == "spec-parity" and p["phase"]["kind"] == arm["phase"]["kind"]), arm)
            if "outputs" in (src.get("parity") or {}):
                sp[arm["label"]] = dict(compare_parity(ref["parity"]["outputs"], src["parity"]["outputs"],
                                                       args.near_tie_tol, args.parity_tokens),
                                        spec_server=src["label"])
        out["spec_vs_nonspec"] = sp
    par = out["parity"]
    noise = args.noise_band
    parts = []
    if geo is not None:
        parts.append(f"throughput ratio {b['label']}/{a['label']} geomean {geo:.3f} "
                     f"(min {out['throughput_ratio_min']:.3f}, max {out['throughput_ratio_max']:.3f})"
                     + (" within the noise band" if abs(geo - 1) <= noise else ""))
    for name, pr in (("parity", par), ("solo parity", out.get("parity_solo") or {}),
                     ("noise floor", out.get("parity_noise_floor") or {})):
        if "exact" in pr:
            parts.append(f"{name} exact" if pr["exact"] else
                         f"{name}: {pr['mismatches']} mismatching prompt(s), {len(pr['near_ties'])} near-tie(s), "
                         f"max |dlogprob| {pr['max_abs_dlogprob']:.3g}")
    out["verdict"] = "; ".join(parts) if parts else "no comparable numbers"
    return out


def slim_phase(rec: Dict[str, Any]) -> Dict[str, Any]:
    q = dict(rec)
    for key in ("parity", "parity_solo"):
        par = q.get(key)
        if isinstance(par, dict) and "outputs" in par:
            q[key] = dict(par, outputs=slim_outputs(par["outputs"]))
    return q


def build_result(run: Dict[str, Any], a: Dict[str, Any], b: Dict[str, Any], args) -> Dict[str, Any]:
    summary = compare(a, b, run["phases"], args)
    extra = [p for p in run["phases"] if p["phase"]["role"] != "arm"]
    res = {k: v for k, v in run.items() if k != "phases"}
    res.update(comparison=f"{a['phase']['kind']}-vs-{b['phase']['kind']}",
               arms={a["label"]: slim_phase(a), b["label"]: slim_phase(b)},
               extra_servers={p["label"]: slim_phase(p) for p in extra}, summary=summary)
    other = [p["label"] for p in run["phases"]
             if p["phase"]["role"] == "arm" and p["label"] not in (a["label"], b["label"])]
    if other:
        res["note_shared_baseline"] = (f"arm {a['label']} is the baseline shared with the other comparison(s) of this "
                                       f"run (arms {', '.join(other)}); all arms ran one after another on one GPU")
    return res


def result_stem(model: str, spec: str, a_kind: str, b_kind: str, tag: Optional[str]) -> str:
    parts = ["ab", model] + ([spec] if spec != "none" else []) + [f"{a_kind}-vs-{b_kind}"] + ([tag] if tag else [])
    return "-".join(parts)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to run")
    g.add_argument("--model", default="tiny-nemotron-h", help="built-in geometry (--list-models) or a model dir")
    g.add_argument("--arms", default="stock,staged", help="servers in order, each stock, staged (our launcher as "
                   "users run it: the replay path), patched (our launcher with --replayssm-staged false: launch checks "
                   "only) or upstream (stock + --enable-linear-replayssm), optionally :nospec "
                   "(a --spec run's non-speculative baseline); a patched or staged arm may end in @FILE, a kernel "
                   "launch-config YAML that replaces the packaged one for that server only (label <arm>-<file "
                   "stem>; make one with python -m eval.config_variant); later arms are compared with the first")
    g.add_argument("--batch", default="1,8,32,64", help="bench_serving --max-concurrency values")
    g.add_argument("--input-len", type=int, default=128)
    g.add_argument("--output-len", type=int, default=256)
    g.add_argument("--rounds", type=int, default=2, help="prompts per batch size = batch x rounds")
    g.add_argument("--min-prompts", type=int, default=4)
    g.add_argument("--warmup-requests", type=int, default=1)
    g.add_argument("--no-bench", action="store_true", help="parity only")
    g.add_argument("--no-parity", action="store_true", help="speed only")
    g.add_argument("--list-models", action="store_true")
    g.add_argument("--render", metavar="JSON", nargs="+", help="re-draw the .md/.png of result JSON files, exit")
    g.add_argument("--dry-run", action="store_true", help="print the plan and the command lines, start nothing")
    s = p.add_argument_group("SGLang server flags (identical on every arm)")
    s.add_argument("--attention-backend", default=None, help="default: the geometry's (flashinfer/triton)")
    s.add_argument("--load-format", default=None, help="default: dummy for built-in geometries")
    s.add_argument("--sampling-backend", default="pytorch")
    s.add_argument("--mem-fraction-static", type=float, default=0.0,
                   help="default: 0.25 for tiny built-in geometries, 0.85 otherwise")
    s.add_argument("--context-length", type=int, default=4096)
    s.add_argument("--max-running-requests", type=int, default=0, help="0: SGLang decides (reported)")
    s.add_argument("--cuda-graph", choices=("on", "off"), default="on")
    s.add_argument("--radix-cache", choices=("on", "off"), default="off",
                   help="on: radix cache with SGLang's no_buffer mamba strategy and --disable-overlap-schedule "
                        "(SGLang 0.5.17 runs no_buffer only without the overlap scheduler)")
    s.add_argument("--cuda-graph-max-bs", type=int, default=0, help="default: the largest --batch")
    s.add_argument("--prefill-graph", choices=("default", "off"), default="off")
    s.add_argument("--server-arg", action="append", help="extra SGLang flags for every server (shell-split)")
    s.add_argument("--patched-arg", action="append", help="extra flags for the patched and staged arms' launcher, "
                   "e.g. '--replayssm-buffer-len 16'")
    s.add_argument("--seed", type=int, default=0, help="SGLang --random-seed, bench and parity prompt seed")
    s.add_argument("--test-retract", type=int, default=0, metavar="N",
                   help="force retraction on every server: SGLang's SGLANG_TEST_RETRACT=1 with "
                        "SGLANG_TEST_RETRACT_INTERVAL=N (one running request retracted and later re-prefilled every "
                        "N forward passes); the servers table counts the retracted requests (0: off)")
    s.add_argument("--host", default="127.0.0.1")
    w = p.add_argument_group("weights")
    w.add_argument("--random-weights", dest="random_weights", action="store_true", default=True,
                   help="scaled random weights via eval/weights.py (default with dummy load format)")
    w.add_argument("--no-random-weights", dest="random_weights", action="store_false")
    w.add_argument("--weight-seed", type=int, default=0)
    sp = p.add_argument_group("speculative decoding")
    sp.add_argument("--spec", choices=sorted(SPEC_ALGOS), default="none")
    sp.add_argument("--spec-steps", type=int, default=3, help="draft steps; draft tokens = steps + 1, topk 1")
    sp.add_argument("--spec-draft-model", default=None)
    sp.add_argument("--sim-acc-len", type=float, default=None, help="SGLANG_SIMULATE_ACC_LEN for the speed runs")
    sp.add_argument("--sim-acc-method", default="match-expected")
    sp.add_argument("--sim-acc-token-mode", default="real-draft-token")
    sp.add_argument("--no-spec-parity", dest="spec_parity", action="store_false", default=True,
                    help="skip the extra parity servers of a spec run")
    pr = p.add_argument_group("profile (eval/profile_trace.py)")
    pr.add_argument("--profile-batch", default="", metavar="B[,B...]",
                    help="after the speed runs, one more bench_serving run per listed concurrency on each server "
                         "while SGLang's /start_profile traces --profile-steps forward steps (GPU kernels only); "
                         "the result gets each arm's kernel time per step by group and the traces (default: off)")
    pr.add_argument("--profile-steps", type=int, default=20, help="forward steps in the traced window")
    pr.add_argument("--profile-delay-s", type=float, default=3.0,
                    help="seconds into the profiled run before tracing starts (the batch fills first)")
    pa = p.add_argument_group("parity")
    pa.add_argument("--parity-prompts", type=int, default=8)
    pa.add_argument("--parity-tokens", type=int, default=1024)
    pa.add_argument("--parity-topk", type=int, default=5)
    pa.add_argument("--parity-solo", action="store_true",
                    help="also send the parity prompts one at a time; stock batched vs stock solo is reported as "
                         "the engine's own noise floor (parity_noise_floor)")
    pa.add_argument("--near-tie-tol", type=float, default=0.05, help="nats; top-2 gap under which a flip is a near-tie")
    o = p.add_argument_group("run control and output")
    o.add_argument("--out-dir", default=str(ROOT / "eval" / "results"))
    o.add_argument("--tag", default=None, help="suffix for the result file names")
    o.add_argument("--log-dir", default=None, help="server and bench logs (default: <out-dir>/logs-<stem>)")
    o.add_argument("--python", default=sys.executable, help="interpreter for the servers and bench_serving")
    o.add_argument("--stock-module", default=STOCK_MODULE)
    o.add_argument("--patched-module", default=PATCHED_MODULE)
    o.add_argument("--entry-points", choices=("auto", "skip"), default="auto",
                   help="auto: write the plugin dist-infos into a temp dir on the servers' PYTHONPATH")
    o.add_argument("--server-timeout", type=float, default=600.0)
    o.add_argument("--bench-timeout", type=float, default=600.0)
    o.add_argument("--parity-timeout", type=float, default=600.0)
    o.add_argument("--shutdown-grace", type=float, default=30.0)
    o.add_argument("--deadline-s", type=float, default=0.0, help="stop starting work after this many seconds")
    o.add_argument("--reserve-s", type=float, default=20.0, help="time kept for shutdown/reporting under a deadline")
    o.add_argument("--min-phase-s", type=float, default=60.0, help="skip a server if less time than this is left")
    o.add_argument("--save-jitcache", default=None, metavar="DIR", help="tar the JIT caches after the first server")
    o.add_argument("--concurrent-start", action="store_true",
                   help="start every server at once (one cold JIT compile, one import wait), then measure them "
                        "one at a time while the others idle; recorded in the result. Size the pools so that all "
                        "fit (e.g. --mem-fraction-static 0.2 --server-arg '--max-total-tokens 65536')")
    o.add_argument("--gpu-index", default=None, help="GPU for peak-memory sampling (default: first visible)")
    o.add_argument("--noise-band", type=float, default=0.03, help="|ratio-1| reported as noise")
    o.add_argument("--no-progress", action="store_true")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from eval import ab_report, entry_points, models

    if args.list_models:
        return models.main()
    if args.render:
        for path in args.render:
            print(ab_report.render(path))
        return 0
    try:
        phases = plan_phases(args)
        parse_batches(args.batch)
        if args.profile_batch:
            parse_batches(args.profile_batch, "--profile-batch")
            if args.profile_steps < 1 or args.profile_delay_s < 0:
                raise ValueError("--profile-steps takes a positive integer and --profile-delay-s a non-negative "
                                 f"number, got {args.profile_steps} and {args.profile_delay_s}")
    except ValueError as e:
        print(f"python -m eval.ab: error: {e}", file=sys.stderr)
        return 2
    if args.gpu_index is None:
        args.gpu_index = (os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") or ["0"])[0] or "0"
    t_start = time.time()
    deadline = t_start + args.deadline_s if args.deadline_s > 0 else math.inf
    workdir = Path(tempfile.mkdtemp(prefix="replayssm-ab-"))
    spec_models = {False: None, True: None}
    for ph in phases:
        if spec_models[ph.spec] is None:
            spec_models[ph.spec] = prepare_model(args, workdir, ph.spec)
    model0 = spec_models[phases[0].spec]
    flags = {k: common_server_flags(args, m, k) for k, m in spec_models.items() if m is not None}
    out_dir = Path(args.out_dir)
    stem0 = "-".join(["ab", model0.name] + ([args.spec] if args.spec != "none" else [])
                     + ([args.tag] if args.tag else []))
    logdir = Path(args.log_dir) if args.log_dir else out_dir / f"logs-{stem0}"
    pythonpath = [str(ROOT)]
    if args.entry_points == "auto":
        ep = entry_points.install(workdir / "entry-points", package=None, eval_weights=args.random_weights)
        pythonpath.insert(0, str(ep))
    base_env = dict(os.environ)
    if args.dry_run:
        for ph in phases:
            module, extra = arm_launch(args, ph.kind)
            cmd = launch_cmd(args.python, module, flags[ph.spec], args.host, 30000, extra)
            env = env_delta(server_env(base_env, args, ph, spec_models[ph.spec], pythonpath), base_env)
            print(f"# {ph.label} ({ph.role}): bench={ph.bench} parity={ph.parity}")
            print("  env: " + " ".join(f"{k}={v}" for k, v in env.items()))
            print("  " + shlex.join(cmd))
            if ph.bench:
                for b in parse_batches(args.batch):
                    print("  python -m sglang.bench_serving "
                          + shlex.join(bench_serving_argv("http://127.0.0.1:30000", spec_models[ph.spec], b, args,
                                                          f"bench-{ph.label}-b{b}.jsonl")))
        return 0

    atexit.register(_stop_all)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: (_stop_all(), sys.exit(130)))
    vocab = int(model0.config.get("vocab_size", 1024))
    prompts = parity_prompts(args.parity_prompts, vocab, args.seed)
    run: Dict[str, Any] = {
        "schema": SCHEMA, "kind": "ab", "git_commit": git_commit(),
        "sglang_version": dist_version("sglang"), "sglang_replayssm_version": entry_points.package_version(),
        "gpu": gpu_info(), "python": sys.version.split()[0], "host": socket.gethostname(),
        "env_inherited": recorded_env(dict(os.environ)),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "model": {"name": model0.name, "builtin": model0.builtin, "source": model0.source, "notes": model0.notes, "size": model0.size,
                  "config": model0.config},
        "flags": {"argv": sys.argv[1:] if argv is None else list(argv), "harness": vars(args).copy(),
                  "server_flags": flags[phases[0].spec], "server_flags_spec": flags.get(True),
                  "launchers": {k: shlex.join([m, *x]) for k in dict.fromkeys(p.kind for p in phases)
                                for m, x in [arm_launch(args, k)]},
                  "patched_extra": args.patched_arg or []},
        "bench": {"tool": "sglang.bench_serving", "dataset": "random-ids (token ids, --tokenize-prompt)",
                  "batches": parse_batches(args.batch), "input_len": args.input_len, "output_len": args.output_len,
                  "prompts_per_batch": f"max(batch x {args.rounds}, {args.min_prompts})"},
        "parity_setup": {"prompts": args.parity_prompts, "prompt_lens": [len(x) for x in prompts],
                         "tokens": args.parity_tokens, "topk": args.parity_topk, "near_tie_tol": args.near_tie_tol,
                         "greedy": True},
        "phases": [],
    }
    run["flags"]["harness"].pop("render", None)
    driver = None
    if any(ph.bench for ph in phases):
        denv = dict(base_env)
        denv["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [x for x in [base_env.get("PYTHONPATH", "")] if x])
        driver = BenchDriver(args.python, denv, logdir / "bench_serving.log")
    n_steps = sum(1 + (len(parse_batches(args.batch)) if ph.bench else 0) + (1 if ph.parity else 0) for ph in phases)
    progress = Progress(n_steps, enable=not args.no_progress)
    partial = out_dir / f"{stem0}-partial.json"
    try:
        if args.concurrent_start:
            runs = [PhaseRun(ph, args, spec_models[ph.spec], flags[ph.spec], base_env, pythonpath, logdir)
                    for ph in phases]
            try:
                for pr in runs:
                    pr.start()
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
            _write_partial(partial, run)
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
                _write_partial(partial, run)
    finally:
        progress.close()
        if driver is not None:
            driver.close()
        _stop_all()
    run["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run["wall_s"] = round(time.time() - t_start, 1)
    if run["sglang_version"] is None:
        run["sglang_version"] = next((((p.get("facts") or {}).get("version")) for p in run["phases"]
                                      if (p.get("facts") or {}).get("version")), None)
    written = []
    pairs = comparisons(run["phases"])
    stems: set = set()
    for a, b in pairs:
        res = build_result(run, a, b, args)
        stem = result_stem(model0.name, args.spec, a["phase"]["kind"], b["phase"]["kind"], args.tag)
        if stem in stems or b["phase"].get("kernel_config"):
            # a second arm of one kind (staged,staged) or a launch-config variant (staged@FILE): its label
            stem = result_stem(model0.name, args.spec, a["label"], b["label"], args.tag)
        n = 2
        while stem in stems:  # labels are unique, but a label may equal an earlier kind-named stem
            stem = result_stem(model0.name, args.spec, a["label"], f"{b['label']}-{n}", args.tag)
            n += 1
        stems.add(stem)
        written += ab_report.write_all(res, out_dir, stem)
        log(f"{res['comparison']}: {res['summary']['verdict']}")
    if not pairs:  # one arm: its numbers alone
        arms = [p for p in run["phases"] if p["phase"]["role"] == "arm"]
        if arms:
            res = {k: v for k, v in run.items() if k != "phases"}
            res.update(comparison=f"{arms[0]['phase']['kind']}-only", arms={arms[0]["label"]: slim_phase(arms[0])},
                       extra_servers={p["label"]: slim_phase(p) for p in run["phases"][1:]},
                       summary={"a": arms[0]["label"], "b": None, "verdict": "single arm: no comparison"})
            written += ab_report.write_all(res, out_dir, f"{stem0}-{arms[0]['phase']['kind']}-only")
    if partial.exists():
        partial.unlink()
    for w in written:
        log(f"wrote {w}")
    ok = all(p.get("status") == "ok" for p in run["phases"])
    print(ab_report.stdout_summary(run, pairs, args), flush=True)
    return 0 if ok else 1


def _write_partial(path: Path, run: Dict[str, Any]) -> None:
    from eval import report

    slim = dict(run)
    slim["phases"] = [{k: v for k, v in p.items() if k != "parity"} for p in run["phases"]]
    report.write_json(path, slim)


if __name__ == "__main__":
    sys.exit(main())
