"""Where the GDN decode kernels wait under ``pdl``, in offline sm_90 builds (no GPU; Triton's bundled ptxas is not
needed, only its PTX): with ``pdl_wait: start`` the wait is the first thing a program does; with ``scores`` loads
(the checkpoint tile's) come before the live rows' wait, and no global store comes before any wait. The build runs
in a subprocess without TRITON_INTERPRET, as eval/gdn_sass.py needs. On the GPU the same launches run for real in
test_gdn_replay.py; this file is what the CPU can say about the order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json, sys, torch
from eval.gdn_sass import _Recorder, capture, compile_offline
from sglang_replayssm.kernels import gdn_replay as gr

gr.pdl_on = lambda want, dev: bool(want)  # built as on sm90
BF16 = torch.bfloat16


def order(ptx):
    lines = ptx.splitlines()
    waits = [i for i, x in enumerate(lines) if "griddepcontrol.wait" in x]
    loads = [i for i, x in enumerate(lines) if "ld.global" in x]
    stores = [i for i, x in enumerate(lines) if "st.global" in x]
    return {"waits": waits, "first_load": loads[0] if loads else None, "first_store": stores[0] if stores else None,
            "loads_before_last_wait": sum(i < waits[-1] for i in loads) if waits else None}


GDN = {"HV": 4, "Hk": 2, "K": 32, "V": 32}
out = {}
for wait in ("start", "scores"):
    base = {"scores": "pre", "pdl": 1, "pdl_wait": wait, "flush_first_max_batch": 64, "BV": 16}
    for name, extra in (("gdn-whole", {"BKC": 0}), ("gdn-kchunk", {"BKC": 16})):
        calls = capture(dict(base, **extra), GDN, 8, torch.float32, BF16, batch=4)
        main = calls.get("_gdn_replay_decode_kchunk_kernel") or calls["_gdn_replay_decode_kernel"]
        out[f"{name}-{wait}"] = order(compile_offline(main)["ptx"])
print(json.dumps(out))
'''


def test_late_wait_follows_the_tile_loads_and_precedes_every_store(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for kernel in ("gdn-whole", "gdn-kchunk"):
        start, late = res[f"{kernel}-start"], res[f"{kernel}-scores"]
        # start: one wait, ahead of every load and store
        assert len(start["waits"]) == 1 and start["waits"][0] < start["first_load"] < start["first_store"], start
        # scores: a wait on the dead rows' path and one on each live path, loads ahead of the last, every store
        # behind the first
        assert len(late["waits"]) >= 2 and late["loads_before_last_wait"] > 0, late
        assert late["first_store"] > late["waits"][0], late
