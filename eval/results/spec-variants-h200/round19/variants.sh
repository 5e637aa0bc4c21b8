# Round 19 candidates (eval/results/spec-variants-h200/README.md, round 19): register caps on the verify kernels as
# packaged since round 17, chosen offline (verify-sass-offline.txt: no spills, one more resident warp per SM).
# Source this file, then name the variables on the command line (fp32 and bf16 in one run):
#   GIT_COMMIT=<sha> VARIANT_TIMEOUT=150 OUT=$OUT/c bash eval/gpu_spec_variants.sh packaged= m_cap224="$m_cap224" \
#       m_cap200="$m_cap200" g16_vcap224="$g16_vcap224" -- --batches 64 256 --dtypes fp32 bf16 --check-batch 64 \
#       --time-budget-s 60
# Mamba2 verify, fp32 state: 255 -> 224 registers, 8 -> 9 warps per SM, no spills
m_cap224="{mamba2_verify: {default_Sfp32: {maxnreg: 224}}}"
# the same at 200: 10 warps per SM, 8 spilled registers
m_cap200="{mamba2_verify: {default_Sfp32: {maxnreg: 200}}}"
# GDN verify, bf16 state (the looping kernel): 246 -> 221 registers, 8 -> 9 warps per SM, no spills. The fp32
# state's verify-rows launch spills at 224 (16 registers), and 200 lost in round 9
g16_vcap224="{gdn_verify: {default_Sbf16: {v_loop_maxnreg: 224}}}"
# GDN decode, `pdl_wait: scores` (late wait): with pdl, each decode program issues its checkpoint tile's loads and
# runs its output pass before it waits for the score pre-kernel (round 16's H100 ncu: that pre-kernel took 12.4 us
# of a 242 us non-flush step at batch 256); with flush rows first it finds its row from the write positions. The
# fp32 K-chunked build then takes 150 registers (13 warps per SM, packaged 128 / 16), hence the capped one (4
# spilled registers). Time against packaged= and round 18's pdl_decode in one BENCH=kernels run:
#   BENCH=kernels GIT_COMMIT=<sha> VARIANT_TIMEOUT=150 OUT=$OUT/d bash eval/gpu_spec_variants.sh packaged= \
#       pdl="$pdl_decode" d_late="$d_late" d_late128="$d_late128" d_late_grid="$d_late_grid" -- --family all \
#       --batches 32 256 --dtypes fp32 bf16 --time-budget-s 40
# The Mamba2 decode took the same option at 42314f1 (its B·C dots read late): a wash on the H100 in grid order and a
# loss with flush rows first (bf16 batch 256 235.0 -> 243.7 us), so it was removed. d_late128, d_late_grid and
# h100_geo_mlate below are kept as they ran (the variant-*.yaml files beside their results); their Mamba2 halves name
# the removed option and no longer load. d_late as the next H200 call runs it: the GDN late wait, Mamba2 pdl only
d_late="{gdn_decode: {default: {pdl: 1, pdl_wait: scores}}, mamba2_output_only: {default: {pdl: 1}}}"
d_late128="{gdn_decode: {default: {pdl: 1, pdl_wait: scores}, default_Sfp32: {maxnreg: 128}}, mamba2_output_only: {default: {pdl: 1, pdl_wait: scores}}}"
# the same late wait with the rows in grid order (no flush-first): every flush-first program reads all the batch's
# write positions to find its row (O(batch) a program), which may cost more than the later wait gains at 256
d_late_grid="{gdn_decode: {default: {pdl: 1, pdl_wait: scores}, HV32_HK16_K128_V128_L16_Sfp32: {flush_first_max_batch: 0}, HV32_HK16_K128_V128_L16_Sbf16: {flush_first_max_batch: 0}}, mamba2_output_only: {default: {pdl: 1, pdl_wait: scores}, H128_P64_N128_G8_L16_Sfp32: {flush_first_max_batch: 0}, H128_P64_N128_G8_L16_Sbf16: {flush_first_max_batch: 0}}}"
# H100 (not the H200): the H200 file's decode geometry entries (the GDN K-chunked fp32 tile, the bf16 cvt tile, the
# Mamba2 register caps, flush rows first) on top of h100.yaml, which has none of them (round 19, H100 section). With
# flush rows first, the GDN decode's late wait finds its row in-kernel: the H200's path. _early: the GDN decode's
# early wait; _grid: no flush-first; _mlate: the Mamba2 decode's late wait too.
#   BENCH=kernels GIT_COMMIT=<sha> VARIANT_TIMEOUT=100 OUT=$OUT/g bash eval/gpu_spec_variants.sh packaged= \
#       h100_geo="$h100_geo" h100_geo_early="$h100_geo_early" h100_geo_grid="$h100_geo_grid" h100_geo_mlate="$h100_geo_mlate" -- \
#       --family all --batches 32 256 --dtypes fp32 bf16 --time-budget-s 45
h100_geo="{gdn_decode: {HV32_HK16_K128_V128_L16_Sbf16: {BV: 32, cast: cvt, flush_first_max_batch: 512, inline_BV: 16}, HV32_HK16_K128_V128_L16_Sfp32: {BKC: 32, BV: 32, flush: dot, flush_first_max_batch: 512, inline_BKC: 0, inline_BV: 16, inline_num_warps: 2}, HV64_HK16_K128_V128_L16_Sbf16: {BV: 32, cast: cvt, flush_first_max_batch: 512, inline_BV: 16}, HV64_HK16_K128_V128_L16_Sfp32: {BKC: 32, BV: 32, flush: dot, flush_first_max_batch: 512, inline_BKC: 0, inline_BV: 16, inline_num_warps: 2}}, mamba2_output_only: {H128_P64_N128_G8_L16_Sbf16: {BLOCK_NC: 32, flush_first_max_batch: 512, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 128}, H128_P64_N128_G8_L16_Sfp32: {BLOCK_NC: 32, flush_first_max_batch: 64, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 168}, H256_P64_N128_G8_L16_Sbf16: {BLOCK_NC: 32, flush_first_max_batch: 512, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 128}, H256_P64_N128_G8_L16_Sfp32: {BLOCK_NC: 32, flush_first_max_batch: 64, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 168}}}"
h100_geo_grid="{gdn_decode: {HV32_HK16_K128_V128_L16_Sbf16: {BV: 32, cast: cvt, flush_first_max_batch: 0, inline_BV: 16}, HV32_HK16_K128_V128_L16_Sfp32: {BKC: 32, BV: 32, flush: dot, flush_first_max_batch: 0, inline_BKC: 0, inline_BV: 16, inline_num_warps: 2}, HV64_HK16_K128_V128_L16_Sbf16: {BV: 32, cast: cvt, flush_first_max_batch: 0, inline_BV: 16}, HV64_HK16_K128_V128_L16_Sfp32: {BKC: 32, BV: 32, flush: dot, flush_first_max_batch: 0, inline_BKC: 0, inline_BV: 16, inline_num_warps: 2}}, mamba2_output_only: {H128_P64_N128_G8_L16_Sbf16: {BLOCK_NC: 32, flush_first_max_batch: 0, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 128}, H128_P64_N128_G8_L16_Sfp32: {BLOCK_NC: 32, flush_first_max_batch: 0, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 168}, H256_P64_N128_G8_L16_Sbf16: {BLOCK_NC: 32, flush_first_max_batch: 0, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 128}, H256_P64_N128_G8_L16_Sfp32: {BLOCK_NC: 32, flush_first_max_batch: 0, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 168}}}"
h100_geo_early="{gdn_decode: {HV32_HK16_K128_V128_L16_Sbf16: {BV: 32, cast: cvt, flush_first_max_batch: 512, inline_BV: 16}, HV32_HK16_K128_V128_L16_Sfp32: {BKC: 32, BV: 32, flush: dot, flush_first_max_batch: 512, inline_BKC: 0, inline_BV: 16, inline_num_warps: 2}, HV64_HK16_K128_V128_L16_Sbf16: {BV: 32, cast: cvt, flush_first_max_batch: 512, inline_BV: 16}, HV64_HK16_K128_V128_L16_Sfp32: {BKC: 32, BV: 32, flush: dot, flush_first_max_batch: 512, inline_BKC: 0, inline_BV: 16, inline_num_warps: 2}, default: {pdl: 1, pdl_wait: start}}, mamba2_output_only: {H128_P64_N128_G8_L16_Sbf16: {BLOCK_NC: 32, flush_first_max_batch: 512, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 128}, H128_P64_N128_G8_L16_Sfp32: {BLOCK_NC: 32, flush_first_max_batch: 64, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 168}, H256_P64_N128_G8_L16_Sbf16: {BLOCK_NC: 32, flush_first_max_batch: 512, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 128}, H256_P64_N128_G8_L16_Sfp32: {BLOCK_NC: 32, flush_first_max_batch: 64, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 168}}}"
h100_geo_mlate="{gdn_decode: {HV32_HK16_K128_V128_L16_Sbf16: {BV: 32, cast: cvt, flush_first_max_batch: 512, inline_BV: 16}, HV32_HK16_K128_V128_L16_Sfp32: {BKC: 32, BV: 32, flush: dot, flush_first_max_batch: 512, inline_BKC: 0, inline_BV: 16, inline_num_warps: 2}, HV64_HK16_K128_V128_L16_Sbf16: {BV: 32, cast: cvt, flush_first_max_batch: 512, inline_BV: 16}, HV64_HK16_K128_V128_L16_Sfp32: {BKC: 32, BV: 32, flush: dot, flush_first_max_batch: 512, inline_BKC: 0, inline_BV: 16, inline_num_warps: 2}}, mamba2_output_only: {H128_P64_N128_G8_L16_Sbf16: {BLOCK_NC: 32, flush_first_max_batch: 512, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 128}, H128_P64_N128_G8_L16_Sfp32: {BLOCK_NC: 32, flush_first_max_batch: 64, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 168}, H256_P64_N128_G8_L16_Sbf16: {BLOCK_NC: 32, flush_first_max_batch: 512, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 128}, H256_P64_N128_G8_L16_Sfp32: {BLOCK_NC: 32, flush_first_max_batch: 64, flush_unroll: 0, inline_maxnreg: 0, maxnreg: 168}, default: {pdl: 1, pdl_wait: scores}}}"
# H100, on top of h100.yaml at 67e5d71: the whole GDN fp32 tile with its flush rows' programs first (up to batch 512 /
# 64); packaged at 64
g32ff="{gdn_decode: {HV32_HK16_K128_V128_L16_Sfp32: {flush_first_max_batch: 512}, HV64_HK16_K128_V128_L16_Sfp32: {flush_first_max_batch: 512}}}"
g32ff64="{gdn_decode: {HV32_HK16_K128_V128_L16_Sfp32: {flush_first_max_batch: 64}, HV64_HK16_K128_V128_L16_Sfp32: {flush_first_max_batch: 64}}}"
# H200 candidate from the H100's round 19: there the late wait helped the whole GDN fp32 tile (37.4 -> 34.4 us at
# batch 32) far more than the K-chunked one (a wash), and the whole tile with flush rows first took mixed rows at
# batch 32 to 34.8 us (1.47x stock, against the H200's K-chunked 1.25x). The whole tile above batch 1 on the H200
# (batch 1 keeps its inline entry), with d_late's waits:
d_late_whole="{gdn_decode: {default: {pdl: 1, pdl_wait: scores}, HV32_HK16_K128_V128_L16_Sfp32: {BKC: 0, BV: 16, flush: rank1}, HV64_HK16_K128_V128_L16_Sfp32: {BKC: 0, BV: 16, flush: rank1}}, mamba2_output_only: {default: {pdl: 1}}}"
