"""The offline sm_90a build of the verify kernels (``eval/verify_sass.py``), in a subprocess
without TRITON_INTERPRET (Triton's bundled ptxas / nvdisasm, no GPU).

Assertions are relative, so a new Triton or ptxas may move the absolute numbers without
failing the test: the captured launch is the wrapper's (grid over the real geometry, the
variant's constexprs), nothing on the chunk loop spills without a register cap, one warp per program with per-token
reductions issues fewer instructions at batch 256 than four warps with one broadcast reduction (the
first packaged configuration), pre-kernels are compiled exactly when a config asks for them, and a
``maxnreg`` cap reaches the compiled kernel.
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
    # b4 / t1 compare the reduction layouts on the chunk loop without a register cap (the streamed tile of the
    # packaged Mamba2 config holds [BLOCK_M, N] at once and spills at 255 registers: timed faster on the H200 all
    # the same; the packaged GDN config is capped at 168)
    wide = {"mamba2": "num_warps=4,reduce=bcast,bc=inline,BLOCK_M=16,nonflush=chunked,maxnreg=0",
            "gdn": "num_warps=4,reduce=bcast,scores=inline,maxnreg=0,v_loop=1"}
    one = {"mamba2": "num_warps=1,reduce=token,bc=inline,BLOCK_M=16,nonflush=chunked,maxnreg=0",
           "gdn": "num_warps=1,reduce=token,scores=inline,maxnreg=0,v_loop=1"}
    argv = ["--variant", "packaged:", "--variant", "mamba2/cap:maxnreg=168"]
    for fam in ("mamba2", "gdn"):
        argv += ["--variant", f"{fam}/b4:{wide[fam]}", "--variant", f"{fam}/t1:{one[fam]}"]
    r = subprocess.run([sys.executable, "-m", "eval.verify_sass", *argv, "--json", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["git_commit"] and doc["command"].startswith("python -m eval.verify_sass")
    res = {(x["family"], x["variant"]): x for x in doc["variants"]}
    # the packaged GDN config (fp32 state) launches its flush rows apart: a second row, "packaged#2"
    assert set(res) == ({(f, v) for f in ("mamba2", "gdn") for v in ("packaged", "b4", "t1")}
                        | {("mamba2", "cap"), ("gdn", "packaged#2")})
    assert res[("gdn", "packaged#2")]["config"]["flush_rows"] == "separate"
    # a pre-kernel is compiled and counted exactly when the config asks for one (the H200 file's packaged choice),
    # with the first launch of a config that launches the main kernel twice
    pre_name = {"mamba2": ("bc", "_mamba2_verify_bc_kernel"), "gdn": ("scores", "_gdn_verify_scores_kernel")}
    for (fam, var), x in res.items():
        key, kname = pre_name[fam]
        want = {kname} if x["config"][key] == "pre" and "#" not in var else set()
        assert set(x["pre_kernels"]) == want, (fam, var)
        assert x["sass_total"] > 0 and x["regs"] > 0
        if not x["config"].get("maxnreg") and x["config"].get("nonflush") != "stream":
            assert x["spill_st"] == 0 and x["spill_ld"] == 0, (fam, var, x["regs"])
    for fam in ("mamba2", "gdn"):
        b4, t1 = res[(fam, "b4")], res[(fam, "t1")]
        assert b4["num_warps"] == 4 and t1["num_warps"] == 1 and t1["config"]["reduce"] == "token"
        assert b4["programs_bs256"] == t1["programs_bs256"]  # same grid: the tile sizes did not change
        assert t1["issue_us_bs256"] < b4["issue_us_bs256"], (fam, b4["issue_us_bs256"], t1["issue_us_bs256"])
    # maxnreg reaches the compiled kernel: the cap holds (spilling what does not fit)
    cap, pk = res[("mamba2", "cap")], res[("mamba2", "packaged")]
    assert cap["config"]["maxnreg"] == 168 and cap["regs"] <= 168
    assert pk["regs"] <= 168 or cap["regs"] < pk["regs"]
    # the wrapper's grid: tiles x batch x heads (Mamba2: cdiv(P, BLOCK_M) x 256 x 128; GDN: cdiv(V, BV) x 256 x 32)
    for fam, heads, extent in (("mamba2", 128, 64), ("gdn", 32, 128)):
        tiles, rest = divmod(res[(fam, "packaged")]["programs_bs256"], 256 * heads)
        assert rest == 0 and 1 <= tiles <= extent // 16


def test_load_order_names_where_each_load_is_first_read():
    """eval.verify_sass.load_order on a hand-written SASS listing: a load's first reader is the first later
    instruction with its register among the sources (not a later write of it, nor the load's own address), a store
    reads every operand, predicated instructions count, and the branches and exits are listed in place."""
    from eval.gdn_sass import parse_sass
    from eval.verify_sass import load_order

    sass = """
        //## File "/x/k.py", line 10
        /*0000*/                   LDG.E R2, desc[UR4][R2.64] ;
        /*0010*/                   MOV R2, R7 ;
        //## File "/x/k.py", line 11
        /*0020*/              @!P0 EXIT ;
        /*0030*/                   LDG.E R5, desc[UR4][R8.64] ;
        /*0040*/               @P1 LDG.E.128 R12, desc[UR4][R10.64] ;
        //## File "/x/k.py", line 12
        /*0050*/                   FADD R6, R9, R12 ;
        /*0060*/               @P1 STG.E desc[UR4][R4.64], R5 ;
        /*0070*/               @P0 BRA `(.L_x_0) ;
"""
    text = load_order(parse_sass(sass)[0])
    lines = text.splitlines()
    assert len(lines) == 6, text
    assert lines[0].startswith("0x00000  k.py:10") and "first read" not in lines[0]  # R2 is overwritten, never read
    assert "EXIT" in lines[1] and "k.py:11" in lines[1]
    assert lines[2].endswith("-> first read at 0x00060 (k.py:12)")  # R5: the store's value operand
    assert lines[3].endswith("-> first read at 0x00050 (k.py:12)")  # R12: a predicated load, read by the FADD
    assert "STG.E" in lines[4] and "BRA" in lines[5]
