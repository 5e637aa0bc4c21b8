"""Kernel-level TREE speculative-verify benchmark: our tree verify on the ring vs SGLang 0.5.17's tree verify.

GPU host (after ``source .sglang-bundle/bootstrap.sh``)::

    python3 -m eval.bench_tree_spec --out eval/results/spec-tree-kernels-h200.json

CPU harness check (Triton interpreter, tiny shapes, the times mean nothing)::

    python -m eval.bench_tree_spec --device cpu --out /tmp/spec-tree-cpu.json

What is compared, per (family, geometry, batch), fp32 state, bf16 activation values, one
tree of T nodes per row (EAGLE ``--speculative-eagle-topk K``, ``--speculative-num-draft-tokens T``:
the root's K children, each growing a chain; the accepted path root -> child 1 -> ... of
``--accept`` nodes, as ``SGLANG_SIMULATE_ACC_LEN``):

* Stock (what SGLang runs per layer in a tree target verify): Mamba2 ``selective_state_update``
  (ssu_dispatch, triton backend) and GDN ``fused_sigmoid_gating_delta_rule_update``, each with
  ``retrieve_parent_token`` and the per-node intermediate-state buffer [bs+1, T, ...] (one full
  state written per node), then ``fused_mamba_state_scatter_with_mask`` of the last accepted node's
  snapshot into the state.  Same argument forms as :mod:`eval.bench_spec` (its work objects).
* Ours: ``mamba2_tree_verify`` / ``gdn_tree_verify`` on the ring plus ``spec_commit_tree``
  (gather of the accepted path + cursor move), walked through the flush cycle: ``--steps``
  verify+commit steps captured in one CUDA graph, from a steady cursor state, per step time =
  graph time / steps (the cursors move on the device between steps, flushes included).

Correctness (fp32 state, fp32 outputs): ``--check-steps`` steps from one state, ours vs stock
every node output within 1e-3 abs + 1e-3 rel.  Exit status 1 when it fails.  Writes ``<out>``
(JSON) with ``summary`` keys ``<family>_tree_verify_speedup_bs<b>_fp32`` (stock time / ours).

``--merge-into eval/results/spec-kernels-h200.json`` copies those keys into the chain verify benchmark's
summary (with ``tree_source``: where they came from; it refuses a run of another commit or GPU);
``--from <json>`` merges an earlier result instead of running the benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from eval import bench_common as bc
from eval import bench_spec as bs

CHECK_RTOL = CHECK_ATOL = 1e-3


def tree_parents(T: int, topk: int) -> List[int]:
    """The root's ``topk`` children (nodes 1..topk), each growing a chain: node s > topk hangs under s - topk."""
    return [-1] + [0 if s <= topk else s - topk for s in range(1, T)]


def accepted_path(T: int, topk: int, accept: int) -> List[int]:
    """root -> node 1 -> node 1 + topk -> ... (``accept`` nodes, capped by the tree's depth)."""
    path = [0]
    node = 1
    while len(path) < accept and node < T:
        path.append(node)
        node += topk
    return path


