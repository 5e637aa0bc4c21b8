#!/usr/bin/env bash
# One GPU-host call for the kernel suite: CUDA tests, then the benchmark vs SGLang's stock kernels.
# Usage (repo root on the GPU host, offline SGLang bundle carried in .sglang-bundle/):
#   GIT_COMMIT=<sha> OUT=<dir> bash eval/gpu_kernels.sh [--quick]
# Writes $OUT/gpu-tests.log (per-shard pytest summaries, failures, the total, the slowest tests),
# $OUT/gpu-test-times.txt (every test's time; KERNEL_BENCH=0 stops after the tests), $OUT/gpu-shard-logs.tgz
# (each shard's full pytest output), $OUT/bench.log,
# $OUT/kernels-h200.{json,md,png}, and (SPEC=0 skips it) $OUT/spec-bench.log, $OUT/spec-kernels-h200.{json,md,png}.
set -uo pipefail
OUT="${OUT:-eval/results}"
mkdir -p "$OUT"
PY="${GPU_PY:-python3}"
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
# The CUDA tests' time is Triton compiles on the host's CPU cores: TEST_JOBS pytest processes side by side, each
# one contiguous block of the tests of TEST_PATHS (tests/kernels; REPLAYSSM_TEST_SHARD, tests/conftest.py);
# TEST_JOBS=0 skips them.
jobs="${TEST_JOBS:-12}"
: > "$OUT/gpu-tests.log"
if [ "$jobs" -gt 0 ]; then
  T="$(mktemp -d /tmp/gpu-tests.XXXXXX)"
  threads="${TEST_THREADS:-$(( $(nproc 2>/dev/null || echo "$jobs") / jobs ))}"
  [ "$threads" -ge 1 ] || threads=1
  for ((i = 0; i < jobs; i++)); do
    # SIGINT at the limit: pytest stops and still prints its summary. TEST_THREADS torch / BLAS CPU threads per
    # shard, default the cores shared out as tests/run_shards.sh does (the fp64 oracles run on the CPU; torch's
    # default, one thread per core in every shard, oversubscribes it)
    OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" \
      REPLAYSSM_TEST_SHARD="$i/$jobs" REPLAYSSM_TEST_TIMES="$T/times-$i.txt" \
      timeout -s INT -k 20 "${TEST_TIMEOUT:-240}" \
      "$PY" -m pytest -q -rfE -p no:cacheprovider ${TEST_PATHS:-tests/kernels} >"$T/shard-$i.log" 2>&1 &
  done
  wait
  for ((i = 0; i < jobs; i++)); do
    { echo "# shard $i/$jobs: $(tail -1 "$T/shard-$i.log")"; grep -E "^(FAILED|ERROR) " "$T/shard-$i.log"; } >> "$OUT/gpu-tests.log"
  done
  "$PY" - "$T" "$jobs" <<'PY' | tee -a "$OUT/gpu-tests.log"
import collections, pathlib, re, sys
t, tot, cut = pathlib.Path(sys.argv[1]), collections.Counter(), 0
for i in range(int(sys.argv[2])):
    log = (t / f"shard-{i}.log").read_text()
    summary = [line for line in log.splitlines() if re.search(r"\d+ (passed|failed|skipped|deselected|errors?)", line)]
    found = re.findall(r"(\d+) (passed|failed|skipped|deselected|error)s?", summary[-1] if summary else "")
    if found and "KeyboardInterrupt" not in log:
        tot.update({k + "s" * (k == "error"): int(n) for n, k in found})
    else:  # cut by TEST_TIMEOUT: count the tests that finished (REPLAYSSM_TEST_TIMES)
        cut += 1
        times = t / f"times-{i}.txt"
        tot.update(line.split()[1] for line in (times.read_text().splitlines() if times.exists() else []))
tot.pop("deselected", None)  # each shard deselects the others' tests
order = ["passed", "failed", "errors", "skipped"]
print("# all shards:", ", ".join(f"{tot[k]} {k}" for k in sorted(tot, key=lambda k: (order + [k]).index(k)))
      or "no test finished",
      f"({cut} shards cut by TEST_TIMEOUT)" if cut else "")
PY
  echo "# slowest tests (call time in s; setup and compiles of module-level fixtures not included):" >> "$OUT/gpu-tests.log"
  cat "$T"/times-*.txt 2>/dev/null | sort -rn | head -25 >> "$OUT/gpu-tests.log"
  cat "$T"/times-*.txt > "$OUT/gpu-test-times.txt" 2>/dev/null
  tar czf "$OUT/gpu-shard-logs.tgz" -C "$T" .  # every shard's full pytest output (failures' tracebacks)
  rm -rf "$T"
fi
echo "== gpu tests: $(grep '^# all shards' "$OUT/gpu-tests.log")"
[ "${KERNEL_BENCH:-1}" = "0" ] && exit 0  # KERNEL_BENCH=0: the tests only
timeout "${BENCH_TIMEOUT:-420}" "$PY" -m eval.bench_kernels --out "$OUT/kernels-h200.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60
# the speculative-verify benchmark (skip with SPEC=0)
if [ "${SPEC:-1}" != "0" ]; then
  timeout "${SPEC_TIMEOUT:-300}" "$PY" -m eval.bench_spec --out "$OUT/spec-kernels-h200.json" "$@" 2>&1 \
    | tee "$OUT/spec-bench.log" | tail -40
fi
