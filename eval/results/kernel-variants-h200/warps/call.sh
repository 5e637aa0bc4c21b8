#!/usr/bin/env bash
# One device call (~200 s, H100 or H200): the variants of variants.sh beside the packaged file in one BENCH=kernels run.
#   GIT_COMMIT=<sha> OUT=$OUT bash eval/results/kernel-variants-h200/warps/call.sh
set -uo pipefail
: "${GIT_COMMIT:?GIT_COMMIT=<sha>}" "${OUT:?OUT=<dir>}"
here=$(dirname "$0")
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
source "$here/variants.sh"
BENCH=kernels VARIANT_TIMEOUT=${VARIANT_TIMEOUT:-100} OUT="$OUT/w" bash eval/gpu_spec_variants.sh packaged= \
  m16="$m16" m16c="$m16c" w2="$w2" w2c="$w2c" -- --family mamba2 --batches 32 256 --dtypes fp32 bf16 \
  --time-budget-s 60 2>&1 | grep -E "^== |nemotron-h-8b |Error|error|FAIL" | head -60
echo "total $SECONDS s"
