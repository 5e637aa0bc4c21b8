#!/usr/bin/env bash
# One GPU-host call: the speculative-verify kernel benchmark (eval/bench_spec.py) once per launch-config
# variant of the verify kernels, so that variants are compared in the same run against SGLang's kernels.
# Usage (repo root on the GPU host, offline SGLang bundle carried in .sglang-bundle/):
#   GIT_COMMIT=<sha, a literal from the development machine> OUT=<dir> bash eval/gpu_spec_variants.sh \
#       [name='<yaml mapping of mamba2_verify / gdn_verify defaults>' ...] [-- <bench_spec flags>]
# Without variants: the packaged configs alone (earlier rounds, chosen offline with eval/verify_sass.py, and their
# H200 times: eval/results/spec-variants-h200/, kernel-variants-h200/).
# Writes spec-<name>.{json.gz,md,png,log} per variant, packed into $OUT/spec-variants.tgz (the device tool
# brings back at most 8 files), then $OUT/h200-picked.yaml (eval/pick_verify_config.py: the
# packaged file with each verify family's fastest correct variant) and a copy in .replayssm-picked.yaml at the
# repo root (git-ignored; the GPU host keeps it for the next call, which can serve with
# SGLANG_REPLAYSSM_KERNEL_CONFIG=$PWD/.replayssm-picked.yaml).
#
# BENCH=kernels times the standard-decode kernels instead (eval/bench_kernels.py against SGLang's decode kernels;
# files kernels-<name>.*, packed into $OUT/kernels-variants.tgz; no pick: read the tables; with neither variants nor
# flags: GDN rows, fp32 state, batch 1/32/256; named variants without flags: both families, fp32, batch 1/32/256).
# BENCH=tree times the tree verify (eval/bench_tree_spec.py against SGLang's tree verify; files tree-<name>.*,
# packed into $OUT/tree-variants.tgz; no pick; default flags: 8-node trees, batch 8 and 64), e.g. the 8-node
# candidates of docs/tree-speculation.md §6:
#   BENCH=tree bash eval/gpu_spec_variants.sh packaged= \
#     t8='{mamba2_verify: {H128_P64_N128_G8_R24_T8: {nonflush: chunked, BLOCK_M: 16}},
#          gdn_verify: {HV32_HK16_K128_V128_R24_T8: {maxnreg: 0}}}'
set -uo pipefail
BENCH="${BENCH:-spec}"
case "$BENCH" in spec|kernels) module="eval.bench_$BENCH" ;; tree) module=eval.bench_tree_spec ;;
  *) echo "BENCH must be spec, kernels or tree, got '$BENCH'" >&2; exit 2;; esac
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
  # The packaged file alone (a run-to-run reference; open candidates are named on the command line). The options
  # that lost on the H200 were removed from the kernels (standard decode: GDN `prefetch`, `l2_hints`, `rank1_fold`,
  # `v_tiles`, `flush_prefetch`, the Mamba2 state_and_output route and `flush_prefetch`; verify: GDN and Mamba2
  # `reduce: dot`, GDN `flush: split`, `early_tile`, the `prologue` orders that lost (both families), Mamba2
  # `stream_chunk: 0`, `flush_dots: fold`); their results stay under
  # eval/results/kernel-variants-h200/ and spec-variants-h200/. Name variants on the command line to time new ones.
  variants=("packaged=")
  if [ "$BENCH" = kernels ] && [ ${#flags[@]} -eq 0 ]; then flags=(--quick --family gdn --dtypes fp32 --time-budget-s 60); fi
fi
if [ ${#flags[@]} -eq 0 ]; then  # --quick times batch 1/32/256
  if [ "$BENCH" = tree ]; then flags=(--batches 8 64); else flags=(--quick --dtypes fp32 --time-budget-s 60); fi
fi
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
    python3 -m "$module" --out "$W/$BENCH-$name.json" "${flags[@]}" >"$W/$BENCH-$name.log" 2>&1
  r=$?; [ "$r" = 0 ] || rc=$r
  tail -12 "$W/$BENCH-$name.log"
done
if [ "$BENCH" = spec ] && python3 -m eval.pick_verify_config "$W"/spec-*.json --out "$OUT/h200-picked.yaml"; then
  cp "$OUT/h200-picked.yaml" .replayssm-picked.yaml
fi
# the per-variant records as committed (eval/results/*-variants-h200/: gzip-compressed, the tables beside them)
gzip -9 -n "$W"/*.json 2>/dev/null
tar czf "$OUT/$BENCH-variants.tgz" -C "$W" . && echo "packed $(ls "$W" | wc -l) files into $OUT/$BENCH-variants.tgz"
exit "$rc"
