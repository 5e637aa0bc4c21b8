#!/usr/bin/env bash
# One device call (~200 s, H100 or H200): the flush_tiles GPU tests, then variants.sh beside the packaged file.
#   GIT_COMMIT=<sha> OUT=$OUT bash eval/results/kernel-variants-h200/tiles/call.sh
set -uo pipefail
: "${GIT_COMMIT:?GIT_COMMIT=<sha>}" "${OUT:?OUT=<dir>}"
here=$(dirname "$0")
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
[ -f .sglang-bundle/bootstrap.sh ] && source .sglang-bundle/bootstrap.sh >/dev/null 2>&1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mamba2_replay.py -k "flush_tiles or real_geometries" \
  > "$OUT/gpu-tests.log" 2>&1
echo "tests: $(tail -1 "$OUT/gpu-tests.log") at $SECONDS s"
source "$here/variants.sh"
BENCH=kernels VARIANT_TIMEOUT=${VARIANT_TIMEOUT:-100} OUT="$OUT/t" bash eval/gpu_spec_variants.sh packaged= \
  tiles="$tiles" tiles_c="$tiles_c" -- --family mamba2 --batches 32 256 --dtypes fp32 bf16 \
  --time-budget-s 60 2>&1 | grep -E "^== |nemotron-h-8b |Error|error|FAIL" | head -40
echo "total $SECONDS s"
