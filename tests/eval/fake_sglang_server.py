"""A stand-in for ``python -m sglang.launch_server`` on a CPU (tests of eval/ab/ only).

Speaks the parts of SGLang's HTTP API the harness and ``sglang.bench_serving`` use:
``/health``, ``/v1/models``, ``/model_info``, ``/server_info``, ``/metrics``, ``/flush_cache``,
``/start_profile`` (writes a small synthetic GPU trace), ``/generate`` (token-id input, greedy,
optional top-k logprobs, SSE streaming), ``/abort_request`` and OpenAI ``/v1/completions`` with
token prompts.  Tokens are a deterministic function of the context, so two instances agree exactly;
``--fake-flip-at P`` swaps the top-2 tokens of prompt 0 at generated position P (a
near-tie when ``--fake-gap`` is small), to exercise the parity report.

For the soak test (eval/soak.py): invalid requests get 400 as SGLang's validation answers them (token
ids outside [0, vocab) or not integers, wrong nesting, empty input, context overflow, bad sampling
parameters, malformed JSON); a request holds one "mamba slot" while it runs (``/metrics``
``sglang:mamba_used_tokens``), given back when it ends, is aborted or its client hangs up.  Faults on
demand: ``--fake-bad-status`` (answer invalid requests with that code), ``--fake-bad-drop`` (drop their
connection), ``--fake-drift-after N`` (greedy outputs change after N generate requests),
``--fake-die-after N`` (the process exits on the N-th), ``--fake-hang-after N`` (from the N-th on, no
request gets an answer, ``/health`` included), ``--fake-leak-aborts`` (each ``/abort_request``
and each stream its client cuts keeps a slot).

Accepts and ignores every other SGLang flag.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VOCAB = 1024
TOPN = 8
MAMBA_SLOTS = 256
SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "ignore_eos", "frequency_penalty",
                 "presence_penalty", "repetition_penalty", "min_new_tokens", "stop", "n"}


def _h(ctx) -> int:
    return zlib.crc32(",".join(map(str, ctx[-3:])).encode())


def candidates(ctx, gap: float):
    """Deterministic top list [(logprob, token)] for the next position."""
    h = _h(ctx)
    toks, seen = [], set()
    k = 0
    while len(toks) < TOPN:
        t = 3 + (h + 7919 * k) % (VOCAB - 3)
        k += 1
        if t not in seen:
            seen.add(t)
            toks.append(t)
    lps = [-0.05 - (h % 97) / 1000.0]
    lps.append(lps[0] - gap)
    for i in range(2, TOPN):
        lps.append(lps[-1] - 0.5)
    return list(zip(lps, toks))


def generate(prompt, n, topk, flip_at, gap, flip):
    ctx = list(prompt)
    out, otl, otop = [], [], []
    for pos in range(n):
        cand = candidates(ctx, gap)
        if flip and pos == flip_at:
            (l0, t0), (l1, t1) = cand[0], cand[1]
            cand[0], cand[1] = (l0, t1), (l1, t0)
        lp, tok = cand[0]
        out.append(tok)
        otl.append([lp, tok, None])
        otop.append([[l, t, None] for l, t in cand[:topk]] if topk else None)
        ctx.append(tok)
    return out, otl, otop


class State:
    model_path = ""
    flip_at = -1
    gap = 0.5
    started = 0.0
    startup_delay = 0.3
    requests = 0
    context_len = 4096
    bad_status = 400
    bad_drop = False
    drift_after = -1
    die_after = -1
    hang_after = -1
    hung = False
    leak_aborts = False

    def __init__(self):
        self.lock = threading.Lock()
        self.used = 0              # mamba slots held by running requests
        self.running = 0
        self.aborted = set()       # rids named by /abort_request

    def take(self) -> None:
        with self.lock:
            self.used += 1
            self.running += 1

    def give(self, aborted: bool) -> None:
        with self.lock:
            self.running -= 1
            if not (aborted and self.leak_aborts):
                self.used -= 1


def _ids_error(ids, context_len: int, max_new: int):
    """SGLang's answer to a token-id prompt (or batch of them), as a message, or None when it is valid."""
    if ids is None:
        return "Either text, input_ids or input_embeds should be provided."
    if not isinstance(ids, list):
        return f"input_ids must be list or null; got {type(ids).__name__}"
    if not ids:
        return "input_ids cannot be empty."
    rows = ids if isinstance(ids[0], list) else [ids]
    for row in rows:
        if not isinstance(row, list) or not row:
            return "each prompt must be a non-empty list of token ids"
        for t in row:
            if type(t) is not int:
                return f"token ids must be integers; got {type(t).__name__}"
            if not 0 <= t < VOCAB:
                return f"token id {t} is outside [0, {VOCAB})"
        if len(row) + max(0, max_new) > context_len:
            return f"The input ({len(row)} tokens) is longer than the model's context length ({context_len} tokens)."
    return None


