"""Soak test: one SGLang server at a time under a bounded chaos client.

For each planned server (a built-in geometry or a model directory, with or without NEXTN/EAGLE speculative
decoding; started as the A/B harness starts its ``staged`` arm: ``python -m sglang_replayssm.launch_server``
with ``eval.ab.common_server_flags``, dummy + scaled random weights), in this order:

1. start it, wait for ``/health``;
2. warm-up: ``--concurrency`` long greedy prompts at once (the caching allocator reaches its working set);
3. baseline: the same greedy prompts, one request at a time;
4. idle reading: ``/metrics`` (``sglang:mamba_used_tokens`` / ``sglang:mamba_available_tokens``, the mamba
   pool's slots, which SGLang's scheduler publishes on going idle; a probe request first makes that
   publication immediate, see ``idle_reading``) and the GPU memory of the server's processes (``nvidia-smi``);
5. chaos for ``--minutes`` (or ``--max-requests``), split into ``--rounds`` rounds with an idle reading after
   each (as in step 6): ``--concurrency`` workers send random prompt lengths up to
   the context, random output lengths, greedy and sampled, single and batch ``/generate``, streams cut by
   the client after a random number of chunks, ``/abort_request`` mid-generation, OpenAI
   ``/v1/completions`` with token prompts, and bad requests (negative ids, ids >= vocab, non-integer ids,
   wrongly nested lists, empty input, prompt longer than the context, negative max_new_tokens, bad sampling
   params, unknown sampling keys, malformed JSON), which must each get a 4xx;
6. drain (in-flight requests finish, bounded by ``--drain-timeout``), then the idle reading again: the mamba
   slots and GPU memory must be back at their step-4 values;
7. the baseline again: identical tokens; ``/health`` must pass and the process must be alive.

A server that dies, or hangs (``/health`` failing for ``--hang-s`` while its process lives), is recorded as
a crash (with the requests that went unanswered) and the run moves on to the next server; nothing is
restarted.  The harness only records: targets (``TARGETS``) are judged by reading ``summary`` in the JSON,
never asserted here.  Loopback only; every phase is bounded (request and wall caps, per-request timeouts,
``--deadline-s`` over the whole run).

``summary``: ``requests`` and ``bad_requests_sent`` are the fewest any one server got (each server's count
beside them), ``server_crashes`` counts dead or hung servers, ``baseline_identical`` is 1 when every server's
greedy outputs after the chaos equal those before it, ``bad_requests_not_4xx`` sums bad requests answered
with anything but a 4xx (a 5xx, a dropped connection, a timeout, ...), ``leaked_mamba_slots`` sums the mamba
slots still used after the drain beyond the idle value, ``gpu_mem_growth_mib`` is the largest growth of a
server's GPU memory from its idle reading after the first chaos round to the one after the last (one round:
from before the chaos; None without ``nvidia-smi``): the first round's growth is PyTorch's caching allocator
meeting the chaos's shapes for the first time (reported beside it, ``gpu_mem_round1_growth_mib``), what a leak
adds shows in every round.

    python -m eval.soak --model tiny-nemotron-h --model nemotron-h-8b --spec none,nextn --minutes 2
    python -m eval.soak --plan tiny-nemotron-h:nextn:0.75 --plan nemotron-h-8b:none:1.5 --deadline-s 500
    python -m eval.soak --render eval/results/soak-h200.json      # re-draw the Markdown
    python -m eval.soak --merge a.json b.json --out eval/results/soak-h200.json   # runs of one commit, one record
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import math
import os
import random
import shlex
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from eval import ab

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "replayssm-soak/1"
SUMMARY_KEYS = ("requests", "server_crashes", "baseline_identical", "bad_requests_sent", "bad_requests_not_4xx",
                "leaked_mamba_slots", "gpu_mem_growth_mib")
TARGETS = {
    "requests": ">= 2000 (the fewest any one server got)",
    "server_crashes": "0",
    "baseline_identical": "1",
    "bad_requests_sent": ">= 100 (the fewest any one server got)",
    "bad_requests_not_4xx": "0",
    "leaked_mamba_slots": "0",
    "gpu_mem_growth_mib": "<= 256",
}
METRICS = ("num_running_reqs", "num_queue_reqs", "mamba_used_tokens", "mamba_available_tokens", "mamba_usage")
GOOD_FAIL = ("5xx", "conn_error", "timeout", "stream_error", "cancelled", "client_error")

# request kinds the chaos client draws from: good ones (expected 2xx; an aborted one may get 4xx) with weights
GOOD_KINDS = {
    "generate": 0.20, "generate_batch": 0.10, "generate_stream": 0.12, "generate_stream_cut": 0.12,
    "generate_stream_abort": 0.08, "generate_abort": 0.06, "completions": 0.10, "completions_stream": 0.07,
}
# bad requests (each must get a 4xx): token ids out of range or not integers, wrong nesting, empty input, and
# SGLang's own validation (context length, sampling parameters, unknown sampling keys, malformed JSON)
BAD_KINDS = (
    "generate_negative_id", "generate_id_ge_vocab", "generate_float_id", "generate_string_id", "generate_bool_id",
    "generate_null_id", "generate_nested_3d", "generate_mixed_nesting", "generate_ids_not_list", "generate_empty",
    "generate_batch_empty_row", "generate_batch_negative_id", "generate_batch_id_ge_vocab", "generate_no_input",
    "generate_too_long", "generate_max_new_negative", "generate_temperature_negative", "generate_top_p_gt_1",
    "generate_unknown_sampling_key", "generate_malformed_json", "generate_json_not_object",
    "completions_negative_id", "completions_id_ge_vocab", "completions_null_id", "completions_empty",
    "completions_too_long", "completions_max_tokens_negative", "completions_temperature_negative",
    "completions_top_p_gt_1", "completions_malformed_json",
)
# lenient probes: odd but legal for SGLang (its request dataclass ignores unknown top-level fields):
# any answer but a 5xx or a dropped connection is fine; not counted as bad requests
LENIENT_KINDS = ("generate_unknown_field", "completions_unknown_field")


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------
@dataclass
class Plan:
    model: str
    spec: str = "none"
    minutes: float = 2.0
    extra: List[str] = field(default_factory=list)   # launcher flags for this server only

    @property
    def label(self) -> str:
        return (Path(self.model).name or self.model) + ("" if self.spec == "none" else f"-{self.spec}")


def parse_plan(text: str, default_minutes: float) -> Plan:
    """``MODEL[:SPEC[:MINUTES]][ LAUNCHER FLAGS...]`` -> Plan (flags after the first space: this server only)."""
    head, *extra = shlex.split(text)
    parts = head.split(":")
    if not parts[0] or len(parts) > 3:
        raise ValueError(f"--plan {text!r}: expected MODEL[:SPEC[:MINUTES]] (e.g. nemotron-h-8b:none:1.5)")
    spec = parts[1] if len(parts) > 1 and parts[1] else "none"
    if spec not in ab.SPEC_ALGOS:
        raise ValueError(f"--plan {text!r}: spec {spec!r} is not one of {', '.join(sorted(ab.SPEC_ALGOS))}")
    try:
        minutes = float(parts[2]) if len(parts) > 2 and parts[2] else default_minutes
    except ValueError:
        raise ValueError(f"--plan {text!r}: minutes must be a number") from None
    if not minutes > 0:
        raise ValueError(f"--plan {text!r}: minutes must be positive")
    return Plan(parts[0], spec, minutes, extra)


def build_plans(args) -> List[Tuple[Plan, str]]:
    """The servers in order, each with its unique label (the same model and spec twice: numbered)."""
    if args.plan:
        plans = [parse_plan(p, args.minutes) for p in args.plan]
    else:
        specs = [s.strip() for s in args.spec.split(",") if s.strip()]
        bad = [s for s in specs if s not in ab.SPEC_ALGOS]
        if not specs or bad:
            raise ValueError(f"--spec takes a comma list of {', '.join(sorted(ab.SPEC_ALGOS))}, got {args.spec!r}")
        if not args.minutes > 0:
            raise ValueError(f"--minutes must be positive, got {args.minutes}")
        plans = [Plan(m, s, args.minutes) for m in (args.model or ["tiny-nemotron-h"]) for s in specs]
    labels = Counter(p.label for p in plans)
    seen: Counter = Counter()
    out = []
    for p in plans:
        seen[p.label] += 1
        out.append((p, p.label if labels[p.label] == 1 else f"{p.label}-{seen[p.label]}"))
    return out


def ab_namespace(args, plan: Plan) -> argparse.Namespace:
    """The A/B harness's settings for one server, so its flags match ``eval.ab``'s exactly."""
    argv = ["--model", plan.model, "--spec", plan.spec, "--context-length", str(args.context_length),
            "--seed", str(args.seed), "--spec-steps", str(args.spec_steps), "--python", args.python,
            "--host", args.host, "--stock-module", args.stock_module, "--patched-module", args.patched_module,
            "--radix-cache", args.radix_cache, "--weight-seed", str(args.weight_seed)]
    if args.mem_fraction_static:
        argv += ["--mem-fraction-static", str(args.mem_fraction_static)]
    if args.cuda_graph_max_bs:
        argv += ["--cuda-graph-max-bs", str(args.cuda_graph_max_bs)]
    if args.spec_draft_model:
        argv += ["--spec-draft-model", args.spec_draft_model]
    if not args.random_weights:
        argv += ["--no-random-weights"]
    argv += [f"--server-arg={s}" for s in args.server_arg or []]
    argv += [f"--patched-arg={s}" for s in (args.patched_arg or []) + ([shlex.join(plan.extra)] if plan.extra else [])]
    return ab.build_parser().parse_args(argv)


# ---------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------
def log_uniform_int(rng: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], uniform in log space (mostly short, sometimes up to hi)."""
    lo, hi = max(1, lo), max(1, lo, hi)
    return max(lo, min(hi, int(round(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))))