class TreeCase:
    """One case: :mod:`eval.bench_spec`'s work object (pools, ring, sets, stock buffers) plus the tree."""

    def __init__(self, family, geom, batch, T, R, topk, accept, device, n_sets, seed, kern, **kw):
        import torch

        self.family, self.T, self.R, self.kern = family, T, R, kern
        self.path = accepted_path(T, topk, accept)
        self.w = bs.make_work(family, geom, batch, T, R, len(self.path), "fp32", device, n_sets, seed, **kw)
        i32 = dict(dtype=torch.int32, device=device)
        self.parents = torch.tensor(tree_parents(T, topk), **i32).expand(batch, T).contiguous()
        self.stock_parents = self.parents.clamp(min=0)  # SGLang's retrieve_parent_token (root unused)
        acc = torch.zeros(batch, T, **i32)
        acc[:, :len(self.path)] = torch.tensor(self.path, **i32)
        self.accepted, self.n_accept = acc, torch.full((batch,), len(self.path), **i32)
        for st in self.w.sets:
            st["last_step"].fill_(self.path[-1])  # the stock commit scatters the last accepted node's snapshot

    def stock_fn(self, s, state=None, out=None):
        w, st, kern = self.w, self.w.sets[s], self.kern
        state = w.state if state is None else state
        if self.family == "mamba2":
            out = w.out if out is None else out
            return lambda: kern.ssu(state, st["x"], st["dt"], w.A, st["B"], st["C"], w.D, z=None, dt_bias=w.dt_bias,
                                    dt_softplus=True, state_batch_indices=st["idx"], out=out,
                                    disable_state_update=True, intermediate_states_buffer=st["buf"][0],
                                    cache_steps=self.T, retrieve_parent_token=self.stock_parents,
                                    intermediate_state_indices=st["inter_idx"])

        def run():
            o = kern.gdn_stock(A_log=w.A_log, a=st["a"], dt_bias=w.dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
                               q=st["q"], k=st["k"], v=st["v"], b=st["b"], initial_state_source=state,
                               initial_state_indices=st["idx"], cu_seqlens=st["cu"], use_qk_l2norm_in_kernel=True,
                               is_kda=False, disable_state_update=True, intermediate_states_buffer=st["buf"][0],
                               intermediate_state_indices=st["inter_idx"], cache_steps=self.T,
                               retrieve_parent_token=self.stock_parents)
            if out is not None:
                out.copy_(o.view(out.shape))
            return o

        return run

    def ours_fn(self, s, state=None, rings=None, out=None):
        from sglang_replayssm.kernels.gdn_verify import gdn_tree_verify
        from sglang_replayssm.kernels.mamba2_verify import mamba2_tree_verify

        w, st = self.w, self.w.sets[s]
        state = w.state if state is None else state
        r0, r1, r2 = rings if rings is not None else w.rings()
        out = w.out if out is None else out
        if self.family == "mamba2":
            return lambda: mamba2_tree_verify(state, r0, r1, r2, st["x"], st["dt"], w.A, st["B"], st["C"], st["idx"],
                                              w.wp, w.origin, w.flush, self.parents, D=w.D, z=None,
                                              dt_bias=w.dt_bias, dt_softplus=True, out=out)
        b, T, HV = w.b, self.T, w.HV
        return lambda: gdn_tree_verify(st["mq"].view(b, T, w.width), st["a"].view(b, T, HV), st["b"].view(b, T, HV),
                                       w.A_log, w.dt_bias, state, r0, r1, r2, st["idx"], w.wp, w.origin, w.flush,
                                       self.parents, scale=w.scale, use_qk_l2norm=True, out=out)

    def commit_fn(self, s, rings=None):
        from sglang_replayssm.kernels.spec_tree import spec_commit_tree

        w, st = self.w, self.w.sets[s]
        rings = list(rings if rings is not None else w.rings())
        return lambda: spec_commit_tree(w.wp, w.origin, w.flush, st["idx"], self.accepted, self.n_accept, rings,
                                        window=self.T, ring_len=self.R)


def check(family, geom, T, R, topk, accept, device, kern, batch, steps, seed=1234) -> Dict[str, Any]:
    """``steps`` tree verifies from one state: ours (tree verify + tree commit) vs stock (tree verify + scatter)."""
    import torch

    act = "bf16" if family == "mamba2" else "fp32"
    c = TreeCase(family, geom, batch, T, R, topk, accept, device, 1, seed, kern, act_dtype=act, out_dtype="fp32")
    w, st = c.w, c.w.sets[0]
    s_stock, s_ours = w.state.clone(), w.state.clone()
    rings = tuple(torch.full_like(t, float("nan")) for t in w.rings())
    kern.spec_reset(w.wp, w.origin, w.flush, st["idx"], window=T, ring_len=R)
    per_step, ok = [], True
    for i in range(steps):
        if i:
            w.new_inputs(st)
        o_s = torch.full(w.out.shape, float("nan"), dtype=torch.float32, device=device)
        o_o = torch.full_like(o_s, float("nan"))
        c.stock_fn(0, state=s_stock, out=o_s)()
        kern.scatter(s_stock[None], st["buf"], st["idx"], st["last_step"])
        flush = int(w.flush[st["idx"][0].long()])
        c.ours_fn(0, state=s_ours, rings=rings, out=o_o)()
        c.commit_fn(0, rings=rings)()
        diff = (o_o.double() - o_s.double()).abs()
        fin = bool(torch.isfinite(o_o).all() and torch.isfinite(o_s).all())
        excess = float((diff - (CHECK_ATOL + CHECK_RTOL * o_s.double().abs())).max()) if fin else None
        good = fin and excess <= 0
        ok &= good
        per_step.append({"step": i, "flush": flush, "max_abs_diff": float(diff.max()) if fin else None,
                         "tol_excess": excess, "within_tol": good})
    return {"family": family, "batch": batch, "T": T, "R": R, "topk": topk, "path": c.path, "steps": per_step,
            "flush_steps": [p["step"] for p in per_step if p["flush"]], "passed": bool(ok)}