def _sampling_error(sp) -> str:
    if not isinstance(sp, dict):
        return "sampling_params must be an object"
    unknown = set(sp) - SAMPLING_KEYS
    if unknown:
        return f"unknown sampling parameter(s) {sorted(unknown)}"
    try:
        if int(sp.get("max_new_tokens", 16)) < 0:
            return "max_new_tokens must be at least 0"
        if float(sp.get("temperature", 1.0)) < 0:
            return "temperature must be non-negative"
        if not 0.0 < float(sp.get("top_p", 1.0)) <= 1.0:
            return "top_p must be in (0, 1]"
    except (TypeError, ValueError):
        return "sampling parameters must be numbers"
    return ""


# GPU kernels of one traced forward step: (name, category, microseconds), ending with the greedy sampler's argmax
# as SGLang's steps do; the stand-in for the replay arm swaps the SSM update for a replay kernel of a third of its
# time.  Step PREFILL_STEP (of a window of more than that many) also runs PREFILL_KERNEL, a chunked-scan prefill.
STEP_KERNELS = (("nvjet_tst_128x64_gemm", "kernel", 200.0), ("_selective_scan_update_kernel", "kernel", 90.0),
                ("_causal_conv1d_update_kernel", "kernel", 12.0), ("BatchDecodeWithPagedKVCacheKernel", "kernel", 30.0),
                ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 3.0),
                ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>",
                 "kernel", 4.0))
PREFILL_KERNEL, PREFILL_STEP = ("_chunk_scan_fwd_kernel", "kernel", 400.0), 2


def write_trace(req: dict, replay: bool) -> str:
    """A Chrome trace of req["num_steps"] steps of STEP_KERNELS under req["output_dir"], named as SGLang
    names it; 20 us of idle GPU between steps."""
    import gzip

    steps = int(req.get("num_steps") or 1)
    events, ts = [], 1000.0
    for i in range(steps):
        for name, cat, dur in ((PREFILL_KERNEL,) if i == PREFILL_STEP else ()) + STEP_KERNELS:
            if replay and name.startswith("_selective"):
                name, dur = "_mamba2_replay_kernel", dur / 3
            events.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7})
            ts += dur
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": ts, "dur": 5.0, "pid": 1, "tid": 1})
        ts += 20.0
    os.makedirs(req["output_dir"], exist_ok=True)
    path = os.path.join(req["output_dir"], f"{time.time():.3f}-TP-0.trace.json.gz")
    with gzip.open(path + ".tmp", "wt") as f:
        json.dump({"traceEvents": events}, f)
    os.replace(path + ".tmp", path)
    return path


