# Round 18 candidates (eval/results/spec-variants-h200/README.md, round 17): flush_stages for 16-bit Mamba2 verify
# states, untimed (fp32 took 3 on the H200 in round 17). Source this file, then name the variables on the command line:
#   GIT_COMMIT=<sha> VARIANT_TIMEOUT=90 OUT=$OUT/m bash eval/gpu_spec_variants.sh packaged= m16_fs3="$m16_fs3" \
#       m16_fs4="$m16_fs4" -- --family mamba2 --batches 64 256 --dtypes bf16 --check-batch 64 --time-budget-s 80
m16_fs3="{mamba2_verify: {default_Sbf16: {flush_stages: 3}}}"
m16_fs4="{mamba2_verify: {default_Sbf16: {flush_stages: 4}}}"
# pdl (round 18 of the same README; won on an H100 for the GDN verify and both decode kernels, a wash for the Mamba2
# verify; untimed on the H200): the verify families, then the decode families
pdl_verify="{mamba2_verify: {default: {pdl: 1}}, gdn_verify: {default: {pdl: 1}}}"
pdl_decode="{gdn_decode: {default: {pdl: 1}}, mamba2_output_only: {default: {pdl: 1}}}"
