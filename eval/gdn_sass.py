"""Offline sm_90a build of the GDN decode kernel: registers, spills and SASS counts.

No GPU is needed (and none is touched): the wrapper ``gdn_replay_decode`` is called on
small CPU tensors of the requested geometry with its two Triton kernels swapped for
recorders, so the launch arguments, constexprs and launch options are exactly the
ones the wrapper would pass on a GPU.  Each recorded launch is then specialised the
way Triton's launcher does it (``JITFunction`` binder + ``_pack_args``: pointer and
integer divisibility by 16, integer arguments equal to 1 as constants) and compiled
with ``triton.compile`` for ``GPUTarget("cuda", 90, 64)``.  The bundled ``ptxas``
(``-lineinfo -v --gpu-name=sm_90a``, as Triton runs it) reports registers and spills;
the bundled ``nvdisasm -c -gi`` gives the SASS with source lines.

The SASS is split at the conditional branch of ``if is_flush:`` in ``_tile_finish``
(found by its source line): ``common`` (everything up to that branch: loads, the
output pass, the output store), ``flush`` (the fall-through block: state rebuild and
store) and ``nonflush`` (the branch target onwards: d append, g/k append, exits).

Must run in a process WITHOUT ``TRITON_INTERPRET`` (it is refused)::

    python -m eval.gdn_sass                                  # tuned H200 config, rank1 / dot / cvt
    python -m eval.gdn_sass --variant dot:flush=dot --variant cap128:maxnreg=128
    python -m eval.gdn_sass --json /tmp/gdn_sass.json --dump /tmp/gdn_sass   # + ptx/sass files

Issue model (printed as ``issue_us``): warp instructions of a launch where every row is
in the same phase, divided by the H200's issue rate (132 SMs x 4 schedulers x 1.98 GHz);
a lower bound on the time the SMs spend issuing, to put beside the DRAM time of the
bytes moved.  ``warps/SM`` is the register-limited residency (65536 registers per SM,
allocated per warp in units of 256; at most 64 warps and 32 CTAs per SM).
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

H200_SMS = 132
H200_CLOCK_HZ = 1.98e9
SCHEDULERS_PER_SM = 4
REGS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
MAX_CTAS_PER_SM = 32

GEOMETRIES = {
    "qwen3-next": dict(HV=32, Hk=16, K=128, V=128),
    "qwen3.5-122b": dict(HV=64, Hk=16, K=128, V=128),
}
DEFAULT_VARIANTS = ("rank1:flush=rank1", "rank1-cvt:flush=rank1,cast=cvt", "dot:flush=dot")


# ---------------------------------------------------------------------------------
# capture the wrapper's launches
# ---------------------------------------------------------------------------------
class _Recorder:
    def __init__(self, fn, calls: Dict[str, Any]):
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):  # a kernel's second launch in one call is recorded as "<name>#2", ...
            name, n = self.fn.__name__, 1
            while (name if n == 1 else f"{name}#{n}") in self.calls:
                n += 1
            self.calls[name if n == 1 else f"{name}#{n}"] = dict(fn=self.fn, grid=grid, args=args, kwargs=kwargs)

        return launch


def tuned_config(path: Optional[str] = None, key: Optional[str] = None, state: Optional[str] = None
                 ) -> Dict[str, Any]:
    """The gdn_decode entry of a per-GPU YAML: ``default``, then ``key``, then ``key_S{state}`` (the state
    dtype's entry, as the wrapper resolves it)."""
    import yaml

    from sglang_replayssm.kernels.common import CONFIG_DIR

    p = Path(path) if path else CONFIG_DIR / "h200.yaml"
    section = (yaml.safe_load(p.read_text()) or {}).get("gdn_decode") or {}
    cfg = dict(section.get("default") or {})
    for k in ([key] + ([f"{key}_S{state}"] if state else [])) if key else []:
        if section.get(k):
            cfg.update(section[k])
    return cfg


def capture(config: Dict[str, Any], geom: Dict[str, int], L: int, state_dtype, act_dtype, w: int = 3,
            batch: int = 4) -> Dict[str, Dict[str, Any]]:
    """Launches (kernel name -> fn, grid, args, kwargs) the wrapper makes under ``config``."""
    import torch
    import yaml

    from sglang_replayssm.kernels import gdn_replay as gr
    from sglang_replayssm.kernels.common import ENV_CONFIG_FILE

    tmp = Path(tempfile.mkdtemp(prefix="gdn-sass-")) / "cfg.yaml"
    tmp.write_text(yaml.safe_dump({"gdn_decode": {"default": dict(config)}}))
    prev = os.environ.get(ENV_CONFIG_FILE)
    os.environ[ENV_CONFIG_FILE] = str(tmp)
    calls: Dict[str, Any] = {}
    saved = gr._gdn_replay_decode_kernel, gr._gdn_history_scores_kernel, gr._gdn_replay_decode_kchunk_kernel
    gr._gdn_replay_decode_kernel = _Recorder(saved[0], calls)
    gr._gdn_history_scores_kernel = _Recorder(saved[1], calls)
    gr._gdn_replay_decode_kchunk_kernel = _Recorder(saved[2], calls)
    try:
        HV, Hk, K, V = geom["HV"], geom["Hk"], geom["K"], geom["V"]
        S, B = batch + 2, batch
        g = torch.Generator().manual_seed(0)
        mq = torch.randn(B, 2 * Hk * K + HV * V, generator=g).to(act_dtype)
        a = torch.randn(B, HV, generator=g).to(act_dtype)
        b = torch.randn(B, HV, generator=g).to(act_dtype)
        A_log = torch.rand(HV, generator=g)
        dt_bias = torch.rand(HV, generator=g).to(act_dtype)
        state = torch.zeros(S, HV, V, K, dtype=state_dtype)
        d_ring = torch.zeros(S, HV, L, V, dtype=state_dtype)
        k_ring = torch.zeros(S, Hk, L, K, dtype=act_dtype)
        g_ring = torch.zeros(S, HV, L, dtype=torch.float32)
        idx = torch.arange(1, B + 1, dtype=torch.int32)
        wp = torch.full((B,), w, dtype=torch.int32)
        out = torch.empty(B, 1, HV, V, dtype=act_dtype)  # the layout SGLang's backend passes
        gr.gdn_replay_decode(mq, a, b, A_log, dt_bias, state, d_ring, k_ring, g_ring, idx, wp, out=out)
    finally:
        gr._gdn_replay_decode_kernel, gr._gdn_history_scores_kernel, gr._gdn_replay_decode_kchunk_kernel = saved
        if prev is None:
            os.environ.pop(ENV_CONFIG_FILE, None)
        else:
            os.environ[ENV_CONFIG_FILE] = prev
    return calls


# ---------------------------------------------------------------------------------
# compile and inspect
# ---------------------------------------------------------------------------------
def _nvidia_bin(name: str) -> str:
    import triton

    p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not p.is_file():
        raise FileNotFoundError(f"{p} (bundled with Triton) not found")
    return str(p)


def compile_offline(launch: Dict[str, Any], capability: int = 90) -> Dict[str, Any]:
    """PTX, cubin and ttgir of one recorded launch, specialised like Triton's launcher."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn, args, kwargs = launch["fn"], launch["args"], dict(launch["kwargs"])
    target = GPUTarget("cuda", capability, 64)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, opts)
    src = ASTSource(fn, signature, constexprs, attrs)
    ck = triton.compile(src, target=target, options=options.__dict__)
    if "ptx" not in ck.asm:  # a hit in a cache kept without the text IRs (the carried JIT caches): compile afresh
        old = os.environ.get("TRITON_CACHE_DIR")
        with tempfile.TemporaryDirectory() as d:
            os.environ["TRITON_CACHE_DIR"] = d
            try:
                ck = triton.compile(src, target=target, options=options.__dict__)
            finally:
                if old is None:
                    os.environ.pop("TRITON_CACHE_DIR", None)
                else:
                    os.environ["TRITON_CACHE_DIR"] = old
    return {"ptx": ck.asm["ptx"], "cubin": ck.asm["cubin"], "ttgir": ck.asm.get("ttgir", ""),
            "num_warps": options.num_warps, "shared": getattr(ck.metadata, "shared", None)}


def ptxas_report(ptx: str, arch: str = "sm_90a") -> Dict[str, Any]:
    """Registers / spills / stack / shared memory of the kernel in ``ptx``."""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        r = subprocess.run([_nvidia_bin("ptxas"), "-lineinfo", "-v", f"--gpu-name={arch}", str(src),
                            "-o", str(Path(d) / "k.cubin")], capture_output=True, text=True, check=True)
    log = r.stdout + r.stderr
    out: Dict[str, Any] = {"log": log}
    m = re.search(r"Used (\d+) registers", log)
    out["regs"] = int(m.group(1)) if m else None
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if m:
        out["stack"], out["spill_st"], out["spill_ld"] = (int(x) for x in m.groups())
    m = re.search(r"(\d+) bytes smem", log)
    out["smem"] = int(m.group(1)) if m else 0
    return out


def disassemble(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.cubin"
        f.write_bytes(cubin)
        r = subprocess.run([_nvidia_bin("nvdisasm"), "-c", "-gi", str(f)], capture_output=True, text=True,
                           check=True)
    return r.stdout


_INSN = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")
_LINE = re.compile(r'\s*//## File "([^"]+)", line (\d+)')
_LABEL = re.compile(r"^(\.L_x_\d+):")


def parse_sass(text: str) -> Tuple[List[Dict[str, Any]], Dict[str, int]]:
    """Instructions (address, opcode, predicated, source file/line, text) and label addresses."""
    insns, labels, pending = [], {}, []
    src = (None, None)
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            src = (m.group(1), int(m.group(2)))
            continue
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSN.match(line)
        if m:
            addr = int(m.group(1), 16)
            for lab in pending:
                labels[lab] = addr
            pending = []
            insns.append(dict(addr=addr, op=m.group(3), pred=bool(m.group(2)), file=src[0], line=src[1],
                              text=line.strip()))
    return insns, labels


def flush_branch_line(kchunk: bool = False) -> Tuple[str, int]:
    """(file, line) of ``if is_flush:`` in gdn_replay._tile_finish (the whole-tile kernel) or in
    _gdn_replay_decode_kchunk_kernel (``kchunk``: launch option BKC > 0)."""
    from sglang_replayssm.kernels import gdn_replay as gr

    jit = gr._gdn_replay_decode_kchunk_kernel if kchunk else gr._tile_finish
    fn = jit.fn if hasattr(jit, "fn") else jit
    lines, start = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if text.strip().startswith("if is_flush"):
            return inspect.getsourcefile(fn), start + i
    raise RuntimeError(f"no 'if is_flush' line in {fn.__name__}")


def split_regions(insns: List[Dict[str, Any]], labels: Dict[str, int], branch_at: Tuple[str, int]
                  ) -> Dict[str, List[Dict[str, Any]]]:
    """common / flush / nonflush instruction lists (see the module docstring)."""
    fname, line = branch_at
    # compare file names, not paths: a kernel from Triton's cache keeps the line info of the
    # checkout that first compiled it (same source hash, another directory)
    br = next((i for i in insns if i["op"] == "BRA" and i["pred"] and i["line"] == line
               and os.path.basename(i["file"]) == os.path.basename(fname)), None)
    if br is None:
        return {"all": insns}
    lab = re.search(r"\((\.L_x_\d+)\)", br["text"]).group(1)
    tgt = labels[lab]
    return {"common": [i for i in insns if i["addr"] <= br["addr"]],
            "flush": [i for i in insns if br["addr"] < i["addr"] < tgt],
            "nonflush": [i for i in insns if i["addr"] >= tgt]}


def opcode_counts(insns: Sequence[Dict[str, Any]]) -> Dict[str, int]:
    """Counts per base opcode (LDG.E.128 -> LDG) plus LDG/STG split by width."""
    c = collections.Counter(i["op"].split(".")[0] for i in insns)
    for i in insns:
        if i["op"].startswith(("LDG", "STG", "LDS", "STS")):
            width = next((p for p in i["op"].split(".")[1:] if p in ("64", "128", "U16", "U8")), "32")
            c[f'{i["op"].split(".")[0]}.{width}'] += 1
    return dict(c)


def warps_per_sm(regs: int, num_warps: int) -> int:
    per_warp = math.ceil(max(regs, 1) * 32 / 256) * 256
    by_regs = REGS_PER_SM // per_warp
    ctas = min(MAX_CTAS_PER_SM, by_regs // num_warps, MAX_WARPS_PER_SM // num_warps)
    return ctas * num_warps


# ---------------------------------------------------------------------------------
# one variant
# ---------------------------------------------------------------------------------
KEY_OPS = ("FFMA", "FMUL", "FADD", "SHFL", "LDG", "STG", "LDS", "STS", "CS2R", "BRA", "MUFU")


def analyse(name: str, config: Dict[str, Any], geom: Dict[str, int], L: int, state_dtype, act_dtype,
            batch_model: int = 256, dump: Optional[Path] = None) -> Dict[str, Any]:
    calls = capture(config, geom, L, state_dtype, act_dtype)
    kchunk = "_gdn_replay_decode_kchunk_kernel" in calls
    launch = calls["_gdn_replay_decode_kchunk_kernel" if kchunk else "_gdn_replay_decode_kernel"]
    built = compile_offline(launch)
    rep = ptxas_report(built["ptx"])
    text = disassemble(built["cubin"])
    insns, labels = parse_sass(text)
    regions = split_regions(insns, labels, flush_branch_line(kchunk))
    kw = launch["kwargs"]
    nw = built["num_warps"]
    grid0 = launch["grid"][0]
    n_warps = grid0 * batch_model * geom["HV"] * nw  # every row in the same phase
    res: Dict[str, Any] = {
        "variant": name, "config": config, "regs": rep["regs"], "spill_st": rep.get("spill_st"),
        "spill_ld": rep.get("spill_ld"), "stack": rep.get("stack"), "smem": built.get("shared"),
        "num_warps": nw, "BV": kw.get("BV"),
        "warps_per_sm": warps_per_sm(rep["regs"] or 255, nw), "sass_total": len(insns),
        "regions": {r: {"n": len(v), "ops": opcode_counts(v)} for r, v in regions.items()},
    }
    if "flush" in regions:
        n_c, n_f, n_n = (len(regions[r]) for r in ("common", "flush", "nonflush"))
        rate = H200_SMS * SCHEDULERS_PER_SM * H200_CLOCK_HZ
        res["warp_insns_flush"] = n_c + n_f
        res["warp_insns_nonflush"] = n_c + n_n
        res["issue_us_flush"] = n_warps * (n_c + n_f) / rate * 1e6
        res["issue_us_nonflush"] = n_warps * (n_c + n_n) / rate * 1e6
    if "_gdn_history_scores_kernel" in calls:
        sb = compile_offline(calls["_gdn_history_scores_kernel"])
        sr = ptxas_report(sb["ptx"])
        res["scores_kernel"] = {"regs": sr["regs"], "spill_st": sr.get("spill_st"), "spill_ld": sr.get("spill_ld"),
                                "sass_total": len(parse_sass(disassemble(sb["cubin"]))[0])}
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / f"{name}.ptx").write_text(built["ptx"])
        (dump / f"{name}.ttgir").write_text(built["ttgir"])
        (dump / f"{name}.sass").write_text(text)
        (dump / f"{name}.ptxas.log").write_text(rep["log"])
    return res


def parse_variant(spec: str, base: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """'name:key=val,key=val' -> (name, base updated); ints parsed as ints."""
    name, _, body = spec.partition(":")
    cfg = dict(base)
    for item in filter(None, body.split(",")):
        k, _, v = item.partition("=")
        cfg[k.strip()] = int(v) if re.fullmatch(r"-?\d+", v.strip()) else v.strip()
    return name, cfg


def table(results: Sequence[Dict[str, Any]]) -> str:
    from eval import report

    head = ["variant", "regs", "spill st/ld", "warps/SM", "SASS common", "flush", "nonflush",
            "flush FFMA/FMUL/FADD", "flush SHFL", "flush LDG/LDS/STS", "flush CS2R/BRA",
            "issue us flush/nonflush"]
    rows = []
    for r in results:
        reg = r["regions"]
        f = reg.get("flush", {}).get("ops", {})
        g = lambda k: f.get(k, 0)  # noqa: E731
        rows.append([
            r["variant"], r["regs"], f'{r["spill_st"]}/{r["spill_ld"]}', r["warps_per_sm"],
            reg.get("common", reg.get("all", {})).get("n"), reg.get("flush", {}).get("n", "-"),
            reg.get("nonflush", {}).get("n", "-"), f'{g("FFMA")}/{g("FMUL")}/{g("FADD")}', g("SHFL"),
            f'{g("LDG")}/{g("LDS")}/{g("STS")}', f'{g("CS2R")}/{g("BRA")}',
            f'{r.get("issue_us_flush", float("nan")):.0f}/{r.get("issue_us_nonflush", float("nan")):.0f}',
        ])
    return report.text_table(head, rows)


def main(argv=None) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("gdn_sass: unset TRITON_INTERPRET (the interpreter cannot build PTX)", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", default=None,
                    help="name:key=val,... over the base config (repeatable; default: DEFAULT_VARIANTS)")
    ap.add_argument("--base", default=None, help="YAML with a gdn_decode section (default configs/h200.yaml)")
    ap.add_argument("--geometry", choices=sorted(GEOMETRIES), default="qwen3-next")
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--state", choices=("fp32", "bf16", "fp16"), default="fp32")
    ap.add_argument("--act", choices=("fp32", "bf16", "fp16"), default="bf16")
    ap.add_argument("--batch", type=int, default=256, help="batch of the issue model")
    ap.add_argument("--json", default=None, help="write every number (and opcode histograms) here")
    ap.add_argument("--dump", default=None, help="directory for ptx / ttgir / sass / ptxas logs")
    args = ap.parse_args(argv)

    import torch

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    geom = GEOMETRIES[args.geometry]
    L = args.L
    base = tuned_config(args.base, f'HV{geom["HV"]}_HK{geom["Hk"]}_K{geom["K"]}_V{geom["V"]}_L{L}', args.state)
    results = []
    for spec in args.variant or DEFAULT_VARIANTS:
        name, cfg = parse_variant(spec, base)
        results.append(analyse(name, cfg, geom, L, dt[args.state], dt[args.act], args.batch,
                               Path(args.dump) if args.dump else None))
    return emit(f"gdn decode, {args.geometry} {geom} L={L} state {args.state} act {args.act}, sm_90a offline "
                f"(base config {base})", table(results), results, args.json)


def emit(header: str, text: str, results, json_path: Optional[str]) -> int:
    """Print the header and table; write every result as JSON when asked."""
    print(header)
    print(text)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
