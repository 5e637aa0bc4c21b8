#!/usr/bin/env bash
# A/B harness on a GPU host: stock SGLang vs sglang_replayssm (python -m eval.ab).
# Usage (repo root; SGLang installed, or the offline bundle in .sglang-bundle/):
#   GIT_COMMIT=<sha> bash eval/gpu_ab.sh [python -m eval.ab flags...]      # -> eval/results/
# Knobs (environment):
#   OUT=<dir>       where results go (default eval/results)
#   PACK=1          write results + logs to a temp dir, then pack them as $OUT/ab-results.tgz
#                   (for hosts that return few files)
#   PYTHON=<python> interpreter for the harness, the servers and bench_serving (default python3)
#   JIT=0           no JIT cache tarballs; by default the run ends with eval/jit_cache.sh save $OUT (jit-*.txz:
#                   every server's caches, copy them to .sglang-bundle/jitcache/ for warm starts next time)
#   CALL_S=<s>      the wall limit of the device call this runs in (seconds from this script's start): eval.ab is
#                   stopped TAIL_S (default 45) seconds before it, leaving time to pack; its --deadline-s defaults
#                   to 30 s (a quarter of its time, if less) before the stop (a --deadline-s given wins); a run
#                   stopped before it wrote its results is finished from its partial record
#                   (python -m eval.ab --finish); with JIT=1 the caches are also saved right after the first
#                   server is up (--save-jitcache $OUT), so a cut call returns them;
#                   the partial record is also kept as ab-*-partial-kept.json: a later call's
#                   bash eval/gpu_ab.sh --resume <that file> runs the servers it had not finished and writes the run
# The plugin entry points are written by the harness itself (no pip install needed).
set -uo pipefail
OUT="${OUT:-eval/results}"
mkdir -p "$OUT"
if [ -f .sglang-bundle/bootstrap.sh ] && ! "${PYTHON:-python3}" -c "import sglang" 2>/dev/null; then
  bash eval/jit_cache.sh restore  # carried warm caches (.sglang-bundle/jitcache/*.txz)
  SGLANG_BUNDLE_HTTP=1 source .sglang-bundle/bootstrap.sh
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export GIT_COMMIT="${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
RESULTS="$OUT"
[ "${PACK:-0}" = 1 ] && RESULTS="$(mktemp -d /tmp/ab-results.XXXXXX)"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader || true
PY="${PYTHON:-python3}"
extra=() stop=()
if [ -n "${CALL_S:-}" ]; then
  for v in CALL_S TAIL_S; do
    if ! [[ "${!v:-45}" =~ ^[0-9]+$ ]]; then echo "$v must be a whole number of seconds, got '${!v}'" >&2; exit 2; fi
  done
  left=$((10#$CALL_S - SECONDS - 10#${TAIL_S:-45}))
  if [ "$left" -lt 8 ]; then
    echo "CALL_S=$CALL_S leaves ${left}s for eval.ab (TAIL_S ${TAIL_S:-45}): too little" >&2
    exit 2
  fi
  stop=(timeout -k 15 -s INT "$left")  # SIGINT: eval.ab stops its servers and keeps its partial record
  margin=$((left / 4 < 30 ? left / 4 : 30))
  case " $* " in *" --deadline-s "*|*" --deadline-s="*) ;; *) extra+=(--deadline-s $((left - margin))) ;; esac
  case " $* " in *" --dry-run "*) ;; *) [ "${JIT:-1}" = 1 ] && extra+=(--save-jitcache "$OUT") ;; esac
fi
"${stop[@]}" "$PY" -m eval.ab --out-dir "$RESULTS" --python "$PY" "${extra[@]}" "$@" 2>&1 | tee "$RESULTS/ab-console.log"
rc=${PIPESTATUS[0]}
dirs=("$RESULTS") prev=""
for a in "$@"; do  # an --out-dir given to eval.ab wins over $RESULTS
  [ "$prev" = --out-dir ] && dirs+=("$a")
  case "$a" in --out-dir=*) dirs+=("${a#--out-dir=}") ;; esac
  prev="$a"
done
for d in "${dirs[@]}"; do
  for partial in "$d"/ab-*-partial.json; do  # stopped before it wrote its results: write them from the record
    [ -f "$partial" ] || continue
    cp "$partial" "${partial%-partial.json}-partial-kept.json"  # for a later call's python -m eval.ab --resume
    if "$PY" -m eval.ab --finish "$partial" 2>&1 | tee -a "$RESULTS/ab-console.log" && [ "${PIPESTATUS[0]}" = 0 ]; then
      echo "gpu_ab: the run was stopped (rc $rc); its results were written from $partial" \
        | tee -a "$RESULTS/ab-console.log"
      [ "$rc" = 0 ] || rc=1  # results of the servers it finished: a partial run, not a timed-out call
    fi
  done
done
if [ "${PACK:-0}" = 1 ]; then
  tar -C "$RESULTS" -czf "$OUT/ab-results.tgz" . && echo "packed $(du -h "$OUT/ab-results.tgz" | cut -f1) -> $OUT/ab-results.tgz"
  cp "$RESULTS"/ab-*.md "$OUT"/ 2>/dev/null || true
fi
case " $* " in *" --dry-run "*) JIT=0 ;; esac  # a dry run starts no server: no caches to return
[ "${JIT:-1}" = 1 ] && bash eval/jit_cache.sh save "$OUT"  # the warm JIT caches (JIT=0: not)
exit "$rc"
