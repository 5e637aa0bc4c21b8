#!/usr/bin/env bash
# One GPU-host call: the speculative-verify kernel benchmark (eval/bench_spec.py) once per launch-config
# variant of the verify kernels, so that variants are compared in the same run against SGLang's kernels.
# Usage (repo root on the GPU host, offline SGLang bundle carried in .sglang-bundle/):
#   GIT_COMMIT=<sha, a literal from the development machine> OUT=<dir> bash eval/gpu_spec_variants.sh \
#       [name='<yaml mapping of mamba2_verify / gdn_verify defaults>' ...] [-- <bench_spec flags>]
# Without variants: the packaged configs, then the candidates listed below (chosen offline with
# eval/verify_sass.py; rounds 1 and 2 and their H200 times: eval/results/spec-variants-h200/).
# Writes spec-<name>.{json,md,png,log} per variant, packed into $OUT/spec-variants.tgz (the device tool
# brings back at most 8 files), then $OUT/h200-picked.yaml (eval/pick_verify_config.py: the
# packaged file with each verify family's fastest correct variant) and a copy in .replayssm-picked.yaml at the
# repo root (git-ignored; the GPU host keeps it for the next call, which can serve with
# SGLANG_REPLAYSSM_KERNEL_CONFIG=$PWD/.replayssm-picked.yaml).
#
# BENCH=kernels times the standard-decode kernels instead (eval/bench_kernels.py against SGLang's decode kernels;
# files kernels-<name>.*, packed into $OUT/kernels-variants.tgz; no pick: read the tables), with its own default
# candidates below.
set -uo pipefail
BENCH="${BENCH:-spec}"
case "$BENCH" in spec|kernels) ;; *) echo "BENCH must be spec or kernels, got '$BENCH'" >&2; exit 2;; esac
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
if [ ${#variants[@]} -eq 0 ] && [ "$BENCH" = kernels ]; then
  # Without named variants (GDN rows, fp32 state): launch option `l2_hints` on the packaged K-chunked tile (BV 32,
  # BKC 32, dot flush; the prefetch round before, kernel-variants-h200/prefetch/, lost). At batch 256 its flush
  # step moves its bytes at 62% of copy bandwidth, the other steps at 82-85% (kernels-h200.json, 76ab56a). A flush
  # row re-reads its tile expecting L2, with about 34 MB of tiles plus the flush stores in flight against 50 MB of
  # L2. 1: the flush stores evict_first, 2: the output pass's tile loads evict_last, 3: both (offline sm_90a: 128
  # registers in all, the hints in the PTX; eval/results/gdn-decode-sass-offline-prefetch.md).
  K=HV32_HK16_K128_V128_L16
  variants=("packaged="
            "l2h1=gdn_decode: {${K}_Sfp32: {l2_hints: 1}}"
            "l2h2=gdn_decode: {${K}_Sfp32: {l2_hints: 2}}"
            "l2h3=gdn_decode: {${K}_Sfp32: {l2_hints: 3}}")
  [ ${#flags[@]} -eq 0 ] && flags=(--quick --family gdn --dtypes fp32 --time-budget-s 60)
elif [ ${#variants[@]} -eq 0 ]; then
  # Round 5b (GDN only; Mamba2 as packaged, its run-to-run reference). Round 5 (97df991,
  # eval/results/spec-variants-h200/round5/) timed `flush: split` with a verify kernel compiled without its fold
  # branch: the flush step gained 5% but that kernel spilled 20 registers at the 168 cap and every non-flush
  # step lost 11% (483 vs 460 us). Now the fold launch (_gdn_verify_fold_kernel) also writes the cursor the
  # verify launch reads, a flush row's being an empty history where its window starts, so the verify kernel is
  # the packaged one (offline sm_90a: the same 3912 SASS, 168 registers, no spills) and never enters its fold
  # branch. Estimate: the all-flush step about 700 us (fold about 350 + an empty-history verify) against 784,
  # about 445 us per layer amortised against 460. Fold tile variants beside the default (BV 32, 4 warps).
  variants=("packaged="
            "split=gdn_verify: {default: {flush: split}}"
            "split-f64=gdn_verify: {default: {flush: split, fold_BV: 64}}"
            "split-w2=gdn_verify: {default: {flush: split, fold_num_warps: 2}}")
fi
[ ${#flags[@]} -eq 0 ] && flags=(--quick --dtypes fp32 --time-budget-s 60)  # --quick times batch 1/32/256
rc=0
for v in "${variants[@]}"; do
  name="${v%%=*}" body="${v#*=}"
  cfg=""
  if [ -n "$body" ]; then
    # the packaged GPU file first, the variant's keys on top (a variant names only what it changes)
    cfg="$W/variant-$name.yaml"
    python3 -m eval.config_variant --out "$cfg" "$body" >/dev/null || { rc=2; continue; }
  fi
  echo "== variant $name ${cfg:+($cfg)}"
  SGLANG_REPLAYSSM_KERNEL_CONFIG="$cfg" timeout "${VARIANT_TIMEOUT:-150}" \
    python3 -m "eval.bench_$BENCH" --out "$W/$BENCH-$name.json" "${flags[@]}" >"$W/$BENCH-$name.log" 2>&1
  r=$?; [ "$r" = 0 ] || rc=$r
  tail -12 "$W/$BENCH-$name.log"
done
if [ "$BENCH" = spec ] && python3 -m eval.pick_verify_config "$W"/spec-*.json --out "$OUT/h200-picked.yaml"; then
  cp "$OUT/h200-picked.yaml" .replayssm-picked.yaml
fi
tar czf "$OUT/$BENCH-variants.tgz" -C "$W" . && echo "packed $(ls "$W" | wc -l) files into $OUT/$BENCH-variants.tgz"
exit "$rc"