def run_case(family, name, geom, batch, T, R, topk, accept, device, kern, timer, steps, n_sets=None,
             seed=7) -> Dict[str, Any]:
    row = bs.state_row_bytes(family, geom, 4)
    n_sets = n_sets or bc.slot_sets_needed(batch, row)  # disjoint slot sets rotated to defeat L2
    c = TreeCase(family, geom, batch, T, R, topk, accept, device, n_sets, seed, kern)
    w = c.w
    case = {"family": family, "geometry": name, "geom": dict(geom), "batch": batch, "state_dtype": "fp32", "T": T,
            "R": R, "topk": topk, "accepted_path": c.path, "n_sets": n_sets,
            "stock_snapshot_buffers_MB": n_sets * (batch + 1) * T * row / 1e6}
    if kern.stock_ok(family):
        seq = [f for i in range(n_sets)
               for f in (c.stock_fn(i), lambda i=i: kern.scatter(w.state[None], w.sets[i]["buf"], w.sets[i]["idx"],
                                                                  w.sets[i]["last_step"]))]
        r = timer(seq)
        case["stock"] = {"t_us": r["us"] * len(seq) / n_sets, "timing": r}
    # ours: walk the cursor cycle from a steady state (a few eager steps first), verify + tree commit per step
    for s in range(n_sets):
        kern.spec_reset(w.wp, w.origin, w.flush, w.sets[s]["idx"], window=T, ring_len=R)
        for _ in range(3):
            c.ours_fn(s)()
            c.commit_fn(s)()
    n_steps = max(steps, n_sets)
    seq = [f for i in range(n_steps) for f in (c.ours_fn(i % n_sets), c.commit_fn(i % n_sets))]
    r = timer(seq)
    case["ours"] = {"t_us": r["us"] * len(seq) / n_steps, "timing": r, "steps_in_graph": n_steps}
    if "stock" in case:
        case["speedup"] = case["stock"]["t_us"] / case["ours"]["t_us"]
    bc.release_device_memory(device)
    return case


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="eval/results/spec-tree-kernels-h200.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--family", choices=("mamba2", "gdn", "all"), default="all")
    ap.add_argument("--batches", type=int, nargs="*", default=None, help="default 1 8 64 128 (cpu: 2)")
    ap.add_argument("--window", type=int, default=8, help="draft tokens T (tree nodes incl. the root)")
    ap.add_argument("--topk", type=int, default=4, help="children of the root (--speculative-eagle-topk)")
    ap.add_argument("--accept", type=int, default=3, help="accepted path length (root included)")
    ap.add_argument("--history", type=int, default=16, help="history block B (ring R = B + T)")
    ap.add_argument("--steps", type=int, default=24, help="verify+commit steps per timed graph")
    ap.add_argument("--check-steps", type=int, default=None, help="correctness steps (default 24; cpu 6)")
    ap.add_argument("--sets", type=int, default=None, help="slot sets (emulated layers; default: enough to "
                                                            "defeat L2; cpu 1)")
    ap.add_argument("--merge-into", default=None, help="a bench_spec JSON whose summary gets the tree keys")
    ap.add_argument("--from", dest="from_json", default=None,
                    help="with --merge-into: merge this earlier result, run nothing")
    args = ap.parse_args(argv)
    if args.from_json is not None:
        if args.merge_into is None:
            ap.error("--from needs --merge-into")
        try:
            merge_into(json.loads(Path(args.from_json).read_text()), args.from_json, args.merge_into)
        except ValueError as e:
            ap.error(str(e))
        return 0
    device = bc.pick_device(args.device)
    cpu = device == "cpu"
    T, R = args.window, args.history + args.window
    if args.history < T:
        ap.error(f"--history {args.history} must be >= --window {T}")
    kern = bs.Kernels(device)
    geoms = []
    if args.family in ("mamba2", "all"):
        geoms += [("mamba2", n, g) for n, g in (bs.TINY_MAMBA2 if cpu else bs.MAMBA2_GEOMETRIES).items()]
    if args.family in ("gdn", "all"):
        geoms += [("gdn", n, g) for n, g in (bs.TINY_GDN if cpu else bs.GDN_GEOMETRIES).items()]
    batches = args.batches or ([2] if cpu else [1, 8, 64, 128])
    timer = bc.Timer(device)
    t0 = time.time()
    import torch

    result: Dict[str, Any] = {"git_commit": bc.git_commit(), "sglang_version": bc.sglang_version(),
                              "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)",
                              "device": device, "T": T, "R": R, "topk": args.topk, "accept": args.accept,
                              "parents": tree_parents(T, args.topk), "kernels": kern.info(), "checks": [],
                              "cases": [], "summary": {}, "notes": [bc.CPU_NOTE] if cpu else []}
    ok = True
    for family, name, geom in geoms:
        if not kern.stock_ok(family):
            result["checks"].append({"family": family, "passed": None, "error": "stock kernels unavailable"})
            ok = False
        else:
            chk = check(family, geom, T, R, args.topk, args.accept, device, kern, 2 if cpu else 8,
                        args.check_steps or (6 if cpu else 24))
            result["checks"].append(chk)
            ok &= chk["passed"]
            bc.log(f"check {family} {name}: {'ok' if chk['passed'] else 'FAILED'} (flush steps {chk['flush_steps']})")
        for b in batches:
            case = run_case(family, name, geom, b, T, R, args.topk, args.accept, device, kern, timer,
                            2 if cpu else args.steps, args.sets or (1 if cpu else None))
            result["cases"].append(case)
            sp = case.get("speedup")
            bc.log(f"{family} {name} bs{b}: stock {case.get('stock', {}).get('t_us')} us, ours "
                   f"{case['ours']['t_us']:.2f} us, speedup {sp}")
            if sp is not None and name in (list(bs.MAMBA2_GEOMETRIES) + list(bs.GDN_GEOMETRIES)):
                result["summary"][f"{family}_tree_verify_speedup_bs{b}_fp32"] = sp
    result["wall_s"] = time.time() - t0
    result["checks_passed"] = bool(ok)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result["summary"], indent=1))
    if args.merge_into is not None and ok:
        merge_into(result, args.out, args.merge_into)
    return 0 if ok else 1


