#!/usr/bin/env bash
# One device call (H100 or H200, ~400 s): the fold launch's GPU tests (compiled tf32x3 dots at odd geometries), then
# the fold variants beside the packaged file in one BENCH=kernels run (variants.sh).
#   GIT_COMMIT=<sha> OUT=$OUT bash eval/results/kernel-variants-h200/fold/call.sh
set -uo pipefail
: "${GIT_COMMIT:?GIT_COMMIT=<sha>}" "${OUT:?OUT=<dir>}"
here=$(dirname "$0")
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
[ -f .sglang-bundle/bootstrap.sh ] && source .sglang-bundle/bootstrap.sh >/dev/null 2>&1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="$PWD/.sglang-bundle/jitcache/triton"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mamba2_replay.py -k "fold_launch or flush_first or real_geometries" \
  > "$OUT/gpu-tests.log" 2>&1
echo "tests: $(tail -1 "$OUT/gpu-tests.log") at $SECONDS s"
source "$here/variants.sh"
BENCH=kernels VARIANT_TIMEOUT=${VARIANT_TIMEOUT:-110} OUT="$OUT/f" bash eval/gpu_spec_variants.sh packaged= \
  fold16="$fold16" fold32="$fold32" foldw2="$foldw2" fold16c="$fold16c" -- --family mamba2 \
  --batches 32 256 --dtypes fp32 bf16 --time-budget-s 60 2>&1 | grep -E "^== |nemotron-h-8b |headline|total|Error|error" | head -60
echo "total $SECONDS s"
