"""GDN decode flush modes outside the kernel: the tuner's sweep of the flush choice and
the offline sm_90a build (``eval/gdn_sass.py``) of rank1 vs dot.

The offline build runs in a subprocess without TRITON_INTERPRET (the conftest sets it
in this process when there is no GPU); it needs Triton's bundled ptxas / nvdisasm and
no GPU.  Its assertions are relative (the dot flush leaves the rank-1 FMAs to the tensor
cores: fewer flush-branch instructions and FFMAs than rank1), so a new Triton or ptxas
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
    assert set(choices["flush"]) == set(GDN_LAUNCH_CHOICES["flush"]) == {"rank1", "dot"}
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
    assert "flush=dot" in tk.compact(dict(cur, flush="dot"))
    assert tk.parse_args(["--out", "x.yaml", "--fixed-choices"]).fixed_choices
    assert not tk.parse_args(["--out", "x.yaml"]).fixed_choices


def _bundled(tool: str) -> bool:
    import triton

    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool).is_file()


@pytest.mark.skipif(not (_bundled("ptxas") and _bundled("nvdisasm")), reason="Triton's bundled ptxas/nvdisasm")
@pytest.mark.parametrize("state", ["fp32", pytest.param("bf16", marks=pytest.mark.slow)])  # slow: the GPU run's
def test_offline_sass_dot_vs_rank1(tmp_path, state):
    out = tmp_path / "sass.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "eval.gdn_sass", "--state", state, "--json", str(out),
                        "--variant", "rank1:flush=rank1,BKC=0,BV=16", "--variant", "dot:flush=dot,BKC=0,BV=16"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    print(r.stdout)
    res = {x["variant"]: x for x in json.loads(out.read_text())}
    rank1, dot = res["rank1"], res["dot"]
    for x in (rank1, dot):
        assert set(x["regions"]) == {"common", "flush", "nonflush"}, "flush branch not found in the SASS"
    n = {v: {r: x["regions"][r]["n"] for r in x["regions"]} for v, x in res.items()}
    assert n["dot"]["flush"] < n["rank1"]["flush"], n
    assert rank1["regions"]["flush"]["ops"].get("FFMA", 0) >= 15 * 64  # the L-1 rank-1 updates (BV 16 x K 128 / 32)
    ops = dot["regions"]["flush"]["ops"]
    assert any(op.startswith("HMMA") for op in ops), ops  # the history fold on the tensor cores
    assert ops.get("FFMA", 0) < rank1["regions"]["flush"]["ops"]["FFMA"] / 2, n
