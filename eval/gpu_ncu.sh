#!/usr/bin/env bash
# One GPU-host call: Nsight Compute counters of the verify and decode kernels (eval/ncu_profile.py), one profiled
# launch per region, beside SGLang's kernels and an elementwise device copy.
# Usage (repo root on the GPU host, offline SGLang bundle carried in .sglang-bundle/):
#   GIT_COMMIT=<sha> OUT=<dir> bash eval/gpu_ncu.sh [region ...]     # region: kind:family:dtype:batch
# Without regions: eval/ncu_profile.py's DEFAULT_REGIONS (the issue's keys). Writes $OUT/ncu-h200.{json,md} (the
# summary), $OUT/ncu-raw.tgz (the manifest, ncu's raw CSV, its details page, the per-instruction source page: SASS
# with stall samples, the log) and, where it fits the device tool's file limit, $OUT/ncu-h200.ncu-rep (ncu's
# report). NCU_TIMEOUT (default 420 s) bounds the profiled run; the summary is written from whatever ncu profiled
# by then. SGLANG_REPLAYSSM_KERNEL_CONFIG picks a variant's launch config as in every benchmark. Clocks are left
# as found (--clock-control none). Exit status 0 when the run and its summary both succeeded.
set -uo pipefail
OUT="${OUT:-/tmp/replayssm-ncu}"
mkdir -p "$OUT"
rm -f "$OUT/ncu-h200.json" "$OUT/ncu-h200.md" "$OUT/ncu-h200.ncu-rep" "$OUT/ncu-raw.tgz"  # no stale summary
W="$(mktemp -d /tmp/ncu.XXXXXX)"
PY="${GPU_PY:-python3}"
if [ -f .sglang-bundle/bootstrap.sh ] && ! "$PY" -c "import sglang" 2>/dev/null; then
  source .sglang-bundle/bootstrap.sh
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
NCU="${NCU:-$(command -v ncu || ls -d /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | tail -1)}"
if [ -z "$NCU" ] || [ ! -x "$NCU" ]; then
  echo "gpu_ncu.sh: no ncu found (PATH, /opt/nvidia/nsight-compute/*/ncu, /usr/local/cuda/bin/ncu); set NCU=<path>" >&2
  exit 2
fi
"$NCU" --version | tail -1 | tee "$W/ncu-version.txt"
sections=()
for s in $("$PY" -c "from eval.ncu_profile import SECTIONS; print(' '.join(SECTIONS))"); do
  sections+=(--section "$s")
done
# the named counters the sections may lack, those this ncu knows (a name it does not know would stop the run)
known="$("$NCU" --query-metrics --csv 2>/dev/null | cut -d, -f1 | tr -d '"')"
metrics=()
for m in $("$PY" -c "from eval.ncu_profile import EXTRA_METRICS; print(' '.join(EXTRA_METRICS))"); do
  grep -qx "${m%%.*}" <<< "$known" && metrics+=("$m")
done
echo "extra metrics: ${metrics[*]:-none}"
extra=()
[ ${#metrics[@]} -gt 0 ] && extra=(--metrics "$(IFS=,; echo "${metrics[*]}")")
regions=()
[ $# -gt 0 ] && regions=(--regions "$@")
# the profiled program: each region's launch between cudaProfilerStart/Stop, a marker kernel first
timeout -k 30 "${NCU_TIMEOUT:-420}" "$NCU" --profile-from-start off --target-processes all --clock-control none \
  --replay-mode kernel --import-source no "${sections[@]}" "${extra[@]}" -o "$W/profile" -f \
  "$PY" -m eval.ncu_profile run --device cuda --manifest "$W/manifest.json" "${regions[@]}" > "$W/ncu-run.log" 2>&1
rc=$?
sum_rc=1
tail -30 "$W/ncu-run.log"
echo "== ncu run: exit status $rc"
if [ -f "$W/profile.ncu-rep" ]; then
  "$NCU" --import "$W/profile.ncu-rep" --csv --page raw --print-units base > "$W/raw.csv" 2> "$W/import.err"
  "$NCU" --import "$W/profile.ncu-rep" --page details > "$W/details.txt" 2>> "$W/import.err"
  "$NCU" --import "$W/profile.ncu-rep" --csv --page source --print-source sass > "$W/source-sass.csv" \
    2>> "$W/import.err" || echo "(the source page failed: $W/import.err)"
  if [ -f "$W/manifest.json" ]; then
    "$PY" -m eval.ncu_profile summarize --csv "$W/raw.csv" --manifest "$W/manifest.json" --out "$OUT/ncu-h200.json"
    sum_rc=$?
    echo "== summary: exit status $sum_rc (1: problems listed in ncu-h200.md)"
  else
    echo "gpu_ncu.sh: the profiled run wrote no manifest (see ncu-run.log in $OUT/ncu-raw.tgz)" >&2
  fi
else
  echo "gpu_ncu.sh: ncu wrote no report (see ncu-run.log in $OUT/ncu-raw.tgz)" >&2
fi
# ncu's report too where it fits the device tool's file limit (16 MiB; the CSV pages hold what the summary reads)
tar -C "$W" -czf "$OUT/ncu-raw.tgz" --exclude=profile.ncu-rep .
[ -f "$W/profile.ncu-rep" ] && [ "$(stat -c %s "$W/profile.ncu-rep")" -lt $((14 << 20)) ] \
  && cp "$W/profile.ncu-rep" "$OUT/ncu-h200.ncu-rep"
ls -la "$OUT"
rm -rf "$W"
[ "$rc" = 0 ] && [ "$sum_rc" = 0 ]