def make_handler(state: State):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def handle(self):
            try:
                super().handle()
            except (ConnectionResetError, BrokenPipeError):  # a client that hung up (the soak test's cut streams)
                self.close_connection = True

        def _send(self, code, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if state.hung:
                self._hang()
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                ok = time.time() - state.started > state.startup_delay
                return self._send(200 if ok else 503, b"")
            if path == "/v1/models":
                return self._send(200, {"data": [{"id": state.model_path}]})
            if path == "/model_info":
                return self._send(200, {"model_path": state.model_path, "tokenizer_path": state.model_path})
            if path in ("/server_info", "/get_server_info"):
                return self._send(200, {
                    "version": "fake-0.0", "model_path": state.model_path, "attention_backend": "fake",
                    "max_total_num_tokens": 65536,
                    "internal_states": [{"effective_max_running_requests_per_dp": 48, "last_gen_throughput": 1.0,
                                         "memory_usage": {"weight": 0.01, "kvcache": 0.5, "token_capacity": 65536}}],
                })
            if path == "/metrics":
                text = ("# HELP sglang:num_running_reqs x\n"
                        f'sglang:num_running_reqs{{model_name="m"}} {float(state.running)}\n'
                        f'sglang:num_queue_reqs{{model_name="m"}} 0.0\n'
                        f'sglang:mamba_used_tokens{{model_name="m"}} {float(state.used)}\n'
                        f'sglang:mamba_available_tokens{{model_name="m"}} {float(MAMBA_SLOTS - state.used)}\n'
                        f'sglang:generation_tokens_total{{model_name="m"}} {state.requests * 10.0}\n')
                return self._send(200, text, "text/plain")
            return self._send(404, {"error": path})

        def _bad(self, message: str):
            """An invalid request: 400 as SGLang answers it, or the fault asked for."""
            if state.bad_drop:
                self.close_connection = True
                try:
                    self.connection.shutdown(2)
                except OSError:
                    pass
                return None
            return self._send(state.bad_status, {"error": {"message": message}})

        def do_POST(self):
            if state.hung:
                self._hang()
            n = int(self.headers.get("Content-Length", "0") or 0)
            raw = self.rfile.read(n)
            path = self.path.split("?")[0]
            try:
                body = json.loads(raw or b"{}")
            except ValueError as e:
                return self._bad(f"JSON decode error: {e}")
            if not isinstance(body, dict):
                return self._bad("the request body must be a JSON object")
            if path == "/abort_request":
                with state.lock:
                    state.aborted.add(body.get("rid"))
                    if state.leak_aborts:  # the abort path forgets a slot, whether or not the request still ran
                        state.used += 1
                return self._send(200, b"")
            if path == "/v1/completions":
                return self._completions(body)
            if path == "/flush_cache":
                return self._send(200, b"")
            if path == "/start_profile":
                write_trace(body, replay=bool(os.environ.get("SGLANG_REPLAYSSM_ENABLE")))
                return self._send(200, b"Start profiling.\n", "text/plain")
            if path != "/generate":
                return self._send(404, {"error": path})
            sp = body.get("sampling_params", {})
            err = _sampling_error(sp) or _ids_error(body.get("input_ids"), state.context_len,
                                                    int(sp.get("max_new_tokens", 16)))
            if err:
                return self._bad(err)
            self._count()
            ids = body.get("input_ids")
            single = isinstance(ids[0], int)
            prompts = [ids] if single else ids
            ntok = int(sp.get("max_new_tokens", 16))
            topk = int(body.get("top_logprobs_num", 0) or 0) if body.get("return_logprob") else 0
            if body.get("stream"):
                return self._stream(self._drifted(prompts[0]), ntok, topk, rid=body.get("rid"))
            results = []
            for i, p in enumerate(prompts):
                toks, otl, otop = generate(self._drifted(p), ntok, topk, state.flip_at, state.gap, flip=(i == 0))
                meta = {"id": f"r{i}", "prompt_tokens": len(p), "completion_tokens": ntok,
                        "finish_reason": {"type": "length"}}
                if body.get("return_logprob"):
                    meta["output_token_logprobs"] = otl
                    meta["output_top_logprobs"] = otop
                results.append({"text": " ".join(f"w{t}" for t in toks), "output_ids": toks, "meta_info": meta})
            return self._send(200, results[0] if single else results)

        def _count(self):
            with state.lock:
                state.requests += 1
                n = state.requests
            if state.die_after >= 0 and n >= state.die_after:
                print(f"fake server: dying on generate request {n} as asked", flush=True)
                os._exit(17)
            if state.hang_after >= 0 and n >= state.hang_after:
                if not state.hung:
                    print(f"fake server: hanging from generate request {n} on, as asked", flush=True)
                state.hung = True
                self._hang()

        def _hang(self):
            while True:  # until the process is stopped
                time.sleep(1.0)

        def _drifted(self, prompt):
            """After --fake-drift-after requests the server answers as if the prompt had one more token."""
            return list(prompt) + [5] if 0 <= state.drift_after < state.requests else prompt

        def _stream(self, prompt, ntok, topk, rid=None, event=None):
            """SSE: one event per token (``event(i, toks)`` builds it; SGLang's /generate shape by default).
            An aborted request ends with finish_reason abort; a client that hangs up frees its slot."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            toks, _, _ = generate(prompt, ntok, 0, -1, state.gap, flip=False)
            event = event or (lambda i, fin: {"text": " ".join(f"w{t}" for t in toks[: i + 1]),
                                              "output_ids": toks[: i + 1],
                                              "meta_info": {"completion_tokens": i + 1, "prompt_tokens": len(prompt),
                                                            **({"finish_reason": fin} if fin else {})}})

            def chunk(s: str):
                b = s.encode()
                self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
                self.wfile.flush()

            state.take()
            aborted = False
            try:
                for i in range(ntok):
                    time.sleep(0.0005)
                    if rid is not None and rid in state.aborted:
                        aborted = True
                        chunk("data: " + json.dumps(event(i, {"type": "abort"})) + "\n\n")
                        break
                    chunk("data: " + json.dumps(event(i, None)) + "\n\n")
                chunk("data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:  # the client hung up mid-stream
                aborted = True
                self.close_connection = True
            finally:
                state.give(aborted)

        def _completions(self, body):
            """OpenAI /v1/completions with a token-id prompt (or a batch of them)."""
            ntok = body.get("max_tokens", 16)
            sp = {k: body[k] for k in ("temperature", "top_p") if k in body}
            if not isinstance(ntok, int) or isinstance(ntok, bool):
                return self._bad("max_tokens must be an integer")
            err = _sampling_error(dict(sp, max_new_tokens=ntok)) or _ids_error(body.get("prompt"), state.context_len,
                                                                             ntok)
            if err:
                return self._bad(err)
            self._count()
            prompt = body["prompt"]
            prompts = [prompt] if isinstance(prompt[0], int) else prompt
            if body.get("stream"):
                return self._stream(self._drifted(prompts[0]), ntok, 0, event=lambda i, fin: {
                    "id": "cmpl-fake", "object": "text_completion",
                    "choices": [{"index": 0, "text": " w", "finish_reason": fin and fin["type"]}]})
            choices = []
            for i, p in enumerate(prompts):
                toks, _, _ = generate(self._drifted(p), ntok, 0, -1, state.gap, flip=False)
                choices.append({"index": i, "text": " ".join(f"w{t}" for t in toks), "finish_reason": "length"})
            return self._send(200, {"id": "cmpl-fake", "object": "text_completion", "model": state.model_path,
                                    "choices": choices, "usage": {"prompt_tokens": sum(map(len, prompts)),
                                                                  "completion_tokens": ntok * len(prompts)}})

    return H


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--fake-flip-at", type=int, default=-1)
    p.add_argument("--fake-gap", type=float, default=0.5)
    p.add_argument("--fake-crash", action="store_true", help="exit before becoming healthy")
    p.add_argument("--fake-replayssm", action="store_true",
                   help="log the plugin's activation line as sglang_replayssm.launch_server would")
    p.add_argument("--fake-seams", choices=("auto", "on", "off"), default="auto",
                   help="the seams state that line reports (auto: --replayssm-staged, default true)")
    p.add_argument("--replayssm-staged", default="true")
    p.add_argument("--context-length", type=int, default=4096)
    p.add_argument("--fake-bad-status", type=int, default=400, help="HTTP status for invalid requests")
    p.add_argument("--fake-bad-drop", action="store_true", help="drop the connection of invalid requests")
    p.add_argument("--fake-drift-after", type=int, default=-1, help="greedy outputs change after N requests")
    p.add_argument("--fake-die-after", type=int, default=-1, help="exit on the N-th generate request")
    p.add_argument("--fake-hang-after", type=int, default=-1, help="stop answering from the N-th generate request")
    p.add_argument("--fake-leak-aborts", action="store_true", help="each abort and each cut stream keeps a slot")
    a, _unknown = p.parse_known_args(argv)
    print("fake sglang server:", " ".join(sys.argv[1:]), flush=True)
    if a.fake_crash:
        print("fake server: crashing as asked", flush=True)
        return 3
    if os.environ.get("REPLAYSSM_EVAL_RANDOM_WEIGHTS") == "1":
        print("replayssm-eval: scaled random weights (fake server)", flush=True)
    if os.environ.get("SGLANG_REPLAYSSM_ENABLE"):
        print("sglang_replayssm active (fake server)", flush=True)
    if a.fake_replayssm:
        seams = {"on": True, "off": False}.get(a.fake_seams, a.replayssm_staged.lower() in ("1", "true", "yes", "on"))
        print(f"sglang_replayssm active (pid {os.getpid()}): L=16, ssm_types=mamba2,gdn, spec=True, "
              f"staged={seams}, kernel config (fake), 1 patch(es) verified", flush=True)
    st = State()
    st.model_path, st.flip_at, st.gap, st.started = a.model_path, a.fake_flip_at, a.fake_gap, time.time()
    st.context_len, st.bad_status, st.bad_drop = a.context_length, a.fake_bad_status, a.fake_bad_drop
    st.drift_after, st.die_after, st.leak_aborts = a.fake_drift_after, a.fake_die_after, a.fake_leak_aborts
    st.hang_after = a.fake_hang_after
    srv = ThreadingHTTPServer((a.host, a.port), make_handler(st))
    srv.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown, daemon=True).start())
    try:
        srv.serve_forever(poll_interval=0.1)
    finally:
        srv.server_close()
        print("fake server: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