def merge_into(tree: Dict[str, Any], tree_path: str, spec_path: str) -> None:
    """Copy a tree result's summary keys into the bench_spec JSON at ``spec_path`` (rewritten in place), with
    ``summary.tree_source``.  Refuses (ValueError) a tree run whose checks failed, or one of another commit or GPU
    than the chain benchmark's (a run without those fields is taken as the same)."""
    spec = json.loads(Path(spec_path).read_text())
    if not tree.get("checks_passed"):
        raise ValueError(f"{tree_path}: the tree run's correctness checks did not pass; nothing merged")
    for key in ("git_commit", "gpu"):
        a, b = tree.get(key), spec.get(key)
        n = min(len(str(a)), len(str(b))) if key == "git_commit" else None  # short and full hashes
        if a is not None and b is not None and str(a)[:n] != str(b)[:n]:
            raise ValueError(f"{tree_path} ran at {key} {a}, {spec_path} at {b}: not merged")
    keys = {k: v for k, v in tree.get("summary", {}).items() if "_tree_verify_" in k}
    if not keys:
        raise ValueError(f"{tree_path}: no tree summary keys to merge")
    spec.setdefault("summary", {}).update(keys)
    spec["summary"]["tree_source"] = {"file": str(tree_path),
                                      "git_commit": tree.get("git_commit", spec.get("git_commit")),
                                      "T": tree.get("T"), "topk": tree.get("topk"), "accept": tree.get("accept")}
    Path(spec_path).write_text(json.dumps(spec, indent=1, default=str))
    bc.log(f"merged {len(keys)} tree key(s) into {spec_path}")


if __name__ == "__main__":
    sys.exit(main())