def random_ids(rng: random.Random, n: int, vocab: int) -> List[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def sampling_params(rng: random.Random, max_new: int, greedy: bool) -> Dict[str, Any]:
    sp: Dict[str, Any] = {"max_new_tokens": max_new, "ignore_eos": rng.random() < 0.7}
    if greedy:
        sp["temperature"] = 0.0
    else:
        sp.update(temperature=round(rng.uniform(0.2, 1.5), 3), top_p=round(rng.uniform(0.3, 1.0), 3),
                  top_k=rng.choice([1, 5, 50, 1000]))
        if rng.random() < 0.2:
            sp["frequency_penalty"] = round(rng.uniform(-1.0, 1.0), 3)
        if rng.random() < 0.1:
            sp["min_p"] = round(rng.uniform(0.0, 0.2), 3)
    return sp


@dataclass
class Limits:
    vocab: int
    context: int
    max_new: int
    margin: int = 16          # tokens kept free of prompt + output (spec drafts reserve a few)

    def lengths(self, rng: random.Random) -> Tuple[int, int]:
        """(prompt length, max_new_tokens) of a good request: up to the context, never past it."""
        new = log_uniform_int(rng, 1, self.max_new)
        return log_uniform_int(rng, 1, max(1, self.context - new - self.margin)), new


def good_request(kind: str, rng: random.Random, lim: Limits, model_name: Optional[str] = None) -> Dict[str, Any]:
    """One valid request of ``kind`` (GOOD_KINDS): path, JSON payload, and how the client treats it (stream,
    hang up after ``cut_after`` chunks, ``/abort_request`` after ``abort_after`` chunks or ``abort_delay`` s)."""
    plen, new = lim.lengths(rng)
    greedy = rng.random() < 0.5
    sp = sampling_params(rng, new, greedy)
    rid = f"soak-{uuid.UUID(int=rng.getrandbits(128)).hex[:20]}"
    q: Dict[str, Any] = {"path": "/generate", "stream": False, "cut_after": None, "abort_after": None,
                         "abort_delay": None}
    ids = random_ids(rng, plen, lim.vocab)
    if kind in ("generate", "generate_abort"):
        q["payload"] = {"input_ids": ids, "sampling_params": sp, "rid": rid}
        if rng.random() < 0.2:
            q["payload"].update(return_logprob=True, top_logprobs_num=rng.choice([0, 1, 5]))
        if kind == "generate_abort":
            q["abort_delay"] = rng.uniform(0.0, 0.5)
    elif kind == "generate_batch":
        room = max(1, lim.context - new - lim.margin)
        q["payload"] = {"input_ids": [ids] + [random_ids(rng, log_uniform_int(rng, 1, room), lim.vocab)
                                              for _ in range(rng.randint(1, 3))], "sampling_params": sp}
    elif kind in ("generate_stream", "generate_stream_cut", "generate_stream_abort"):
        q["payload"] = {"input_ids": ids, "sampling_params": sp, "stream": True, "rid": rid}
        k = rng.randint(1, max(1, new))
        q.update(stream=True, cut_after=k if kind == "generate_stream_cut" else None,
                 abort_after=k if kind == "generate_stream_abort" else None)
    elif kind in ("completions", "completions_stream"):
        body: Dict[str, Any] = {"prompt": ids, "max_tokens": new, "temperature": sp["temperature"]}
        if model_name:
            body["model"] = model_name
        if not greedy:
            body["top_p"] = sp["top_p"]
        q.update(path="/v1/completions", payload=body)
        if kind == "completions_stream":
            body["stream"] = True
            q.update(stream=True, cut_after=rng.randint(1, max(1, new)) if rng.random() < 0.5 else None)
    else:
        raise ValueError(f"unknown request kind {kind!r}; good kinds: {', '.join(GOOD_KINDS)}")
    return q


def _with(rng: random.Random, ids: List[int], value: Any) -> List[Any]:
    out: List[Any] = list(ids)
    out[rng.randrange(len(out))] = value
    return out


def bad_request(kind: str, rng: random.Random, lim: Limits) -> Tuple[str, bytes]:
    """(path, body) of one bad request of ``kind`` (every one must be answered 4xx)."""
    ids = random_ids(rng, rng.randint(2, 24), lim.vocab)
    sp = {"max_new_tokens": rng.randint(1, 16), "temperature": 0.0}

    def gen(input_ids: Any, params: Optional[dict] = None, **extra) -> Tuple[str, bytes]:
        return "/generate", json.dumps({"input_ids": input_ids, "sampling_params": params or sp, **extra}).encode()

    def cmpl(prompt: Any, **over) -> Tuple[str, bytes]:
        body = {"prompt": prompt, "max_tokens": rng.randint(1, 16), "temperature": 0.0, **over}
        return "/v1/completions", json.dumps(body).encode()

    too_long = random_ids(rng, lim.context + rng.randint(1, 64), lim.vocab)
    table: Dict[str, Callable[[], Tuple[str, bytes]]] = {
        "generate_negative_id": lambda: gen(_with(rng, ids, -rng.randint(1, 1000))),
        "generate_id_ge_vocab": lambda: gen(_with(rng, ids, lim.vocab + rng.randint(0, 1000))),
        "generate_float_id": lambda: gen(_with(rng, ids, rng.randrange(3, lim.vocab) + 0.5)),
        "generate_string_id": lambda: gen(_with(rng, ids, rng.choice(["w7", "12", ""]))),
        "generate_bool_id": lambda: gen(_with(rng, ids, True)),
        "generate_null_id": lambda: gen(_with(rng, ids, None)),
        "generate_nested_3d": lambda: gen([[ids]]),
        "generate_mixed_nesting": lambda: gen([ids[0], ids[1:]]),
        "generate_ids_not_list": lambda: gen(rng.choice([5, "w5 w6", {"ids": ids}])),
        "generate_empty": lambda: gen([]),
        "generate_batch_empty_row": lambda: gen([ids, []]),
        "generate_batch_negative_id": lambda: gen([ids, _with(rng, ids, -1)]),
        "generate_batch_id_ge_vocab": lambda: gen([_with(rng, ids, lim.vocab), ids]),
        "generate_no_input": lambda: ("/generate", json.dumps({"sampling_params": sp}).encode()),
        "generate_too_long": lambda: gen(too_long),
        "generate_max_new_negative": lambda: gen(ids, dict(sp, max_new_tokens=-rng.randint(1, 100))),
        "generate_temperature_negative": lambda: gen(ids, dict(sp, temperature=-round(rng.uniform(0.1, 2), 2))),
        "generate_top_p_gt_1": lambda: gen(ids, dict(sp, temperature=0.7, top_p=round(rng.uniform(1.1, 3), 2))),
        "generate_unknown_sampling_key": lambda: gen(ids, dict(sp, frobnicate=1)),
        "generate_malformed_json": lambda: ("/generate", b'{"input_ids": [' + ",".join(map(str, ids)).encode()),
        "generate_json_not_object": lambda: ("/generate", json.dumps(ids).encode()),
        "completions_negative_id": lambda: cmpl(_with(rng, ids, -rng.randint(1, 1000))),
        "completions_id_ge_vocab": lambda: cmpl(_with(rng, ids, lim.vocab + rng.randint(0, 1000))),
        "completions_null_id": lambda: cmpl(_with(rng, ids, None)),
        "completions_empty": lambda: cmpl([]),
        "completions_too_long": lambda: cmpl(too_long),
        "completions_max_tokens_negative": lambda: cmpl(ids, max_tokens=-rng.randint(1, 100)),
        "completions_temperature_negative": lambda: cmpl(ids, temperature=-0.5),
        "completions_top_p_gt_1": lambda: cmpl(ids, temperature=0.7, top_p=1.5),
        "completions_malformed_json": lambda: ("/v1/completions", b'{"prompt": [1, 2, 3], "max_tokens": '),
    }
    return table[kind]()




def lenient_request(kind: str, rng: random.Random, lim: Limits) -> Tuple[str, bytes]:
    ids = random_ids(rng, rng.randint(2, 24), lim.vocab)
    if kind == "generate_unknown_field":
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}, "frobnicate": 1}
        return "/generate", json.dumps(body).encode()
    return "/v1/completions", json.dumps({"prompt": ids, "max_tokens": 4, "frobnicate": [1]}).encode()


