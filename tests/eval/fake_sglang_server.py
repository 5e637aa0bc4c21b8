"""A stand-in for ``python -m sglang.launch_server`` on a CPU (tests of eval/ab.py only).

Speaks the parts of SGLang's HTTP API the harness and ``sglang.bench_serving`` use:
``/health``, ``/v1/models``, ``/model_info``, ``/server_info``, ``/metrics``, ``/flush_cache``,
``/start_profile`` (writes a small synthetic GPU trace) and ``/generate`` (token-id input, greedy,
optional top-k logprobs, SSE streaming).  Tokens
are a deterministic function of the context, so two instances agree exactly;
``--fake-flip-at P`` swaps the top-2 tokens of prompt 0 at generated position P (a
near-tie when ``--fake-gap`` is small), to exercise the parity report.

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

        def _send(self, code, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
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
                        f'sglang:num_running_reqs{{model_name="m"}} 0.0\n'
                        f'sglang:generation_tokens_total{{model_name="m"}} {state.requests * 10.0}\n')
                return self._send(200, text, "text/plain")
            return self._send(404, {"error": path})

        def do_POST(self):
            n = int(self.headers.get("Content-Length", "0") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            path = self.path.split("?")[0]
            if path == "/flush_cache":
                return self._send(200, b"")
            if path == "/start_profile":
                write_trace(body, replay=bool(os.environ.get("SGLANG_REPLAYSSM_ENABLE")))
                return self._send(200, b"Start profiling.\n", "text/plain")
            if path != "/generate":
                return self._send(404, {"error": path})
            state.requests += 1
            ids = body.get("input_ids")
            single = ids and isinstance(ids[0], int)
            prompts = [ids] if single else ids
            sp = body.get("sampling_params", {})
            ntok = int(sp.get("max_new_tokens", 16))
            topk = int(body.get("top_logprobs_num", 0) or 0) if body.get("return_logprob") else 0
            if body.get("stream"):
                return self._stream(prompts[0], ntok, topk)
            results = []
            for i, p in enumerate(prompts):
                toks, otl, otop = generate(p, ntok, topk, state.flip_at, state.gap, flip=(i == 0))
                meta = {"id": f"r{i}", "prompt_tokens": len(p), "completion_tokens": ntok,
                        "finish_reason": {"type": "length"}}
                if body.get("return_logprob"):
                    meta["output_token_logprobs"] = otl
                    meta["output_top_logprobs"] = otop
                results.append({"text": " ".join(f"w{t}" for t in toks), "output_ids": toks, "meta_info": meta})
            return self._send(200, results[0] if single else results)

        def _stream(self, prompt, ntok, topk):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            toks, _, _ = generate(prompt, ntok, 0, -1, state.gap, flip=False)

            def chunk(s: str):
                b = s.encode()
                self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
                self.wfile.flush()

            for i in range(ntok):
                time.sleep(0.0005)
                d = {"text": " ".join(f"w{t}" for t in toks[: i + 1]), "output_ids": toks[: i + 1],
                     "meta_info": {"completion_tokens": i + 1, "prompt_tokens": len(prompt)}}
                chunk("data: " + json.dumps(d) + "\n\n")
            chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

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
