# Round 3 of eval/results/kernel-variants-h200/regcap/ (timed 2026-12-03 at 802c5f0, all four lost: README, round 3): flush_prefetch, each
# rebuild chunk loaded one chunk ahead and a flush row's first chunk before the window chain, on the packaged caps (a config naming it is refused since the option was removed)
K8=H128_P64_N128_G8_L16
v1="{mamba2_output_only: {${K8}_Sbf16: {flush_prefetch: 1}, ${K8}_Sfp32: {flush_prefetch: 1}}}"
v2="{mamba2_output_only: {${K8}_Sbf16: {BLOCK_NC: 16, flush_prefetch: 1}, ${K8}_Sfp32: {BLOCK_NC: 16, flush_prefetch: 1}}}"
# GDN (Qwen3-Next geometry, fp32 state): flush_prefetch on the K-chunked tile's flush pass; uncapped it takes 222
# registers (9 warps per SM), capped at 128 it spills 188/256 B
G=HV32_HK16_K128_V128_L16_Sfp32
g1="{gdn_decode: {${G}: {flush_prefetch: 1, maxnreg: 128}}}"
g2="{gdn_decode: {${G}: {flush_prefetch: 1}}}"