# ---------------------------------------------------------------------------------
# the chaos client
# ---------------------------------------------------------------------------------
@dataclass
class Rec:
    kind: str
    cat: str                  # good | bad | lenient | warmup
    t0: float
    t1: float = 0.0
    status: Optional[int] = None
    outcome: str = ""         # ok | cut | 4xx | 5xx | conn_error | timeout | stream_error | cancelled
    chunks: int = 0
    detail: str = ""


def _outcome(status: int) -> str:
    return "ok" if 200 <= status < 300 else "4xx" if 400 <= status < 500 else "5xx" if status >= 500 else "other"


class Chaos:
    """``concurrency`` asyncio workers against one server until ``stop_at`` or ``max_requests``."""

    def __init__(self, url: str, lim: Limits, *, concurrency: int, bad_fraction: float, lenient_fraction: float,
                 request_timeout: float, seed: int, model_name: Optional[str], alive: Callable[[], bool],
                 hang_s: float = 60.0, compiling: Optional[Callable[[], bool]] = None):
        self.url, self.lim, self.concurrency = url, lim, concurrency
        self.bad_fraction, self.lenient_fraction = bad_fraction, lenient_fraction
        self.request_timeout, self.seed, self.model_name, self.alive = request_timeout, seed, model_name, alive
        self.recs: List[Rec] = []
        self.aborts: Counter = Counter()
        self.started = 0
        self.crashed_at: Optional[float] = None
        self.hung_at: Optional[float] = None    # /health failed for hang_s on end while the process lived
        self.hang_s = hang_s
        self.compiling = compiling              # is the server JIT-compiling (nvcc & co. running under it)?
        self.compile_wait_s = 0.0               # /health-stale time forgiven because a compile was running
        self.last_healthy = 0.0
        self.health_failures = 0
        self._stop = False

    # -- one request of each kind -------------------------------------------------
    async def _post(self, session, rec: Rec, path: str, data: bytes) -> None:
        async with session.post(self.url + path, data=data, headers={"Content-Type": "application/json"}) as r:
            rec.status = r.status
            body = await r.read()
            rec.outcome = _outcome(r.status)
            if rec.outcome != "ok":
                rec.detail = body[:200].decode(errors="replace")

    async def _stream(self, session, rec: Rec, path: str, payload: dict, cut_after: Optional[int] = None,
                      abort_after: Optional[int] = None) -> None:
        async with session.post(self.url + path, json=payload) as r:
            rec.status = r.status
            if r.status != 200:
                rec.outcome = _outcome(r.status)
                rec.detail = (await r.read())[:200].decode(errors="replace")
                return
            done = False
            async for line in r.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                rec.chunks += 1
                try:
                    ev = json.loads(data)
                except ValueError:
                    ev = {}
                if isinstance(ev, dict) and ev.get("error"):
                    err = ev["error"] if isinstance(ev["error"], dict) else {"message": ev["error"]}
                    code = err.get("code") if isinstance(err.get("code"), int) else 500
                    rec.outcome, rec.detail = ("4xx" if 400 <= code < 500 else "stream_error"), str(err)[:200]
                if cut_after is not None and rec.chunks >= cut_after:
                    r.close()  # the client hangs up mid-stream
                    rec.outcome = rec.outcome or "cut"
                    return
                if abort_after is not None and rec.chunks == abort_after:
                    await self._abort(session, payload["rid"])
            rec.outcome = rec.outcome or ("ok" if done else "stream_error")
            if not done and not rec.detail:
                rec.detail = "stream ended without [DONE]"

    async def _abort(self, session, rid: str) -> None:
        try:
            async with session.post(self.url + "/abort_request", json={"rid": rid}) as r:
                await r.read()
                self.aborts[str(r.status)] += 1
        except Exception as e:  # noqa: BLE001 - recorded
            self.aborts[type(e).__name__] += 1

    async def _good(self, session, rng: random.Random, kind: str, rec: Rec) -> None:
        q = good_request(kind, rng, self.lim, self.model_name)
        data = json.dumps(q["payload"]).encode()
        if q["stream"]:
            return await self._stream(session, rec, q["path"], q["payload"], cut_after=q["cut_after"],
                                      abort_after=q["abort_after"])
        if q["abort_delay"] is None:
            return await self._post(session, rec, q["path"], data)
        task = asyncio.ensure_future(self._post(session, rec, q["path"], data))
        try:  # /abort_request while the request runs (or waits); its answer may then be a 4xx
            await asyncio.wait({task}, timeout=q["abort_delay"])
            if not task.done():
                await self._abort(session, q["payload"]["rid"])
            return await task
        finally:
            if not task.done():
                task.cancel()

    async def one(self, session, rng: random.Random, kind: str, cat: str) -> Rec:
        import aiohttp

        rec = Rec(kind, cat, time.time())
        self.recs.append(rec)
        try:
            if cat == "bad":
                path, data = bad_request(kind, rng, self.lim)
                await self._post(session, rec, path, data)
            elif cat == "lenient":
                path, data = lenient_request(kind, rng, self.lim)
                await self._post(session, rec, path, data)
            else:
                await self._good(session, rng, kind, rec)
        except asyncio.CancelledError:
            rec.outcome = rec.outcome or "cancelled"
            raise
        except asyncio.TimeoutError:
            rec.outcome = "timeout"
        except (aiohttp.ClientError, OSError) as e:
            rec.outcome = "conn_error"
            rec.detail = f"{type(e).__name__}: {e}"[:200]
        except Exception as e:  # noqa: BLE001 - the client's own trouble (an oversized line, say): recorded
            rec.outcome = "client_error"
            rec.detail = f"{type(e).__name__}: {e}"[:200]
        finally:
            rec.t1 = time.time()
            if not rec.outcome:
                rec.outcome = "cancelled"
        return rec

    def _pick(self, rng: random.Random) -> Tuple[str, str]:
        x = rng.random()
        if x < self.bad_fraction:
            return rng.choice(BAD_KINDS), "bad"
        if x < self.bad_fraction + self.lenient_fraction:
            return rng.choice(LENIENT_KINDS), "lenient"
        kinds, weights = zip(*GOOD_KINDS.items())
        return rng.choices(kinds, weights)[0], "good"

    # -- the run ----------------------------------------------------------------
    async def _worker(self, session, i: int, stop_at: float, max_requests: int) -> None:
        rng = random.Random(self.seed * 1000003 + i)
        while not self._stop and time.time() < stop_at and self.started < max_requests:
            if not self.alive():  # no request goes to a dead server (the monitor may look a moment later)
                self.crashed_at = self.crashed_at or time.time()
                self._stop = True
                break
            self.started += 1
            kind, cat = self._pick(rng)
            await self.one(session, rng, kind, cat)

    async def _health(self, session) -> None:
        try:
            async with session.get(self.url + "/health", timeout=_timeout(30.0)) as r:
                await r.read()
                ok = r.status == 200
        except Exception:  # noqa: BLE001 - counted
            ok = False
        if ok:
            self.last_healthy = time.time()
        else:
            self.health_failures += 1

    async def _monitor(self, session, bar) -> None:
        """Every half second: is the process alive, has ``/health`` (probed once a second, one probe at a time)
        passed within ``hang_s``?  A dead or hung server stops the chaos."""
        t0 = self.last_healthy = time.time()
        probe: Optional[asyncio.Future] = None
        tick = 0
        try:
            while not self._stop:
                if not self.alive():
                    self.crashed_at = time.time()
                    self._stop = True
                    return
                stale, look = time.time() - self.last_healthy, min(5.0, self.hang_s / 2)
                if stale > look and self.compiling is not None and self.compiling():
                    # a first-use JIT compile (SGLang / FlashInfer / Triton) stalls the scheduler: not a hang
                    self.compile_wait_s += 0.5
                    self.last_healthy = time.time() - look
                elif stale > self.hang_s:
                    self.hung_at = time.time()
                    self._stop = True
                    return
                if tick % 2 == 0 and (probe is None or probe.done()):
                    probe = asyncio.ensure_future(self._health(session))
                if bar is not None:
                    bar.n = min(bar.total, int(time.time() - t0))
                    bar.set_postfix_str(f"{self.started} requests", refresh=True)
                tick += 1
                await asyncio.sleep(0.5)
        finally:
            if probe is not None and not probe.done():
                probe.cancel()

    async def run(self, seconds: float, max_requests: int, drain_timeout: float, progress: bool = False
                  ) -> Dict[str, Any]:
        import aiohttp

        t0 = time.time()
        stop_at = t0 + seconds
        bar = _bar(seconds, progress)
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=_timeout(self.request_timeout),
                                         read_bufsize=1 << 20) as session:
            workers = [asyncio.ensure_future(self._worker(session, i, stop_at, max_requests))
                       for i in range(self.concurrency)]
            mon = asyncio.ensure_future(self._monitor(session, bar))
            # until every worker has stopped picking (deadline, request cap) or the server died
            while not self._stop and not all(w.done() for w in workers) and time.time() < stop_at:
                await asyncio.sleep(0.1)
            t_stop = time.time()
            grace = 2.0 if self.crashed_at or self.hung_at else drain_timeout
            _done, pending = await asyncio.wait(workers, timeout=grace) if workers else (set(), set())
            self._stop = True
            for w in pending:  # in flight past the drain cap: hang up (the server aborts them)
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            t_drained = time.time()
            mon.cancel()
            await asyncio.gather(mon, return_exceptions=True)
        if bar is not None:
            bar.close()
        if self.crashed_at is None and not self.alive():
            self.crashed_at = time.time()
        return {"seconds": round(t_stop - t0, 2), "drain_s": round(t_drained - t_stop, 2),
                "cancelled_at_drain": len(pending), "started": self.started}


