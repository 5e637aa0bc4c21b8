# Flush programs first across all heads (kernel-variants-h200/README.md, "Flush programs first across all heads"),
# timed on 2026-12-03 (mixed-order/flush-first/): launch option flush_first_max_batch on the packaged entries (fp32 and bf16 state)
K8=H128_P64_N128_G8_L16
G=HV32_HK16_K128_V128_L16
ff64="{mamba2_output_only: {${K8}_Sfp32: {flush_first_max_batch: 64}, ${K8}_Sbf16: {flush_first_max_batch: 64}},
  gdn_decode: {${G}_Sfp32: {flush_first_max_batch: 64}, ${G}_Sbf16: {flush_first_max_batch: 64}}}"
ff512="{mamba2_output_only: {${K8}_Sfp32: {flush_first_max_batch: 512}, ${K8}_Sbf16: {flush_first_max_batch: 512}},
  gdn_decode: {${G}_Sfp32: {flush_first_max_batch: 512}, ${G}_Sbf16: {flush_first_max_batch: 512}}}"
