#!/usr/bin/env bash
# One GPU-host call for the kernel suite: CUDA tests, then the benchmark vs SGLang's stock kernels.
# Usage (repo root on the GPU host, offline SGLang bundle carried in .sglang-bundle/):
#   GIT_COMMIT=<sha> OUT=<dir> bash eval/gpu_kernels.sh [--quick]
# Writes $OUT/gpu-tests.log (pytest's exit status, failures, the finished tests by outcome, the slowest tests,
# pytest's summary), $OUT/gpu-test-times.txt (every finished test's time and outcome), $OUT/gpu-tests-full.log
# (pytest's whole output: the failures' tracebacks); KERNEL_BENCH=0 stops after the tests and exits with pytest's
# status (`make gpu-test`); else $OUT/bench.log,
# $OUT/kernels-h200.{json,md,png}, and (SPEC=0 skips it) $OUT/spec-bench.log, $OUT/spec-kernels-h200.{json,md,png};
# (DVV=0 skips it) $OUT/spec-t1-h200.json and $OUT/decode-vs-verify-h200.{json,md}; (TREE=0 skips it)
# $OUT/spec-tree-kernels-h200.json (its summary keys also merged into spec-kernels-h200.json); PACK=1 then packs
# all but the JSONs into $OUT/gpu-kernels-logs.tgz.
# Wall on the H200 with warm caches: tests ~3 min, decode benchmark ~1.5 min, verify ~1.5 min, T = 1 verify ~1 min,
# tree ~2 min: more than one 10-minute device call holds with margin, so split it, e.g. TEST_JOBS=0 SPEC=0 DVV=0
# TREE=0 for the decode benchmark alone, then TEST_JOBS=0 DECODE_BENCH=0 for the rest (or KERNEL_BENCH=0 for the
# tests alone).
set -uo pipefail
OUT="${OUT:-eval/results}"
mkdir -p "$OUT"
PY="${GPU_PY:-python3}"
jobs="${TEST_JOBS:-16}"  # pytest-xdist workers for the tests (below)
if ! [[ "$jobs" =~ ^[0-9]+$ ]]; then
  echo "TEST_JOBS must be a whole number of pytest-xdist workers (0: no tests), got '$jobs'" >&2
  exit 2
fi
# the offline SGLang bundle (../shared/device) where SGLang is not installed
if [ -f .sglang-bundle/bootstrap.sh ] && ! "$PY" -c "import sglang" 2>/dev/null; then
  source .sglang-bundle/bootstrap.sh
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu-info.txt"
"$PY" - <<'PY' | tee -a "$OUT/gpu-info.txt"
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "device", torch.cuda.get_device_name())
PY
# The CUDA tests' time is Triton compiles on the host's CPU cores: pytest-xdist spreads TEST_PATHS (tests/kernels)
# over TEST_JOBS worker processes (TEST_JOBS=0 skips the tests). --dist worksteal: each worker starts on one
# contiguous block of the tests (a test's parametrisations, which share compiled kernels, stay together) and an
# idle worker takes half of a busy one's rest. tests/conftest.py shares the cores out for torch's CPU threads (the
# fp64 oracles run on the CPU; TEST_THREADS sets them instead) and writes each finished test's time and outcome
# (REPLAYSSM_TEST_TIMES). TEST_TIMEOUT bounds the whole run (SIGINT: pytest stops and still prints its summary;
# `make gpu-test` allows more), TEST_TIMEOUT_EACH (pytest-timeout) each test.
test_rc=0
: > "$OUT/gpu-tests.log"
if [ "$jobs" -gt 0 ]; then
  if ! "$PY" -c "import xdist, pytest_timeout" 2>/dev/null; then
    echo "eval/gpu_kernels.sh needs pytest-xdist and pytest-timeout in $PY: pip install pytest-xdist pytest-timeout" >&2
    exit 2
  fi
  : > "$OUT/gpu-test-times.txt"
  # shellcheck disable=SC2086  # TEST_PATHS: one or more paths
  env ${TEST_THREADS:+OMP_NUM_THREADS=$TEST_THREADS OPENBLAS_NUM_THREADS=$TEST_THREADS MKL_NUM_THREADS=$TEST_THREADS} \
    REPLAYSSM_TEST_TIMES="$OUT/gpu-test-times.txt" timeout -s INT -k 60 "${TEST_TIMEOUT:-240}" \
    "$PY" -m pytest -q -rfEs -p no:cacheprovider -n "$jobs" --dist worksteal --timeout "${TEST_TIMEOUT_EACH:-600}" \
    ${TEST_PATHS:-tests/kernels} > "$OUT/gpu-tests-full.log" 2>&1
  test_rc=$?
  {
    echo "# pytest -n $jobs --dist worksteal ${TEST_PATHS:-tests/kernels}: exit status $test_rc$(
      [ "$test_rc" = 124 ] || [ "$test_rc" = 137 ] && echo ", cut by TEST_TIMEOUT=${TEST_TIMEOUT:-240} s")$(
      [ "$test_rc" = 5 ] && echo ", no test collected")"
    grep -E "^(FAILED|ERROR) " "$OUT/gpu-tests-full.log"
    echo "# finished tests: $(awk '{print $2}' "$OUT/gpu-test-times.txt" | sort | uniq -c | awk '{printf "%s%d %s", s, $1, $2; s=", "}')"
    echo "# slowest tests (call time in s; setup and compiles of module-level fixtures not included):"
    sort -rn "$OUT/gpu-test-times.txt" | head -25
    echo "# pytest: $(tail -1 "$OUT/gpu-tests-full.log")"
  } >> "$OUT/gpu-tests.log"
