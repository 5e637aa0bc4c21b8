"""Tests of the GDN tree speculative verify (``gdn_verify.gdn_tree_verify``: the chain verify kernel with
``parents``, ``IS_TREE``) and its tree commit.

CUDA when present, else Triton's CPU interpreter (tests/conftest.py).  Fresh random inputs
every run (seed in every message; REPLAYSSM_TEST_SEED replays one).

Every step draws a random tree per row (depth <= 8, branching <= 4), verifies it, and
compares EVERY node's output -- and the d_i it writes to the ring -- with the fp64
sequential delta rule run from the committed state along that node's own path; then a
random root..node path is accepted and committed with :func:`spec_commit_tree` (checked
against its host reference) and the oracle's committed state advances to that node's
state.  Every flushed checkpoint must equal the oracle's committed state.  Ring pools and
outputs start as NaN: a read of a masked position or an unwritten live output shows.
"""

from __future__ import annotations

import pytest
import torch

from gdn_testlib import MANTISSA_BITS, ORACLE_TOL, REF_OUT_TOL, ULP_RTOL, bits, check_close
from kernel_testlib import make_gen
from test_mamba2_tree_verify import random_tree
from test_gdn_verify import VARIANTS as GDN_VERIFY_VARIANTS

from sglang_replayssm.kernels.common import interpreting
from sglang_replayssm.kernels.gdn_verify import gdn_tree_verify, gdn_verify
from sglang_replayssm.kernels.gdn_verify_ref import gdn_tree_oracle, gdn_tree_verify_ref
from sglang_replayssm.kernels.spec_cursor import check_spec_cursors, spec_reset, spec_ring_len
from sglang_replayssm.kernels.spec_tree import chain_parents, check_tree_parents, spec_commit_tree, \
    spec_commit_tree_ref, tree_path

F32, BF16, F16, F64 = torch.float32, torch.bfloat16, torch.float16, torch.float64
SMALL = dict(Hk=1, HV=2, K=32, V=32)
ODD = dict(Hk=2, HV=6, K=24, V=40)  # 3 v-heads per k-head, K and V not powers of two
STATE_RTOL = 1e-5  # fp32 flushed checkpoint vs the fp64 oracle (relative to the state's scale)


@pytest.fixture
def whole_v_tile(tmp_path, monkeypatch):
    """In the interpreter, one V tile per (row, v-head) (its time grows with the number of programs);
    on CUDA the built-in launch parameters.  The tests that keep several V tiles do not use it."""
    if interpreting():
        f = tmp_path / "gdn_verify_launch.yaml"
        f.write_text("gdn_verify:\n  default:\n    BV: 64\n")
        monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))


