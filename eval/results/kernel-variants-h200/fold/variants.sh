# Mamba2 decode `fold_launch` candidates as they ran at 0108665 on an H100 (README.md beside this file; the option
# lost and was removed, so these variants no longer load): the flush rows' fold as a persistent launch of
# its own after the decode kernel, which then builds without its flush branch. Offline sm_90a builds (Nemotron-H-8B,
# batch 64; decode kernel / fold kernel registers, no spills unless said):
#   fold16  fold 4 warps, 64 x 16 chunks: bf16 127 / 123 (4 programs per SM), fp32 87 / 128 (4 per SM)
#   fold32  fold 4 warps, 64 x 32 chunks capped at 168: bf16 127 / 168 (3 per SM), fp32 87 / 165 (3 per SM)
#   foldw2  fold 2 warps, 32 x 32 chunks: bf16 127 / 135 (7 per SM), fp32 87 / 166 (6 per SM)
#   fold16c fold16 with the decode kernel's packaged caps (bf16 128, fp32 168: 149 used)
# The decode kernel runs uncapped in the first three (maxnreg 0; without its flush branch it needs 127 / 87).
# Source this file, then name the variables on the command line:
#   BENCH=kernels GIT_COMMIT=<sha> VARIANT_TIMEOUT=110 OUT=$OUT/f bash eval/gpu_spec_variants.sh packaged= \
#       fold16="$fold16" fold32="$fold32" foldw2="$foldw2" fold16c="$fold16c" -- --family mamba2 \
#       --batches 32 256 --dtypes fp32 bf16 --time-budget-s 60
_k=H128_P64_N128_G8_L16
fold16="{mamba2_output_only: {${_k}_Sbf16: {fold_launch: 1, fold_BLOCK_NC: 16, fold_ctas_per_sm: 4, maxnreg: 0}, ${_k}_Sfp32: {fold_launch: 1, fold_BLOCK_NC: 16, fold_ctas_per_sm: 4, maxnreg: 0}}}"
fold32="{mamba2_output_only: {${_k}_Sbf16: {fold_launch: 1, fold_BLOCK_NC: 32, fold_maxnreg: 168, fold_ctas_per_sm: 3, maxnreg: 0}, ${_k}_Sfp32: {fold_launch: 1, fold_BLOCK_NC: 32, fold_maxnreg: 168, fold_ctas_per_sm: 3, maxnreg: 0}}}"
foldw2="{mamba2_output_only: {${_k}_Sbf16: {fold_launch: 1, fold_BLOCK_M: 32, fold_num_warps: 2, fold_BLOCK_NC: 32, fold_ctas_per_sm: 7, maxnreg: 0}, ${_k}_Sfp32: {fold_launch: 1, fold_BLOCK_M: 32, fold_num_warps: 2, fold_BLOCK_NC: 32, fold_ctas_per_sm: 6, maxnreg: 0}}}"
fold16c="{mamba2_output_only: {${_k}_Sbf16: {fold_launch: 1, fold_BLOCK_NC: 16, fold_ctas_per_sm: 4}, ${_k}_Sfp32: {fold_launch: 1, fold_BLOCK_NC: 16, fold_ctas_per_sm: 4}}}"
