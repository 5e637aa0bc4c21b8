"""Offline sm_90a builds of the verify's conv1d: ours (kernels/conv_verify.py) and SGLang's Triton kernel.

No GPU: both wrappers are called on CPU tensors of a real geometry (Nemotron-H-8B's 10240 conv channels, or
Qwen3-Next's 8192), their Triton kernel swapped for a recorder, and each recorded launch compiled for
``GPUTarget("cuda", 90, 64)`` (the machinery of :mod:`eval.gdn_sass`). Prints registers and the global/shared memory
instructions of each build: how many stores a thread issues and how wide. Must run WITHOUT ``TRITON_INTERPRET``::

    python -m eval.conv_sass [--geometry nemotron-h-8b|qwen3-next-80b] [--configs 256x4 128x4]
"""

from __future__ import annotations

import argparse
import collections
import sys
from typing import Any, Dict, List

from eval.bench_conv import GEOMETRIES, config_tag, make_pool, make_set, parse_config
from eval.gdn_sass import _Recorder, compile_offline, disassemble, parse_sass, ptxas_report

MEM_OPS = ("LDG", "STG", "LDS", "STS", "BAR")


def build(kernel_module, attr: str, call) -> Dict[str, Any]:
    """Registers and memory-instruction counts of the one launch ``call()`` makes of ``kernel_module.attr``."""
    calls: Dict[str, Any] = {}
    saved = getattr(kernel_module, attr)
    setattr(kernel_module, attr, _Recorder(saved, calls))
    try:
        call()
    finally:
        setattr(kernel_module, attr, saved)
    (launch,) = calls.values()
    ck = compile_offline(launch)
    rep = ptxas_report(ck["ptx"])
    insns, _ = parse_sass(disassemble(ck["cubin"]))
    ops = collections.Counter(i["op"] for i in insns if i["op"].startswith(MEM_OPS))
    return {"regs": rep["regs"], "spill_st": rep.get("spill_st"), "warps": ck["num_warps"],
            "instructions": len(insns), "memory_ops": dict(sorted(ops.items()))}


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--geometry", choices=sorted(GEOMETRIES), default="nemotron-h-8b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--configs", type=parse_config, nargs="+", default=[parse_config("256x4")])
    args = ap.parse_args(argv)
    import os

    if os.environ.get("TRITON_INTERPRET"):
        ap.error("run without TRITON_INTERPRET (offline GPU builds)")
    import torch

    import sglang.kernels.ops.mamba.causal_conv1d_triton as sg
    import sglang_replayssm.kernels.conv_verify as cv

    g, B, T = GEOMETRIES[args.geometry], args.batch, args.window
    gen = torch.Generator().manual_seed(0)
    pool = make_pool(g, B + 1, torch.bfloat16, "cpu", gen)
    s = make_set(g, B, T, torch.arange(1, B + 1, dtype=torch.int32), B + 1, torch.bfloat16, "cpu", gen)
    w = torch.randn(g["dim"], g["K"], generator=gen).to(torch.bfloat16)
    bias = torch.randn(g["dim"], generator=gen).to(torch.bfloat16)
    kw = dict(conv_state_indices=s["slots"], intermediate_conv_window=s["win"], intermediate_state_indices=s["rows"])
    rows = [("sglang", build(sg, "_causal_conv1d_update_kernel",
                             lambda: sg.causal_conv1d_update(s["x"], pool, w, bias, "silu", **kw)))]
    for cfg in args.configs:
        rows.append((f"ours {config_tag(cfg)}", build(cv, "_conv1d_verify_kernel", lambda cfg=cfg: cv.conv1d_verify(
            s["x"], pool, w, bias, "silu", launch=cfg, **kw))))
    print(f"{args.geometry} ({g['layout']} layout), batch {B}, T {T}, sm_90a")
    for name, r in rows:
        print(f"  {name:14s} regs {r['regs']:3d} spill {r['spill_st']} warps {r['warps']} insns {r['instructions']:5d} "
              f"{r['memory_ops']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
