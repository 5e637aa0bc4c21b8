"""Offline sm_90a build of the speculative-verify kernels: registers, spills, SASS counts per variant.

No GPU is needed: ``mamba2_verify`` / ``gdn_verify`` are called on CPU tensors of a real geometry
(a batch of 64 rows: the launches of large batches, e.g. GDN's ``v_loop`` kernel) with their Triton
kernel swapped for a recorder, so the launch arguments, constexprs
and launch options are the ones the wrapper passes on a GPU; each launch is compiled offline
for ``GPUTarget("cuda", 90, 64)`` and inspected with the ptxas / nvdisasm bundled with Triton
(the machinery of :mod:`eval.gdn_sass`).  Use it to compare launch-config variants (e.g.
``reduce: bcast`` against ``reduce: token``) before spending GPU time on them.

Must run WITHOUT ``TRITON_INTERPRET``::

    python -m eval.verify_sass                                   # packaged H200 config vs register caps, smaller tile
    python -m eval.verify_sass --family mamba2 --variant w2:reduce=token,num_warps=2
    python -m eval.verify_sass --variant packaged: --variant mamba2/pre:bc=pre,num_warps=1
    python -m eval.verify_sass --json /tmp/verify_sass.json --dump /tmp/verify_sass

``issue us`` is the SASS count per warp (instructions inside runtime loops, found as backward
branches, counted ``--trips`` times) times the warps of a batch-256 launch divided by the H200's
issue rate: a model for comparing variants, not a prediction of a time.  It ignores memory latency;
``warps/SM`` (resident warps allowed by the registers) bounds how many loads are in flight -- the
H200 timed the packaged 255-register kernels at 2.4x (Mamba2) / 1.8x (GDN) their issue bound.
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
# launched before the main kernel by some variants (grid axis 0 runs over the batch)
PRE_KERNELS = {"mamba2": ("_mamba2_verify_bc_kernel",), "gdn": ("_gdn_verify_scores_kernel",)}
# the H200 file (one warp, per-token reductions, pre-kernels: timed 3.46x / 1.74x stock) sits at 255 registers,
# 8 resident warps per SM; the defaults compare it with register caps, a smaller Mamba2 tile and Mamba2's
# one-read non-flush path (the issue model cannot see its gain: more loads in flight, not fewer instructions),
# and Mamba2's per-token reductions over wider column chunks (stream_chunk 32: lost in round 7)
DEFAULT_VARIANTS = ("packaged:", "mamba2/sc32:stream_chunk=32", "mamba2/w2:num_warps=2", "mamba2/w4:num_warps=4",
                    "mamba2/nc64:BLOCK_NC=64", "mamba2/chunked:nonflush=chunked", "gdn/dot224:flush=dot,maxnreg=224,v_loop=1",
                    "gdn/dot255:flush=dot,maxnreg=0,v_loop=1", "gdn/cap184:maxnreg=184,v_loop=1")


def packaged_config(family: str, state_dtype=None) -> Dict[str, Any]:
    """The verify family's geometry-free launch config on the H200: the built-in defaults under the packaged files'
    ``default`` entries and, given ``state_dtype``, their ``default_S<dtype>`` ones (variants are written on top)."""
    import importlib

    from sglang_replayssm.kernels.common import CONFIG_DIR, dtype_tag, launch_config

    importlib.import_module(f"sglang_replayssm.kernels.{FAMILY_KEY[family]}")  # registers the family's defaults
    keys = "default" if state_dtype is None else f"default_S{dtype_tag(state_dtype)}"
    return launch_config(FAMILY_KEY[family], keys, path=str(CONFIG_DIR / "h200.yaml"))


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
            batch: int = 64) -> Dict[str, Any]:
    """The verify launches (kernel name -> fn, grid, args, kwargs) the wrapper makes under ``config``."""
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
    names = (KERNEL[family],) + PRE_KERNELS[family]
    saved = {n: getattr(mod, n) for n in names}
    for n in names:
        setattr(mod, n, _Recorder(saved[n], calls))
    saved_pdl = mod.pdl_on  # the inputs here are CPU tensors: a config's pdl builds as on an sm90 GPU
    mod.pdl_on = lambda want, dev: bool(want)
    try:
        (_call_mamba2 if family == "mamba2" else _call_gdn)(geom, T, hist, state_dtype, act_dtype, batch)
    finally:
        for n in names:
            setattr(mod, n, saved[n])
        mod.pdl_on = saved_pdl
        if prev is None:
            os.environ.pop(ENV_CONFIG_FILE, None)
        else:
            os.environ[ENV_CONFIG_FILE] = prev
    return calls


_GLOBAL_MEM = ("LDG", "STG", "LDGSTS")


def load_order(insns: Sequence[Dict[str, Any]]) -> str:
    """The global loads and stores, exits and branches of a build in program order, each load with the address of
    the first later instruction that reads its destination register (where the warp first waits on it) and the
    source lines of both: how many dependent round trips a program waits on before a given load is issued is read
    off this listing (round 14 of eval/results/spec-variants-h200/README.md). A register is taken as read where it
    appears among an instruction's sources (every operand after the first, or every operand of a store)."""
    import re

    out = []
    for i, ins in enumerate(insns):
        op = ins["op"]
        if not (op.split(".")[0] in _GLOBAL_MEM or op.startswith(("EXIT", "BRA"))):
            continue
        src = f"{Path(ins['file']).name if ins['file'] else '?'}:{ins['line']}"
        body = ins["text"].split("*/", 1)[-1].strip().rstrip(";").strip()
        line = f"{ins['addr']:#07x}  {src:26s} {body}"
        m = re.search(r"\bLDG\S*\s+(R\d+)", body)
        if m and not op.startswith("LDGSTS"):
            reg = m.group(1)
            for later in insns[i + 1:]:
                operands = later["text"].split("*/", 1)[-1].strip().rstrip(";").split(None, 1)
                operands = operands[-1] if len(operands) > 1 else ""  # (a predicated one keeps its opcode here)
                parts = [x.strip() for x in operands.split(",")]
                sources = parts if later["op"].split(".")[0] in ("STG", "STS", "ST") else parts[1:]
                if any(re.search(rf"\b{reg}\b", x) for x in sources):
                    lsrc = f"{Path(later['file']).name if later['file'] else '?'}:{later['line']}"
                    line += f"   -> first read at {later['addr']:#07x} ({lsrc})"
                    break
        out.append(line)
    return "\n".join(out) + "\n"


