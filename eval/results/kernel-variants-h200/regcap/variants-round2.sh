# Round 2 of eval/results/kernel-variants-h200/regcap/: the flush branch's chunk loop under the packaged caps
K8=H128_P64_N128_G8_L16
v1="{mamba2_output_only: {${K8}_Sbf16: {BLOCK_NC: 32, flush_unroll: 1}, ${K8}_Sfp32: {BLOCK_NC: 32, flush_unroll: 1}}}"
v2="{mamba2_output_only: {${K8}_Sbf16: {BLOCK_NC: 16, flush_unroll: 1}, ${K8}_Sfp32: {BLOCK_NC: 16, flush_unroll: 1}}}"
v3="{mamba2_output_only: {${K8}_Sbf16: {num_stages: 2}, ${K8}_Sfp32: {num_stages: 2}}}"
v4="{mamba2_output_only: {${K8}_Sbf16: {BLOCK_NC: 16, maxnreg: 112}, ${K8}_Sfp32: {maxnreg: 152}}}"
