"""GDN decode flush modes outside the kernel: the tuner's sweep of the flush choice and
the offline sm_90a build (``eval/gdn_sass.py``) of rank1 vs rank1_fold.

The offline build runs in a subprocess without TRITON_INTERPRET (the conftest sets it
in this process when there is no GPU); it needs Triton's bundled ptxas / nvdisasm and
no GPU.  Its assertions are relative (rank1_fold issues fewer flush-branch instructions
than rank1, adds none to the common part, spills nothing), so a new Triton or ptxas
may move the absolute numbers without failing the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QWEN3_NEXT = dict(HV=32, Hk=16, K=128, V=128)


def test_tuner_sweeps_flush_choices():
    from eval import tune_kernels as tk
    from sglang_replayssm.kernels.gdn_replay import GDN_DEFAULT_LAUNCH, GDN_LAUNCH_CHOICES

    choices = tk.launch_choices("gdn_decode")
    assert "rank1_fold" in choices["flush"] and set(choices["flush"]) == set(GDN_LAUNCH_CHOICES["flush"])
    assert tk.launch_choices("mamba2_output_only") == {}
    assert tk.candidate_values("flush", "rank1", QWEN3_NEXT, tk.SWEEP_VALUES, choices) == list(choices["flush"])
    assert tk.candidate_values("flush", "rank1", QWEN3_NEXT, tk.SWEEP_VALUES) == ["rank1"]  # fixed without choices
    assert tk.candidate_values("dot_precision", "tf32x3", QWEN3_NEXT, tk.SWEEP_VALUES, choices) == ["tf32x3"]
    cur = dict(GDN_DEFAULT_LAUNCH)
    s2 = tk.stage2_candidates([cur], cur, QWEN3_NEXT, tk.SWEEP_VALUES, choices)
    flushes = [c["flush"] for c in s2 if c["flush"] != cur["flush"]]
    assert sorted(flushes) == sorted(set(choices["flush"]) - {cur["flush"]})
    # each flush candidate differs from the current config in the flush mode only
    for c in s2:
        if c["flush"] != cur["flush"]:
            assert {k for k in c if c[k] != cur[k]} == {"flush"}
    assert all(c["flush"] == cur["flush"] for c in tk.stage2_candidates([cur], cur, QWEN3_NEXT, tk.SWEEP_VALUES))
    assert "flush=rank1_fold" in tk.compact(dict(cur, flush="rank1_fold"))
    assert tk.parse_args(["--out", "x.yaml", "--fixed-choices"]).fixed_choices
    assert not tk.parse_args(["--out", "x.yaml"]).fixed_choices


def _bundled(tool: str) -> bool:
    import triton

    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool).is_file()


@pytest.mark.skipif(not (_bundled("ptxas") and _bundled("nvdisasm")), reason="Triton's bundled ptxas/nvdisasm")
@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_offline_sass_rank1_fold_vs_rank1(tmp_path, state):
    out = tmp_path / "sass.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "eval.gdn_sass", "--state", state, "--json", str(out),
                        "--variant", "rank1:flush=rank1", "--variant", "fold:flush=rank1_fold"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    print(r.stdout)
    res = {x["variant"]: x for x in json.loads(out.read_text())}
    rank1, fold = res["rank1"], res["fold"]
    for x in (rank1, fold):
        assert set(x["regions"]) == {"common", "flush", "nonflush"}, "flush branch not found in the SASS"
    assert fold["spill_st"] == 0 and fold["spill_ld"] == 0
    assert fold["regs"] <= rank1["regs"]
    n = {v: {r: x["regions"][r]["n"] for r in x["regions"]} for v, x in res.items()}
    assert n["fold"]["common"] <= n["rank1"]["common"] + 8, n  # the non-flush path does not pay for it
    assert n["fold"]["flush"] < 0.95 * n["rank1"]["flush"], n
    ops = fold["regions"]["flush"]["ops"]
    assert ops.get("FFMA", 0) >= 15 * 64  # the L-1 rank-1 updates are all there (BV 16 x K 128 / 32 lanes)