def loop_instructions(insns: Sequence[Dict[str, Any]], labels: Dict[str, int]) -> int:
    """Instructions inside runtime loops: the address ranges [target, branch] of backward branches."""
    import re

    ranges = []
    for i in insns:
        if i["op"].startswith("BRA"):
            m = re.search(r"(\.L_x_\d+)", i["text"])
            if m and labels.get(m.group(1), i["addr"]) < i["addr"]:
                ranges.append((labels[m.group(1)], i["addr"]))
    return sum(1 for x in insns if any(lo <= x["addr"] <= hi for lo, hi in ranges))


def analyse(family: str, name: str, config: Dict[str, Any], T: int = 4, hist: int = 16, state_dtype=None,
            act_dtype=None, batch_model: int = 256, dump: Optional[Path] = None, trips: float = 7.5) -> List[Dict[str, Any]]:
    import torch

    geom = GEOMETRIES[family]
    calls = capture(family, config, geom, T, hist, state_dtype or torch.float32, act_dtype or torch.bfloat16)
    return [_analyse_launch(family, name if k == KERNEL[family] else name + k[len(KERNEL[family]):], config, calls,
                            calls[k], T, hist, batch_model, dump, trips, with_pre=k == KERNEL[family])
            for k in calls if k.partition("#")[0] == KERNEL[family]]