fi
echo "== gpu tests: $(tail -1 "$OUT/gpu-tests.log")"
[ "${KERNEL_BENCH:-1}" = "0" ] && exit "$test_rc"  # KERNEL_BENCH=0: the tests only
# the decode benchmark (skip with DECODE_BENCH=0: decode vs verify then reads eval/results/kernels-h200.json)
if [ "${DECODE_BENCH:-1}" != "0" ]; then
  timeout "${BENCH_TIMEOUT:-420}" "$PY" -m eval.bench_kernels --out "$OUT/kernels-h200.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60
fi
decode_json="$OUT/kernels-h200.json"
[ -f "$decode_json" ] || decode_json="eval/results/kernels-h200.json"
# the speculative-verify benchmark (skip with SPEC=0)
if [ "${SPEC:-1}" != "0" ]; then
  timeout "${SPEC_TIMEOUT:-300}" "$PY" -m eval.bench_spec --out "$OUT/spec-kernels-h200.json" "$@" 2>&1 \
    | tee "$OUT/spec-bench.log" | tail -40
fi
# decode vs verify at T = 1 (skip with DVV=0): the verify kernels at a one-token window beside the decode kernels
if [ "${DVV:-1}" != "0" ] && [ -f "$decode_json" ]; then
  timeout "${DVV_TIMEOUT:-240}" "$PY" -m eval.bench_spec --window 1 --accept 1 --history 16 --batches 1 32 256 \
    --dtypes fp32 bf16 --out "$OUT/spec-t1-h200.json" 2>&1 | tee "$OUT/spec-t1-bench.log" | tail -20
  "$PY" -m eval.decode_vs_verify --decode "$decode_json" --verify "$OUT/spec-t1-h200.json" \
    --out "$OUT/decode-vs-verify-h200.json" 2>&1 | tail -20
fi
# the tree speculative-verify benchmark vs SGLang's tree verify (skip with TREE=0)
if [ "${TREE:-1}" != "0" ]; then
  merge=()  # the tree keys go into the chain verify benchmark's summary when that ran here
  [ -f "$OUT/spec-kernels-h200.json" ] && merge=(--merge-into "$OUT/spec-kernels-h200.json")
  timeout "${TREE_TIMEOUT:-300}" "$PY" -m eval.bench_tree_spec --out "$OUT/spec-tree-kernels-h200.json" "${merge[@]}" \
    2>&1 | tee "$OUT/tree-bench.log" | tail -20
fi
# PACK=1: everything but the result JSONs in one tarball (the device tool returns at most 8 files)
if [ "${PACK:-0}" = "1" ]; then
  tmp_tgz="$(mktemp /tmp/gpu-kernels-logs.XXXXXX.tgz)"
  tar -C "$OUT" -czf "$tmp_tgz" --exclude='*.json' . \
    && find "$OUT" -maxdepth 1 -type f ! -name '*.json' -delete && mv "$tmp_tgz" "$OUT/gpu-kernels-logs.tgz"
  ls -la "$OUT"
fi
[ "$test_rc" = 0 ] || exit "$test_rc"  # the benchmarks ran; the tests failed