class GdnTreeHarness:
    """Pools, rings, cursors, per-request committed fp64 states; one checked tree verify + tree commit."""

    def __init__(self, device, geom, T, hist, state_dtype=F32, act_dtype=F32, *, n_req=2, null_slot=0,
                 check_ref=True, round_beta=False):
        self.gen, self.seed = make_gen()
        self.dev = device
        self.Hk, self.HV, self.K, self.V = geom["Hk"], geom["HV"], geom["K"], geom["V"]
        self.T, self.R = T, spec_ring_len(hist, T)
        self.sd, self.ad = state_dtype, act_dtype
        self.null_slot, self.check_ref, self.round_beta = null_slot, check_ref, round_beta
        self.W = 2 * self.Hk * self.K + self.HV * self.V
        S = 2 * n_req + 3
        free = [s for s in range(S) if s != null_slot]
        perm = torch.randperm(len(free), generator=self.gen).tolist()
        self.slots = [free[i] for i in perm[:n_req]]
        HV, V, K, Hk, R = self.HV, self.V, self.K, self.Hk, self.R
        A = torch.rand(HV, generator=self.gen) * 15 + 1
        A[0] = torch.rand(1, generator=self.gen) * 0.18 + 0.02  # v-head 0 keeps a long memory
        self.A_log = torch.log(A)
        self.dt_bias = torch.rand(HV, generator=self.gen) * 1.5 - 1.0
        nan = float("nan")
        self.pools = {
            "state": (torch.randn(S, HV, V, K, generator=self.gen) * 2.0).to(state_dtype).to(device),
            "d": torch.full((S, HV, R, V), nan, dtype=state_dtype, device=device),
            "k": torch.full((S, Hk, R, K), nan, dtype=act_dtype, device=device),
            "g": torch.full((S, HV, R), nan, dtype=F32, device=device),
        }
        self.oracle = [self.pools["state"][s].cpu().to(F64) for s in self.slots]
        self.wp = torch.full((S,), 4, dtype=torch.int32, device=device)
        self.origin = torch.full((S,), 1, dtype=torch.int32, device=device)
        self.flush = torch.ones(S, dtype=torch.int32, device=device)
        spec_reset(self.wp, self.origin, self.flush, torch.tensor(self.slots, dtype=torch.int32, device=device),
                   window=T, ring_len=R, null_slot=null_slot)
        self.steps = self.flushes = self.wraps = self.flush_paths = self.max_depth = 0

    def tag(self):
        return f"[seed={self.seed} T={self.T} R={self.R} state={self.sd} act={self.ad} step={self.steps}]"

    def inputs(self, batch):
        g, T = self.gen, self.T
        return (torch.randn(batch, T, self.W, generator=g).to(self.ad), torch.randn(batch, T, self.HV, generator=g)
                .to(self.ad), torch.randn(batch, T, self.HV, generator=g).to(self.ad))

    def run(self, fn, x, a, b, idx, pools, cur, parents, out):
        return fn(x, a, b, self.A_log.to(self.dev), self.dt_bias.to(self.dev), pools["state"], pools["d"],
                  pools["k"], pools["g"], idx, *cur, parents, round_beta=self.round_beta, out=out,
                  null_slot=self.null_slot)

    def step(self, *, trees=None, accept_node=None, pads=("neg", "null"), out_dtype=None):
        dev, T, R = self.dev, self.T, self.R
        out_dtype = self.ad if out_dtype is None else out_dtype
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
        x, a, b = self.inputs(batch)
        xd, ad_, bd = x.to(dev), a.to(dev), b.to(dev)
        out = torch.full((batch, T, self.HV, self.V), float("nan"), dtype=out_dtype, device=dev)
        before = {k: t.clone() for k, t in self.pools.items()}
        cur = (self.wp, self.origin, self.flush)
        cur0 = {s: (int(self.wp[s]), int(self.origin[s]), int(self.flush[s])) for s in self.slots}
        if self.check_ref:
            ref = {k: t.clone() for k, t in before.items()}
            ref_out = torch.full_like(out, float("nan"))
            self.run(gdn_tree_verify_ref, xd, ad_, bd, idx, ref, cur, parents, ref_out)
        ret = self.run(gdn_tree_verify, xd, ad_, bd, idx, self.pools, cur, parents, out)
        assert ret is out
        live = [k for k, r in enumerate(rows) if not isinstance(r, str)]
        pad = [k for k, r in enumerate(rows) if isinstance(r, str)]
        now = self.pools

        # nothing outside the write set changed (window ring positions; the checkpoint on flush)
        allowed = {k: torch.zeros(t.shape, dtype=torch.bool) for k, t in now.items()}  # bits() is on the CPU
        for k in live:
            s = slot_of[k]
            w, o, f = cur0[s]
            phys = [(o + w + t) % R for t in range(T)]
            for name in ("d", "k", "g"):
                allowed[name][s, :, phys] = True
            if f and w > 0:
                allowed["state"][s] = True
        for name in now:
            assert torch.equal(bits(now[name])[~allowed[name]], bits(before[name])[~allowed[name]]), \
                f"{tag} {name}: memory outside the verify's write set changed"
        assert torch.isnan(out[pad].float()).all(), f"{tag} padded rows were written"
        assert torch.isfinite(out[live].float()).all(), f"{tag} a live output is not finite (unwritten / stale read)"

        if self.check_ref:
            check_close(now["state"], ref["state"], 1e-5 if self.sd == F32 else 1e-6, ULP_RTOL[self.sd],
                        f"{tag} checkpoint vs reference")
            if self.sd == F32:
                if out_dtype == F32:
                    check_close(out[live], ref_out[live], *REF_OUT_TOL, f"{tag} out vs reference")
                else:
                    check_close(out[live], ref_out[live], 1e-6, ULP_RTOL[out_dtype], f"{tag} out vs reference")
            d_atol = 1e-5
            if self.sd != F32:
                # a 16-bit checkpoint is rounded from fp32 values that kernel and reference form in different
                # orders: at a rounding tie one element lands a unit apart, and d = beta (v - S k^) carries that
                # unit times |k^|_1 <= sqrt(K) (unit keys, beta <= 1), which cancellation in v - S k^ can make
                # several units of a small d (seen: 2 units at 2/3840 elements, fp16)
                s_max = float(ref["state"].float().abs().max())
                _, e = torch.frexp(torch.tensor(max(s_max, 1e-30), dtype=torch.float64))
                d_atol = float(torch.ldexp(torch.tensor(1.0, dtype=torch.float64), e - 1 - MANTISSA_BITS[self.sd])) \
                    * self.K ** 0.5
            for name, atol, rtol in (("d", d_atol, ULP_RTOL[self.sd]), ("g", 0.0, 1e-5)):
                fin = torch.isfinite(ref[name].float())  # the rings start as NaN
                assert torch.equal(fin, torch.isfinite(now[name].float())), f"{tag} {name} written elsewhere"
                check_close(now[name][fin], ref[name][fin], atol, rtol, f"{tag} {name} ring vs reference")
            assert torch.equal(bits(now["k"]), bits(ref["k"])), f"{tag} k ring differs from reference"

        # oracle along every node's own path
        tol = ORACLE_TOL[self.sd]
        accepted = torch.zeros(batch, T, dtype=torch.int32)
        n_acc = torch.ones(batch, dtype=torch.int32)
        for k in live:
            i, s = rows[k], slot_of[k]
            w, o, f = cur0[s]
            base = self.oracle[i]
            if f and w > 0:
                self.flushes += 1
                if self.sd == F32:
                    err = float((now["state"][s].cpu().to(F64) - base).abs().max())
                    assert err <= STATE_RTOL * max(1.0, float(base.abs().max())), \
                        f"{tag} flushed checkpoint of slot {s} (folded {w}) off by {err:.3g}"
                else:
                    check_close(now["state"][s], base, *tol["state"][:2], f"{tag} flushed state slot {s}",
                                scale=tol["state"][2])
                base = now["state"][s].cpu().to(F64)  # continue from the stored (rounded) checkpoint
            o_orc, d_orc, st_orc = gdn_tree_oracle(x[k], a[k], b[k], self.A_log, self.dt_bias, base, par_rows[k],
                                                   num_k_heads=self.Hk, round_beta=self.round_beta)
            atol, rtol, scale = tol["out"]
            if out_dtype != F32:
                rtol = max(rtol, ULP_RTOL[out_dtype])
            check_close(out[k], o_orc, atol, rtol, f"{tag} request {i} outputs vs the per-path oracle "
                        f"(parents {par_rows[k]}, wp={w} origin={o} flush={f})", scale=scale)
            if self.sd == F32:  # node i's ring d is its delta-rule correction along its own path
                phys = [(o + w + t) % R for t in range(T)]
                check_close(now["d"][s][:, phys].permute(1, 0, 2), d_orc, 2e-5, 2e-5,
                            f"{tag} request {i} ring d vs the per-path oracle")
            node = int(torch.randint(0, T, (1,), generator=self.gen)) if accept_node is None else accept_node
            path = tree_path(par_rows[k], node)
            self.max_depth = max(self.max_depth, len(path) - 1)
            accepted[k, :len(path)] = torch.tensor(path, dtype=torch.int32)
            accepted[k, len(path):] = torch.randint(0, T, (T - len(path),), generator=self.gen, dtype=torch.int32)
            n_acc[k] = len(path)
            self.oracle[i] = st_orc[node]
            if f and len(path) > 1:
                self.flush_paths += 1
            if (o + w + T - 1) // R != o // R:
                self.wraps += 1

        rings = [now["d"], now["k"], now["g"]]
        want_c = [t.cpu().clone() for t in cur]
        want_r = [r.cpu().clone() for r in rings]
        spec_commit_tree_ref(*want_c, idx.cpu(), accepted, n_acc, want_r, window=T, ring_len=R,
                             null_slot=self.null_slot)
        spec_commit_tree(*cur, idx, accepted.to(dev), n_acc.to(dev), rings, window=T, ring_len=R,
                         null_slot=self.null_slot)
        for name, got, exp in zip(("wp", "origin", "flush"), cur, want_c):
            assert torch.equal(got.cpu(), exp), f"{tag} tree commit {name} {got.tolist()} != reference {exp.tolist()}"
        for name, got, exp in zip(("d", "k", "g"), rings, want_r):
            assert torch.equal(bits(got), bits(exp)), f"{tag} tree commit: {name} ring differs from reference"
        check_spec_cursors(*cur, window=T, ring_len=R, slots=self.slots)
        self.steps += 1
        return out, parents