def _analyse_launch(family, name, config, calls, launch, T, hist, batch_model, dump, trips,
                    with_pre: bool) -> Dict[str, Any]:
    """One launch of the main kernel (a config that launches it twice, e.g. GDN ``flush_rows: separate``, gives two
    rows: ``name`` and ``name#2``); the pre-kernels are the first row's (their issue time added to it alone)."""
    geom = GEOMETRIES[family]
    built = compile_offline(launch)
    rep = ptxas_report(built["ptx"])
    text = disassemble(built["cubin"])
    insns, labels = parse_sass(text)
    in_loops = loop_instructions(insns, labels)
    nw = built["num_warps"]
    heads = geom["H"] if family == "mamba2" else geom["HV"]
    programs = launch["grid"][0] * batch_model * heads
    rate = H200_SMS * SCHEDULERS_PER_SM * H200_CLOCK_HZ
    pre = {}
    for kname in PRE_KERNELS[family]:
        # scale the recorded batch to batch_model (every program as if its row took every branch)
        if kname in calls and with_pre:
            pb = compile_offline(calls[kname])
            pr = ptxas_report(pb["ptx"])
            p_insns, p_labels = parse_sass(disassemble(pb["cubin"]))
            n_pre = len(p_insns) + (trips - 1) * loop_instructions(p_insns, p_labels)
            grid = list(calls[kname]["grid"]) + [1] * (3 - len(calls[kname]["grid"]))
            grid[0] = batch_model
            pre_programs = grid[0] * grid[1] * grid[2]
            pre[kname] = {"regs": pr["regs"], "spill_st": pr.get("spill_st"), "spill_ld": pr.get("spill_ld"),
                         "sass_total": n_pre, "num_warps": pb["num_warps"],
                         "issue_us_bs256": pre_programs * pb["num_warps"] * n_pre / rate * 1e6}
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
        for ext, body in (("ptx", built["ptx"]), ("ttgir", built["ttgir"]), ("sass", text), ("ptxas.log", rep["log"]),
                          ("loads.txt", load_order(insns))):
            (dump / f"{family}-{name}.{ext}").write_text(body)
    main_us = programs * nw * (len(insns) + (trips - 1) * in_loops) / rate * 1e6
    return {"family": family, "variant": name, "config": config, "geometry": geom, "T": T, "history": hist,
            "regs": rep["regs"], "spill_st": rep.get("spill_st"), "spill_ld": rep.get("spill_ld"),
            "stack": rep.get("stack"), "smem": built.get("shared"), "num_warps": nw,
            "warps_per_sm": warps_per_sm(rep["regs"] or 255, nw), "sass_total": len(insns),
            "sass_in_loops": in_loops, "loop_trips_assumed": trips,
            "ops": opcode_counts(insns), "programs_bs256": programs, "pre_kernels": pre,
            "issue_us_bs256": main_us + sum(p["issue_us_bs256"] for p in pre.values())}


