"""The offline sm_90a build of the verify kernels (``eval/verify_sass.py``), in a subprocess
without TRITON_INTERPRET (Triton's bundled ptxas / nvdisasm, no GPU).

Assertions are relative, so a new Triton or ptxas may move the absolute numbers without
failing the test: the captured launch is the wrapper's (grid over the real geometry, the
variant's constexprs), nothing spills, and one warp per program with per-token reductions
issues fewer instructions at batch 256 than the packaged four-warp broadcast configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bundled(tool: str) -> bool:
    import triton

    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool).is_file()


@pytest.mark.skipif(not (_bundled("ptxas") and _bundled("nvdisasm")), reason="Triton's bundled ptxas/nvdisasm")
def test_offline_verify_variants(tmp_path):
    out = tmp_path / "verify.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "eval.verify_sass", "--variant", "packaged:",
                        "--variant", "w1-token:reduce=token,num_warps=1", "--variant", "mamba2/pre:bc=pre,num_warps=1",
                        "--json", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["git_commit"] and doc["command"].startswith("python -m eval.verify_sass")
    res = {(x["family"], x["variant"]): x for x in doc["variants"]}
    assert set(res) == {(f, v) for f in ("mamba2", "gdn") for v in ("packaged", "w1-token")} | {("mamba2", "pre")}
    # the pre variant's B·C pre-kernel is compiled and counted; the others launch none
    assert set(res[("mamba2", "pre")]["pre_kernels"]) == {"_mamba2_verify_bc_kernel"}
    assert not res[("mamba2", "packaged")]["pre_kernels"] and not res[("gdn", "w1-token")]["pre_kernels"]
    for (fam, var), x in res.items():
        assert x["spill_st"] == 0 and x["spill_ld"] == 0, (fam, var, x["regs"])
        assert x["sass_total"] > 0 and x["regs"] > 0
    for fam in ("mamba2", "gdn"):
        pk, tk = res[(fam, "packaged")], res[(fam, "w1-token")]
        assert tk["num_warps"] == 1 and tk["config"]["reduce"] == "token"
        assert pk["programs_bs256"] == tk["programs_bs256"]  # same grid: the tile sizes did not change
        assert tk["issue_us_bs256"] < pk["issue_us_bs256"], (fam, pk["issue_us_bs256"], tk["issue_us_bs256"])
    # the wrapper's grid: tiles x batch x heads (Mamba2: cdiv(P, BLOCK_M) x 256 x 128; GDN: cdiv(V, BV) x 256 x 32)
    for fam, heads, extent in (("mamba2", 128, 64), ("gdn", 32, 128)):
        tiles, rest = divmod(res[(fam, "packaged")]["programs_bs256"], 256 * heads)
        assert rest == 0 and 1 <= tiles <= extent // 16