@pytest.mark.parametrize("T,hist,geom", [(8, 8, SMALL),
                                         pytest.param(16, 16, SMALL, marks=pytest.mark.slow),
                                         pytest.param(5, 7, ODD, marks=pytest.mark.slow)],
                         ids=["T8B8", "T16B16", "T5B7odd"])
def test_stream_of_random_trees_and_paths_matches_sequential_recurrence(device, whole_v_tile, T, hist, geom):
    """40+ verify + tree-commit steps at fp32: random trees and accepted paths, ring wrap, flushes mid-path."""
    h = GdnTreeHarness(device, geom, T, hist, F32, F32, n_req=2)
    for _ in range(42):
        h.step()
    assert h.flushes >= 3, f"{h.tag()} the stream must cross several flushes, saw {h.flushes}"
    assert h.flush_paths >= 1, f"{h.tag()} no path of length > 1 was accepted on a flush step"
    assert h.wraps >= 1, f"{h.tag()} the circular ring never wrapped"
    assert h.max_depth >= 3, f"{h.tag()} accepted paths stayed shallow ({h.max_depth})"


def test_deep_trees_T16(device):
    """T = 16 with depth up to 8 and branching up to 4 (the CPU run's short stream; the long one is slow)."""
    h = GdnTreeHarness(device, SMALL, 16, 16, F32, F32, n_req=1, check_ref=False)
    for _ in range(6):
        h.step(pads=("null",))


