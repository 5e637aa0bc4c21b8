"""Tests of the Mamba2 tree speculative verify and the tree commit on the spec ring.

CUDA when present, else Triton's CPU interpreter (tests/conftest.py).  Fresh random inputs
every run (seed in every message; REPLAYSSM_TEST_SEED replays one).

Every step draws a random tree per row (depth <= 8, branching <= 4), verifies it, and
compares EVERY node's output with the fp64 sequential recurrence run from the committed
state along that node's own path; then a random root..node path is accepted and committed
with :func:`spec_commit_tree` (checked against its host reference), and the oracle's
committed state advances to that node's state.  After every flush the checkpoint must equal
the oracle's committed state.  Ring pools and outputs start as NaN: a read of a masked
position or an unwritten live output shows.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernel_testlib import bits, make_gen, mismatch, view_like
from test_mamba2_replay import ORACLE_TOL, REF_TOL

from sglang_replayssm.kernels.mamba2_verify import mamba2_tree_verify
from sglang_replayssm.kernels.mamba2_verify_ref import mamba2_tree_oracle, mamba2_tree_verify_ref
from sglang_replayssm.kernels.mamba2_verify import mamba2_verify
from sglang_replayssm.kernels.spec_cursor import check_spec_cursors, spec_reset, spec_ring_len
from sglang_replayssm.kernels.spec_tree import (chain_parents, check_tree_parents, spec_commit_tree,
                                                spec_commit_tree_ref, tree_path)

F32, BF16, F16, F64 = torch.float32, torch.bfloat16, torch.float16, torch.float64
SMALL = (4, 16, 16, 1)   # H, P, N, G
SMALL_H2 = (2, 16, 16, 1)  # the CPU stream's: two heads on one group (the interpreter's time is per head program)
ODD = (3, 24, 40, 3)     # H = 3 odd, P and N not powers of two, N over two 32-column chunks
STATE_RTOL = 1e-5        # fp32 flushed checkpoint vs the fp64 oracle (relative to the state's scale)


def random_tree(T, gen, max_depth=8, max_branch=4):
    """parents [T] of a random tree in node order: each node picks a parent among the earlier nodes that
    still have room (depth < max_depth, fewer than max_branch children); 1 in 6 trees is a chain."""
    if T > 1 and int(torch.randint(0, 6, (1,), generator=gen)) == 0:
        return list(range(-1, T - 1))
    par, depth, kids = [-1], [0], [0]
    for s in range(1, T):
        room = [m for m in range(s) if depth[m] < max_depth and kids[m] < max_branch]
        m = room[int(torch.randint(0, len(room), (1,), generator=gen))]
        par.append(m)
        depth.append(depth[m] + 1)
        kids.append(0)
        kids[m] += 1
    return par


class TreeHarness:
    """Pools, spec rings, cursors, per-request committed fp64 states; one checked tree verify + tree commit."""

    def __init__(self, device, geom, T, hist, state_dtype=F32, act_dtype=F32, *, n_req=3, has_z=True, has_D=True,
                 null_slot=0, check_ref=True, strided=False):
        self.gen, self.seed = make_gen()
        self.device = device
        H, P, N, G = geom
        self.H, self.P, self.N, self.G, self.T = H, P, N, G, T
        self.R = spec_ring_len(hist, T)
        self.sd, self.ad = state_dtype, act_dtype
        self.null_slot, self.check_ref, self.strided = null_slot, check_ref, strided
        S = 2 * n_req + 3
        free = [s for s in range(S) if s != null_slot]
        perm = torch.randperm(len(free), generator=self.gen).tolist()
        self.slots = [free[i] for i in perm[:n_req]]
        R = self.R
        self.bases = {}
        self.state = self._pool("state", (S, H, P, N), state_dtype)
        self.x_ring = self._pool("x_ring", (S, H, R, P), act_dtype)
        self.B_ring = self._pool("B_ring", (S, G, R, N), act_dtype)
        self.dt_ring = self._pool("dt_ring", (S, H, R), F32)
        self.state.copy_((torch.randn(S, H, P, N, generator=self.gen) * 0.5).to(device=device, dtype=state_dtype))
        self.oracle = [self.state[s].cpu().to(F64) for s in self.slots]
        self.A_h = -torch.exp(torch.rand(H, generator=self.gen) * 2 - 1)
        self.dtb_h = -4 * torch.rand(H, generator=self.gen)
        self.D_h = torch.randn(H, generator=self.gen) if has_D else None
        self.has_z = has_z
        self.A, self.dt_bias = self.A_h.to(device), self.dtb_h.to(device)
        self.D = None if self.D_h is None else self.D_h.to(device)
        self.wp = torch.full((S,), 5, dtype=torch.int32, device=device)
        self.origin = torch.full((S,), 2, dtype=torch.int32, device=device)
        self.flush = torch.ones(S, dtype=torch.int32, device=device)
        spec_reset(self.wp, self.origin, self.flush, torch.tensor(self.slots, dtype=torch.int32, device=device),
                   window=T, ring_len=R, null_slot=null_slot)
        self.steps = self.flushes = self.wraps = self.flush_paths = 0
        self.max_depth = 0

    def tag(self):
        return f"[seed={self.seed} T={self.T} R={self.R} state={self.sd} act={self.ad} step={self.steps}]"

    def _pool(self, name, shape, dtype):
        if self.strided:  # a view into a bigger pool: padded slot stride and last dim
            big = (shape[0] + 1, shape[1] + 1) + tuple(shape[2:-1]) + (shape[-1] + 3,)
            base = torch.full(big, float("nan"), dtype=dtype, device=self.device)
            view = base[1:, : shape[1]][..., : shape[-1]]
        else:
            base = torch.full(shape, float("nan"), dtype=dtype, device=self.device)
            view = base
        self.bases[name] = (base, view)
        return view

    def _inputs(self, batch):
        H, P, N, G, T, ad, g = self.H, self.P, self.N, self.G, self.T, self.ad, self.gen
        return {
            "x": torch.randn(batch, T, H, P, generator=g).to(ad),
            "dt": torch.randn(batch, T, H, generator=g).to(ad),
            "B": torch.randn(batch, T, G, N, generator=g).to(ad),
            "C": (torch.randn(batch, T, G, N, generator=g) / math.sqrt(N)).to(ad),
            "z": torch.randn(batch, T, H, P, generator=g).to(ad) if self.has_z else None,
        }

    def step(self, *, trees=None, accept_node=None, pads=("neg", "null")):
        dev, T, R = self.device, self.T, self.R
        tag = self.tag()
        rows = list(range(len(self.slots)))
        if "neg" in pads:
            rows.insert(0, "neg")
        if "null" in pads:
            rows.insert(len(rows) // 2 + 1, "null")
        batch = len(rows)
        slot_of = [(-1 if r == "neg" else self.null_slot) if isinstance(r, str) else self.slots[r] for r in rows]
        idx = torch.tensor(slot_of, dtype=torch.int32, device=dev)
        par_rows = [trees[r] if trees is not None and not isinstance(r, str) else random_tree(T, self.gen)
                    for r in rows]
        parents = torch.tensor(par_rows, dtype=torch.int32)
        check_tree_parents(parents)
        parents = parents.to(dev)
        inp = self._inputs(batch)
        d = {k: (None if v is None else v.to(dev)) for k, v in inp.items()}
        if self.strided:  # SGLang passes dt expanded over P with stride 0
            d["dt"] = d["dt"][..., None].expand(batch, T, self.H, self.P)
        out = torch.full((batch, T, self.H, self.P), float("nan"), dtype=self.ad, device=dev)
        before = {k: b.clone() for k, (b, _) in self.bases.items()}
        cur = {s: (int(self.wp[s]), int(self.origin[s]), int(self.flush[s])) for s in self.slots}
        kw = dict(D=self.D, z=d["z"], dt_bias=self.dt_bias, null_slot=self.null_slot)
        args = (d["x"], d["dt"], self.A, d["B"], d["C"], idx, self.wp, self.origin, self.flush, parents)
        if self.check_ref:
            ref = {k: b.clone() for k, b in before.items()}
            rv = {k: view_like(v, ref[k]) for k, (_, v) in self.bases.items()}
            ref_out = torch.full_like(out, float("nan"))
            mamba2_tree_verify_ref(rv["state"], rv["x_ring"], rv["B_ring"], rv["dt_ring"], *args, out=ref_out, **kw)
        ret = mamba2_tree_verify(self.state, self.x_ring, self.B_ring, self.dt_ring, *args, out=out, **kw)
        assert ret is out
        live = [k for k, r in enumerate(rows) if not isinstance(r, str)]
        pad = [k for k, r in enumerate(rows) if isinstance(r, str)]

        # nothing outside the write set changed (window ring positions; the checkpoint on flush)
        allowed = {k: torch.zeros(b.shape, dtype=torch.bool, device=dev) for k, (b, _) in self.bases.items()}
        for k in live:
            s = slot_of[k]
            w, o, f = cur[s]
            phys = [(o + w + t) % R for t in range(T)]
            for name in ("x_ring", "B_ring", "dt_ring"):
                view_like(self.bases[name][1], allowed[name])[s, :, phys] = True
            if f and w > 0:
                view_like(self.state, allowed["state"])[s] = True
        for name, (b, _) in self.bases.items():
            assert torch.equal(bits(b)[~allowed[name]], bits(before[name])[~allowed[name]]), \
                f"{tag} {name}: memory outside the verify's write set changed"
        assert torch.isnan(out[pad].float()).all(), f"{tag} padded rows were written"
        assert torch.isfinite(out[live].float()).all(), f"{tag} a live output is not finite (unwritten / stale read)"

        if self.check_ref:
            rt, at = REF_TOL[self.ad]
            r_, i_ = mismatch(out[live], ref_out[live], rt, at)
            assert r_ <= 1, f"{tag} output vs reference off by {r_:.3g}x at {i_}"
            fin = torch.isfinite(rv["state"].float())
            r_, _ = mismatch(self.state[fin], rv["state"][fin], *REF_TOL[self.sd])
            assert r_ <= 1, f"{tag} checkpoint vs reference off by {r_:.3g}x"
            for name in ("x_ring", "B_ring"):
                assert torch.equal(bits(self.bases[name][0]), bits(ref[name])), f"{tag} {name} differs from reference"
            fin = torch.isfinite(rv["dt_ring"])
            assert torch.equal(fin, torch.isfinite(self.dt_ring)), f"{tag} dt_ring written elsewhere than reference"
            r_, _ = mismatch(self.dt_ring[fin], rv["dt_ring"][fin], 1e-5, 1e-6)
            assert r_ <= 1, f"{tag} dt_ring vs reference off by {r_:.3g}x"

        # oracle: flushed checkpoint == committed state; every node == the recurrence along its own path
        rt, at = ORACLE_TOL[(self.sd, self.ad)]
        accepted = torch.zeros(batch, T, dtype=torch.int32)
        n_acc = torch.ones(batch, dtype=torch.int32)  # padded rows carry accepts too (skipped: null slots)
        for k in live:
            i, s = rows[k], slot_of[k]
            w, o, f = cur[s]
            base = self.oracle[i]
            if f:
                self.flushes += 1
                if self.sd == F32:
                    err = float((self.state[s].cpu().to(F64) - base).abs().max())
                    assert err <= STATE_RTOL * max(1.0, float(base.abs().max())), \
                        f"{tag} flushed checkpoint of slot {s} (folded {w}) off by {err:.3g}"
                else:
                    r_, i_ = mismatch(self.state[s].cpu(), base, rt, at)
                    assert r_ <= 1, f"{tag} flushed checkpoint of slot {s} (folded {w}) off by {r_:.3g}x at {i_}"
                base = self.state[s].cpu().to(F64)  # continue from the stored (rounded) checkpoint
            ys, states = mamba2_tree_oracle(base, inp["x"][k], inp["dt"][k], self.A_h, inp["B"][k], inp["C"][k],
                                            par_rows[k], D=self.D_h, z=None if inp["z"] is None else inp["z"][k],
                                            dt_bias=self.dtb_h)
            for t in range(T):
                at_y = at if self.sd == F32 else at * max(1.0, float(ys[t].abs().max()))
                r_, i_ = mismatch(out[k, t].cpu(), ys[t], rt, at_y)
                assert r_ <= 1, (f"{tag} output of request {i} node {t} (path {tree_path(par_rows[k], t)}, wp={w} "
                                 f"origin={o} flush={f}) off by {r_:.3g}x at {i_}")
            node = int(torch.randint(0, T, (1,), generator=self.gen)) if accept_node is None else accept_node
            path = tree_path(par_rows[k], node)
            self.max_depth = max(self.max_depth, len(path) - 1)
            accepted[k, :len(path)] = torch.tensor(path, dtype=torch.int32)
            # rejected tails carry junk (the commit reads only n_accept entries)
            accepted[k, len(path):] = torch.randint(0, T, (T - len(path),), generator=self.gen, dtype=torch.int32)
            n_acc[k] = len(path)
            self.oracle[i] = states[node]
            if f and len(path) > 1:
                self.flush_paths += 1
            if (o + w + T - 1) // R != o // R:
                self.wraps += 1

        # tree commit (device) vs its host reference: rings and cursors
        rings = [self.x_ring, self.B_ring, self.dt_ring]
        want_c = [t.cpu().clone() for t in (self.wp, self.origin, self.flush)]
        want_r = [r.cpu().clone() for r in rings]
        spec_commit_tree_ref(*want_c, idx.cpu(), accepted, n_acc, want_r, window=T, ring_len=R,
                             null_slot=self.null_slot)
        spec_commit_tree(self.wp, self.origin, self.flush, idx, accepted.to(dev), n_acc.to(dev), rings,
                         window=T, ring_len=R, null_slot=self.null_slot)
        for name, got, exp in zip(("wp", "origin", "flush"), (self.wp, self.origin, self.flush), want_c):
            assert torch.equal(got.cpu(), exp), f"{tag} tree commit {name} {got.tolist()} != reference {exp.tolist()}"
        for name, got, exp in zip(("x_ring", "B_ring", "dt_ring"), rings, want_r):
            assert torch.equal(bits(got.cpu()), bits(exp)), f"{tag} tree commit: {name} differs from reference"
        check_spec_cursors(self.wp, self.origin, self.flush, window=T, ring_len=R, slots=self.slots)
        self.steps += 1
        return out, parents


@pytest.mark.parametrize("T,hist,geom", [(8, 8, SMALL_H2),
                                         pytest.param(8, 8, SMALL, marks=pytest.mark.slow),
                                         pytest.param(16, 16, SMALL, marks=pytest.mark.slow),
                                         pytest.param(5, 7, ODD, marks=pytest.mark.slow)],
                         ids=["T8B8", "T8B8h4", "T16B16", "T5B7odd"])
def test_stream_of_random_trees_and_paths_matches_sequential_recurrence(device, T, hist, geom):
    """40+ verify + tree-commit steps at fp32: random trees and accepted paths, ring wrap, flushes mid-path."""
    h = TreeHarness(device, geom, T, hist, F32, F32, n_req=2)
    for _ in range(42):
        h.step()
    assert h.flushes >= 3, f"{h.tag()} the stream must cross several flushes, saw {h.flushes}"
    assert h.flush_paths >= 1, f"{h.tag()} no path of length > 1 was accepted on a flush step"
    assert h.wraps >= 1, f"{h.tag()} the circular ring never wrapped"
    assert h.max_depth >= 3, f"{h.tag()} accepted paths stayed shallow ({h.max_depth})"


@pytest.mark.parametrize("variant", ["bc: pre", "bc: inline", "nonflush: chunked", "nonflush: mma, flush_split: 1"])
def test_load_orders_keep_trees_on_the_recurrence(device, tmp_path, monkeypatch, variant):
    """The row-indexed loads and the ancestor mask before the slot, with the cursors from the pre-kernel's per-row
    copy (``bc: pre``) or read after the slot (``bc: inline``), and a flush row's outputs from S_ck and the replayed
    history (its chunk loop folding only) or from its folded chunks (``nonflush: chunked``), under the same random
    trees, paths, flushes and padded rows."""
    from sglang_replayssm.kernels import common

    f = tmp_path / "cfg.yaml"
    f.write_text("mamba2_verify:\n  default: {inline_bc_max_batch: 0, " + variant + "}\n")
    monkeypatch.setenv(common.ENV_CONFIG_FILE, str(f))
    h = TreeHarness(device, SMALL_H2, 8, 8, F32, F32, n_req=2)
    for _ in range(14):
        h.step()
    assert h.flushes >= 1, f"{h.tag()} the stream must cross a flush, saw {h.flushes}"


def test_deep_trees_T16(device):
    """T = 16 with depth up to 8 and branching up to 4 (the CPU run's short stream; the long one is slow)."""
    h = TreeHarness(device, (2, 16, 16, 1), 16, 16, F32, F32, n_req=1, check_ref=False)
    for _ in range(6):
        h.step(pads=("null",))


@pytest.mark.parametrize("prec", [(F32, BF16), (BF16, BF16), (F16, F16)], ids=["s32a16b", "s16b_a16b", "s16_a16"])
def test_precisions_odd_geometry(device, prec):
    """H = 3, P = 24, N = 40 over two chunks, every state / activation dtype."""
    h = TreeHarness(device, ODD, 4, 4, *prec, n_req=2)
    for _ in range(10):
        h.step()
    assert h.flushes >= 1


def test_strided_pools_no_z_no_D_null_slot_none(device):
    h = TreeHarness(device, SMALL, 3, 3, F32, BF16, n_req=2, strided=True, has_z=False, has_D=False, null_slot=None)
    for _ in range(8):
        h.step(pads=("neg",))


def test_chain_as_tree_matches_chain_verify(device):
    """parents[s] = s - 1 gives the chain kernel's outputs and ring writes (flush and verify rows)."""
    gen, seed = make_gen()
    for flush_val in (0, 1):
        h = TreeHarness(device, ODD, 4, 5, F32, F32, n_req=2, check_ref=False)
        for _ in range(2):  # some committed history
            h.step(trees={i: list(range(-1, 3)) for i in range(2)}, accept_node=1)
        h.flush[h.slots[0]] = flush_val
        batch = len(h.slots)
        idx = torch.tensor(h.slots, dtype=torch.int32, device=device)
        inp = {k: (None if v is None else v.to(device)) for k, v in h._inputs(batch).items()}
        res = []
        for fn in ("chain", "tree"):
            snap = {k: b.clone() for k, (b, _) in h.bases.items()}
            v = {k: view_like(vv, snap[k]) for k, (_, vv) in h.bases.items()}
            args = (v["state"], v["x_ring"], v["B_ring"], v["dt_ring"], inp["x"], inp["dt"], h.A, inp["B"], inp["C"],
                    idx, h.wp, h.origin, h.flush)
            kw = dict(D=h.D, z=inp["z"], dt_bias=h.dt_bias)
            if fn == "chain":
                y = mamba2_verify(*args, **kw)
            else:
                y = mamba2_tree_verify(*args, chain_parents(batch, h.T, device), **kw)
            res.append((y, snap))
        (yc, sc), (yt, st) = res
        r_, i_ = mismatch(yt, yc, *REF_TOL[F32])
        assert r_ <= 1, f"[seed={seed}] flush={flush_val} tree-as-chain output off the chain kernel's by {r_:.3g}x"
        for name in ("x_ring", "B_ring"):
            assert torch.equal(bits(sc[name]), bits(st[name])), f"[seed={seed}] {name} differs from the chain's"
        r_, _ = mismatch(st["state"], sc["state"], *REF_TOL[F32])
        assert r_ <= 1, f"[seed={seed}] flushed checkpoint differs from the chain's by {r_:.3g}x"


def test_sibling_inputs_do_not_leak(device):
    """Changing one node's inputs changes exactly its subtree's outputs (bit-exact elsewhere)."""
    gen, seed = make_gen()
    h = TreeHarness(device, SMALL, 6, 6, F32, F32, n_req=1, check_ref=False)
    h.step(pads=())
    par = [-1, 0, 0, 1, 2, 1]  # 0 -> {1, 2}; 1 -> {3, 5}; 2 -> {4}
    idx = torch.tensor(h.slots, dtype=torch.int32, device=device)
    parents = torch.tensor([par], dtype=torch.int32, device=device)
    inp = {k: (None if v is None else v.to(device)) for k, v in h._inputs(1).items()}

    def run(x):
        snap = {k: b.clone() for k, (b, _) in h.bases.items()}
        v = {k: view_like(vv, snap[k]) for k, (_, vv) in h.bases.items()}
        return mamba2_tree_verify(v["state"], v["x_ring"], v["B_ring"], v["dt_ring"], x, inp["dt"], h.A, inp["B"],
                                  inp["C"], idx, h.wp, h.origin, h.flush, parents, D=h.D, z=inp["z"],
                                  dt_bias=h.dt_bias).cpu()

    clean = run(inp["x"])
    x2 = inp["x"].clone()
    x2[0, 1] += 3.0  # node 1: subtree {1, 3, 5}
    dirty = run(x2)
    changed = [t for t in range(6) if not torch.equal(bits(clean[0, t]), bits(dirty[0, t]))]
    assert changed == [1, 3, 5], f"[seed={seed}] changing node 1 changed nodes {changed}"


@pytest.mark.parametrize("bad,match", [
    (lambda p: p.to(torch.float32), "int32 or int64"),
    (lambda p: p[:, :-1], r"shape \(3, 4\)"),
    (lambda p: p[:1], r"shape \(3, 4\)"),
])
def test_parents_validation(device, bad, match):
    h = TreeHarness(device, SMALL, 4, 4, F32, F32, n_req=3, check_ref=False)
    inp = {k: (None if v is None else v.to(device)) for k, v in h._inputs(3).items()}
    idx = torch.tensor(h.slots, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=match):
        mamba2_tree_verify(h.state, h.x_ring, h.B_ring, h.dt_ring, inp["x"], inp["dt"], h.A, inp["B"], inp["C"],
                           idx, h.wp, h.origin, h.flush, bad(chain_parents(3, 4, device)))


def test_chain_validation_is_named_for_the_tree_entry(device):
    h = TreeHarness(device, SMALL, 4, 4, F32, F32, n_req=1, check_ref=False)
    inp = {k: (None if v is None else v.to(device)) for k, v in h._inputs(1).items()}
    idx = torch.tensor(h.slots, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"^mamba2_tree_verify: dt_ring must be float32"):
        mamba2_tree_verify(h.state, h.x_ring, h.B_ring, h.dt_ring.half(), inp["x"], inp["dt"], h.A, inp["B"],
                           inp["C"], idx, h.wp, h.origin, h.flush, chain_parents(1, 4, device))


def test_matches_sglang_stock_tree_verify(device):
    """SGLang 0.5.17's own tree verify (selective_state_update with retrieve_parent_token and per-node
    intermediate states, then the scatter of the accepted node's state) against ours (tree verify + tree
    commit) over 4 steps from one state, a flush included: every node output within 1e-3 (the harness of
    eval/bench_tree_spec.py, which the GPU benchmark runs too)."""
    bts = pytest.importorskip("eval.bench_tree_spec")
    kern = bts.bs.Kernels(device.type)
    if not kern.stock_ok("mamba2"):
        pytest.skip(f"SGLang's Mamba2 verify kernels are not importable here: {kern.errors}")
    res = bts.check("mamba2", dict(H=4, P=16, N=16, G=2), 8, 16, 4, 3, device.type, kern, 2, 4)
    assert res["flush_steps"], f"no flush in the checked steps: {res}"
    assert res["passed"], f"ours vs SGLang's tree verify: {res['steps']}"
