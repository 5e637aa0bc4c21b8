#!/usr/bin/env bash
# `make test`: TEST_JOBS pytest processes side by side on the CPU, shard i running every TEST_JOBS-th collected
# test from the i-th (REPLAYSSM_TEST_SHARD=i/n, REPLAYSSM_TEST_SHARD_ORDER=stride; tests/conftest.py). Shard 0
# prints as it goes, the others' output follows when they end. Fails when any shard fails; a shard that
# collected nothing (exit 5: a -k filter that leaves it no test) fails only if every shard collected nothing.
# Usage: PY=<python> TEST_JOBS=<n> bash tests/run_shards.sh [pytest args]
set -uo pipefail
PY="${PY:-python3}"
jobs="${TEST_JOBS:-2}"
if ! [[ "$jobs" =~ ^[0-9]+$ ]] || [ "$jobs" -lt 1 ]; then
  echo "TEST_JOBS must be a positive whole number, got '$jobs'" >&2
  exit 2
fi
if [ "$jobs" -eq 1 ]; then
  exec "$PY" -m pytest -q "$@"
fi
# the CPU cores shared out: torch / BLAS threads per shard (unless set), so that the shards do not oversubscribe
threads=$(( $(nproc 2>/dev/null || echo "$jobs") / jobs ))
[ "$threads" -ge 1 ] || threads=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-$threads}" \
  MKL_NUM_THREADS="${MKL_NUM_THREADS:-$threads}"
L="$(mktemp -d /tmp/replayssm-test-shards.XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$L"' EXIT
pids=()
for ((i = 1; i < jobs; i++)); do
  REPLAYSSM_TEST_SHARD="$i/$jobs" REPLAYSSM_TEST_SHARD_ORDER=stride \
    "$PY" -m pytest -q -p no:cacheprovider "$@" >"$L/shard-$i.log" 2>&1 &
  pids+=("$!")
done
echo "== shard 0/$jobs (shards 1..$((jobs - 1)) run beside it, their output follows; $OMP_NUM_THREADS CPU thread(s) each)"
REPLAYSSM_TEST_SHARD="0/$jobs" REPLAYSSM_TEST_SHARD_ORDER=stride "$PY" -m pytest -q "$@"
rcs=("$?")
for ((i = 1; i < jobs; i++)); do
  wait "${pids[i - 1]}"
  rcs+=("$?")
  echo "== shard $i/$jobs"
  cat "$L/shard-$i.log"
done
rc=0 empty=0
for r in "${rcs[@]}"; do
  case "$r" in
    0) ;;
    5) empty=$((empty + 1)) ;;
    *) rc="$r" ;;
  esac
done
[ "$rc" = 0 ] && [ "$empty" = "$jobs" ] && rc=5
echo "== $jobs shards, exit statuses ${rcs[*]}: $([ "$rc" = 0 ] && echo passed || echo FAILED)"
exit "$rc"