@pytest.mark.parametrize("prec", [(F32, BF16), (BF16, BF16), (F16, F16)], ids=["s32a16b", "s16b_a16b", "s16_a16"])
def test_precisions_odd_geometry(device, whole_v_tile, prec):
    """Hk = 2, HV = 6, K = 24, V = 40, every state / activation dtype (round_beta on the bf16 state)."""
    h = GdnTreeHarness(device, ODD, 4, 4, *prec, n_req=2, round_beta=prec[0] == BF16)
    for _ in range(6):
        h.step()
    assert h.flushes >= 1


def test_null_slot_none_fp32_output_of_bf16_activations(device):
    h = GdnTreeHarness(device, SMALL, 3, 3, F32, BF16, n_req=2, null_slot=None)
    for _ in range(8):
        h.step(pads=("neg",), out_dtype=F32)


def test_chain_as_tree_matches_chain_verify(device, whole_v_tile):
    """parents[i] = i - 1 gives the chain kernel's outputs and ring writes (flush and verify rows)."""
    for flush_val in (0, 1):
        h = GdnTreeHarness(device, ODD, 4, 5, F32, F32, n_req=2, check_ref=False)
        for _ in range(1 + flush_val):  # some committed history
            h.step(trees={i: [-1, 0, 1, 2] for i in range(2)}, accept_node=2, pads=())
        h.flush[h.slots[0]] = flush_val
        batch = len(h.slots)
        idx = torch.tensor(h.slots, dtype=torch.int32, device=device)
        x, a, b = (t.to(device) for t in h.inputs(batch))
        res = []
        for fn in ("chain", "tree"):
            pools = {k: t.clone() for k, t in h.pools.items()}
            out = torch.full((batch, h.T, h.HV, h.V), float("nan"), device=device)
            cur = (h.wp, h.origin, h.flush)
            if fn == "chain":
                gdn_verify(x, a, b, h.A_log.to(device), h.dt_bias.to(device), pools["state"], pools["d"],
                           pools["k"], pools["g"], idx, *cur, out=out)
            else:
                h.run(gdn_tree_verify, x, a, b, idx, pools, cur, chain_parents(batch, h.T, device), out)
            res.append((out, pools))
        (oc, pc), (ot, pt) = res
        check_close(ot, oc, *REF_OUT_TOL, f"[seed={h.seed}] flush={flush_val} tree-as-chain output vs chain kernel")
        fin = torch.isfinite(pc["d"])  # the ring starts as NaN
        assert torch.equal(fin, torch.isfinite(pt["d"])), f"[seed={h.seed}] d ring written elsewhere than the chain's"
        check_close(pt["d"][fin], pc["d"][fin], 1e-6, 1e-5, f"[seed={h.seed}] d ring vs chain kernel")
        check_close(pt["state"], pc["state"], 1e-6, 1e-5, f"[seed={h.seed}] checkpoint vs chain kernel")
        for name in ("k", "g"):
            assert torch.equal(bits(pt[name]), bits(pc[name])), f"[seed={h.seed}] {name} ring differs from the chain's"


