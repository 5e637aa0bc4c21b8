# Round 16 (eval/results/spec-variants-h200/README.md): the launch option l2_prefetch (a bulk L2 prefetch of a later
# program's checkpoint block and rings) and the flush-step launch shapes of round 15's "Next" section, timed on an
# H100 at 55b6620. l2_prefetch lost and is removed: the *_pf* variants below are refused now ("unknown parameter");
# the others (m_fs3 .. m_fs6 first) remain the next H200 call's. Source this file, then name the variables on the command line.
# Mamba2 verify (Nemotron-H-8B, 2 P blocks): 512 programs a head at batch 256, 128 at 64
m_pf512="{mamba2_verify: {default: {l2_prefetch: 512}}}"
m_pf1024="{mamba2_verify: {default: {l2_prefetch: 1024}}}"
m_pf2048="{mamba2_verify: {default: {l2_prefetch: 2048}}}"
m_nc16="{mamba2_verify: {default: {BLOCK_NC: 16}}}"
m_fs1="{mamba2_verify: {default: {flush_stages: 1}}}"
m_fs3="{mamba2_verify: {default: {flush_stages: 3}}}"
m_fs4="{mamba2_verify: {default: {flush_stages: 4}}}"
m_fs5="{mamba2_verify: {default: {flush_stages: 5}}}"
m_fs6="{mamba2_verify: {default: {flush_stages: 6}}}"
m_bm16="{mamba2_verify: {default: {BLOCK_M: 16}}}"
m_bm16pf="{mamba2_verify: {default: {BLOCK_M: 16, l2_prefetch: 1024}}}"
m_bm16nc16="{mamba2_verify: {default: {BLOCK_M: 16, BLOCK_NC: 16}}}"
m_nw2="{mamba2_verify: {default: {num_warps: 2}}}"
# GDN verify (Qwen3-Next, v_loop 8: one program a (row, v-head)): 256 programs a v-head at batch 256, 64 at 64
g_pf64="{gdn_verify: {default: {l2_prefetch: 64}}}"
g_pf256="{gdn_verify: {default: {l2_prefetch: 256}}}"
g_pf512="{gdn_verify: {default: {l2_prefetch: 512}}}"
# Decode kernels (BENCH=kernels). Mamba2 (2 P blocks): 512 programs a head at batch 256 (fp32: rows-first grid),
# 256 a rank with flush_first (bf16 up to 512 rows, fp32 up to 64 in h200.yaml); GDN (Qwen3-Next, BV 32: 4 V tiles,
# flush_first up to 512 rows): 128 programs a rank
d_pf512="{mamba2_output_only: {default: {l2_prefetch: 512}}, gdn_decode: {default: {l2_prefetch: 512}}}"
d_pf1024="{mamba2_output_only: {default: {l2_prefetch: 1024}}, gdn_decode: {default: {l2_prefetch: 1024}}}"
d_pf2048="{mamba2_output_only: {default: {l2_prefetch: 2048}}, gdn_decode: {default: {l2_prefetch: 2048}}}"
