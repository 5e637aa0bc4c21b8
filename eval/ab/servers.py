"""SGLang servers: each arm's model, command line and environment, the process (own process group, all
stopped on exit), its HTTP endpoints and facts, and the GPU memory it takes.  Also used by eval/soak.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from eval.ab.common import ROOT
from eval.ab.plan import SPEC_ALGOS, STOCK_KINDS, Phase, parse_batches, spec_shape


STOCK_MODULE = "sglang.launch_server"
PATCHED_MODULE = "sglang_replayssm.launch_server"


METRIC_NAMES = ("spec_accept_length", "spec_accept_rate", "num_running_reqs", "gen_throughput",
                "token_usage", "num_queue_reqs", "generation_tokens_total", "prompt_tokens_total")


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
    draft: Optional[str] = None  # --speculative-draft-model-path (a separate draft model), else the target's MTP


def draft_model(args, workdir: Path) -> Optional[str]:
    """The separate draft model of a speculative run: ``--spec-draft-model``, else (``--spec eagle``) the built-in
    geometry's dummy-weight EAGLE draft written under ``workdir`` (``eval/models.py``), else None (NEXTN/MTP)."""
    from eval import models

    if args.spec_draft_model:
        return args.spec_draft_model
    if args.spec != "eagle":
        return None
    if args.model not in models.EAGLE_DRAFT_LAYERS:
        raise SystemExit(f"--spec eagle: --model {args.model} has no built-in EAGLE draft (built-in: "
                         f"{', '.join(models.eagle_draft_names())}); pass --spec-draft-model DIR")
    return models.materialize_eagle_draft(args.model, root=workdir)


