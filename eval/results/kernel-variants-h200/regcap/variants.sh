# Variants timed in eval/results/kernel-variants-h200/regcap/ (sourced by the device call; see its README)
K8=H128_P64_N128_G8_L16; KL=H256_P64_N128_G8_L16
v1="{mamba2_output_only: {${K8}_Sbf16: {BLOCK_NC: 32, flush_unroll: 0}, ${KL}_Sbf16: {BLOCK_NC: 32, flush_unroll: 0}, ${K8}_Sfp32: {BLOCK_NC: 32, flush_unroll: 0}, ${KL}_Sfp32: {BLOCK_NC: 32, flush_unroll: 0}}}"
v2="{mamba2_output_only: {${K8}_Sbf16: {BLOCK_NC: 32, flush_unroll: 0, maxnreg: 128}, ${KL}_Sbf16: {BLOCK_NC: 32, flush_unroll: 0, maxnreg: 128}, ${K8}_Sfp32: {BLOCK_NC: 32, flush_unroll: 0, maxnreg: 168}, ${KL}_Sfp32: {BLOCK_NC: 32, flush_unroll: 0, maxnreg: 168}}}"
v3="{mamba2_output_only: {${K8}_Sbf16: {BLOCK_M: 64, num_warps: 2, BLOCK_NC: 32, flush_unroll: 0, maxnreg: 128}, ${KL}_Sbf16: {BLOCK_M: 64, num_warps: 2, BLOCK_NC: 32, flush_unroll: 0, maxnreg: 128}, ${K8}_Sfp32: {BLOCK_NC: 16, flush_unroll: 0, maxnreg: 168}, ${KL}_Sfp32: {BLOCK_NC: 16, flush_unroll: 0, maxnreg: 168}}}"
v4="{mamba2_output_only: {${K8}_Sbf16: {BLOCK_NC: 16, flush_unroll: 0, maxnreg: 96}, ${KL}_Sbf16: {BLOCK_NC: 16, flush_unroll: 0, maxnreg: 96}, ${K8}_Sfp32: {BLOCK_NC: 16, flush_unroll: 0}, ${KL}_Sfp32: {BLOCK_NC: 16, flush_unroll: 0}}}"
