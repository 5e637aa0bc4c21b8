# Mamba2 decode `flush_tiles` as it ran at 12e2afc on an H100 (README.md beside this file; the option lost and was
# removed, so these variants no longer load): a flush row's M tiles all rebuilt by its (row, head)'s
# first program, so the per-program part of a flush (set-up, the window's weights) is paid once per head, not once
# per 32-row tile (../warps/: halving the rows per program made the flush step slower, 630 -> 698-851 us on the H100).
# Offline sm_90a (Nemotron-H-8B, batch 64): bf16 at the cap of 128 spills 8-10 bytes, fp32 at 168 spills 12; the
# packaged builds are unchanged (same SASS counts).
#   tiles     flush_tiles on the packaged entries
#   tiles_c   the same with one register-allocation step more (bf16 cap 136: 15 warps per SM; fp32 176: 11)
# Source this file, then:
#   BENCH=kernels GIT_COMMIT=<sha> VARIANT_TIMEOUT=100 OUT=$OUT/t bash eval/gpu_spec_variants.sh packaged= \
#       tiles="$tiles" tiles_c="$tiles_c" -- --family mamba2 --batches 32 256 --dtypes fp32 bf16 --time-budget-s 60
_k=H128_P64_N128_G8_L16
tiles="{mamba2_output_only: {${_k}_Sbf16: {flush_tiles: 1}, ${_k}_Sfp32: {flush_tiles: 1}}}"
tiles_c="{mamba2_output_only: {${_k}_Sbf16: {flush_tiles: 1, maxnreg: 136}, ${_k}_Sfp32: {flush_tiles: 1, maxnreg: 176}}}"
