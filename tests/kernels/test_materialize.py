"""Tests of the ring materialize kernels (``kernels/materialize.py``).

Scenario per test: a few requests decode different numbers of steps with the real
decode kernels (``mamba2_replay_decode`` / ``gdn_replay_decode``; a request that does
not take part in a step gets a padded row, slot -1), which leaves rings with w = 0,
0 < w < L-1, w = L-1 and w after a flush.  Then the slots are materialized and each
checkpoint must equal the fp64 sequential oracle state after that request's steps
(``mamba2_step_oracle`` / ``gdn_step_oracle``), with write_pos = 0.  Decoding then
continues on the empty rings (across another flush) and must still follow the oracle,
and a second materialize must again be exact.  Slots with w = 0, padded (-1) and
null-slot entries must stay bit-identical (state, ring, cursor).

Runs on CUDA when present, else in Triton's CPU interpreter (tests/conftest.py).
Fresh random inputs every run; the seed is printed (replay: MATERIALIZE_TEST_SEED).

Tolerances vs the fp64 oracle, |a - e| <= atol + rtol |e| (+ scale max|e|):
  fp32 state: 1e-4 / 1e-4 (states; outputs with bf16 activations: 1.5e-2 / 2e-3, the
  output store rounds to bf16); bf16 state: rtol 2^-6 + scale 2^-6 (the checkpoint and
  GDN's d ring are rounded to bf16).  Kernel vs the fp32 PyTorch reference: 2e-5 (fp32
  states), two bf16 ulps (bf16 states).
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_replayssm.kernels.gdn_ref import gdn_step_oracle
from sglang_replayssm.kernels.gdn_replay import gdn_replay_decode
from sglang_replayssm.kernels.mamba2_ref import mamba2_step_oracle
from sglang_replayssm.kernels.mamba2_replay import mamba2_replay_decode
from sglang_replayssm.kernels.materialize import (gdn_materialize, gdn_materialize_ref, mamba2_materialize,
                                                  mamba2_materialize_ref, materialize_ring, reset_cursors)
from sglang_replayssm.ring import make_ring

F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64
NULL = 0


@pytest.fixture
def seed(request):
    s = int(os.environ.get("MATERIALIZE_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"[{request.node.name}] seed={s}  (replay: MATERIALIZE_TEST_SEED={s})")
    return s


def state_tol(sd):
    return (1e-4, 1e-4, 0.0) if sd == F32 else (2.0 ** -6, 0.0, 2.0 ** -6)


def out_tol(sd, ad):
    if sd == F32 and ad == F32:
        return (1e-4, 1e-4, 0.0)
    if sd == F32:
        return (1.5e-2, 2e-3, 0.0)
    return (2e-2, 0.0, 2e-2)


def check_close(actual, expected, tol, what, seed):
    rtol, atol, scale = tol
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    lim = atol + rtol * e.abs() + scale * float(e.abs().max())
    err = (a - e).abs()
    bad = ~(err <= lim)
    assert not bool(bad.any()), (f"{what}: {int(bad.sum())}/{bad.numel()} off, max err {float(err.max()):.3e} "
                                 f"(seed {seed})")
    return float(err.max())


def bits(t):
    t = t.detach().cpu().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


class Sim:
    """Pools (optionally strided views), a per-slot fp64 oracle, cursors, and decode steps."""

    def __init__(self, family, device, seed, *, sd=F32, ad=F32, L=6, n_slots=8, strided=False):
        self.family, self.dev, self.seed = family, torch.device(device), seed
        self.gen = torch.Generator().manual_seed(seed)
        self.sd, self.ad, self.L, self.S = sd, ad, L, n_slots
        S = n_slots
        if family == "mamba2":
            self.H, self.P, self.N, self.G = H, P, N, G = 4, 16, 24, 2
            self.A = (-torch.exp(self.rand(H) * 2 - 1)).to(self.dev)
            self.dt_bias = (-3 * self.rand(H)).to(self.dev)
            self.D = self.randn(H).to(self.dev)
            shapes = {"state": ((S, H, P, N), sd), "x": ((S, H, L, P), ad), "B": ((S, G, L, N), ad),
                      "dt": ((S, H, L), F32)}
        else:
            self.Hk, self.HV, self.K, self.V = Hk, HV, K, V = 1, 2, 32, 32
            A = torch.exp(self.rand(HV) * 2.0)  # decays alpha = exp(-A softplus(.)), A in [1, e^2]
            A[0] = 0.05  # head 0: long memory, so the whole ring stays visible
            self.A_log = torch.log(A).to(self.dev)
            self.dt_bias = (self.rand(HV) * 3 - 2).to(self.dev)
            shapes = {"state": ((S, HV, V, K), sd), "d": ((S, HV, L, V), sd), "k": ((S, Hk, L, K), ad),
                      "g": ((S, HV, L), F32)}
        self.p = {}
        for name, (shape, dt) in shapes.items():
            if strided:  # junk-filled larger buffer, slot-major view with a gap (last dim contiguous)
                big = (self.randn((shape[0] + 1,) + shape[1:-1] + (shape[-1] + 3,)) if name != "g"
                       else -self.rand((shape[0] + 1,) + shape[1:-1] + (shape[-1] + 3,))).to(dt).to(self.dev)
                view = big[1:, ..., 2:2 + shape[-1]]
                if name == "state" and family == "mamba2":  # Mamba2 takes any strides: transpose P/N storage
                    big = self.randn((S + 1, shape[1], shape[3], shape[2] + 2)).to(dt).to(self.dev)
                    view = big[1:, :, :, 1:1 + shape[2]].transpose(2, 3)
                assert tuple(view.shape) == shape and not view.is_contiguous()
                self.p[name] = view
            else:
                t = self.randn(shape) if name != "g" else -self.rand(shape)
                self.p[name] = t.to(dt).to(self.dev)
        if family == "mamba2":
            self.p["dt"].abs_()
        self.write_pos = torch.randint(0, L, (S,), generator=self.gen, dtype=torch.int32).to(self.dev)
        self.oracle = {}

    def rand(self, *shape):
        return torch.rand(*shape, generator=self.gen)

    def randn(self, *shape):
        return torch.randn(*shape, generator=self.gen)

    def activate(self, slot):
        self.write_pos[slot] = 0
        self.oracle[slot] = self.p["state"][slot].double().cpu()

    # one decode step for ``slots`` (one row per entry; -1 = padded row)
    def step(self, slots, check_out=True):
        n = len(slots)
        sl = torch.tensor(slots, dtype=torch.int64)
        live = [i for i, s in enumerate(slots) if s >= 0]
        wp_rows = self.write_pos[sl.clamp(min=0).to(self.dev)].clone()
        if self.family == "mamba2":
            x = self.randn(n, self.H, self.P).to(self.ad).to(self.dev)
            dt = self.randn(n, self.H).to(self.ad).to(self.dev)
            B = self.randn(n, self.G, self.N).to(self.ad).to(self.dev)
            C = self.randn(n, self.G, self.N).to(self.ad).to(self.dev)
            out = mamba2_replay_decode(self.p["state"], self.p["x"], self.p["B"], self.p["dt"], x, dt, self.A,
                                       B, C, sl.to(self.dev), wp_rows, D=self.D, dt_bias=self.dt_bias,
                                       null_slot=NULL)
            for i in live:
                s = slots[i]
                S_new, y = mamba2_step_oracle(self.oracle[s][None], x[i:i + 1].cpu(), dt[i:i + 1].cpu(),
                                              self.A.cpu(), B[i:i + 1].cpu(), C[i:i + 1].cpu(), D=self.D.cpu(),
                                              dt_bias=self.dt_bias.cpu())
                self.oracle[s] = S_new[0]
                if check_out:
                    check_close(out[i], y[0], out_tol(self.sd, self.ad), f"decode out slot {s}", self.seed)
        else:
            W = 2 * self.Hk * self.K + self.HV * self.V
            qkv = self.randn(n, W).to(self.ad).to(self.dev)
            a = self.randn(n, self.HV).to(self.ad).to(self.dev)
            b = self.randn(n, self.HV).to(self.ad).to(self.dev)
            out = gdn_replay_decode(qkv, a, b, self.A_log, self.dt_bias, self.p["state"], self.p["d"],
                                    self.p["k"], self.p["g"], sl.to(self.dev), wp_rows, null_slot=NULL)
            for i in live:
                s = slots[i]
                o, h = gdn_step_oracle(qkv[i:i + 1].cpu(), a[i:i + 1].cpu(), b[i:i + 1].cpu(), self.A_log.cpu(),
                                       self.dt_bias.cpu(), self.oracle[s][None], num_k_heads=self.Hk)
                self.oracle[s] = h[0]
                if check_out:
                    check_close(out[i], o[0], out_tol(self.sd, self.ad), f"decode out slot {s}", self.seed)
        for i in live:  # the cursor advance the decode seam does; a flush re-syncs the oracle's rounding
            s = slots[i]
            w = int(wp_rows[i])
            if w == self.L - 1:
                self.write_pos[s] = 0
                if self.sd != F32:
                    self.oracle[s] = self.p["state"][s].double().cpu()
            else:
                self.write_pos[s] = w + 1

    def materialize(self, slots, fn=None, **kw):
        if self.family == "mamba2":
            f = fn or mamba2_materialize
            f(self.p["state"], self.p["x"], self.p["B"], self.p["dt"], self.A, self.write_pos, slots,
              null_slot=NULL, **kw)
        else:
            f = fn or gdn_materialize
            f(self.p["state"], self.p["d"], self.p["k"], self.p["g"], self.write_pos, slots, null_slot=NULL, **kw)

    def snapshot(self):
        return {n: t.clone() for n, t in self.p.items()} | {"write_pos": self.write_pos.clone()}


def run_scenario(sim: Sim, steps_per_req, extra_steps):
    """Decode, materialize and check; returns the live request slots."""
    L = sim.L
    free = [s for s in range(1, sim.S)]
    perm = torch.randperm(len(free), generator=sim.gen).tolist()
    req = [free[i] for i in perm[: len(steps_per_req)]]
    idle = [free[i] for i in perm[len(steps_per_req):]]  # never decoded: cursors stay as they are
    for s in req:
        sim.activate(s)
    for t in range(max(steps_per_req)):
        sim.step([s if t < k else -1 for s, k in zip(req, steps_per_req)])
    expect_w = [k if k < L else (k - L) for k in steps_per_req]  # one flush at most (k < 2L)
    assert sim.write_pos[torch.tensor(req, device=sim.dev)].tolist() == expect_w, "scenario setup"
    assert max(steps_per_req) < 2 * L

    before = sim.snapshot()
    ref = {n: t.clone() for n, t in sim.p.items()}
    ref_wp = sim.write_pos.clone()
    # materialize the requests, plus padded and null entries (never the idle slots)
    listed = req + [-1, NULL]
    order = torch.randperm(len(listed), generator=sim.gen).tolist()
    listed = torch.tensor([listed[i] for i in order], dtype=torch.int32, device=sim.dev)
    sim.materialize(listed)

    # reference on the pre-materialize copy
    if sim.family == "mamba2":
        mamba2_materialize_ref(ref["state"], ref["x"], ref["B"], ref["dt"], sim.A, ref_wp, listed.cpu(),
                               null_slot=NULL)
    else:
        gdn_materialize_ref(ref["state"], ref["d"], ref["k"], ref["g"], ref_wp, listed.cpu(), null_slot=NULL)
    ref_tol = (2e-5, 2e-5, 0.0) if sim.sd == F32 else (2.0 ** -6, 1e-5, 0.0)
    check_close(sim.p["state"], ref["state"], ref_tol, "materialize vs PyTorch reference", sim.seed)
    assert torch.equal(sim.write_pos, ref_wp)

    for s, w in zip(req, expect_w):
        assert int(sim.write_pos[s]) == 0
        if w == 0:  # nothing pending: bit-identical
            assert torch.equal(bits(sim.p["state"][s]), bits(before["state"][s])), f"w=0 slot {s} rewritten"
        check_close(sim.p["state"][s], sim.oracle[s], state_tol(sim.sd), f"materialized slot {s} (w={w})",
                    sim.seed)
        sim.oracle[s] = sim.p["state"][s].double().cpu()  # round where the kernel rounds
    for s in idle + [NULL]:  # not materialized (idle) / null slot: untouched
        assert torch.equal(bits(sim.p["state"][s]), bits(before["state"][s]))
        assert int(sim.write_pos[s]) == int(before["write_pos"][s])
    for name in sim.p:  # rings are never written by a materialize
        if name != "state":
            assert torch.equal(bits(sim.p[name]), bits(before[name]))

    # continue on the empty rings (across a flush), then materialize again
    for _ in range(extra_steps):
        sim.step(req)
    sim.materialize(torch.tensor(req, device=sim.dev))
    for s in req:
        assert int(sim.write_pos[s]) == 0
        check_close(sim.p["state"][s], sim.oracle[s], state_tol(sim.sd), f"second materialize slot {s}", sim.seed)
    return req


PRECS = [(F32, F32), (F32, BF16), (BF16, BF16)]
PREC_IDS = ["s32a32", "s32a16b", "s16b_a16b"]


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("prec", [pytest.param(PRECS[0], marks=pytest.mark.slow), *PRECS[1:]],
                         ids=PREC_IDS)  # all-fp32: the GPU run's
def test_materialize_matches_oracle(device, seed, family, prec):
    L = 6
    sim = Sim(family, device, seed, sd=prec[0], ad=prec[1], L=L)
    # w = 0 (never decoded), 3, L-1 (the next step would flush), 3 after a flush
    run_scenario(sim, [0, 3, L - 1, L + 3], extra_steps=L + 2)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_strided_views(device, seed, family):
    L = 5
    sim = Sim(family, device, seed, L=L, strided=True)
    run_scenario(sim, [2, L - 1, L + 1], extra_steps=3)


@pytest.mark.parametrize("form", ["stacked", "list"])
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_materialize_ring_all_layers(device, seed, family, form):
    """``materialize_ring``: every layer folded with the shared cursor, reset once after the last layer; SGLang's
    stacked ``[layers, S, ...]`` checkpoint in one launch (layer x tile programs: head / value dims of two tiles,
    Mamba2 A tied over P and N on one layer), a list of per-layer views one layer at a time."""
    gen = torch.Generator().manual_seed(seed)
    L, S, nl = 5, 6, 3
    if family == "mamba2":
        P = 40  # two row tiles of 32
        ring = make_ring("mamba2", nl, S, device, nheads=4, head_dim=P, dstate=16, ngroups=2, buffer_len=L,
                         act_dtype=F32)
        temporal = torch.randn(nl, S, 4, P, 16, generator=gen).to(device)
        A = [(-torch.rand(4, generator=gen)).to(device) for _ in range(nl)]
        A[1] = A[1].view(4, 1, 1).expand(4, P, 16)  # SGLang's tied form
    else:
        ring = make_ring("gdn", nl, S, device, num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=24,
                         buffer_len=L, act_dtype=F32, state_dtype=F32)  # V 24: two value tiles of 16
        temporal = torch.randn(nl, S, 2, 24, 16, generator=gen).to(device)
        A = None
    for name, t in ring.tensors.items():
        t.copy_(torch.randn(t.shape, generator=gen).abs().to(t.dtype) * (-1 if name == "g" else 1))
    ring.write_pos.copy_(torch.tensor([3, 2, 0, 4, 1, 3], dtype=torch.int32))
    slots = torch.tensor([2, 1, -1, 3, 0], device=device)  # 0 is the null slot
    orig = temporal.clone()
    ref_state = temporal.clone()
    ref_wp = ring.write_pos.clone()
    for i in range(nl):
        lay = ring.layer(i)
        if family == "mamba2":
            mamba2_materialize_ref(ref_state[i], lay["x"], lay["B"], lay["dt"], A[i], ref_wp.clone(), slots.cpu())
        else:
            gdn_materialize_ref(ref_state[i], lay["d"], lay["k"], lay["g"], ref_wp.clone(), slots.cpu())
    materialize_ring(ring, temporal if form == "stacked" else [temporal[i] for i in range(nl)], slots, A=A)
    assert ring.write_pos.tolist() == [3, 0, 0, 0, 1, 3]
    check_close(temporal, ref_state, (2e-5, 2e-5, 0.0), "materialize_ring vs reference", seed)
    # slot 1 (layer 1+) really changed: the cursor was not reset after layer 0
    assert float((temporal[nl - 1, 1] - orig[nl - 1, 1]).abs().max()) > 1e-3
    assert torch.equal(temporal[:, 4], orig[:, 4]) and torch.equal(temporal[:, 0], orig[:, 0])
    if family == "mamba2":
        with pytest.raises(ValueError, match="needs A"):
            materialize_ring(ring, temporal, slots)
        untied = [A[0], A[0].view(4, 1).repeat(1, P), A[2]]  # [H, P] with real P values: not per head
        with pytest.raises(ValueError, match="tied"):
            materialize_ring(ring, temporal if form == "stacked" else [temporal[i] for i in range(nl)], slots,
                             A=untied)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_layered_fold_matches_one_layer_at_a_time_on_a_spec_ring(device, seed, family):
    """``layered=True`` on a spec ring (origin cursors, wrapped windows) writes exactly what per-layer calls
    write, and refuses tensors whose layer counts differ."""
    gen = torch.Generator().manual_seed(seed)
    L, S, nl, T = 5, 5, 2, 3
    kw = dict(nheads=2, head_dim=16, dstate=16, ngroups=1) if family == "mamba2" else \
        dict(num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16, state_dtype=F32)
    ring = make_ring(family, nl, S, device, spec_window=T, buffer_len=L, act_dtype=F32, **kw)
    shape = (nl, S, 2, 16, 16)
    temporal = torch.randn(shape, generator=gen).to(device)
    for name, t in ring.tensors.items():
        t.copy_(torch.randn(t.shape, generator=gen).abs().to(t.dtype) * (-1 if name == "g" else 1))
    R = ring.ring_len
    wp = torch.tensor([0, 4, 2, 5, 3], dtype=torch.int32)
    org = torch.tensor([0, R - 2, 1, R - 1, 3], dtype=torch.int32)  # windows that wrap
    slots = torch.tensor([1, 3, 4, 2], device=device)
    A = (-torch.rand(nl, 2, generator=gen)).to(device)
    got, want = temporal.clone(), temporal.clone()
    cur_a = (wp.clone().to(device), org.clone().to(device), torch.zeros(S, dtype=torch.int32, device=device))
    cur_b = tuple(c.clone() for c in cur_a)
    t = ring.tensors
    if family == "mamba2":
        mamba2_materialize(got, t["x"], t["B"], t["dt"], A, cur_a[0], slots, spec_cursors=cur_a[1:], layered=True)
        for i in range(nl):
            mamba2_materialize(want[i], t["x"][i], t["B"][i], t["dt"][i], A[i], cur_b[0], slots,
                               spec_cursors=cur_b[1:], reset_cursor=i == nl - 1)
        with pytest.raises(ValueError, match="same leading layer dimension"):
            mamba2_materialize(got, t["x"], t["B"], t["dt"], A[:1], cur_a[0], slots, layered=True)
    else:
        gdn_materialize(got, t["d"], t["k"], t["g"], cur_a[0], slots, spec_cursors=cur_a[1:], layered=True)
        for i in range(nl):
            gdn_materialize(want[i], t["d"][i], t["k"][i], t["g"][i], cur_b[0], slots, spec_cursors=cur_b[1:],
                            reset_cursor=i == nl - 1)
        with pytest.raises(ValueError, match="same leading layer dimension"):
            gdn_materialize(got[:1], t["d"], t["k"], t["g"], cur_a[0], slots, layered=True)
    assert torch.equal(got, want), seed
    assert not torch.equal(got, temporal)
    assert all(torch.equal(a, b) for a, b in zip(cur_a, cur_b))


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_teeth(device, seed, family):
    """A skipped materialize, a corrupted ring entry and a wrong cursor are all visible."""
    L = 6
    sim = Sim(family, device, seed, L=L)
    req = [1, 2]
    for s in req:
        sim.activate(s)
    for _ in range(4):
        sim.step(req)
    tol = state_tol(F32)
    # no materialize: the checkpoint lags by 4 tokens
    lag = float((sim.p["state"][1].double().cpu() - sim.oracle[1]).abs().max())
    assert lag > 100 * tol[1], f"checkpoint unexpectedly equals the oracle without a fold ({lag:.2e})"
    # corrupt the oldest ring entry of slot 1 (every head: one head's dt B or decay can make its error small;
    # head 0 alone missed the bound with seed 252558938), fold on a copy: off by far more than the tolerance
    snap = sim.snapshot()
    if family == "mamba2":
        sim.p["x"][1, :, 0] += 1.0
    else:
        sim.p["d"][1, :, 0] += 1.0
    sim.materialize([1])
    err = float((sim.p["state"][1].double().cpu() - sim.oracle[1]).abs().max())
    assert err > 10 * tol[1], f"corrupted ring entry went unnoticed ({err:.2e})"
    # a cursor one short drops the newest token
    for n, t in snap.items():
        (sim.write_pos if n == "write_pos" else sim.p[n]).copy_(t)
    sim.write_pos[2] = 3
    sim.materialize([2])
    err = float((sim.p["state"][2].double().cpu() - sim.oracle[2]).abs().max())
    assert err > 10 * tol[1], f"short cursor went unnoticed ({err:.2e})"


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_noop_cases_are_bit_identical(device, seed, family):
    """Empty slot lists, all-padded lists, w=0 slots, reset_cursor=False and L=1 write nothing they must not."""
    sim = Sim(family, device, seed, L=4)
    sim.write_pos.copy_(torch.tensor([2, 0, 3, 0, 1, 2, 0, 3], dtype=torch.int32))
    snap = sim.snapshot()

    def same(except_state=(), except_wp=()):
        for n, t in snap.items():
            cur = sim.write_pos if n == "write_pos" else sim.p[n]
            for s in range(sim.S):
                if (n == "state" and s in except_state) or (n == "write_pos" and s in except_wp):
                    continue
                assert torch.equal(bits(cur[s]), bits(t[s])), f"{n}[{s}] changed"

    sim.materialize(torch.empty(0, dtype=torch.int64, device=sim.dev))
    sim.materialize(torch.tensor([-1, NULL, -7], device=sim.dev))
    sim.materialize([1, 3, 6])  # all w == 0
    same()
    reset_cursors(sim.write_pos, [-1, NULL])
    same()
    sim.materialize([2, 4], reset_cursor=False)
    same(except_state=(2, 4))
    assert sim.write_pos.tolist() == snap["write_pos"].tolist()
    reset_cursors(sim.write_pos, torch.tensor([2, 4, -1], dtype=torch.int32))
    same(except_state=(2, 4), except_wp=(2, 4))
    assert sim.write_pos[2] == 0 and sim.write_pos[4] == 0 and sim.write_pos[0] == 2


def test_validation(device):
    S, H, P, N, G, L = 3, 2, 16, 16, 1, 4
    st = torch.zeros(S, H, P, N, device=device)
    x = torch.zeros(S, H, L, P, device=device)
    B = torch.zeros(S, G, L, N, device=device)
    dt = torch.zeros(S, H, L, device=device)
    A = torch.zeros(H, device=device)
    wp = torch.zeros(S, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="dot_precision"):
        mamba2_materialize(st, x, B, dt, A, wp, [1], dot_precision="tf32")
    with pytest.raises(ValueError, match="write_pos"):
        mamba2_materialize(st, x, B, dt, A, wp[:2], [1])
    with pytest.raises(ValueError, match="dt_ring"):
        mamba2_materialize(st, x, B, dt.half(), A, wp, [1])
    with pytest.raises(ValueError, match="slots"):
        mamba2_materialize(st, x, B, dt, A, wp, torch.tensor([1.0]))
    d = torch.zeros(S, 2, L, 16, device=device)
    k = torch.zeros(S, 1, L, 16, device=device)
    g = torch.zeros(S, 2, L, device=device)
    gs = torch.zeros(S, 2, 16, 16, device=device)
    with pytest.raises(ValueError, match="contiguous"):
        gdn_materialize(gs.transpose(2, 3), d, k, g, wp, [1])
    with pytest.raises(ValueError, match="k_ring"):
        gdn_materialize(gs, d, torch.zeros(S, 1, L + 1, 16, device=device), g, wp, [1])


# ======================================================================================
# spec rings: logical j at physical (origin + j) % R; all three cursors reset
# ======================================================================================


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_spec_ring_origin_matches_linearised_fold(device, seed, family):
    """Random circular rings (wrapped origins): the kernel equals its reference, and the reference equals
    the linear-ring fold of the same entries gathered into logical order (an independent path)."""
    gen = torch.Generator().manual_seed(seed)
    S, R = 7, 9
    wp = torch.tensor([0, 3, 6, 6, 2, 5, 4], dtype=torch.int32)
    origin = torch.randint(0, R, (S,), generator=gen, dtype=torch.int32)
    origin[3] = R - 2  # wraps after two entries
    flush = (wp + 4 > R).to(torch.int32)
    slots = torch.tensor([1, 2, 3, 5, -1, 0], dtype=torch.int64)
    if family == "mamba2":
        H, P, N, G = 4, 16, 16, 2
        state = torch.randn(S, H, P, N, generator=gen)
        rings = [torch.randn(S, H, R, P, generator=gen), torch.randn(S, G, R, N, generator=gen),
                 torch.rand(S, H, R, generator=gen)]
        A = -torch.exp(torch.rand(H, generator=gen))
        fn, ref, extra = mamba2_materialize, mamba2_materialize_ref, (A.to(device),)
    else:
        HV, Hk, K, V = 4, 2, 16, 16
        state = torch.randn(S, HV, V, K, generator=gen)
        rings = [torch.randn(S, HV, R, V, generator=gen), torch.randn(S, Hk, R, K, generator=gen),
                 -torch.rand(S, HV, R, generator=gen)]
        fn, ref, extra = gdn_materialize, gdn_materialize_ref, ()
    dev = [t.clone().to(device) for t in [state] + rings]
    cur = [t.clone().to(device) for t in (wp, origin, flush)]
    fn(*dev, *extra, cur[0], slots.to(device), spec_cursors=(cur[1], cur[2]))
    ref_t = [t.clone() for t in [state] + rings]
    ref_c = [t.clone() for t in (wp, origin, flush)]
    ref(*ref_t, *[e.cpu() for e in extra], ref_c[0], slots, spec_cursors=(ref_c[1], ref_c[2]))
    check_close(dev[0], ref_t[0], (2e-5, 2e-5, 0.0), f"{family} spec fold vs reference", seed)
    for c, r in zip(cur, ref_c):
        assert torch.equal(c.cpu(), r)
    for s in (1, 2, 3, 5):
        assert int(cur[0][s]) == 0 and int(cur[1][s]) == 0 and int(cur[2][s]) == 0, "cursors not reset"
    assert int(cur[0][6]) == 4 and int(cur[1][6]) == int(origin[6]), "an unlisted slot's cursors changed"
    assert torch.equal(dev[0][6].cpu(), state[6]), "an unlisted slot's state changed"
    # independent path: gather each slot's entries into logical order, fold as a linear ring
    lin = [torch.empty_like(t) for t in rings]
    for s in range(S):
        pos = [(int(origin[s]) + j) % R for j in range(R)]
        for dst, src in zip(lin, rings):
            dst[s] = src[s][:, pos]
    lin_state = state.clone()
    ref(lin_state, *lin, *[e.cpu() for e in extra], wp.clone(), slots)
    check_close(ref_t[0], lin_state, (1e-6, 1e-6, 0.0), f"{family} circular vs linearised fold", seed)
    assert not torch.equal(lin_state[3], state[3]), "the wrapped slot was not folded"
