"""Chain-verify conv1d: sglang_replayssm's conv1d_verify against SGLang's causal_conv1d_update, same inputs.

Both compute the target verify's causal conv over T draft tokens and write the per-draft conv windows that
rollback reads and the new conv state (kernels/conv_verify.py).  Per case (model geometry, batch): each graph
replays one launch per slot set (disjoint slots, fresh inputs and windows, enough sets that a replay touches
several times the L2), timed as CUDA graph replays; bytes each launch must move against the run's measured copy
bandwidth; the outputs, windows and states of both kernels compared on one set first (states and windows bit for
bit, outputs within OUT_RTOL of the largest; any mismatch: exit status 1).  ``--configs`` times
several launch configurations of ours in the same run (BLOCK_F x num_warps).

    python -m eval.bench_conv --out eval/results/conv-verify-h200.json [--batches 1 8 64 256] \
        [--configs 256x4 128x4]

On CPU (``--device cpu``, Triton's interpreter) it runs tiny shapes to check the harness: not speed numbers.
Writes <out> (JSON), <out>.md and <out>.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eval import report  # noqa: E402
from eval.bench_common import (CPU_NOTE, L2_BYTES, Timer, copy_bandwidth, gbps, git_commit, log,  # noqa: E402
                               pick_device, progress, release_device_memory, sglang_version, slot_sets_needed)

# conv channels per TP rank and state layout. SGLang's Mamba2 and GDN pools (Mamba2StateShape) keep a channel's K-1
# inputs contiguous ([slots, dim, K-1], "rows"); "transposed" ([slots, K-1, dim] handed over as a transposed view,
# with a deduplicated [rows, T+K-2, dim] window) checks the kernels on the other layout they accept
GEOMETRIES: Dict[str, Dict[str, Any]] = {
    "nemotron-h-8b": dict(dim=128 * 64 + 2 * 8 * 128, K=4, layout="rows"),
    "qwen3-next-80b": dict(dim=2 * 16 * 128 + 32 * 128, K=4, layout="rows"),
}
CPU_GEOMETRIES = {"tiny-rows": dict(dim=48, K=4, layout="rows"), "tiny-transposed": dict(dim=40, K=4,
                                                                                        layout="transposed")}


def parse_config(s: str) -> Dict[str, Any]:
    """``256x4``: BLOCK_F 256 on 4 warps."""
    try:
        f, w = s.lower().split("x")
        return {"BLOCK_F": int(f), "num_warps": int(w)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"config {s!r}: expected BLOCK_FxNUM_WARPS, e.g. 256x4") from None


# outputs against SGLang's: it rounds each product to bf16 before summing (a few bf16 units of the largest output)
OUT_RTOL = 2 ** -5


def config_tag(cfg: Optional[Dict[str, int]]) -> str:
    if cfg is None:
        return "packaged"
    return f"{cfg['BLOCK_F']}x{cfg['num_warps']}"


def make_set(geom: Dict[str, Any], batch: int, T: int, slots, num_slots: int, dtype, device: str, gen):
    """One launch's tensors: x [batch, dim, T] (SGLang's transposed view of the tokens), the conv state pool, the
    deduplicated window buffer and its [rows, T, dim, K-1] view, the slots and window rows."""
    import torch

    dim, K = geom["dim"], geom["K"]
    x = torch.randn(batch * T, dim, generator=gen, device=device).to(dtype).view(batch, T, dim).transpose(1, 2)
    rows = torch.arange(batch, dtype=torch.int32, device=device)
    if geom["layout"] == "rows":
        phys = torch.zeros(batch + 1, dim, T + K - 2, dtype=dtype, device=device)
        s = phys.stride()
        win = phys.as_strided((batch + 1, T, dim, K - 1), (s[0], s[2], s[1], s[2]))
    else:
        phys = torch.zeros(batch + 1, T + K - 2, dim, dtype=dtype, device=device)
        s = phys.stride()
        win = phys.as_strided((batch + 1, T, dim, K - 1), (s[0], s[1], s[2], s[1]))
    return {"x": x, "win": win, "phys": phys, "slots": slots, "rows": rows}


def make_pool(geom: Dict[str, Any], num_slots: int, dtype, device: str, gen):
    import torch

    dim, K = geom["dim"], geom["K"]
    if geom["layout"] == "rows":
        return torch.randn(num_slots, dim, K - 1, generator=gen, device=device).to(dtype)
    return torch.randn(num_slots, K - 1, dim, generator=gen, device=device).to(dtype).transpose(1, 2)


def launch_bytes(geom: Dict[str, Any], batch: int, T: int, elt: int) -> int:
    """Bytes one launch must move: x read, outputs written, the committed inputs read and the new ones written,
    the deduplicated windows written (T + K - 2 inputs a channel), weights and bias read."""
    dim, K = geom["dim"], geom["K"]
    per_row = dim * elt * (T + T + 2 * (K - 1) + (T + K - 2))
    return batch * per_row + dim * elt * (K + 1)


def run_case(name: str, geom: Dict[str, Any], batch: int, T: int, configs: List[Dict[str, int]], device: str,
             timer: Timer, copy_gbps: Optional[float], seed: int) -> Dict[str, Any]:
    import torch

    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update
    from sglang_replayssm.kernels.conv_verify import conv1d_verify

    dtype = torch.bfloat16
    nbytes = launch_bytes(geom, batch, T, 2)
    n_sets = 2 if device == "cpu" else slot_sets_needed(batch, max(1, nbytes // batch), L2_BYTES)
    num_slots = n_sets * batch + 1
    gen = torch.Generator(device=device).manual_seed(seed)
    perm = torch.randperm(num_slots - 1, generator=torch.Generator().manual_seed(seed + 1)) + 1
    pool = make_pool(geom, num_slots, dtype, device, gen)
    dim, K = geom["dim"], geom["K"]
    w = (torch.randn(dim, K, generator=gen, device=device) / K ** 0.5).to(dtype)
    bias = torch.randn(dim, generator=gen, device=device).to(dtype)
    sets = [make_set(geom, batch, T, perm[i * batch:(i + 1) * batch].to(torch.int32).to(device), num_slots, dtype,
                     device, gen) for i in range(n_sets)]

    def stock(s):
        return causal_conv1d_update(s["x"], pool, w, bias, "silu", conv_state_indices=s["slots"],
                                    intermediate_conv_window=s["win"], intermediate_state_indices=s["rows"])

    def ours(s, cfg):
        return conv1d_verify(s["x"], pool, w, bias, "silu", conv_state_indices=s["slots"],
                             intermediate_conv_window=s["win"], intermediate_state_indices=s["rows"], launch=cfg)

    # correctness on set 0: both from the same pool, windows and outputs compared (outputs within a few bf16
    # units: SGLang rounds each product to bf16 before summing)
    s0 = sets[0]
    before = pool.clone()
    out_s = stock(s0)
    state_s, win_s = pool.clone(), s0["phys"].clone()
    pool.copy_(before)
    s0["phys"].zero_()
    check = {}
    for cfg in configs:
        out_o = ours(s0, cfg)
        tag = config_tag(cfg)
        err = (out_o.float() - out_s.float()).abs().max().item()
        scale = out_s.float().abs().max().item()
        check[tag] = {"state_equal": bool(torch.equal(pool, state_s)),
                      "window_equal": bool(torch.equal(s0["phys"], win_s)),
                      "out_max_abs_diff": err, "out_max_abs": scale, "out_tolerance": OUT_RTOL * scale,
                      # Triton's CPU interpreter computes SGLang's outputs wrong (its running sum aliases its bias
                      # across tokens): outputs are compared on CUDA only
                      "out_ok": bool(err <= OUT_RTOL * scale) if device == "cuda" else None}
        pool.copy_(before)
        s0["phys"].zero_()
    del before, state_s, win_s

    case: Dict[str, Any] = {"geometry": name, **geom, "batch": batch, "T": T, "slot_sets": n_sets,
                            "bytes_per_launch": nbytes, "check": check, "kernels": {}}
    t = timer([lambda s=s: stock(s) for s in sets])
    case["kernels"]["sglang"] = {**t, "GBps": gbps(nbytes, t["us"])}
    for cfg in configs:
        tag = config_tag(cfg)
        t = timer([lambda s=s, cfg=cfg: ours(s, cfg) for s in sets])
        case["kernels"][f"ours {tag}"] = {**t, "GBps": gbps(nbytes, t["us"]), "launch": cfg}
    best = min((k for k in case["kernels"] if k.startswith("ours")), key=lambda k: case["kernels"][k]["us"])
    case["best_ours"] = best
    case["speedup"] = report.ratio(case["kernels"]["sglang"]["us"], case["kernels"][best]["us"])
    for k, v in case["kernels"].items():
        v["bw_fraction"] = report.ratio(v["GBps"], copy_gbps)
    del sets, pool
    release_device_memory(device)
    return case


def _ok(check: Dict[str, Any]) -> bool:
    """State and windows bit for bit, outputs within OUT_RTOL of SGLang's (on CUDA; None: not compared)."""
    return check["state_equal"] and check["window_equal"] and check["out_ok"] is not False


