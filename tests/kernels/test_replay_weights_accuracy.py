"""Replay weights after a large step: the kernels stay within 2x a plain fp32 recurrence's error.

A replay weight is the exponential of the log-decays summed between two positions (Mamba2
A·Σ Δ_i, GDN Σ g_i). Formed as a difference of two fp32 prefix sums it cancels after one large
step (dt + dt_bias ~ 22: the prefix sums are ~22, their difference carries ~ulp(22) of absolute
error, times |A|): with the kernels before the change the Mamba2 RMS error was 16-1900x that of a plain
fp32 sequential recurrence on these inputs, GDN's (inclusive suffix minus g_j) 1.6-35x. The kernels now
sum the suffix directly (``common.suffix_sum_excl``). Each test fills a ring with random history holding
large steps (replay_cases.py), runs the kernel once (decode: a replay and a flush step; verify: a verify
and a flush call, with a large step in the window too; materialize) and compares it with the fp64
sequential recurrence. The yardstick is the same recurrence run in fp32 on the same inputs; the bar:
kernel error <= 2 x yardstick error (+ one fp32 unit of the tensor's RMS, the floor of any stored fp32
result), root mean square over each tensor (the outputs and, where the call stores one, the checkpoint). Dots run at "ieee" (``_ieee_dots``).

Runs on CUDA when present, else in Triton's CPU interpreter (tests/conftest.py). The seed is in every
failure message (REPLAYSSM_TEST_SEED replays one).
"""

from __future__ import annotations

import pytest

from kernel_testlib import make_gen
from replay_cases import rms_errors, run_gdn_decode, run_gdn_materialize, run_gdn_verify, run_mamba2_decode
from replay_cases import run_mamba2_materialize, run_mamba2_verify

FACTOR = 2.0  # kernel error <= FACTOR x the fp32 sequential recurrence's error + FLOOR
# + one fp32 unit (2^-23) of the tensor's RMS magnitude: the stored fp32 result's own rounding is ~0.3 units RMS,
# so a yardstick that lands near that floor (e.g. a state that one large step reduced to a single exact product)
# cannot be beaten 2x by any fp32 kernel
FLOOR_UNITS = 2.0 ** -23
FAMILIES = ("mamba2_output_only", "mamba2_verify", "gdn_decode", "gdn_verify")


@pytest.fixture(autouse=True)
def _ieee_dots(tmp_path, monkeypatch):
    """Every kernel's fp32 dots at "ieee": these tests measure the weights' formation, so the flush dots must
    not add tf32x3's residue on the GPU (the interpreter ignores input_precision anyway; the tensor-core
    paths have their own bar: test_tensor_core_paths_gpu.py)."""
    f = tmp_path / "ieee.yaml"
    f.write_text("".join(f"{fam}:\n  default: {{dot_precision: ieee}}\n" for fam in FAMILIES))
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
MAMBA2 = dict(H=4, P=16, N=16, G=2)  # two heads per group
GDN = dict(Hk=2, HV=4, K=16, V=16)


def _check(case, seed, what):
    for name, k, y, m in rms_errors(case):
        assert y > 0.0, f"{what}: {name}: the fp32 yardstick matched fp64 exactly (seed {seed}): no measurement"
        bar = FACTOR * y + FLOOR_UNITS * m
        assert k <= bar, (f"{what}: {name}: kernel RMS error {k:.3e} > {FACTOR} x the fp32 sequential recurrence's "
                          f"{y:.3e} + 2^-23 x RMS {m:.3e} (ratio {k / y:.2f}; replay: REPLAYSSM_TEST_SEED={seed})")


@pytest.mark.parametrize("flush", [False, True], ids=["replay", "flush"])
def test_mamba2_decode_large_step_within_2x_fp32_recurrence(device, flush):
    gen, seed = make_gen()
    L = 16
    case = run_mamba2_decode(device, gen, **MAMBA2, L=L, w=L - 1 if flush else L - 3)
    _check(case, seed, "mamba2 decode")


@pytest.mark.parametrize("flush", [False, True], ids=["verify", "flush"])
def test_mamba2_verify_large_step_within_2x_fp32_recurrence(device, flush):
    gen, seed = make_gen()
    _check(run_mamba2_verify(device, gen, **MAMBA2, T=4, R=20, flush=flush), seed, "mamba2 verify")


def test_mamba2_materialize_large_step_within_2x_fp32_recurrence(device):
    gen, seed = make_gen()
    _check(run_mamba2_materialize(device, gen, **MAMBA2, L=16, w=15, dot_precision="ieee"), seed, "mamba2 materialize")


@pytest.mark.parametrize("flush", [False, True], ids=["replay", "flush"])
def test_gdn_decode_large_gate_within_2x_fp32_recurrence(device, flush):
    gen, seed = make_gen()
    L = 16
    _check(run_gdn_decode(device, gen, **GDN, L=L, w=L - 1 if flush else L - 3), seed, "gdn decode")


@pytest.mark.parametrize("flush", [False, True], ids=["verify", "flush"])
def test_gdn_verify_large_gate_within_2x_fp32_recurrence(device, flush):
    gen, seed = make_gen()
    _check(run_gdn_verify(device, gen, **GDN, T=4, R=20, flush=flush), seed, "gdn verify")


def test_gdn_materialize_large_gate_within_2x_fp32_recurrence(device):
    gen, seed = make_gen()
    _check(run_gdn_materialize(device, gen, **GDN, L=16, w=15, dot_precision="ieee"), seed, "gdn materialize")