def test_sibling_inputs_do_not_leak(device):
    """Changing one node's inputs changes exactly its subtree's outputs and ring d (bit-exact elsewhere)."""
    h = GdnTreeHarness(device, SMALL, 6, 6, F32, F32, n_req=1, check_ref=False)
    h.step(pads=())
    par = [-1, 0, 0, 1, 2, 1]  # 0 -> {1, 2}; 1 -> {3, 5}; 2 -> {4}
    idx = torch.tensor(h.slots, dtype=torch.int32, device=device)
    parents = torch.tensor([par], dtype=torch.int32, device=device)
    x, a, b = (t.to(device) for t in h.inputs(1))
    s = h.slots[0]
    w, o = int(h.wp[s]), int(h.origin[s])
    phys = [(o + w + t) % h.R for t in range(6)]

    def run(xx):
        pools = {k: t.clone() for k, t in h.pools.items()}
        y = h.run(gdn_tree_verify, xx, a, b, idx, pools, (h.wp, h.origin, h.flush), parents, None)
        return y.cpu(), pools["d"][s][:, phys].cpu()

    clean, d_clean = run(x)
    x2 = x.clone()
    x2[0, 1] += 1.0  # node 1's q, k and v: subtree {1, 3, 5}
    dirty, d_dirty = run(x2)
    changed = [t for t in range(6) if not torch.equal(bits(clean[0, t]), bits(dirty[0, t]))]
    assert changed == [1, 3, 5], f"[seed={h.seed}] changing node 1 changed outputs {changed}"
    changed = [t for t in range(6) if not torch.equal(bits(d_clean[:, t]), bits(d_dirty[:, t]))]
    assert changed == [1, 3, 5], f"[seed={h.seed}] changing node 1 changed ring d of {changed}"


@pytest.mark.parametrize("bad,match", [
    (lambda p: p.to(torch.float32), "int32 or int64"),
    (lambda p: p[:, :-1], r"shape \(2, 4\)"),
    (lambda p: p.cpu() if p.is_cuda else p[None], r"parents"),
])
def test_parents_validation(device, bad, match):
    h = GdnTreeHarness(device, SMALL, 4, 4, F32, F32, n_req=2, check_ref=False)
    x, a, b = (t.to(device) for t in h.inputs(2))
    idx = torch.tensor(h.slots, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=match):
        h.run(gdn_tree_verify, x, a, b, idx, h.pools, (h.wp, h.origin, h.flush), bad(chain_parents(2, 4, device)),
              None)


def test_chain_validation_is_named_for_the_tree_entry(device):
    h = GdnTreeHarness(device, SMALL, 4, 4, F32, F32, n_req=1, check_ref=False)
    x, a, b = (t.to(device) for t in h.inputs(1))
    idx = torch.tensor(h.slots, dtype=torch.int32, device=device)
    pools = dict(h.pools, g=h.pools["g"].half())
    with pytest.raises(ValueError, match=r"^gdn_tree_verify: g_ring dtype must be float32"):
        h.run(gdn_tree_verify, x, a, b, idx, pools, (h.wp, h.origin, h.flush), chain_parents(1, 4, device), None)


def test_matches_sglang_stock_tree_verify(device):
    """SGLang 0.5.17's own tree verify (fused_sigmoid_gating_delta_rule_update with retrieve_parent_token and
    per-node intermediate states, then the scatter of the accepted node's state) against ours (tree verify +
    tree commit) over 4 steps from one state, a flush included: every node output within 1e-3 (the harness of
    eval/bench_tree_spec.py, which the GPU benchmark runs too)."""
    bts = pytest.importorskip("eval.bench_tree_spec")
    kern = bts.bs.Kernels(device.type)
    if not kern.stock_ok("gdn"):
        pytest.skip(f"SGLang's GDN verify kernels are not importable here: {kern.errors}")
    res = bts.check("gdn", dict(HV=4, Hk=2, K=32, V=32), 8, 16, 4, 3, device.type, kern, 2, 4)
    assert res["flush_steps"], f"no flush in the checked steps: {res}"
    assert res["passed"], f"ours vs SGLang's tree verify: {res['steps']}"


@pytest.mark.parametrize("variant", list(GDN_VERIFY_VARIANTS))
def test_launch_variants_random_trees(device, tmp_path, monkeypatch, variant):
    """The tree path (IS_TREE) under every launch variant of the chain's ``gdn_verify`` config (reduce: bcast /
    token, scores: inline / pre, flush: rank1 / dot; two V tiles): random trees checked against the reference
    and the per-path oracle, flushes included."""
    entries = dict(BV=16, **GDN_VERIFY_VARIANTS[variant])
    f = tmp_path / "gdn_verify_launch.yaml"
    f.write_text("gdn_verify:\n  default:\n" + "".join(f"    {k}: {v}\n" for k, v in entries.items()))
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
    h = GdnTreeHarness(device, SMALL, 4, 4, F32, F32, n_req=2)
    for _ in range(6):
        h.step()
    assert h.flushes >= 1, f"{h.tag()} no flush in the stream"