def markdown(result: Dict[str, Any]) -> List[tuple]:
    tags = [k for k in result["cases"][0]["kernels"]] if result["cases"] else []
    rows = []
    for c in result["cases"]:
        rows.append([c["geometry"], c["batch"], f"{c['bytes_per_launch'] / 1e6:.1f}"]
                    + [f"{report.fmt(c['kernels'][k]['us'], 1)} ({report.fmt(c['kernels'][k]['bw_fraction'], 2)})"
                       for k in tags]
                    + [report.fmt(c["speedup"], 2),
                       "yes" if all(_ok(v) for v in c["check"].values()) else "NO"])
    table = report.markdown_table(["geometry", "batch", "MB/launch"] + [f"{k} µs (of copy bw)" for k in tags]
                                  + ["speedup (best ours)", "same as SGLang"], rows)
    sections = [("Run", report.markdown_kv({k: result[k] for k in ("git_commit", "sglang_version", "gpu", "torch",
                                                                     "triton", "copy_bw_GBps", "T", "wall_s")})),
                ("Per launch", table),
                ("Summary", report.markdown_kv(result["summary"]))]
    if result["notes"]:
        sections.append(("Notes", "\n".join(f"- {n}" for n in result["notes"])))
    return sections


def plot(result: Dict[str, Any], path: Path) -> bool:
    series = []
    for g in dict.fromkeys(c["geometry"] for c in result["cases"]):
        sel = sorted((c for c in result["cases"] if c["geometry"] == g), key=lambda c: c["batch"])
        series.append({"label": f"{g} (best config)", "x": [c["batch"] for c in sel], "y": [c["speedup"] for c in sel]})
    return report.plot_panels(path, [{"title": "conv1d verify: SGLang time / ours", "xlabel": "batch",
                                      "ylabel": "speedup", "xlog2": True, "hline": 1.0, "series": series}],
                              suptitle=f"{result['gpu']}  commit {str(result['git_commit'])[:10]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="eval/results/conv-verify-h200.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=None, help="default 1 8 64 256 (cpu: 2)")
    ap.add_argument("--window", type=int, default=4, help="draft tokens T a row (--speculative-num-draft-tokens)")
    ap.add_argument("--configs", type=parse_config, nargs="+", default=None,
                    help="our launch configurations BLOCK_FxNUM_WARPS (default: the packaged configuration)")
    ap.add_argument("--geometries", nargs="+", default=None, help=f"subset of {sorted(GEOMETRIES)}")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    import torch
    import triton

    cpu = device == "cpu"
    geoms = CPU_GEOMETRIES if cpu else GEOMETRIES
    if args.geometries:
        unknown = sorted(set(args.geometries) - set(geoms))
        if unknown:
            ap.error(f"unknown geometries {unknown}; known: {sorted(geoms)}")
        geoms = {k: geoms[k] for k in args.geometries}
    batches = args.batches or ([2] if cpu else [1, 8, 64, 256])
    configs = args.configs or [None]  # None: what conv1d_verify looks up itself (the packaged configuration)
    t0 = time.time()
    result: Dict[str, Any] = {
        "git_commit": git_commit(), "sglang_version": sglang_version(),
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)",
        "torch": torch.__version__, "triton": triton.__version__, "device": device, "T": args.window,
        "configs": configs, "notes": [CPU_NOTE] if cpu else [], "cases": []}
    log("-- copy bandwidth")
    cb = copy_bandwidth(device)
    result["copy_bw_GBps"] = cb["GBps"]
    timer = Timer(device)
    plan = [(g, b) for g in geoms for b in batches]
    for g, b in progress(plan, len(plan), "conv1d verify"):
        case = run_case(g, geoms[g], b, args.window, configs, device, timer, cb["GBps"], args.seed)
        result["cases"].append(case)
        log(f"   {g} batch {b}: SGLang {report.fmt(case['kernels']['sglang']['us'], 1)} µs, "
            f"{case['best_ours']} {report.fmt(case['kernels'][case['best_ours']]['us'], 1)} µs, "
            f"speedup {report.fmt(case['speedup'], 2)}")
    if timer.fallbacks:
        result["notes"].append(f"CUDA graph capture failed, do_bench used: {timer.fallbacks[:3]}")
    summary: Dict[str, Any] = {}
    for c in result["cases"]:
        key = f"{c['geometry'].replace('-', '_').replace('.', '_')}_bs{c['batch']}"
        summary[f"conv_verify_speedup_{key}"] = c["speedup"]
        summary[f"conv_verify_bw_fraction_{key}"] = c["kernels"][c["best_ours"]]["bw_fraction"]
        summary[f"sglang_conv_bw_fraction_{key}"] = c["kernels"]["sglang"]["bw_fraction"]
    result["summary"] = summary
    result["wall_s"] = time.time() - t0
    out = Path(args.out)
    report.write_json(out, result)
    report.write_markdown(out.with_suffix(".md"), f"Chain-verify conv1d vs SGLang ({result['gpu']})", markdown(result))
    drew = plot(result, out.with_suffix(".png"))
    log(f"-- wrote {out}, {out.with_suffix('.md')}" + (f", {out.with_suffix('.png')}" if drew else ""))
    bad = [(c["geometry"], c["batch"], k) for c in result["cases"] for k, v in c["check"].items() if not _ok(v)]
    if bad:
        log(f"MISMATCH against SGLang's state/window writes or outputs: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
