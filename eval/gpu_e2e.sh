#!/usr/bin/env bash
# One GPU-host call for several end-to-end A/B runs side by side (tiny models share one GPU),
# then the JIT caches as tarballs for warm starts.
# Usage (repo root on the GPU host, offline SGLang bundle carried in .sglang-bundle/):
#   GIT_COMMIT=<sha> OUT=<dir> bash eval/gpu_e2e.sh "<eval.ab flags of run 1>" ["<flags of run 2>" ...]
# Each run i writes its results and logs, packed, to $OUT/ab-run<i>.tgz (unpack into eval/results/);
# JIT=0 skips $OUT/jit-triton.txz and $OUT/jit-other.txz (copy them to .sglang-bundle/jitcache/).
# Give each run its own --deadline-s and size the pools so that every server fits at once.
set -uo pipefail
OUT="${OUT:-/tmp/replayssm-e2e}"
mkdir -p "$OUT"
# the HTTP server needs the bundle's HTTP extras (jsonschema, fastapi, ...), not only sglang
if [ -f .sglang-bundle/bootstrap.sh ] && ! python3 -c "import sglang, jsonschema, fastapi" 2>/dev/null; then
  bash eval/jit_cache.sh restore  # carried warm caches (.sglang-bundle/jitcache/*.txz)
  SGLANG_BUNDLE_HTTP=1 source .sglang-bundle/bootstrap.sh
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export GIT_COMMIT="${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader || true
pids=() dirs=()
i=0
for flags in "$@"; do
  i=$((i + 1))
  d="$(mktemp -d "/tmp/ab-run$i.XXXXXX")"
  dirs+=("$d")
  # shellcheck disable=SC2086  # the flags of one run are shell-split on purpose
  eval "python3 -m eval.ab --out-dir '$d' --no-progress $flags" >"$d/ab-console.log" 2>&1 &
  pids+=($!)
  echo "run $i (pid $!): python3 -m eval.ab $flags"
  sleep 2  # distinct free ports
done
rc=0
for j in "${!pids[@]}"; do
  wait "${pids[$j]}"; r=$?
  echo "== run $((j + 1)) exit $r"; tail -25 "${dirs[$j]}/ab-console.log"
  [ "$r" = 0 ] || rc=$r
  tar -C "${dirs[$j]}" -czf "$OUT/ab-run$((j + 1)).tgz" .
done
if [ "${JIT:-1}" = 1 ] && [ -n "${SGLANG_CACHE_ROOT:-}" ] && [ -d "$SGLANG_CACHE_ROOT" ]; then
  bash eval/jit_cache.sh save "$OUT"  # without Triton's text IRs, xz (eval/jit_cache.sh)
fi
exit "$rc"