def _timeout(total: float):
    import aiohttp

    return aiohttp.ClientTimeout(total=total)


def _bar(seconds: float, enable: bool):
    if not enable:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=max(1, int(seconds)), desc="chaos", unit="s", dynamic_ncols=True, file=sys.stderr)


def tally(recs: Sequence[Rec]) -> Dict[str, Any]:
    """Counts of a chaos run by category, kind and outcome."""
    by_kind: Dict[str, Counter] = defaultdict(Counter)
    by_cat: Dict[str, Counter] = defaultdict(Counter)
    for r in recs:
        by_kind[r.kind][r.outcome] += 1
        by_cat[r.cat][r.outcome] += 1
    bad = by_cat.get("bad", Counter())
    good = by_cat.get("good", Counter())
    lenient = by_cat.get("lenient", Counter())
    failures = [asdict(r) for r in recs if (r.cat == "bad" and r.outcome != "4xx")
                or (r.cat != "bad" and r.outcome in GOOD_FAIL)]
    return {
        "requests": len(recs),
        "good": sum(good.values()), "bad": sum(bad.values()), "lenient": sum(lenient.values()),
        "bad_not_4xx": sum(v for k, v in bad.items() if k != "4xx"),
        "good_failed": sum(good[k] for k in GOOD_FAIL),
        # a 4xx to a good request nobody aborted: the harness built it wrong, or the server refused a valid one
        "good_4xx_not_aborted": sum(by_kind[k]["4xx"] for k in GOOD_KINDS if "abort" not in k and k in by_kind),
        "lenient_failed": sum(lenient[k] for k in GOOD_FAIL),
        "streams_cut": sum(by_kind[k]["cut"] for k in by_kind),
        "by_category": {k: dict(v) for k, v in sorted(by_cat.items())},
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "failures": len(failures),
        "failure_examples": failures[:40],
    }


# ---------------------------------------------------------------------------------
# server-side readings
# ---------------------------------------------------------------------------------
def read_metrics(url: str) -> Optional[Dict[str, float]]:
    code, text = ab.http_text(url + "/metrics", timeout=10)
    return ab.parse_metrics(text, METRICS) if code == 200 else None


def wait_idle(url: str, timeout: float, want_used: Optional[float] = None) -> Dict[str, Any]:
    """Poll ``/metrics`` until no request runs or waits (and, given ``want_used``, the mamba pool's used
    slots are back at that value); the last reading, with ``settled`` and the seconds waited."""
    t0 = time.time()
    last: Optional[Dict[str, float]] = None
    while True:
        m = read_metrics(url)
        if m is not None:
            last = m
            idle = m.get("num_running_reqs", 0.0) == 0 and m.get("num_queue_reqs", 0.0) == 0
            back = want_used is None or m.get("mamba_used_tokens") == want_used
            if idle and back:
                return {"metrics": m, "settled": True, "waited_s": round(time.time() - t0, 2)}
        if time.time() - t0 >= timeout:
            return {"metrics": last, "settled": False, "waited_s": round(time.time() - t0, 2)}
        time.sleep(0.25)


def idle_reading(url: str, timeout: float, probe: Dict[str, Any], want_used: Optional[float] = None
                 ) -> Dict[str, Any]:
    """A fresh idle reading of ``/metrics``.  SGLang's scheduler republishes its pool gauges at once on going
    idle only when its running-requests gauge is stale, which a decode report (one every
    ``decode_log_interval`` decode steps) makes it; after a prefill report the mamba gauges may lag up to
    30 s.  So: wait for no running or waiting request, send ``probe`` (one greedy request of more decode
    steps than that interval), wait again (for ``want_used`` slots, when given)."""
    first = wait_idle(url, timeout)
    t0 = time.time()
    try:
        ab.http_json(url + "/generate", probe, timeout=max(10.0, timeout))
        probed: Any = round(time.time() - t0, 2)
    except Exception as e:  # noqa: BLE001 - recorded; the reading is then the one before the probe
        probed = f"{type(e).__name__}: {e}"[:200]
    out = wait_idle(url, timeout, want_used=want_used)
    out.update(probe_s=probed, before_probe=first.get("metrics"))
    return out


