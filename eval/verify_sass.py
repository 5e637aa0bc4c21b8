"""Offline sm_90a build of the speculative-verify kernels: registers, spills, SASS counts per variant.

No GPU is needed: ``mamba2_verify`` / ``gdn_verify`` are called on small CPU tensors of a real
geometry with their Triton kernel swapped for a recorder, so the launch arguments, constexprs
and launch options are the ones the wrapper passes on a GPU; each launch is compiled offline
for ``GPUTarget("cuda", 90, 64)`` and inspected with the ptxas / nvdisasm bundled with Triton
(the machinery of :mod:`eval.gdn_sass`).  Use it to compare launch-config variants (e.g.
``reduce: bcast`` against ``reduce: token``) before spending GPU time on them.

Must run WITHOUT ``TRITON_INTERPRET``::

    python -m eval.verify_sass                                   # packaged H200 config vs one-warp variants
    python -m eval.verify_sass --family mamba2 --variant w2:reduce=token,num_warps=2
    python -m eval.verify_sass --json /tmp/verify_sass.json --dump /tmp/verify_sass

``issue us`` is the static SASS count times the warps of a batch-256 launch divided by the H200's
issue rate: a lower bound for straight-line code (runtime loops, such as GDN's history loop, run
their body more than once), meant for comparing variants, not for predicting a time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from eval.gdn_sass import (H200_CLOCK_HZ, H200_SMS, SCHEDULERS_PER_SM, _Recorder, compile_offline, disassemble,
                           emit, opcode_counts, parse_sass, parse_variant, ptxas_report, warps_per_sm)

GEOMETRIES = {
    "mamba2": {"name": "nemotron-h-8b", "H": 128, "P": 64, "N": 128, "G": 8},
    "gdn": {"name": "qwen3-next-80b", "HV": 32, "Hk": 16, "K": 128, "V": 128},
}
FAMILY_KEY = {"mamba2": "mamba2_verify", "gdn": "gdn_verify"}
KERNEL = {"mamba2": "_mamba2_verify_kernel", "gdn": "_gdn_verify_kernel"}
DEFAULT_VARIANTS = ("packaged:", "w1-token:reduce=token,num_warps=1", "w1-bcast:num_warps=1")


def packaged_config(family: str) -> Dict[str, Any]:
    """The verify family's ``default`` entry of the packaged H200 file (empty when it has none)."""
    import yaml

    from sglang_replayssm.kernels.common import CONFIG_DIR

    section = (yaml.safe_load((CONFIG_DIR / "h200.yaml").read_text()) or {}).get(FAMILY_KEY[family]) or {}
    return dict(section.get("default") or {})


def _call_mamba2(geom, T, hist, state_dtype, act_dtype, batch):
    import torch

    from sglang_replayssm.kernels.mamba2_verify import mamba2_verify

    H, P, N, G = geom["H"], geom["P"], geom["N"], geom["G"]
    R, S = hist + T, batch + 2
    g = torch.Generator().manual_seed(0)
    r = lambda *shape, dt=act_dtype: torch.randn(*shape, generator=g).to(dt)  # noqa: E731
    cursors = [torch.full((S,), v, dtype=torch.int32) for v in (3, 0, 0)]
    mamba2_verify(torch.zeros(S, H, P, N, dtype=state_dtype), torch.zeros(S, H, R, P, dtype=act_dtype),
                  torch.zeros(S, G, R, N, dtype=act_dtype), torch.zeros(S, H, R), r(batch, T, H, P),
                  r(batch, T, H), -torch.rand(H, generator=g), r(batch, T, G, N), r(batch, T, G, N),
                  torch.arange(1, batch + 1, dtype=torch.int32), *cursors,
                  D=r(H, dt=torch.float32), z=r(batch, T, H, P), dt_bias=r(H, dt=torch.float32))


def _call_gdn(geom, T, hist, state_dtype, act_dtype, batch):
    import torch

    from sglang_replayssm.kernels.gdn_verify import gdn_verify

    HV, Hk, K, V = geom["HV"], geom["Hk"], geom["K"], geom["V"]
    R, S = hist + T, batch + 2
    g = torch.Generator().manual_seed(0)
    cursors = [torch.full((S,), v, dtype=torch.int32) for v in (3, 0, 0)]
    gdn_verify(torch.randn(batch, T, 2 * Hk * K + HV * V, generator=g).to(act_dtype),
               torch.randn(batch, T, HV, generator=g).to(act_dtype), torch.randn(batch, T, HV, generator=g).to(act_dtype),
               torch.rand(HV, generator=g), torch.rand(HV, generator=g).to(act_dtype),
               torch.zeros(S, HV, V, K, dtype=state_dtype), torch.zeros(S, HV, R, V, dtype=state_dtype),
               torch.zeros(S, Hk, R, K, dtype=act_dtype), torch.zeros(S, HV, R),
               torch.arange(1, batch + 1, dtype=torch.int32), *cursors)


