#!/usr/bin/env bash
# One GPU-host call: the speculative-verify kernel benchmark (eval/bench_spec.py) once per launch-config
# variant of the verify kernels, so that variants are compared in the same run against SGLang's kernels.
# Usage (repo root on the GPU host, offline SGLang bundle carried in .sglang-bundle/):
#   GIT_COMMIT=<sha, a literal from the development machine> OUT=<dir> bash eval/gpu_spec_variants.sh \
#       [name='<yaml mapping of mamba2_verify / gdn_verify defaults>' ...] [-- <bench_spec flags>]
# Without variants: the packaged configs, then the candidates of eval/verify_sass.py (listed below).
# Writes spec-<name>.{json,md,png,log} per variant, packed into $OUT/spec-variants.tgz (the device tool
# brings back at most 8 files), then $OUT/h200-picked.yaml (eval/pick_verify_config.py: the
# packaged file with each verify family's fastest correct variant) and a copy in .replayssm-picked.yaml at the
# repo root (git-ignored; the GPU host keeps it for the next call, which can serve with
# SGLANG_REPLAYSSM_KERNEL_CONFIG=$PWD/.replayssm-picked.yaml).
set -uo pipefail
OUT="${OUT:-/tmp/replayssm-spec-variants}"
W="$(mktemp -d /tmp/spec-variants.XXXXXX)"  # per-variant files; packed into $OUT at the end
mkdir -p "$OUT"
if [ -f .sglang-bundle/bootstrap.sh ] && ! python3 -c "import sglang" 2>/dev/null; then
  source .sglang-bundle/bootstrap.sh
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
variants=() flags=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; flags=("$@"); break; fi
  variants+=("$1"); shift
done
if [ ${#variants[@]} -eq 0 ]; then
  # the candidates of the offline sm_90a analysis (eval/results/verify-sass-offline.md): one warp per
  # program, T two-dimensional reductions and the group-shared dots in a pre-kernel (B·C for Mamba2,
  # the key scores for GDN) cut the modelled issue time about 5x (Mamba2) and 4x (GDN)
  variants=("packaged="
            "w1-token=mamba2_verify: {default: {reduce: token, num_warps: 1}}
gdn_verify: {default: {reduce: token, num_warps: 1}}"
            "w1-pre=mamba2_verify: {default: {reduce: token, num_warps: 1, BLOCK_M: 32, bc: pre}}
gdn_verify: {default: {reduce: token, num_warps: 1, scores: pre}}"
            "w1-bcast-pre=mamba2_verify: {default: {num_warps: 1, bc: pre}}
gdn_verify: {default: {num_warps: 1, scores: pre}}"
            "w2-wide=mamba2_verify: {default: {reduce: token, num_warps: 2, BLOCK_M: 32, bc: pre}}
gdn_verify: {default: {reduce: token, num_warps: 2, BV: 32, scores: pre}}")
fi
[ ${#flags[@]} -eq 0 ] && flags=(--quick --dtypes fp32 --time-budget-s 60)  # --quick times batch 1/32/256
rc=0
for v in "${variants[@]}"; do
  name="${v%%=*}" body="${v#*=}"
  cfg=""
  if [ -n "$body" ]; then
    # the packaged GPU file first, the variant's keys on top (a variant names only what it changes)
    cfg="$W/variant-$name.yaml"
    python3 - "$cfg" "$body" <<'PY'
import sys, yaml
from sglang_replayssm.kernels import common
base = yaml.safe_load(open(common.config_file())) or {}
for fam, sec in (yaml.safe_load(sys.argv[2]) or {}).items():
    for key, entry in sec.items():
        base.setdefault(fam, {}).setdefault(key, {}).update(entry)
yaml.safe_dump(base, open(sys.argv[1], "w"))
PY
  fi
  echo "== variant $name ${cfg:+($cfg)}"
  SGLANG_REPLAYSSM_KERNEL_CONFIG="$cfg" timeout "${VARIANT_TIMEOUT:-150}" \
    python3 -m eval.bench_spec --out "$W/spec-$name.json" "${flags[@]}" >"$W/spec-$name.log" 2>&1
  r=$?; [ "$r" = 0 ] || rc=$r
  tail -12 "$W/spec-$name.log"
done
if python3 -m eval.pick_verify_config "$W"/spec-*.json --out "$OUT/h200-picked.yaml"; then
  cp "$OUT/h200-picked.yaml" .replayssm-picked.yaml
fi
tar czf "$OUT/spec-variants.tgz" -C "$W" . && echo "packed $(ls "$W" | wc -l) files into $OUT/spec-variants.tgz"
exit "$rc"
