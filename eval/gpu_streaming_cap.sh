#!/usr/bin/env bash
# Streaming-cap diagnosis on a GPU host (python -m eval.streaming_cap, issue 24) in one call: one server at a
# time (eval.ab's server flags, dummy + scaled random weights), bench_serving at batch 256 while the CPU of the
# server's processes (tokenizer manager + HTTP, scheduler, detokenizer) and of the bench client is sampled.
# Usage (repo root; SGLang installed, or the offline bundle in .sglang-bundle/):
#   GIT_COMMIT=<sha> OUT=<dir> bash eval/gpu_streaming_cap.sh [more python -m eval.streaming_cap flags...]
# Knobs (environment):
#   OUT=<dir>            streaming-cap-<model>.json / .md and streaming-cap-logs.tgz (server and bench logs,
#                        console) go here (default eval/results), and the warm JIT caches (eval/jit_cache.sh
#                        save: jit-*.txz, for .sglang-bundle/jitcache/; JIT=0: not); at most 6 files
#   CAP_MODEL=<name>     geometry (default tiny-nemotron-h: it decodes far above the cap, so it shows it best)
#   CAP_OUTPUT_LEN=N     output tokens per request (default 512; SGLang's non-incremental stream resends the whole
#                        output so far in every event, so the per-token cost grows with it: 1024 is the issue's
#                        workload, at about twice the bench time)
#   CAP_DEADLINE_S=N     wall cap of the harness in seconds (default 430): a server that no longer fits is skipped
#                        and recorded, stream intervals 2 and 4 run only while the servers still to come fit
#   PYTHON=<python>      interpreter for the harness and the servers (default python3)
# Default plan, in order: stock and staged at stream intervals 1 and 8 (2 and 4 only while 80 s stay kept for each
# server still to come), then staged --incremental-streaming-output (1, 8), stock --incremental-streaming-output
# (1, 8), staged --tokenizer-worker-num 2 (1, 8).  Wall estimate: bootstrap ~30 s; first server ~60 s to start
# with warm JIT caches (+~150 s cold), later ones ~55 s; per server a warm-up (~3 s) and ~20-30 s of runs at batch
# 256 x 512 tokens: stock + staged + the first variant fit 430 s cold, all five warm; at most ~8.5 min in all
# (a run in flight at the deadline is cut to what is left; stopping a server takes up to ~25 s).
set -uo pipefail
OUT="${OUT:-eval/results}"
mkdir -p "$OUT"
# the HTTP server needs the bundle's HTTP extras (jsonschema, fastapi, ...), not only sglang
if [ -f .sglang-bundle/bootstrap.sh ] && ! "${PYTHON:-python3}" -c "import sglang, jsonschema, fastapi, aiohttp, psutil" 2>/dev/null; then
  bash eval/jit_cache.sh restore  # carried warm caches (.sglang-bundle/jitcache/*.txz)
  SGLANG_BUNDLE_HTTP=1 source .sglang-bundle/bootstrap.sh
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export GIT_COMMIT="${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
PY="${PYTHON:-python3}"
LOGS="$(mktemp -d /tmp/streaming-cap-logs.XXXXXX)"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader || true
echo "host: $(nproc) CPUs, $(uptime)"
"$PY" -m eval.streaming_cap --model "${CAP_MODEL:-tiny-nemotron-h}" --arms stock,staged \
  --intervals 1,8 --extra-intervals 2,4 --variant-intervals 1,8 \
  --variant 'staged+incremental=staged:--incremental-streaming-output' \
  --variant 'stock+incremental=stock:--incremental-streaming-output' \
  --variant 'staged+tokenizer-workers-2=staged:--tokenizer-worker-num 2' \
  --batch 256 --input-len 256 --output-len "${CAP_OUTPUT_LEN:-512}" \
  --deadline-s "${CAP_DEADLINE_S:-430}" --est-server-s 80 --server-timeout 360 --bench-timeout 150 \
  --out-dir "$OUT" --log-dir "$LOGS" --python "$PY" "$@" 2>&1 | tee "$LOGS/streaming-cap-console.log"
rc=${PIPESTATUS[0]}
tar -C "$LOGS" -czf "$OUT/streaming-cap-logs.tgz" . && echo "packed $(du -h "$OUT/streaming-cap-logs.tgz" | cut -f1) -> $OUT/streaming-cap-logs.tgz"
case " $* " in *" --dry-run "*) JIT=0 ;; esac  # a dry run starts no server: no caches to return
[ "${JIT:-1}" = 1 ] && bash eval/jit_cache.sh save "$OUT"  # the warm JIT caches (JIT=0: not)
ls -la "$OUT"
exit "$rc"
