# Mamba2 decode: smaller per-warp tiles under the packaged register caps (README.md beside this file). The packaged
# Nemotron-H-8B entries run one-warp programs over 32-row tiles (bf16: cap 128, 16 warps per SM; fp32: cap 168, 12).
# A flush program walks four 32-column chunks, a latency chain per warp (../fold/README.md, the H100 ncu). Halving the
# rows per warp shortens that chain and fits more warps per SM. Offline sm_90a builds (batch 64), no spills:
#   m16   BLOCK_M 16:                          bf16 100 registers (19 warps per SM), fp32 137 (14)
#   m16c  BLOCK_M 16, cap 96 / 128:            bf16 96 (21),                         fp32 122 (16)
#   w2    2 warps over the 32-row tile:        bf16 106 (18),                        fp32 136 (14)
#   w2c   2 warps, cap 96 / 128:               bf16 94 (20),                         fp32 118 (16)
# Source this file, then:
#   BENCH=kernels GIT_COMMIT=<sha> VARIANT_TIMEOUT=100 OUT=$OUT/w bash eval/gpu_spec_variants.sh packaged= \
#       m16="$m16" m16c="$m16c" w2="$w2" w2c="$w2c" -- --family mamba2 --batches 32 256 --dtypes fp32 bf16 \
#       --time-budget-s 60
_k=H128_P64_N128_G8_L16
m16="{mamba2_output_only: {${_k}_Sbf16: {BLOCK_M: 16}, ${_k}_Sfp32: {BLOCK_M: 16}}}"
m16c="{mamba2_output_only: {${_k}_Sbf16: {BLOCK_M: 16, maxnreg: 96}, ${_k}_Sfp32: {BLOCK_M: 16, maxnreg: 128}}}"
w2="{mamba2_output_only: {${_k}_Sbf16: {num_warps: 2}, ${_k}_Sfp32: {num_warps: 2}}}"
w2c="{mamba2_output_only: {${_k}_Sbf16: {num_warps: 2, maxnreg: 96}, ${_k}_Sfp32: {num_warps: 2, maxnreg: 128}}}"