def capture(family: str, config: Dict[str, Any], geom: Dict[str, int], T: int, hist: int, state_dtype, act_dtype,
            batch: int = 4) -> Dict[str, Any]:
    """The verify kernel launch (fn, grid, args, kwargs) the wrapper makes under ``config``."""
    import yaml

    from sglang_replayssm.kernels import gdn_verify as gv
    from sglang_replayssm.kernels import mamba2_verify as mv
    from sglang_replayssm.kernels.common import ENV_CONFIG_FILE

    mod = mv if family == "mamba2" else gv
    tmp = Path(tempfile.mkdtemp(prefix="verify-sass-")) / "cfg.yaml"
    tmp.write_text(yaml.safe_dump({FAMILY_KEY[family]: {"default": dict(config)}}))
    prev = os.environ.get(ENV_CONFIG_FILE)
    os.environ[ENV_CONFIG_FILE] = str(tmp)
    calls: Dict[str, Any] = {}
    saved = getattr(mod, KERNEL[family])
    setattr(mod, KERNEL[family], _Recorder(saved, calls))
    try:
        (_call_mamba2 if family == "mamba2" else _call_gdn)(geom, T, hist, state_dtype, act_dtype, batch)
    finally:
        setattr(mod, KERNEL[family], saved)
        if prev is None:
            os.environ.pop(ENV_CONFIG_FILE, None)
        else:
            os.environ[ENV_CONFIG_FILE] = prev
    return calls[KERNEL[family]]


def analyse(family: str, name: str, config: Dict[str, Any], T: int = 4, hist: int = 16, state_dtype=None,
            act_dtype=None, batch_model: int = 256, dump: Optional[Path] = None) -> Dict[str, Any]:
    import torch

    geom = GEOMETRIES[family]
    launch = capture(family, config, geom, T, hist, state_dtype or torch.float32, act_dtype or torch.bfloat16)
    built = compile_offline(launch)
    rep = ptxas_report(built["ptx"])
    text = disassemble(built["cubin"])
    insns, _ = parse_sass(text)
    nw = built["num_warps"]
    programs = launch["grid"][0] * batch_model * (geom["H"] if family == "mamba2" else geom["HV"])
    rate = H200_SMS * SCHEDULERS_PER_SM * H200_CLOCK_HZ
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
        for ext, body in (("ptx", built["ptx"]), ("ttgir", built["ttgir"]), ("sass", text), ("ptxas.log", rep["log"])):
            (dump / f"{family}-{name}.{ext}").write_text(body)
    return {"family": family, "variant": name, "config": config, "geometry": geom, "T": T, "history": hist,
            "regs": rep["regs"], "spill_st": rep.get("spill_st"), "spill_ld": rep.get("spill_ld"),
            "stack": rep.get("stack"), "smem": built.get("shared"), "num_warps": nw,
            "warps_per_sm": warps_per_sm(rep["regs"] or 255, nw), "sass_total": len(insns),
            "ops": opcode_counts(insns), "programs_bs256": programs,
            "issue_us_bs256": programs * nw * len(insns) / rate * 1e6}


def table(results: Sequence[Dict[str, Any]]) -> str:
    from eval import report

    head = ["family", "variant", "regs", "spill st/ld", "stack", "smem", "warps/SM", "SASS", "FFMA/FMUL/FADD",
            "SHFL", "LDG/STG", "LDS/STS", "BAR", "issue us bs256"]
    rows = []
    for r in results:
        o = r["ops"].get
        rows.append([r["family"], r["variant"], r["regs"], f'{r["spill_st"]}/{r["spill_ld"]}', r["stack"], r["smem"],
                     r["warps_per_sm"], r["sass_total"], f'{o("FFMA", 0)}/{o("FMUL", 0)}/{o("FADD", 0)}',
                     o("SHFL", 0), f'{o("LDG", 0)}/{o("STG", 0)}', f'{o("LDS", 0)}/{o("STS", 0)}', o("BAR", 0),
                     f'{r["issue_us_bs256"]:.0f}'])
    return report.text_table(head, rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.verify_sass", description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=("mamba2", "gdn", "all"), default="all")
    ap.add_argument("--variant", action="append", default=None,
                    help="name:key=val,... on top of the packaged H200 config (default: packaged, w1-token, w1-bcast)")
    ap.add_argument("--window", type=int, default=4, help="verify window T")
    ap.add_argument("--history", type=int, default=16, help="history block (ring R = history + T)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dump", default=None, help="directory for ptx/ttgir/sass/ptxas logs")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("eval.verify_sass compiles for sm_90a: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    families = ("mamba2", "gdn") if args.family == "all" else (args.family,)
    results: List[Dict[str, Any]] = []
    for fam in families:
        base = packaged_config(fam)
        for spec in args.variant or DEFAULT_VARIANTS:
            name, cfg = parse_variant(spec, base)
            results.append(analyse(fam, name, cfg, args.window, args.history,
                                   dump=Path(args.dump) if args.dump else None))
    return emit(f"verify kernels, T={args.window}, history {args.history}, state fp32, act bf16, sm_90a offline",
                table(results), results, args.json)


if __name__ == "__main__":
    sys.exit(main())