def probe_request(lim: Limits, decode_log_interval: int, tokens_per_step: int) -> Dict[str, Any]:
    """The idle-reading probe: a short greedy prompt with ``decode_log_interval + 2`` decode steps' tokens."""
    new = min(lim.context - 64, (decode_log_interval + 2) * max(1, tokens_per_step))
    return {"input_ids": list(range(3, 3 + min(16, lim.vocab - 3))),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": new, "ignore_eos": True}}


def gpu_mem(sampler: Optional[ab.GpuMemSampler]) -> Optional[float]:
    """MiB on the GPU of the server's processes (the whole GPU's use where that cannot be told)."""
    if sampler is None:
        return None
    own = sampler.read_own()
    return own if own is not None else sampler.read()


def run_baseline(url: str, prompts: List[List[int]], tokens: int, timeout: float) -> Dict[str, Any]:
    """The greedy prompts one request at a time: their output token ids."""
    out, t0 = [], time.time()
    try:
        for p in prompts:
            res = ab.http_json(url + "/generate", {"input_ids": p, "sampling_params": {
                "temperature": 0.0, "max_new_tokens": tokens, "ignore_eos": True}}, timeout=timeout)
            out.append([int(t) for t in (res or {}).get("output_ids") or []])
    except Exception as e:  # noqa: BLE001 - recorded
        return {"error": f"{type(e).__name__}: {e}"[:300], "outputs": out, "seconds": round(time.time() - t0, 2)}
    return {"outputs": out, "seconds": round(time.time() - t0, 2)}


def baseline_prompts(n: int, lim: Limits, seed: int) -> List[List[int]]:
    """ab's parity prompts (7..300 tokens), the last one long (half the context)."""
    prompts = ab.parity_prompts(max(0, n - 1), lim.vocab, seed)
    rng = random.Random(seed + 1)
    return prompts + [random_ids(rng, max(8, lim.context // 2), lim.vocab)] if n > 0 else []


def compare_baselines(before: Dict[str, Any], after: Dict[str, Any]) -> Dict[str, Any]:
    a, b = before.get("outputs"), after.get("outputs")
    if before.get("error") or after.get("error") or a is None or b is None or len(a) != len(b) or not a:
        return {"identical": False, "why": before.get("error") or after.get("error") or "missing outputs"}
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    first = {i: next((j for j, (u, v) in enumerate(zip(a[i], b[i])) if u != v), min(len(a[i]), len(b[i])))
             for i in diff}
    return {"identical": not diff, "prompts": len(a), "differing_prompts": diff, "first_divergence": first}


def log_checks(path: Path) -> Dict[str, Any]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    return {"memory_leak_warnings": text.count("memory leak detected"),
            "tracebacks": text.count("Traceback (most recent call last)"),
            "replayssm_seams": ab.seams_state(text), "replayssm_conv_verify": ab.conv_verify_state(text),
            "replayssm_active": "sglang_replayssm active" in text,
            "random_weights_confirmed": _weights_marker() in text}


def _weights_marker() -> str:
    from eval import weights

    return weights.LOG_MARKER


# ---------------------------------------------------------------------------------
# one server
# ---------------------------------------------------------------------------------
def soak_server(args, plan: Plan, label: str, index: int, workdir: Path, logdir: Path, base_env: Dict[str, str],
                pythonpath: List[str], deadline: float) -> Dict[str, Any]:
    """Start one server, warm it, baseline, idle reading, chaos, drain, idle reading, baseline, stop."""
    abns = ab_namespace(args, plan)
    spec = plan.spec != "none"
    model = ab.prepare_model(abns, workdir, spec)
    flags = ab.common_server_flags(abns, model, spec)
    phase = ab.Phase(label, args.arm, spec, None, bench=False, parity=False)
    module, extra = ab.arm_launch(abns, args.arm)
    port = ab.free_port(args.host)
    cmd = ab.launch_cmd(args.python, module, flags, args.host, port, extra)
    env = ab.server_env(base_env, abns, phase, model, pythonpath)
    env["PYTHONFAULTHANDLER"] = "1"  # a hung server's processes print every thread's stack on SIGABRT (dump_stacks)
    vocab = int(model.config.get("vocab_size", 1024))
    lim = Limits(vocab, args.context_length, min(args.max_new_tokens, args.context_length // 2),
                 margin=16 + (args.spec_steps + 1 if spec else 0))
    rec: Dict[str, Any] = {"label": label, "plan": asdict(plan), "arm": args.arm, "launcher": module,
                           "command": shlex.join(cmd), "env": ab.env_delta(env, base_env), "vocab": vocab,
                           "limits": asdict(lim), "status": "created", "crashed": False,
                           "log": str(logdir / f"server-{label}.log")}
    server = ab.Server(label, cmd, env, logdir / f"server-{label}.log", args.host, port)
    sampler: Optional[ab.GpuMemSampler] = None
    chaos: Optional[Chaos] = None
    try:
        log(f"{label}: starting {module} on port {port}")
        server.start()
        sampler = ab.GpuMemSampler(args.gpu_index, pgid=server.proc.pid)
        rec["startup_s"] = round(server.wait_ready(min(args.server_timeout, max(10.0, deadline - time.time()))), 1)
        log(f"{label}: healthy after {rec['startup_s']} s")
        info: Dict[str, Any] = {}
        try:
            info = ab.http_json(server.url + "/server_info", timeout=30) or {}
            rec["server_info"] = ab.server_facts(info)
        except Exception as e:  # noqa: BLE001
            rec["server_info_error"] = str(e)[:300]
        interval = info.get("decode_log_interval") if isinstance(info, dict) else None
        probe = probe_request(lim, interval if isinstance(interval, int) and interval > 0 else 40,
                              args.spec_steps + 1 if spec else 1)
        model_name = _served_model(server.url)
        prompts = baseline_prompts(args.baseline_prompts, lim, args.seed)
        rec["warmup"] = _warmup(server.url, lim, args, model_name, server.alive)
        rec["baseline_before"] = run_baseline(server.url, prompts, args.baseline_tokens, args.request_timeout)
        idle = idle_reading(server.url, args.settle_timeout, probe)
        rec["idle_before"] = dict(idle, gpu_mem_mib=gpu_mem(sampler))
        if sampler is not None:
            sampler.start()
        seconds = max(0.0, min(plan.minutes * 60.0, deadline - time.time() - args.reserve_s))
        rounds = max(1, args.rounds)
        log(f"{label}: chaos for {seconds:.0f} s in {rounds} round(s) (at most {args.max_requests} requests, "
            f"{args.concurrency} at once)")
        used0 = ((rec["idle_before"].get("metrics") or {}).get("mamba_used_tokens"))
        runs: List[Dict[str, Any]] = []
        recs: List[Rec] = []
        aborts: Counter = Counter()
        health_failures, compile_wait, died = 0, 0.0, False
        rec["rounds"] = []
        for r in range(rounds):
            # each round gets its share of the time and request cap; the last takes what the earlier left
            r_seconds = max(0.0, min(seconds - sum(x["seconds"] for x in runs), seconds / rounds)) \
                if r < rounds - 1 else max(0.0, seconds - sum(x["seconds"] for x in runs))
            r_cap = (args.max_requests - len(recs)) if r == rounds - 1 else max(1, args.max_requests // rounds)
            chaos = Chaos(server.url, lim, concurrency=args.concurrency, bad_fraction=args.bad_fraction,
                          lenient_fraction=args.lenient_fraction, request_timeout=args.request_timeout,
                          seed=args.seed + 7919 * (index + 1) + 104729 * r, model_name=model_name,
                          alive=server.alive, hang_s=args.hang_s, compiling=lambda: jit_compiling(server.proc.pid))
            run = asyncio.run(chaos.run(r_seconds, r_cap, args.drain_timeout, progress=not args.no_progress))
            runs.append(run)
            recs += chaos.recs
            aborts.update(chaos.aborts)
            health_failures += chaos.health_failures
            compile_wait += chaos.compile_wait_s
            t = tally(chaos.recs)
            rnd: Dict[str, Any] = {"round": r + 1, "seconds": run["seconds"], "requests": t["requests"],
                                   "bad": t["bad"], "bad_not_4xx": t["bad_not_4xx"], "good_failed": t["good_failed"]}
            rec["rounds"].append(rnd)
            if chaos.crashed_at is not None or chaos.hung_at is not None or not server.alive():
                died = True
                break
            # the idle reading after every round: growth after the first round is what a leak would show;
            # the first round's own growth is the caching allocator meeting new shapes
            idle = idle_reading(server.url, args.settle_timeout, probe, want_used=used0)
            rnd["idle"] = dict(idle, gpu_mem_mib=gpu_mem(sampler))
            log(f"{label}: round {r + 1}/{rounds}: {t['requests']} requests ({t['bad']} bad, {t['bad_not_4xx']} "
                f"of them not 4xx; {t['good_failed']} good ones failed) in {run['seconds']} s, drained in "
                f"{run['drain_s']} s; idle GPU memory {rnd['idle']['gpu_mem_mib']} MiB")
            if len(recs) >= args.max_requests:
                break
        rec["chaos"] = dict({"seconds": round(sum(x["seconds"] for x in runs), 2),
                             "drain_s": round(sum(x["drain_s"] for x in runs), 2),
                             "cancelled_at_drain": sum(x["cancelled_at_drain"] for x in runs),
                             "started": sum(x["started"] for x in runs)},
                            **tally(recs), aborts=dict(aborts), health_failures_during=health_failures,
                            jit_compile_wait_s=round(compile_wait, 1))
        _write_requests(logdir / f"requests-{label}.jsonl", recs)
        c = rec["chaos"]
        log(f"{label}: {c['requests']} requests ({c['bad']} bad, {c['bad_not_4xx']} of them not 4xx; "
            f"{c['good_failed']} good ones failed) in {c['seconds']} s, drained in {c['drain_s']} s")
        if died:
            _crash(rec, server, chaos)
        else:
            rec["idle_after"] = rec["rounds"][-1]["idle"]
            rec["baseline_after"] = run_baseline(server.url, prompts, args.baseline_tokens, args.request_timeout)
            rec["health_after"] = ab.http_text(server.url + "/health", timeout=30)[0] == 200
            if not server.alive():
                _crash(rec, server, chaos)
        rec["alive_after"] = server.alive()
        rec["status"] = "crashed" if rec["crashed"] else "ok"
    except Exception as e:  # noqa: BLE001 - recorded; the next server runs
        if server.proc is not None and not server.alive() and "startup_s" in rec:
            _crash(rec, server, chaos)
            rec["status"] = "crashed"
        else:
            rec["status"] = "error"
        rec["error"] = f"{type(e).__name__}: {e}"[:3000]
        log(f"{label}: {rec['status'].upper()} {rec['error'][:1500]}")
    finally:
        if sampler is not None:
            sampler.stop()
            rec["peak_gpu_mem_mib"] = sampler.peak_own if sampler.peak_own is not None else sampler.peak
        rec["shutdown"] = server.stop(grace=args.shutdown_grace)
        rec["log_checks"] = log_checks(server.log_path)
    finish_record(rec)
    return rec


def _crash(rec: Dict[str, Any], server: ab.Server, chaos: Optional[Chaos]) -> None:
    """Record a server that died, or hung (its process alive, ``/health`` failing for ``--hang-s``): both count
    as crashes; ``at`` is seconds since its start (a hang: since the last ``/health`` that passed)."""
    if rec["crashed"]:
        return
    rec["crashed"] = True
    rc = server.proc.poll() if server.proc is not None else None
    hung = chaos is not None and chaos.hung_at is not None and rc is None
    when = time.time()
    if chaos is not None and chaos.crashed_at:
        when = chaos.crashed_at
    elif hung:
        when = chaos.last_healthy
    crash: Dict[str, Any] = {"kind": f"hung (/health failing for {chaos.hang_s:.0f} s)" if hung else "died",
                             "rc": rc, "at": round(when - server.t0, 1)}
    if hung:  # where it hangs: the GPU busy or idle, and every process's Python stacks (into the server log)
        crash["gpu_utilization_pct"] = gpu_utilization()
        crash["process_cpu"] = process_cpu(server.proc.pid)
        crash["stacks_dumped_pids"] = dump_stacks(server.proc.pid)
        time.sleep(3.0)
    crash["log_tail"] = server.tail(200 if hung else 60)
    if chaos is not None:  # suspects: sent before the death was seen, never answered, and not refused at connect
        near = [r for r in chaos.recs if r.t0 <= when and r.outcome not in ("ok", "cut", "4xx")
                and not r.detail.startswith("ClientConnectorError")]
        crash["unanswered_at_death"] = len(near)
        crash["requests_near_death"] = [asdict(r) for r in sorted(near, key=lambda r: r.t0)[-30:]]
        crash["bad_kinds_near_death"] = dict(Counter(r.kind for r in near if r.cat == "bad"))
    rec["crash"] = crash
    log(f"{rec['label']}: CRASHED, {crash['kind']} (rc={rc}); bad requests near its death: "
        f"{crash.get('bad_kinds_near_death')}")


def gpu_utilization() -> Optional[List[int]]:
    """nvidia-smi's utilization.gpu (%) of every GPU, sampled 5 times 0.2 s apart (None without nvidia-smi)."""
    import subprocess

    out: List[int] = []
    for _ in range(5):
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        if r.returncode != 0:
            return None
        out += [int(x) for x in r.stdout.split() if x.strip().isdigit()]
        time.sleep(0.2)
    return out


def _tree(pid: int) -> list:
    """The server's process and its descendants (children first), as psutil processes ([] without psutil)."""
    try:
        import psutil

        root = psutil.Process(pid)
        return root.children(recursive=True) + [root]
    except Exception:  # noqa: BLE001 - no psutil, or the server is gone
        return []


def process_cpu(pid: int, seconds: float = 1.0) -> List[Dict[str, Any]]:
    """Each server process's name (SGLang titles them ``sglang::scheduler`` etc.), state and CPU % over
    ``seconds``: a process at ~100 % spins, one near 0 % waits."""
    procs = _tree(pid)
    for p in procs:
        try:
            p.cpu_percent(None)
        except Exception:  # noqa: BLE001
            pass
    time.sleep(seconds)
    out = []
    for p in procs:
        try:
            out.append({"pid": p.pid, "name": p.name(), "status": p.status(), "cpu_pct": p.cpu_percent(None)})
        except Exception:  # noqa: BLE001 - gone meanwhile
            continue
    return out


COMPILERS = frozenset({"nvcc", "cicc", "ptxas", "ninja", "cudafe++", "fatbinary", "nvlink", "cc1plus", "cc1", "ld"})


def jit_compiling(pid: int) -> bool:
    """Whether a compiler (nvcc, cicc, ptxas, ninja, ...) runs under the server: a JIT compile in progress."""
    for p in _tree(pid):
        try:
            if p.name() in COMPILERS:
                return True
        except Exception:  # noqa: BLE001 - gone meanwhile
            continue
    return False


def dump_stacks(pid: int) -> List[int]:
    """SIGABRT to the server's processes, children first: started with ``PYTHONFAULTHANDLER=1``, each prints
    every thread's Python stack to its stderr (the server log) before it dies. The pids signalled."""
    sent = []
    for p in _tree(pid):
        try:
            p.send_signal(signal.SIGABRT)
            sent.append(p.pid)
        except Exception:  # noqa: BLE001 - gone meanwhile
            continue
    return sent


def _served_model(url: str) -> Optional[str]:
    try:
        data = ab.http_json(url + "/v1/models", timeout=10)
        return data["data"][0]["id"]
    except Exception:  # noqa: BLE001 - /v1/completions then uses SGLang's default name
        return None


def _warmup(url: str, lim: Limits, args, model_name: Optional[str], alive) -> Dict[str, Any]:
    """``concurrency`` long prompts at once, greedy and sampled (top-k / top-p / min-p), before any idle reading
    (not part of the chaos): SGLang JIT-compiles some kernels on first use (FlashInfer's top-k renorm for
    sampled speculative verify: minutes of nvcc on a cold host), and that belongs here, not in the chaos."""
    async def go() -> Dict[str, Any]:
        import aiohttp

        chaos = Chaos(url, lim, concurrency=args.concurrency, bad_fraction=0, lenient_fraction=0,
                      request_timeout=args.request_timeout, seed=args.seed, model_name=model_name, alive=alive)
        n = max(0, args.warmup_requests)

        async def one(i: int) -> Rec:
            rng = random.Random(args.seed + i)
            new = max(8, min(64, lim.max_new))  # long enough to decode the whole warm-up batch for a while
            plen = max(1, lim.context - new - lim.margin - rng.randrange(0, max(1, lim.context // 4)))
            rec = Rec("warmup", "warmup", time.time())
            sp: Dict[str, Any] = {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True}
            if i % 2:
                sp.update(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05)
            payload = {"input_ids": random_ids(rng, plen, lim.vocab), "sampling_params": sp}
            try:
                await chaos._post(session, rec, "/generate", json.dumps(payload).encode())
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                rec.outcome = type(e).__name__
            return rec

        # a cold JIT compile can outlast a chaos request's timeout: the warm-up waits as long as a server start
        async with aiohttp.ClientSession(timeout=_timeout(max(args.request_timeout, args.server_timeout))) as session:
            recs = await asyncio.gather(*(one(i) for i in range(n)))
        return {"requests": n, "outcomes": dict(Counter(r.outcome for r in recs))}

    t0 = time.time()
    out = asyncio.run(go())
    out["seconds"] = round(time.time() - t0, 2)
    return out


def _write_requests(path: Path, recs: Sequence[Rec]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            for r in recs:
                f.write(json.dumps(asdict(r)) + "\n")
    except OSError:
        pass


def finish_record(rec: Dict[str, Any]) -> Dict[str, Any]:
    """The per-server figures the summary needs (``numbers``), from the raw readings."""
    c = rec.get("chaos") or {}
    before = ((rec.get("idle_before") or {}).get("metrics") or {})
    after = ((rec.get("idle_after") or {}).get("metrics") or {})
    used0, used1 = before.get("mamba_used_tokens"), after.get("mamba_used_tokens")
    leaked = max(0, int(round(used1 - used0))) if ab_number(used0) and ab_number(used1) else None
    g0 = (rec.get("idle_before") or {}).get("gpu_mem_mib")
    g1 = (rec.get("idle_after") or {}).get("gpu_mem_mib")
    # the steady-state growth: from the idle reading after the first chaos round to the last one (one round:
    # from before the chaos); the first round's growth is reported beside it
    idles = [(x.get("idle") or {}).get("gpu_mem_mib") for x in rec.get("rounds") or []]
    g_first = idles[0] if len(idles) >= 2 else g0
    cmp = compare_baselines(rec.get("baseline_before") or {}, rec["baseline_after"]) \
        if "baseline_after" in rec else {"identical": False, "why": "no baseline after the chaos"}
    rec["baseline"] = cmp
    rec["numbers"] = {
        "requests": c.get("requests", 0), "bad_requests_sent": c.get("bad", 0),
        "bad_requests_not_4xx": c.get("bad_not_4xx", 0), "good_requests_failed": c.get("good_failed", 0),
        "crashed": bool(rec.get("crashed")), "baseline_identical": bool(cmp.get("identical")),
        "healthy_after": bool(rec.get("health_after")) and bool(rec.get("alive_after")),
        "mamba_used_before": used0, "mamba_used_after": used1, "leaked_mamba_slots": leaked,
        "mamba_available_before": before.get("mamba_available_tokens"),
        "mamba_available_after": after.get("mamba_available_tokens"),
        "gpu_mem_before_mib": g0, "gpu_mem_after_mib": g1,
        "gpu_mem_after_round1_mib": idles[0] if idles else None,
        "gpu_mem_growth_mib": (g1 - g_first) if ab_number(g_first) and ab_number(g1) else None,
        "gpu_mem_round1_growth_mib": (idles[0] - g0) if idles and ab_number(g0) and ab_number(idles[0]) else None,
        "gpu_mem_growth_total_mib": (g1 - g0) if ab_number(g0) and ab_number(g1) else None,
        "peak_gpu_mem_mib": rec.get("peak_gpu_mem_mib"),
    }
    return rec


def ab_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def summarize(servers: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The run's summary: SUMMARY_KEYS (see TARGETS) plus each server's own figure."""
    ran = [s for s in servers if s.get("status") in ("ok", "crashed")]
    nums = {s["label"]: s.get("numbers") or {} for s in servers}
    leaks = [n.get("leaked_mamba_slots") for n in nums.values() if n]
    growth = [n.get("gpu_mem_growth_mib") for n in nums.values() if ab_number(n.get("gpu_mem_growth_mib"))]
    out: Dict[str, Any] = {
        "requests": min((nums[s["label"]].get("requests", 0) for s in servers), default=0),
        "server_crashes": sum(1 for s in servers if s.get("crashed")),
        "baseline_identical": int(bool(servers) and all(nums[s["label"]].get("baseline_identical") for s in servers)),
        "bad_requests_sent": min((nums[s["label"]].get("bad_requests_sent", 0) for s in servers), default=0),
        "bad_requests_not_4xx": sum(n.get("bad_requests_not_4xx", 0) for n in nums.values()),
        # unmeasured on any server (it did not run, or /metrics had no figure): unknown, not zero
        "leaked_mamba_slots": sum(leaks) if leaks and all(ab_number(x) for x in leaks) and len(leaks) == len(servers)
        else None,
        "gpu_mem_growth_mib": max(growth) if growth else None,
    }
    out.update({
        "servers": len(servers), "servers_ran": len(ran), "complete": int(bool(servers) and len(ran) == len(servers)),
        "servers_not_ran": [s["label"] for s in servers if s not in ran],
        "requests_per_server": {k: n.get("requests", 0) for k, n in nums.items()},
        "requests_total": sum(n.get("requests", 0) for n in nums.values()),
        "bad_requests_per_server": {k: n.get("bad_requests_sent", 0) for k, n in nums.items()},
        "bad_requests_total": sum(n.get("bad_requests_sent", 0) for n in nums.values()),
        "good_requests_failed": sum(n.get("good_requests_failed", 0) for n in nums.values()),
        "crashed_servers": [s["label"] for s in servers if s.get("crashed")],
        "leak_unmeasured": [k for k, n in nums.items() if n.get("leaked_mamba_slots") is None],
        "healthy_after": {k: n.get("healthy_after") for k, n in nums.items()},
        "targets": dict(TARGETS),
    })
    return out


# ---------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------
def _v(x: Any) -> str:
    """A number or value for the Markdown: None as a dash, whole floats as integers, others to 4 digits."""
    if x is None:
        return "—"
    if isinstance(x, float):
        return str(int(x)) if x.is_integer() else f"{x:.4g}"
    return str(x)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    rows = [[_v(v) for v in r] for r in rows]
    try:
        from tabulate import tabulate

        return tabulate(rows, headers=list(headers), tablefmt="github")
    except ImportError:  # a GPU host without tabulate
        from eval import report

        return report.markdown_table(list(headers), rows)


def render_markdown(res: Dict[str, Any]) -> str:
    s = res["summary"]
    lines = [f"# Soak test ({res.get('gpu', {}).get('name', '?')})", "",
             f"git `{res.get('git_commit')}`, SGLang {res.get('sglang_version')}, started {res.get('started')}, "
             f"{res.get('wall_s')} s wall. Targets are judged by reading this record, not asserted by the harness.",
             "", *([f"Merged from {len(res['merged_from'])} runs (`--merge`): " + "; ".join(
                 f"started {m.get('started')}, {', '.join(m.get('servers') or [])}" for m in res["merged_from"]) + ".",
                    ""] if res.get("merged_from") else []),
             "## Summary", "",
             _table(["figure", "value", "target"], [[k, s.get(k), TARGETS[k]] for k in SUMMARY_KEYS]), ""]
    for srv in res["servers"]:
        n = srv.get("numbers") or {}
        c = srv.get("chaos") or {}
        lines += [f"## {srv['label']} ({srv.get('status')})", ""]
        if srv.get("error"):
            lines += [f"error: `{srv['error'][:300]}`", ""]
        lc = srv.get("log_checks") or {}
        rows = [["requests", n.get("requests"), f"{_v(c.get('seconds'))} s, drained in {_v(c.get('drain_s'))} s"],
                ["bad requests (not 4xx)", f"{n.get('bad_requests_sent')} ({n.get('bad_requests_not_4xx')})",
                 f"{len(_bad_misses(c))} kinds not all 4xx (below)" if _bad_misses(c) else "all 4xx"],
                ["good requests failed", n.get("good_requests_failed"), f"{c.get('streams_cut', 0)} streams cut, "
                 f"aborts {c.get('aborts') or {}}"],
                ["crashed", n.get("crashed"), (f"{srv['crash']['kind']}, rc {srv['crash']['rc']}, "
                                               f"{srv['crash']['at']} s after its start (below)")
                 if srv.get("crash") else ""],
                ["good requests answered 4xx (not aborted)", c.get("good_4xx_not_aborted"), ""],
                ["baseline identical", n.get("baseline_identical"), (srv.get("baseline") or {}).get("why") or
                 f"differing prompts {(srv.get('baseline') or {}).get('differing_prompts')}"],
                ["healthy after", n.get("healthy_after"), ""],
                ["mamba slots used before / after", f"{_v(n.get('mamba_used_before'))} / "
                 f"{_v(n.get('mamba_used_after'))}", f"leaked {_v(n.get('leaked_mamba_slots'))}"],
                ["GPU MiB before / after / peak", f"{_v(n.get('gpu_mem_before_mib'))} / "
                 f"{_v(n.get('gpu_mem_after_mib'))} / {_v(n.get('peak_gpu_mem_mib'))}",
                 f"growth {_v(n.get('gpu_mem_growth_mib'))} after the first round (that round: "
                 f"{_v(n.get('gpu_mem_round1_growth_mib'))}; in all: {_v(n.get('gpu_mem_growth_total_mib'))})"],
                ["rounds (requests, idle GPU MiB after)", len(srv.get("rounds") or []), ", ".join(
                    f"{x.get('requests')} req, {_v((x.get('idle') or {}).get('gpu_mem_mib'))} MiB"
                    for x in srv.get("rounds") or [])],
                ["SGLang leak warnings, tracebacks in log",
                 f"{_v(lc.get('memory_leak_warnings'))}, {_v(lc.get('tracebacks'))}", ""]]
        lines += [_table(["", "value", "detail"], rows), ""]
        if _bad_misses(c):
            lines += ["Bad requests not answered 4xx, by kind: " + ", ".join(
                f"`{k}` {v} ({', '.join(f'{o} {m}' for o, m in sorted(c['by_kind'][k].items()) if o != '4xx')})"
                for k, v in sorted(_bad_misses(c).items())) + ".", ""]
        if srv.get("crash"):
            kinds = srv["crash"].get("bad_kinds_near_death") or {}
            lines += [f"Crash: {srv['crash'].get('unanswered_at_death', 0)} requests sent before it was seen went "
                      "unanswered; bad ones among them: "
                      + (", ".join(f"`{k}` {v}" for k, v in sorted(kinds.items())) or "none") + ".", ""]
    return "\n".join(lines)


def _bad_misses(chaos: Dict[str, Any]) -> Dict[str, int]:
    """Bad-request kinds that got anything but a 4xx, with how many."""
    out: Dict[str, int] = {}
    for kind, outcomes in (chaos.get("by_kind") or {}).items():
        if kind in BAD_KINDS:
            miss = sum(v for k, v in outcomes.items() if k != "4xx")
            if miss:
                out[kind] = miss
    return out


def merge_runs(runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """One record of several soak runs of the same commit, SGLang and GPU (one device call may not hold every
    server): the servers in run order, each tagged with its run's start, and the summary over all of them.
    A server a run skipped (its deadline) is dropped when another run ran it; a server that ran in several runs
    keeps every record, the later ones labelled "<label> (run N)", so the summary counts each of them."""
    if not runs:
        raise ValueError("--merge: no runs given")
    for key in ("schema", "git_commit", "sglang_version"):
        vals = {r.get(key) for r in runs}
        if len(vals) != 1:
            raise ValueError(f"--merge: the runs differ in {key} ({sorted(map(str, vals))}); merge only runs of "
                             "one commit, SGLang and harness")
    names = {(r.get("gpu") or {}).get("name") for r in runs}
    if len(names) != 1:
        raise ValueError(f"--merge: the runs were on different GPUs ({sorted(map(str, names))})")
    ran = {s["label"] for r in runs for s in r.get("servers", []) if s.get("status") != "skipped"}
    servers: List[Dict[str, Any]] = []
    merged_from: List[Dict[str, Any]] = []
    seen: Dict[str, int] = {}
    for i, r in enumerate(runs, 1):
        kept, dropped = [], []
        for s in r.get("servers", []):
            label = s["label"]
            if s.get("status") == "skipped" and (label in ran or label in seen):
                dropped.append(label)
                continue
            if label in seen:
                s = dict(s, label=f"{label} (run {i})", server=label)
            seen[label] = seen.get(label, 0) + 1
            servers.append(dict(s, run_started=r.get("started")))
            kept.append(s["label"])
        merged_from.append({"started": r.get("started"), "finished": r.get("finished"), "wall_s": r.get("wall_s"),
                            "flags": r.get("flags"), "servers": kept,
                            "skipped_here_ran_elsewhere": dropped})
    res = {k: v for k, v in runs[0].items() if k not in ("servers", "summary", "plan", "flags", "finished",
                                                         "wall_s")}
    res["merged_from"] = merged_from
    res["plan"] = [p for r in runs for p in r.get("plan", [])]
    res["servers"] = servers
    res["finished"] = runs[-1].get("finished")
    res["wall_s"] = round(sum(float(r.get("wall_s") or 0) for r in runs), 1)
    res["summary"] = summarize(res["servers"])
    return res


def write_outputs(res: Dict[str, Any], out: Path) -> List[Path]:
    from eval import report

    out.parent.mkdir(parents=True, exist_ok=True)
    report.write_json(out, res)
    md = out.with_suffix(".md")
    md.write_text(render_markdown(res) + "\n")
    return [out, md]


# ---------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("servers (one at a time)")
    g.add_argument("--model", action="append", help="built-in geometry (python -m eval.models) or model directory; "
                   "repeat for several (default tiny-nemotron-h); each runs with every --spec")
    g.add_argument("--spec", default="none", help="comma list of none, nextn, eagle (default none)")
    g.add_argument("--minutes", type=float, default=2.0, help="chaos minutes per server (default 2)")
    g.add_argument("--plan", action="append", metavar="MODEL[:SPEC[:MINUTES]][ FLAGS]",
                   help="one server (repeat; replaces --model/--spec): its spec and chaos minutes, then, after a "
                        "space, launcher flags for this server only, e.g. 'nemotron-h-8b:none:1.5'")
    g.add_argument("--arm", choices=ab.ARM_KINDS, default="staged",
                   help="server kind as in eval.ab (default staged: our launcher's defaults)")
    g.add_argument("--context-length", type=int, default=4096, help="SGLang --context-length; prompts go up to it")
    g.add_argument("--mem-fraction-static", type=float, default=0.0, help="default: eval.ab's (0.25 tiny, 0.85 real)")
    g.add_argument("--cuda-graph-max-bs", type=int, default=0, help="default: eval.ab's")
    g.add_argument("--radix-cache", choices=("on", "off"), default="off", help="as eval.ab --radix-cache")
    g.add_argument("--spec-steps", type=int, default=3, help="draft steps of a spec server (eval.ab --spec-steps)")
    g.add_argument("--spec-draft-model", default=None, help="draft model directory (needed for eagle)")
    g.add_argument("--server-arg", action="append", help="extra SGLang flags for every server (shell-split)")
    g.add_argument("--patched-arg", action="append", help="extra flags for our launcher (staged/patched arms)")
    g.add_argument("--no-random-weights", dest="random_weights", action="store_false", default=True,
                   help="plain dummy weights instead of eval/weights.py's scaled random ones")
    g.add_argument("--weight-seed", type=int, default=0, help="seed of the scaled random weights")
    c = p.add_argument_group("chaos client")
    c.add_argument("--concurrency", type=int, default=32, help="requests in flight at once (default 32)")
    c.add_argument("--max-requests", type=int, default=2400, help="cap of chaos requests per server (default 2400)")
    c.add_argument("--max-new-tokens", type=int, default=256, help="largest random output length (default 256)")
    c.add_argument("--bad-fraction", type=float, default=0.1, help="share of bad requests (default 0.1)")
    c.add_argument("--lenient-fraction", type=float, default=0.01,
                   help="share of odd-but-legal requests (unknown top-level JSON fields; must not get a 5xx)")
    c.add_argument("--rounds", type=int, default=2,
                   help="chaos rounds per server, the time and request cap split between them, an idle reading "
                        "after each; gpu_mem_growth_mib is the growth after the first round (default 2)")
    c.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request, streams included")
    c.add_argument("--drain-timeout", type=float, default=60.0,
                   help="after the chaos, seconds in-flight requests get to finish before the client hangs up")
    c.add_argument("--warmup-requests", type=int, default=-1,
                   help="long greedy prompts sent at once before the idle readings (default: --concurrency)")
    c.add_argument("--baseline-prompts", type=int, default=8, help="greedy prompts before and after (default 8)")
    c.add_argument("--baseline-tokens", type=int, default=48, help="tokens per baseline prompt (default 48)")
    c.add_argument("--settle-timeout", type=float, default=20.0,
                   help="seconds to wait for the server's idle metrics (mamba slots back) after the drain")
    c.add_argument("--seed", type=int, default=0, help="SGLang --random-seed and the chaos client's random seed")
    o = p.add_argument_group("run control and output")
    o.add_argument("--out", default=str(ROOT / "eval" / "results" / "soak-h200.json"),
                   help="result JSON (the Markdown goes beside it, .md)")
    o.add_argument("--log-dir", default=None, help="server logs and request records (default <out dir>/logs-<stem>)")
    o.add_argument("--render", metavar="JSON", help="re-draw the Markdown of a result JSON, exit")
    o.add_argument("--merge", metavar="JSON", nargs="+", help="write one record (--out, and its Markdown) of "
                   "these runs of one commit, SGLang and GPU, the summary over all their servers, exit")
    o.add_argument("--deadline-s", type=float, default=0.0, help="wall cap of the whole run; servers that do not "
                   "fit are skipped, the chaos of the last one is cut short (0: none)")
    o.add_argument("--reserve-s", type=float, default=30.0, help="seconds kept per server for drain/settle/stop")
    o.add_argument("--min-server-s", type=float, default=90.0, help="skip a server if less time than this is left")
    o.add_argument("--server-timeout", type=float, default=600.0, help="seconds to wait for /health")
    o.add_argument("--hang-s", type=float, default=60.0, help="a server whose /health fails this long during the "
                   "chaos (its process alive, no compiler running under it: a first-use JIT compile is waited for "
                   "and its time recorded) is recorded as crashed (hung) and the chaos stops")
    o.add_argument("--shutdown-grace", type=float, default=30.0, help="seconds after SIGTERM before SIGKILL")
    o.add_argument("--python", default=sys.executable, help="interpreter for the servers")
    o.add_argument("--stock-module", default=ab.STOCK_MODULE, help="launcher module of --arm stock/upstream")
    o.add_argument("--patched-module", default=ab.PATCHED_MODULE, help="launcher module of --arm staged/patched")
    o.add_argument("--entry-points", choices=("auto", "skip"), default="auto",
                   help="auto: write the plugin dist-infos into a temp dir on the servers' PYTHONPATH")
    o.add_argument("--host", default="127.0.0.1", help="loopback address the servers listen on")
    o.add_argument("--gpu-index", default=None, help="GPU for memory readings (default: first visible)")
    o.add_argument("--no-progress", action="store_true")
    return p


def check_args(args) -> None:
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"--host {args.host!r}: the soak runs on loopback only (127.0.0.1)")
    for name in ("rounds", "concurrency", "max_requests", "max_new_tokens", "baseline_tokens", "context_length"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not (0 <= args.bad_fraction and 0 <= args.lenient_fraction and args.bad_fraction + args.lenient_fraction < 1):
        raise ValueError("--bad-fraction and --lenient-fraction must be >= 0 and add up to less than 1")


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from eval import entry_points

    if args.merge:
        try:
            res = merge_runs([json.loads(Path(f).read_text()) for f in args.merge])
        except (OSError, ValueError) as e:
            print(f"python -m eval.soak: error: {e}", file=sys.stderr)
            return 2
        for path in write_outputs(res, Path(args.out)):
            log(f"wrote {path}")
        log("summary: " + json.dumps({k: res["summary"][k] for k in SUMMARY_KEYS}))
        return 0
    if args.render:
        res = json.loads(Path(args.render).read_text())
        md = Path(args.render).with_suffix(".md")
        md.write_text(render_markdown(res) + "\n")
        print(md)
        return 0
    try:
        check_args(args)
        plans = build_plans(args)
    except ValueError as e:
        print(f"python -m eval.soak: error: {e}", file=sys.stderr)
        return 2
    if args.warmup_requests < 0:
        args.warmup_requests = args.concurrency
    if args.gpu_index is None:
        args.gpu_index = (os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") or ["0"])[0] or "0"
    t_start = time.time()
    deadline = t_start + args.deadline_s if args.deadline_s > 0 else math.inf
    out = Path(args.out)
    logdir = Path(args.log_dir) if args.log_dir else out.parent / f"logs-{out.stem}"
    workdir = Path(tempfile.mkdtemp(prefix="replayssm-soak-"))
    pythonpath = [str(ROOT)]
    if args.entry_points == "auto":
        pythonpath.insert(0, str(entry_points.install(workdir / "entry-points", package=None,
                                                      eval_weights=args.random_weights)))
    atexit.register(ab._stop_all)
    base_env = dict(os.environ)
    res: Dict[str, Any] = {
        "schema": SCHEMA, "kind": "soak", "git_commit": ab.git_commit(), "sglang_version": ab.dist_version("sglang"),
        "sglang_replayssm_version": entry_points.package_version(), "gpu": ab.gpu_info(),
        "python": sys.version.split()[0], "host": socket.gethostname(),
        "env_inherited": ab.recorded_env(base_env),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "flags": {"argv": sys.argv[1:] if argv is None else list(argv), "harness": vars(args).copy()},
        "plan": [dict(asdict(p), label=label) for p, label in plans],
        "servers": [],
    }
    try:
        for i, (plan, label) in enumerate(plans):
            left = deadline - time.time()
            if left < args.min_server_s:
                res["servers"].append(finish_record({"label": label, "plan": asdict(plan), "status": "skipped",
                                                     "error": f"deadline: {left:.0f} s left", "crashed": False}))
                log(f"{label}: skipped ({left:.0f} s left)")
                continue
            res["servers"].append(soak_server(args, plan, label, i, workdir, logdir, base_env, pythonpath, deadline))
    finally:
        ab._stop_all()
    res["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res["wall_s"] = round(time.time() - t_start, 1)
    res["summary"] = summarize(res["servers"])
    for path in write_outputs(res, out):
        log(f"wrote {path}")
    log("summary: " + json.dumps({k: res["summary"][k] for k in SUMMARY_KEYS}))
    return 1 if any(s.get("status") == "error" for s in res["servers"]) else 0


def cli() -> int:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: (ab._stop_all(), sys.exit(130)))
    return main()


if __name__ == "__main__":
    sys.exit(cli())
