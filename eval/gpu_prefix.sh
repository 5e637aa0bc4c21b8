#!/usr/bin/env bash
# Prefix caching on a GPU host in one call (issue 19): stock SGLang vs our launcher, both on their defaults (no radix
# flag: SGLang's extra_buffer strategy, overlap scheduler on, CUDA graphs on), on bench_serving's generated-shared-prefix dataset
# (python -m eval.ab --workload shared-prefix): cache hit rate from each server's Prefill batch lines, TTFT p50/p99,
# output tok/s, SGLang's decode rate, and greedy parity on prompts that share prefixes (hit vs cold per server).
# Usage (repo root; SGLang installed, or the offline bundle in .sglang-bundle/):
#   GIT_COMMIT=<sha> OUT=<dir> bash eval/gpu_prefix.sh [more python -m eval.ab flags for both runs...]
#   bash eval/gpu_prefix.sh --spec nextn     # the same under NEXTN speculation (extra_buffer tracked at the commit)
#   bash eval/gpu_prefix.sh --dry-run        # print both runs' plans and command lines, start nothing
# Writes $OUT/prefix-<model>.tgz per run (result JSON/MD/PNG, server and bench logs, console) and the warm JIT
# caches ($OUT/jit-triton.txz, $OUT/jit-other.txz; JIT=0: not): at most 4 files.
# Knobs (environment): PREFIX_MODELS (default "tiny-nemotron-h tiny-qwen3-next"), PREFIX_DEADLINE_S (wall cap
# of each run; default 220 with carried JIT caches, 330 without them, for the servers' cold starts), PYTHON
# (default python3). Under --spec no non-speculative reference server is started
# (--no-spec-parity): the parity here is a prefix hit against a cold cache on each server.
# Wall estimate with warm caches: per tiny-model run both servers start together (--concurrent-start, ~60 s;
# a real-size model's servers start one after another, ~75 s each warm, ~230 s cold), then each is measured alone: 256 shared-prefix prompts x 256 tokens at concurrency 64 and 8 parity prompts x 256 tokens sent
# three times (~30 s a server); ~2.5 min a run, ~6 min for both plus the bootstrap, under 9 min.
set -uo pipefail
OUT="${OUT:-/tmp/replayssm-prefix}"
PY="${PYTHON:-python3}"
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
mkdir -p "$OUT"
if [ "$DRY" = 0 ]; then
  # the HTTP server needs the bundle's HTTP extras (jsonschema, fastapi, ...), not only sglang
  if [ -f .sglang-bundle/bootstrap.sh ] && ! "$PY" -c "import sglang, jsonschema, fastapi, aiohttp" 2>/dev/null; then
    bash eval/jit_cache.sh restore  # carried warm caches (.sglang-bundle/jitcache/*.txz)
    SGLANG_BUNDLE_HTTP=1 source .sglang-bundle/bootstrap.sh
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader || true
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export GIT_COMMIT="${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
deadline="${PREFIX_DEADLINE_S:-}"
if [ -z "$deadline" ]; then
  deadline=220
  if ! ls .sglang-bundle/jitcache/*.txz >/dev/null 2>&1; then
    deadline=330
    echo "gpu_prefix.sh: no JIT caches carried (.sglang-bundle/jitcache/*.txz): cold starts, deadline ${deadline} s a run"
  fi
fi
rc=0
for model in ${PREFIX_MODELS:-tiny-nemotron-h tiny-qwen3-next}; do
  d="$(mktemp -d "/tmp/prefix-$model.XXXXXX")"
  flags=(--model "$model" --workload shared-prefix --radix-cache default --cuda-graph on --batch 64
         --parity-tokens 256 --no-spec-parity --deadline-s "$deadline" --out-dir "$d" --no-progress)
  # one server's default --mem-fraction-static leaves a real-size model's next server no room: tiny models only
  case "$model" in tiny-*) flags+=(--concurrent-start) ;; esac
  echo "== $model: $PY -m eval.ab ${flags[*]} $*"
  if [ "$DRY" = 1 ]; then
    "$PY" -m eval.ab "${flags[@]}" "$@" --dry-run || rc=$?
    rm -rf "$d"
    continue
  fi
  "$PY" -m eval.ab "${flags[@]}" "$@" >"$d/ab-console.log" 2>&1
  r=$?
  echo "== $model exit $r"; tail -25 "$d/ab-console.log"
  [ "$r" = 0 ] || rc=$r
  tar -C "$d" -czf "$OUT/prefix-$model.tgz" . && echo "packed $(du -h "$OUT/prefix-$model.tgz" | cut -f1) -> $OUT/prefix-$model.tgz"
done
[ "$DRY" = 0 ] && [ "${JIT:-1}" = 1 ] && bash eval/jit_cache.sh save "$OUT"  # JIT=0: no cache tarballs
exit "$rc"