def prepare_model(args, workdir: Path, spec: bool) -> ModelSpec:
    from eval import models

    draft = draft_model(args, workdir) if spec else None
    if args.model in models.GEOMETRIES:
        g = models.get(args.model)
        mtp = spec and draft is None  # the MTP keys size the draft inside the target; a separate draft needs none
        path = models.materialize(args.model, root=workdir, spec=mtp)
        return ModelSpec(g.name, path, path, True, g.config_json(spec=mtp), g.size, g.source, g.notes,
                         g.attention_backend, g.server_flags, g.spec_server_flags if mtp else (), dict(g.env), draft)
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
    return ModelSpec(d.name, str(d), tok, False, cfg, "real", f"model directory {d}", draft=draft)


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
    f += ["--sampling-backend", args.sampling_backend] + radix_flags(args.radix_cache)
    f += ["--mem-fraction-static", str(mem),
          "--context-length", str(args.context_length), "--random-seed", str(args.seed),
          "--enable-metrics"]
    if args.max_running_requests:
        f += ["--max-running-requests", str(args.max_running_requests)]
    # tensor parallelism: SGLang's own (NCCL), the same on every arm; each rank's pool gets the ring of its heads
    f += ["--tp-size", str(getattr(args, "tp", 1) or 1)]
    if args.cuda_graph == "off":
        f += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    else:
        f += ["--cuda-graph-max-bs-decode", str(args.cuda_graph_max_bs or max(parse_batches(args.batch)))]
        if args.prefill_graph == "off":
            f += ["--cuda-graph-backend-prefill", "disabled"]
    f += list(model.server_flags)
    if spec:
        steps, topk, ndraft = spec_shape(args)
        f += ["--speculative-algorithm", SPEC_ALGOS[args.spec], "--speculative-num-steps", str(steps),
              "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(ndraft)]
        if model.draft:
            f += ["--speculative-draft-model-path", model.draft]
        elif args.spec == "eagle":
            raise SystemExit("--spec eagle needs a draft model: --spec-draft-model DIR, or a built-in geometry "
                             "with an EAGLE draft")
        f += list(model.spec_server_flags)
    if getattr(args, "stream_interval", 0):  # eval.ab --stream-interval: the same on every arm
        f += ["--stream-interval", str(args.stream_interval)]
    for extra in args.server_arg or []:
        f += shlex.split(extra)
    return f


# eval.ab --radix-cache -> SGLang flags, the same on every arm.  on / no_buffer: SGLang's no_buffer mamba
# strategy, which SGLang 0.5.17 runs only without the overlap scheduler; extra_buffer: SGLang's default strategy
# for hybrid models, overlap scheduler on (our launcher's arms also get --replayssm-extra-buffer true, arm_launch:
# its default, given so that the command records it); default: no radix flag at all, every server on its own
# defaults (SGLang's auto strategy: extra_buffer with the overlap scheduler for these models; our launcher's too)
RADIX_MODES = ("off", "on", "no_buffer", "extra_buffer", "default")


def radix_flags(mode: str) -> List[str]:
    if mode == "off":
        return ["--disable-radix-cache"]
    if mode in ("on", "no_buffer"):
        return ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"]
    if mode == "extra_buffer":
        return ["--mamba-radix-cache-strategy", "extra_buffer"]
    if mode == "default":
        return []
    raise ValueError(f"--radix-cache {mode!r}: choose one of {', '.join(RADIX_MODES)}")


def launch_cmd(python: str, module: str, flags: Sequence[str], host: str, port: int,
               extra: Sequence[str] = ()) -> List[str]:
    return [python, "-m", module, *flags, "--host", host, "--port", str(port), *extra]


def arm_launch(args, kind: str) -> Tuple[str, List[str]]:
    """The launcher module and the launcher-only flags of one arm kind."""
    if kind in STOCK_KINDS:
        if kind != "upstream":
            return args.stock_module, []
        # upstream's replay ring serves prefix caching only as no_buffer (SGLang refuses it with extra_buffer, the
        # strategy its default resolves to), and no_buffer only without the overlap scheduler
        radix = radix_flags("no_buffer") if getattr(args, "radix_cache", "off") == "default" else []
        return args.stock_module, ["--enable-linear-replayssm", *radix]
    extra = [x for e in (args.patched_arg or []) for x in shlex.split(e)]
    if getattr(args, "radix_cache", "off") == "extra_buffer":  # the launcher's default, recorded in the command
        extra += ["--replayssm-extra-buffer", "true"]
    return args.patched_module, extra + (["--replayssm-replay-ring", "false"] if kind == "patched" else [])


def server_env(base: Dict[str, str], args, phase: Phase, model: ModelSpec, pythonpath: Sequence[str]) -> Dict[str, str]:
    from eval import sync_debug, weights

    env = dict(base)
    if phase.kind in STOCK_KINDS:  # plain SGLang: the replayssm plugin must stay inert
        for k in [k for k in env if k.startswith("SGLANG_REPLAYSSM_")]:
            env.pop(k)
    elif phase.kind == "staged":  # the launcher's default (seams on), whatever the caller exported
        for k in ("SGLANG_REPLAYSSM_REPLAY_RING", "SGLANG_REPLAYSSM_STAGED"):  # the setting and its old name
            env.pop(k, None)
    if phase.kind in ("staged", "patched"):  # the conv1d kernel follows the ring (auto) unless --patched-arg says
        env.pop("SGLANG_REPLAYSSM_CONV_VERIFY", None)
    if phase.kernel_config:  # this arm's launch configs, over any inherited file
        env["SGLANG_REPLAYSSM_KERNEL_CONFIG"] = phase.kernel_config
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *(x for x in [base.get("PYTHONPATH", "")] if x)])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(model.env)
    for k in (weights.ENABLE_ENV, weights.PINNED_TOKEN_ENV, sync_debug.ENV):  # the harness's own, never inherited
        env.pop(k, None)
    if args.random_weights:  # the eval plugins ride on the random weights' entry point (eval/entry_points.py)
        env[weights.ENABLE_ENV] = "1"
        env[weights.SEED_ENV] = str(args.weight_seed)
        if getattr(args, "sync_debug", False):
            env[sync_debug.ENV] = "1"
        if getattr(args, "pinned_token", None) is not None:
            env[weights.PINNED_TOKEN_ENV] = str(args.pinned_token)
    for k in ("SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_METHOD", "SGLANG_SIMULATE_ACC_TOKEN_MODE"):
        env.pop(k, None)
    if phase.spec and phase.sim_acc_len is not None:
        env["SGLANG_SIMULATE_ACC_LEN"] = str(phase.sim_acc_len)
        env["SGLANG_SIMULATE_ACC_METHOD"] = args.sim_acc_method
        env["SGLANG_SIMULATE_ACC_TOKEN_MODE"] = sim_acc_token_mode(args)
    if args.test_retract:
        # SGLang's own retraction test hook: one running request is retracted (and later re-prefilled)
        # every N forward passes, on every server alike
        env["SGLANG_TEST_RETRACT"] = "1"
        env["SGLANG_TEST_RETRACT_INTERVAL"] = str(args.test_retract)
    return env


def sim_acc_token_mode(args) -> str:
    """SGLANG_SIMULATE_ACC_TOKEN_MODE for ``--sim-acc-token-mode``: ``auto`` is ``real-draft-token`` for a chain and
    ``fixed`` for a tree (SGLang's ``eagle_sample`` raises on real draft tokens with ``--speculative-eagle-topk`` > 1)."""
    mode = getattr(args, "sim_acc_token_mode", "auto") or "auto"
    if mode != "auto":
        return mode
    return "fixed" if int(getattr(args, "spec_topk", 1) or 1) > 1 else "real-draft-token"


# settings inherited from the caller's environment that change what a server does (recorded per run)
RECORDED_ENV_PREFIXES = ("SGLANG_REPLAYSSM_", "SGLANG_TEST_", "SGLANG_FLASHINFER_WORKSPACE_SIZE")
_RETRACTED = re.compile(r"#retracted_reqs: (\d+)")


def recorded_env(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(RECORDED_ENV_PREFIXES)}


# the replay-ring seams each arm kind must run with (eval.ab checks the servers' own log line)
ARM_SEAMS = {"staged": True, "patched": False}
# replay_ring=; staged= in the logs of servers before the setting's rename
_SEAMS_LINE = re.compile(r"sglang_replayssm active \(pid \d+\):.*?\b(?:replay_ring|staged)=(True|False)\b")


