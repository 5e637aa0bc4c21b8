"""Shared by the tests that build SGLang's own model classes on the CPU in a subprocess (test_ab_eagle.py,
test_pinned_token.py): the subprocess's environment and run, and SGLang's single-rank gloo parallel state."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_worker(test_file: str, out: Path) -> Any:
    """``python <test_file> --worker <out>`` without the package's and the harness's variables and plugins; returns
    the JSON the worker wrote (the subprocess's output is in the assertion message when it fails)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))}
    env.pop("SGLANG_PLUGINS", None)
    env.update(OMP_NUM_THREADS="1", TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(REPO)] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
    r = subprocess.run([sys.executable, test_file, "--worker", str(out)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(Path(out).read_text())


def init_cpu_rank() -> None:
    """SGLang's parallel state for one CPU rank (gloo, no NCCL, its CPU rotary path)."""
    os.environ["SGLANG_NCCL_SO_PATH"] = "/nonexistent/libnccl.so.2"  # no NCCL on CPU
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.layers.rotary_embedding import base as rope_base

    rope_base._is_cpu = True  # SGLang's CPU rotary path (this machine is not its AMX CPU target)
    ps.set_custom_all_reduce(False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                    distributed_init_method=f"tcp://127.0.0.1:{port}")
    ps.initialize_model_parallel(tensor_model_parallel_size=1, backend="gloo")
