#!/usr/bin/env bash
# Round 19's first H200 call (README: "What the next H200 call runs"), one device call of at most ~590 s:
#   GIT_COMMIT=<sha> OUT=$OUT bash eval/results/spec-variants-h200/round19/h200-call.sh
# Exits 3 at once on any GPU but an H200 (the variants' H100 results are in; only the H200 decides the keys).
# 1. the standard-decode benchmark as packaged ($OUT/base) and with d_late ($OUT/late), full runs;
# 2. d_late_whole beside the packaged GDN fp32 decode ($OUT/w);
# 3. with the time left, the verify variants ($OUT/v): packaged, pdl_verify, m_cap224, g16_vcap224.
# At most 8 files come back: base/ and late/ hold a JSON and a tarball each, w/ and v/ a tarball (v/ a pick too).
set -uo pipefail
: "${GIT_COMMIT:?GIT_COMMIT=<sha> (a literal from the development machine)}" "${OUT:?OUT=<dir>}"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing run"; exit 3 ;; esac
budget=${CALL_S:-585}
here=$(dirname "$0")
[ -f .sglang-bundle/bootstrap.sh ] && source .sglang-bundle/bootstrap.sh >/dev/null 2>&1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source "$here/../round18/variants.sh"
source "$here/variants.sh"
python3 -m eval.config_variant --out /tmp/round19-late.yaml "$d_late" >/dev/null || exit 2
left() { echo $((budget - SECONDS)); }
for arm in base late; do
  cfg=""; [ "$arm" = late ] && cfg=/tmp/round19-late.yaml
  SGLANG_REPLAYSSM_KERNEL_CONFIG="$cfg" timeout "$(left)" env TEST_JOBS=0 SPEC=0 DVV=0 TREE=0 PACK=1 \
    OUT="$OUT/$arm" bash eval/gpu_kernels.sh 2>&1 | grep -E "headline|skipped" | head -4
  echo "$arm done at $SECONDS s"
done
cp /tmp/round19-late.yaml "$OUT/late/variant-d_late.yaml" 2>/dev/null
if [ "$(left)" -gt 90 ]; then
  BENCH=kernels VARIANT_TIMEOUT=40 OUT="$OUT/w" bash eval/gpu_spec_variants.sh packaged= \
    d_late_whole="$d_late_whole" -- --family gdn --batches 32 256 --dtypes fp32 --time-budget-s 20 --no-check \
    2>&1 | grep -E "^== |qwen|total"
  echo "w done at $SECONDS s"
fi
if [ "$(left)" -gt 200 ]; then
  n=$(( ($(left) - 20) / 4 ))
  VARIANT_TIMEOUT=$n OUT="$OUT/v" bash eval/gpu_spec_variants.sh packaged= pdl="$pdl_verify" \
    m_cap224="$m_cap224" g16_vcap224="$g16_vcap224" -- --batches 64 256 --dtypes fp32 bf16 --check-batch 64 \
    --time-budget-s $((n - 25)) 2>&1 | grep -E "^== |headline|total|skipped"
fi
echo "total $SECONDS s"
