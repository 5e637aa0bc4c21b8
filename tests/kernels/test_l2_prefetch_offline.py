"""``l2_prefetch`` of the Mamba2 decode kernel, built offline for sm_90a (Triton's bundled ptxas / nvdisasm, no GPU;
the verify kernels' builds are in test_verify_offline.py).

A subprocess without TRITON_INTERPRET (the conftest sets it in this process when there is no GPU) calls
``mamba2_replay_decode`` on CPU tensors of Nemotron-H-8B (bf16 state, batch 64) with its kernels swapped for the
recorder of ``eval/gdn_sass.py`` and builds the recorded main-kernel launch with the option off and on: on, the
build holds three warp-uniform bulk L2 prefetches (checkpoint tile, x ring, Δ ring) and nothing else changes that a
program waits on (same registers, same global loads); with ``flush_first`` (whose launch walks heads first) the
prefetched program is a later rank's, whose row and slot take two more loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import collections, json, os, sys, tempfile
import torch
from eval import bench_common as bc
from eval.gdn_sass import _Recorder, compile_offline, disassemble, parse_sass, ptxas_report
from sglang_replayssm.kernels import mamba2_replay as mr
from sglang_replayssm.kernels.common import ENV_CONFIG_FILE

out = {}
for name, entry in (("off", "{}"), ("on", "{l2_prefetch: 256}"), ("off_ff", "{flush_first_max_batch: 512}"),
                    ("ff", "{l2_prefetch: 256, flush_first_max_batch: 512}")):
    f = os.path.join(tempfile.mkdtemp(), "cfg.yaml")
    open(f, "w").write("mamba2_output_only:\n  default: " + entry + "\n")
    os.environ[ENV_CONFIG_FILE] = f
    w = bc.Mamba2Work(bc.MAMBA2_GEOMETRIES["nemotron-h-8b"], 64, 16, "bf16", "cpu", 1, 0)
    calls = {}
    saved = {n: getattr(mr, n) for n in ("_mamba2_replay_kernel", "_mamba2_bc_kernel")}
    for n, fn in saved.items():
        setattr(mr, n, _Recorder(fn, calls))
    try:
        w.ours_fn(mr.mamba2_replay_decode, 0, 14)()
    finally:
        for n, fn in saved.items():
            setattr(mr, n, fn)
    launch = calls["_mamba2_replay_kernel"]
    built = compile_offline(launch)
    rep = ptxas_report(built["ptx"])
    insns, _ = parse_sass(disassemble(built["cubin"]))
    ops = collections.Counter(i["op"].split(".")[0] for i in insns)
    out[name] = {"regs": rep["regs"], "ldg": ops["LDG"], "ublkpf": ops["UBLKPF"],
                 "pf": launch["kwargs"]["PF"], "pf_dist": launch["kwargs"]["pf_dist"],
                 "pf_st_bytes": launch["kwargs"]["pf_st_bytes"]}
print(json.dumps(out))
"""


def _bundled(tool: str) -> bool:
    import triton

    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool).is_file()


@pytest.mark.skipif(not (_bundled("ptxas") and _bundled("nvdisasm")), reason="Triton's bundled ptxas/nvdisasm")
def test_mamba2_decode_l2_prefetch_build():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    off, on, off_ff, ff = res["off"], res["on"], res["off_ff"], res["ff"]
    # 2 P blocks x 64 rows = 128 programs a head: 256 programs ahead is 2 heads; the bf16 tile [32, 128] is 8 KiB
    assert on["pf"] and on["pf_dist"] == 2 and on["pf_st_bytes"] == 32 * 128 * 2
    assert on["ublkpf"] == 3 and off["ublkpf"] == 0 and not off["pf"]
    assert on["regs"] == off["regs"] and on["ldg"] == off["ldg"]
    # flush first: 2 P blocks x 128 heads = 256 programs a rank, so 256 programs ahead is the next rank
    assert ff["pf"] and ff["pf_dist"] == 1 and ff["ublkpf"] == 3 and ff["ldg"] == off_ff["ldg"] + 2