def _logged_flag(line: "re.Pattern", log_text: str) -> Any:
    """True / False when every process's plugin line agrees on the flag ``line`` captures, ``"mixed"`` when they
    disagree, None when no process logged it."""
    found = {m.group(1) == "True" for m in line.finditer(log_text)}
    return None if not found else found.pop() if len(found) == 1 else "mixed"


def seams_state(log_text: str) -> Any:
    """True / False when every SGLang process of the server logged that state of the replay-ring seams,
    ``"mixed"`` when they disagree, None when no process logged it (plain SGLang, stand-in servers)."""
    return _logged_flag(_SEAMS_LINE, log_text)


_CONV_LINE = re.compile(r"sglang_replayssm active \(pid \d+\):.*?\bconv_verify=(True|False)\b")


def conv_verify_state(log_text: str) -> Any:
    """Whether the server's processes ran the target verify's conv1d on the package's kernel
    (``--replayssm-conv-verify``; the plugin's log line): True / False when every process that logged it agrees,
    ``"mixed"`` when they disagree, None when none did (plain SGLang, servers from before the setting)."""
    return _logged_flag(_CONV_LINE, log_text)


def count_retractions(log_text: str) -> int:
    """Requests SGLang's scheduler retracted, summed over its "#retracted_reqs: N" log lines."""
    return sum(int(m) for m in _RETRACTED.findall(log_text))


def env_delta(env: Dict[str, str], base: Dict[str, str]) -> Dict[str, str]:
    """What the harness set or changed for a server (for the record)."""
    return {k: v for k, v in sorted(env.items()) if base.get(k) != v and k != "PYTHONPATH"}


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

    def wait_log(self, markers: Sequence[str], timeout: float) -> Optional[str]:
        """Poll the log until one of ``markers`` shows, the server is healthy or has exited, or ``timeout``: the
        marker seen, ``"healthy"``, ``"exited"`` or None (timed out)."""
        end = time.time() + timeout
        while time.time() < end:
            try:
                text = self.log_path.read_text(errors="replace")
            except OSError:
                text = ""
            hit = next((m for m in markers if m in text), None)
            if hit is not None:
                return hit
            if not self.alive():
                return "exited"
            if http_text(self.url + "/health", timeout=2)[0] == 200:
                return "healthy"
            time.sleep(0.5)
        return None

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


# Triton's text IRs: a cache hit loads only a kernel's metadata .json and its .cubin (and the launcher .so), so
# these are debugging dumps, about 4/5 of the cache; leaving them out keeps the carried bundle under the limit.
TRITON_IR_SUFFIXES = (".llir", ".ptx", ".ttir", ".ttgir", ".source")


def save_jitcache(dest: Path) -> Dict[str, Any]:
    """xz tarballs of ``$SGLANG_CACHE_ROOT/{triton}`` (without its text IRs) and ``{flashinfer,tvm-ffi}``,
    the names ``eval/jit_cache.sh restore`` unpacks (xz: the device tool returns files of at most 16 MiB).
    FlashInfer's object files stay: its ninja build recompiles a missing one."""
    root = Path(os.environ.get("SGLANG_CACHE_ROOT", "/tmp/sglang-cache"))
    out: Dict[str, Any] = {"root": str(root)}
    if not root.is_dir():
        out["error"] = "no cache root"
        return out
    dest.mkdir(parents=True, exist_ok=True)
    for fname, parts in (("jit-triton.txz", ["triton"]), ("jit-other.txz", ["flashinfer", "tvm-ffi"])):
        present = [p for p in parts if (root / p).is_dir()]
        if not present:
            continue
        path = dest / fname
        with tarfile.open(path, "w:xz") as tf:
            for p in present:
                tf.add(str(root / p), arcname=p, filter=_jitcache_member)
        out[fname] = round(path.stat().st_size / 2**20, 2)
    return out


def _jitcache_member(info: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
    top = info.name.split("/", 1)[0]
    return None if top == "triton" and info.isfile() and info.name.endswith(TRITON_IR_SUFFIXES) else info


def prepare_models(args, phases: List[Phase],
                   workdir: Path) -> Tuple[Dict[bool, Optional[ModelSpec]], Dict[bool, List[str]]]:
    """The model of the plan's non-speculative and speculative servers (those it has) and their SGLang flags."""
    spec_models = {False: None, True: None}
    for ph in phases:
        if spec_models[ph.spec] is None:
            spec_models[ph.spec] = prepare_model(args, workdir, ph.spec)
    flags = {k: common_server_flags(args, m, k) for k, m in spec_models.items() if m is not None}
    return spec_models, flags


def server_pythonpath(args, workdir: Path) -> List[str]:
    """The head of the servers' ``PYTHONPATH``: the repository and, with ``--entry-points auto``, the plugin
    dist-infos written under ``workdir`` (so the servers need no ``pip install``)."""
    from eval import entry_points

    pythonpath = [str(ROOT)]
    if args.entry_points == "auto":
        ep = entry_points.install(workdir / "entry-points", package=None, eval_weights=args.random_weights)
        pythonpath.insert(0, str(ep))
    return pythonpath