def table(results: Sequence[Dict[str, Any]]) -> str:
    from eval import report

    head = ["family", "variant", "regs", "spill st/ld", "stack", "smem", "warps/SM", "SASS (in loops)", "FFMA/FMUL/FADD",
            "SHFL", "LDG/STG", "LDS/STS", "BAR", "pre-kernel us", "issue us bs256"]
    rows = []
    for r in results:
        o = r["ops"].get
        rows.append([r["family"], r["variant"], r["regs"], f'{r["spill_st"]}/{r["spill_ld"]}', r["stack"], r["smem"],
                     r["warps_per_sm"], f'{r["sass_total"]} ({r["sass_in_loops"]})', f'{o("FFMA", 0)}/{o("FMUL", 0)}/{o("FADD", 0)}',
                     o("SHFL", 0), f'{o("LDG", 0)}/{o("STG", 0)}', f'{o("LDS", 0)}/{o("STS", 0)}', o("BAR", 0),
                     f'{sum(p["issue_us_bs256"] for p in r["pre_kernels"].values()):.0f}' if r["pre_kernels"] else "-",
                     f'{r["issue_us_bs256"]:.0f}'])
    return report.text_table(head, rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.verify_sass", description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=("mamba2", "gdn", "all"), default="all")
    ap.add_argument("--variant", action="append", default=None,
                    help="[family/]name:key=val,... on top of the packaged H200 config "
                         "(default: packaged, w1-token, w1-bcast)")
    ap.add_argument("--window", type=int, default=4, help="verify window T")
    ap.add_argument("--history", type=int, default=16, help="history block (ring R = history + T)")
    ap.add_argument("--trips", type=float, default=7.5, help="trip count assumed for runtime loops")
    ap.add_argument("--state-dtype", choices=("fp32", "bf16", "fp16"), default="fp32", help="checkpoint dtype")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None, help="Markdown report (table, and measured times with --measured)")
    ap.add_argument("--measured", default=None,
                    help="an eval.bench_spec result JSON: its batch-256 fp32 times are set beside the issue bound")
    ap.add_argument("--dump", default=None, help="directory for ptx/ttgir/sass/ptxas logs and each build's global "
                                                 "loads with where they are first read (<family>-<variant>.loads.txt)")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("eval.verify_sass compiles for sm_90a: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    import torch

    state_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.state_dtype]
    families = ("mamba2", "gdn") if args.family == "all" else (args.family,)
    results: List[Dict[str, Any]] = []
    for fam in families:
        base = packaged_config(fam, state_dtype)
        for spec in args.variant or DEFAULT_VARIANTS:
            only, sep, rest = spec.partition("/")
            if sep and ":" not in only:  # "mamba2/name:key=val": this family only
                if only != fam:
                    continue
                spec = rest
            name, cfg = parse_variant(spec, base)
            results.extend(analyse(fam, name, cfg, args.window, args.history, state_dtype=state_dtype,
                                   dump=Path(args.dump) if args.dump else None, trips=args.trips))
    header = (f"verify kernels, T={args.window}, history {args.history}, state {args.state_dtype}, act bf16, "
              "sm_90a offline")
    if args.md:
        Path(args.md).write_text(markdown(header, results, args.measured))
    import triton

    from eval.bench_common import git_commit

    doc = {"schema": "replayssm-verify-sass/1", "git_commit": git_commit(), "triton": triton.__version__,
           "command": "python -m eval.verify_sass " + " ".join(sys.argv[1:]),
           "measured_bs256": measured_bs256(args.measured) if args.measured else None, "variants": results}
    return emit(header, table(results), doc, args.json)


def measured_bs256(path: str) -> Dict[str, Dict[str, float]]:
    """family -> {ours_us, stock_us, bw_fraction, git_commit} of the batch-256 fp32 cases of a bench_spec JSON."""
    from eval import report

    doc = report.read_json(Path(path))
    out = {}
    for c in doc.get("cases", []):
        if c.get("batch") == 256 and c.get("state_dtype") == "fp32" and c.get("t_ours_us"):
            out[c["family"]] = {"ours_us": c["t_ours_us"], "stock_us": c.get("t_stock_us"),
                                "bw_fraction": c.get("bw_fraction"), "source": f"{path} ({doc.get('git_commit')})"}
    return out


def markdown(header: str, results: Sequence[Dict[str, Any]], measured: Optional[str]) -> str:
    from eval import report

    lines = ["# Verify kernels, offline sm_90a analysis (no GPU)", "", header + ".", "",
             "`python -m eval.verify_sass " + " ".join(sys.argv[1:]) + "`", "",
             "`issue us bs256` = SASS per warp x warps of a batch-256 launch / the H200's issue rate "
             f"({H200_SMS} SMs x {SCHEDULERS_PER_SM} schedulers x {H200_CLOCK_HZ / 1e9:.2f} GHz), pre-kernels "
             f"included; instructions inside runtime loops (backward branches) count {results[0]['loop_trips_assumed']} "
             "times (the mean committed history of the accept-3 cycle, wp = 3, 6, 9, 12). A model for comparing "
             "variants, not a time.", "", "```", table(results), "```", ""]
    if measured:
        meas = measured_bs256(measured)
        lines += ["## Beside the H200 measurement", ""]
        for fam, m in meas.items():
            pk = next((r for r in results if r["family"] == fam and r["variant"] == "packaged"), None)
            bound = pk["issue_us_bs256"] if pk else None
            lines.append(f"- {fam}: packaged config measured {report.fmt(m['ours_us'], 0)} us per layer and step "
                         f"({report.fmt(100 * (m['bw_fraction'] or 0), 1)}% of copy bandwidth; SGLang's verify "
                         f"{report.fmt(m['stock_us'], 0)} us), issue bound {report.fmt(bound, 0)} us: measured / bound "
                         f"= {report.fmt(report.ratio(m['ours_us'], bound), 2)}. Source: {m['source']}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
