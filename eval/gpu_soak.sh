#!/usr/bin/env bash
# Soak test on a GPU host (python -m eval.soak) in one call: one server at a time (our launcher's defaults,
# eval.ab's server flags, dummy + scaled random weights) under a bounded chaos client.
# Usage (repo root; SGLang installed, or the offline bundle in .sglang-bundle/):
#   GIT_COMMIT=<sha> OUT=<dir> bash eval/gpu_soak.sh [more python -m eval.soak flags...]
# Knobs (environment):
#   OUT=<dir>          soak-h200.json / soak-h200.md and soak-logs.tgz (server logs, per-request records,
#                      console) go here (default eval/results), and the warm JIT caches (eval/jit_cache.sh; JIT=0: not)
#   SOAK_PLAN="..."    servers in order, MODEL:SPEC:MINUTES each, space-separated (default below)
#   SOAK_DEADLINE_S=N  wall cap of the harness in seconds (default 480): a server that no longer fits is skipped
#                      and recorded as such, the chaos of the last one is cut short
#   PYTHON=<python>    interpreter for the harness and the servers (default python3)
# Default plan: each server's chaos long enough for 2000 requests at the request rates and start times recorded in
# eval/results/soak-h200-runs/README.md (--max-requests ends it sooner); with cold Triton caches it needs two calls
# (below).
# With cold Triton caches (the first call after a kernel change: Nemotron-H-8B took 178 s to start) it does not
# fit one call: split the plan over two calls (SOAK_PLAN), then merge the two records of the same commit:
#   python -m eval.soak --merge a/soak-h200.json b/soak-h200.json --out eval/results/soak-h200.json
set -uo pipefail
OUT="${OUT:-eval/results}"
mkdir -p "$OUT"
# the HTTP server needs the bundle's HTTP extras (jsonschema, fastapi, ...), not only sglang
if [ -f .sglang-bundle/bootstrap.sh ] && ! "${PYTHON:-python3}" -c "import sglang, jsonschema, fastapi, aiohttp" 2>/dev/null; then
  bash eval/jit_cache.sh restore  # carried warm caches (.sglang-bundle/jitcache/*.txz)
  SGLANG_BUNDLE_HTTP=1 source .sglang-bundle/bootstrap.sh
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export GIT_COMMIT="${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
PY="${PYTHON:-python3}"
PLAN="${SOAK_PLAN:-nemotron-h-8b:none:1.7 tiny-nemotron-h:none:0.6 tiny-nemotron-h:nextn:1.0 tiny-qwen3-next:nextn:1.3}"
plans=()
for p in $PLAN; do plans+=(--plan "$p"); done
LOGS="$(mktemp -d /tmp/soak-logs.XXXXXX)"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader || true
# FlashInfer's autotune: part of every cold server start, and the soak measures no speed
"$PY" -m eval.soak "${plans[@]}" --server-arg=--disable-flashinfer-autotune --deadline-s "${SOAK_DEADLINE_S:-480}" --server-timeout "${SOAK_SERVER_TIMEOUT:-420}" \
  --out "$OUT/soak-h200.json" --log-dir "$LOGS" --python "$PY" --no-progress "$@" 2>&1 | tee "$LOGS/soak-console.log"
rc=${PIPESTATUS[0]}
tar -C "$LOGS" -czf "$OUT/soak-logs.tgz" . && echo "packed $(du -h "$OUT/soak-logs.tgz" | cut -f1) -> $OUT/soak-logs.tgz"
[ "${JIT:-1}" = 1 ] && bash eval/jit_cache.sh save "$OUT"  # JIT=0: no cache tarballs
exit "$rc"
