#!/usr/bin/env bash
# One GPU-host call: the speculative-verify kernel benchmark (eval/bench_spec.py) once per launch-config
# variant of the verify kernels, so that variants are compared in the same run against SGLang's kernels.
# Usage (repo root on the GPU host, offline SGLang bundle carried in .sglang-bundle/):
#   GIT_COMMIT=<sha, a literal from the development machine> OUT=<dir> bash eval/gpu_spec_variants.sh \
#       [name='<yaml mapping of mamba2_verify / gdn_verify defaults>' ...] [-- <bench_spec flags>]
# Without variants: the packaged configs, then the candidates listed below (chosen offline with
# eval/verify_sass.py; the first round's five variants and their H200 times: eval/results/spec-variants-h200/).
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
  # Candidates on top of the packaged H200 file (one warp, per-token reductions, group-shared dots in a
  # pre-kernel: timed 3.46x / 1.74x stock at batch 256, eval/results/spec-variants-h200/), which reach only
  # 41% / 31% of copy bandwidth.  Mamba2: in the N-chunk loop each chunk's loads wait behind the previous
  # chunk's conditional stores (SASS: ~10 loads per chunk between store groups), so `nonflush: stream`
  # reads a non-flush row's whole S_ck tile at once (~38 loads back to back, as the decode kernel that
  # reaches 87%).  Both families sit at 255 registers (8 warps per SM): register caps (GDN cap168: no
  # spills, 12 warps) and smaller tiles are the other candidates; GDN's flush step (945 vs 454 us at batch 256)
# folds its history with one rank-1 update per token, `flush: dot` folds it in one tl.dot.  Each family is
# picked on its own.
  variants=("packaged="
            "stream=mamba2_verify: {default: {nonflush: stream}}
gdn_verify: {default: {maxnreg: 168}}"
            "stream-m16=mamba2_verify: {default: {nonflush: stream, BLOCK_M: 16}}
gdn_verify: {default: {maxnreg: 128}}"
            "cap168=mamba2_verify: {default: {maxnreg: 168}}
gdn_verify: {default: {maxnreg: 144}}"
            "m16=mamba2_verify: {default: {BLOCK_M: 16}}
gdn_verify: {default: {maxnreg: 96}}"
            "big-dotflush=mamba2_verify: {default: {BLOCK_M: 64}}
gdn_verify: {default: {flush: dot}}")
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
