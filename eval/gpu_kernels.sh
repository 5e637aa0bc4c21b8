#!/usr/bin/env bash
# One GPU-host call for the kernel suite: CUDA tests, then the benchmark vs SGLang's stock kernels.
# Usage (repo root on the GPU host, offline SGLang bundle carried in .sglang-bundle/):
#   GIT_COMMIT=<sha> OUT=<dir> bash eval/gpu_kernels.sh [--quick]
# Writes $OUT/gpu-tests.log, $OUT/bench.log, $OUT/kernels-h200.{json,md,png}, and (SPEC=0 skips it)
# $OUT/spec-bench.log, $OUT/spec-kernels-h200.{json,md,png}.
set -uo pipefail
OUT="${OUT:-eval/results}"
mkdir -p "$OUT"
if [ -f .sglang-bundle/bootstrap.sh ]; then source .sglang-bundle/bootstrap.sh; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu-info.txt"
python3 - <<'PY' | tee -a "$OUT/gpu-info.txt"
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "device", torch.cuda.get_device_name())
PY
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -x -p no:cacheprovider tests/kernels 2>&1 | tail -40 > "$OUT/gpu-tests.log"
echo "== gpu tests: $(tail -1 "$OUT/gpu-tests.log")"
timeout "${BENCH_TIMEOUT:-420}" python3 -m eval.bench_kernels --out "$OUT/kernels-h200.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60
# the speculative-verify benchmark (skip with SPEC=0)
if [ "${SPEC:-1}" != "0" ]; then
  timeout "${SPEC_TIMEOUT:-300}" python3 -m eval.bench_spec --out "$OUT/spec-kernels-h200.json" "$@" 2>&1 \
    | tee "$OUT/spec-bench.log" | tail -40
fi
