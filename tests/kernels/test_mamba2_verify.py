"""Tests of the Mamba2 speculative verify kernel and the spec ring cursors.

CUDA when present, else Triton's CPU interpreter (tests/conftest.py).  Fresh random
inputs every run (seed in every message; REPLAYSSM_TEST_SEED replays one).

The oracle is the fp64 sequential recurrence (``mamba2_step_oracle``) of the
*committed* token stream: every step verifies a window of T fresh tokens, ALL T window
outputs are compared with the oracle run from the committed state through the window,
then a random number of them (1..T, as SGLang's accept_lens) is committed with the
device commit kernel, and the oracle's committed state advances by exactly those
tokens.  After every flush the checkpoint must equal the oracle state at the folded
count.  Ring pools start as NaN, so any read of a masked (stale / future) position
poisons an output.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from kernel_testlib import bits, make_gen, mismatch, view_like
from test_mamba2_replay import ORACLE_TOL, REF_TOL

from sglang_replayssm.kernels import common
from sglang_replayssm.kernels.mamba2_ref import mamba2_step_oracle
from sglang_replayssm.kernels.mamba2_verify import mamba2_verify
from sglang_replayssm.kernels.mamba2_verify_ref import mamba2_verify_ref
from sglang_replayssm.kernels.spec_cursor import (check_spec_cursors, spec_commit, spec_commit_ref, spec_reset,
                                                  spec_reset_ref, spec_ring_len)

F32, BF16, F16, F64 = torch.float32, torch.bfloat16, torch.float16, torch.float64
SMALL = (4, 16, 16, 1)   # H, P, N, G
SMALL_H2 = (2, 16, 16, 1)  # the CPU stream's: two heads on one group (the interpreter's time is per head program)
ODD = (6, 24, 40, 3)     # P, N not powers of two; N spans two 32-column chunks; 2 heads per group


class SpecHarness:
    """Pools, spec rings, slot cursors, per-request committed oracle states; one checked verify+commit."""

    def __init__(self, device, geom, T, hist, state_dtype=F32, act_dtype=F32, *, n_req=3, strided=False,
                 has_z=True, has_D=True, null_slot=0, check_ref=True):
        self.gen, self.seed = make_gen()
        self.device = device
        H, P, N, G = geom
        self.H, self.P, self.N, self.G, self.T = H, P, N, G, T
        self.R = spec_ring_len(hist, T)
        self.sd, self.ad = state_dtype, act_dtype
        self.null_slot = null_slot
        self.check_ref = check_ref
        self.strided = strided
        S = self.n_slots = 2 * n_req + 3
        free = [s for s in range(S) if s != null_slot]
        perm = torch.randperm(len(free), generator=self.gen).tolist()
        self.slots = [free[i] for i in perm[:n_req]]
        self.bases = {}
        R = self.R
        self.state = self._pool("state", (S, H, P, N), state_dtype)
        self.x_ring = self._pool("x_ring", (S, H, R, P), act_dtype)
        self.B_ring = self._pool("B_ring", (S, G, R, N), act_dtype)
        self.dt_ring = self._pool("dt_ring", (S, H, R), F32)
        init = torch.randn(S, H, P, N, generator=self.gen) * 0.5
        self.state.copy_(init.to(device=device, dtype=state_dtype))
        self.oracle = [self.state[s].cpu().to(F64) for s in self.slots]
        self.A_h = -torch.exp(torch.rand(H, generator=self.gen) * 2 - 1)
        self.dtb_h = -4 * torch.rand(H, generator=self.gen)
        self.D_h = torch.randn(H, generator=self.gen) if has_D else None
        self.has_z = has_z
        self.A, self.dt_bias = self.A_h.to(device), self.dtb_h.to(device)
        self.D = None if self.D_h is None else self.D_h.to(device)
        self.wp = torch.full((S,), 7, dtype=torch.int32, device=device)   # stale values: reset must clear them
        self.origin = torch.full((S,), 3, dtype=torch.int32, device=device)
        self.flush = torch.ones(S, dtype=torch.int32, device=device)
        sl = torch.tensor(self.slots, dtype=torch.int32, device=device)
        spec_reset(self.wp, self.origin, self.flush, sl, window=T, ring_len=R, null_slot=null_slot)
        assert self.wp[sl].eq(0).all() and self.origin[sl].eq(0).all() and self.flush[sl].eq(0).all()
        self.steps = 0
        self.flushes = 0
        self.wraps = 0

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
        assert tuple(view.shape) == tuple(shape)
        self.bases[name] = (base, view)
        return view

    def _inputs(self, batch):
        H, P, N, G, T, ad = self.H, self.P, self.N, self.G, self.T, self.ad
        g = self.gen
        return {
            "x": torch.randn(batch, T, H, P, generator=g).to(ad),
            "dt": torch.randn(batch, T, H, generator=g).to(ad),
            "B": torch.randn(batch, T, G, N, generator=g).to(ad),
            "C": (torch.randn(batch, T, G, N, generator=g) / math.sqrt(N)).to(ad),
            "z": torch.randn(batch, T, H, P, generator=g).to(ad) if self.has_z else None,
        }

    def step(self, accept=None, *, pads=("neg", "null")):
        dev, T, R, H, P = self.device, self.T, self.R, self.H, self.P
        tag = self.tag()
        rows = list(range(len(self.slots)))
        if "neg" in pads:
            rows.insert(0, "neg")
        if "null" in pads:
            rows.insert(len(rows) // 2 + 1, "null")
        batch = len(rows)
        slot_of = [(-1 if r == "neg" else self.null_slot) if isinstance(r, str) else self.slots[r] for r in rows]
        idx = torch.tensor(slot_of, dtype=torch.int32, device=dev)
        inp = self._inputs(batch)
        dinp = {k: (None if v is None else v.to(dev)) for k, v in inp.items()}
        if self.strided:  # SGLang passes dt expanded over P with stride 0
            dinp["dt"] = dinp["dt"][..., None].expand(batch, T, H, P)
        out = torch.full((batch, T, H, P), float("nan"), dtype=self.ad, device=dev)
        before = {k: b.clone() for k, (b, _) in self.bases.items()}
        cur = {s: (int(self.wp[s]), int(self.origin[s]), int(self.flush[s])) for s in self.slots}
        kw = dict(D=self.D, z=dinp["z"], dt_bias=self.dt_bias, null_slot=self.null_slot)
        args = (dinp["x"], dinp["dt"], self.A, dinp["B"], dinp["C"], idx, self.wp, self.origin, self.flush)
        if self.check_ref:
            ref = {k: b.clone() for k, b in before.items()}
            rv = {k: view_like(v, ref[k]) for k, (_, v) in self.bases.items()}
            ref_out = torch.full_like(out, float("nan"))
            mamba2_verify_ref(rv["state"], rv["x_ring"], rv["B_ring"], rv["dt_ring"], *args, out=ref_out, **kw)
        ret = mamba2_verify(self.state, self.x_ring, self.B_ring, self.dt_ring, *args, out=out, **kw)
        assert ret is out
        live = [k for k, r in enumerate(rows) if not isinstance(r, str)]
        pad = [k for k, r in enumerate(rows) if isinstance(r, str)]

        # nothing outside the write set changed: window ring positions, the checkpoint on flush
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
            keep = ~allowed[name]
            assert torch.equal(bits(b)[keep], bits(before[name])[keep]), \
                f"{tag} {name}: memory outside the verify's write set changed"
        assert torch.isnan(out[pad].float()).all(), f"{tag} padded rows were written"
        assert torch.isfinite(out[live].float()).all(), f"{tag} a live output is not finite (stale ring read?)"

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

        # oracle: flushed checkpoint == committed state; all T window outputs == sequential recurrence
        rt, at = ORACLE_TOL[(self.sd, self.ad)]
        acc = []
        for k in live:
            i, s = rows[k], slot_of[k]
            w, o, f = cur[s]
            base = self.oracle[i]
            if f:
                self.flushes += 1
                r_, i_ = mismatch(self.state[s].cpu(), base, rt, at)
                assert r_ <= 1, f"{tag} flushed checkpoint of slot {s} (folded {w}) off by {r_:.3g}x at {i_}"
                base = self.state[s].cpu().to(F64)  # continue from the stored (rounded) checkpoint
            states = []
            Sx = base[None]
            for t in range(T):
                z = inp["z"][k:k + 1, t] if inp["z"] is not None else None
                Sx, y = mamba2_step_oracle(Sx, inp["x"][k:k + 1, t], inp["dt"][k:k + 1, t], self.A_h,
                                           inp["B"][k:k + 1, t], inp["C"][k:k + 1, t], D=self.D_h, z=z,
                                           dt_bias=self.dtb_h)
                states.append(Sx[0])
                # a bf16/fp16 checkpoint's rounding error scales with the state, so the absolute bound scales
                # with the output's magnitude (a 0.10 output beside 4.7 ones in a bf16 run: off by 0.023)
                at_y = at if self.sd == F32 else at * max(1.0, float(y.abs().max()))
                r_, i_ = mismatch(out[k, t].cpu(), y[0], rt, at_y)
                assert r_ <= 1, (f"{tag} output of request {i} window token {t} (wp={w} origin={o} flush={f}) "
                                 f"off by {r_:.3g}x at {i_}")
            a = int(torch.randint(1, T + 1, (1,), generator=self.gen)) if accept is None else accept
            acc.append(a)
            self.oracle[i] = states[a - 1] if a > 0 else base  # a = 0: nothing committed
            if (o + w + T - 1) // R != o // R or (f and (o + w) % R + a > R):
                self.wraps += 1

        # commit (device kernel) vs the host reference, and the invariant
        acc_rows = [0] * batch
        for k, a in zip(live, acc):
            acc_rows[k] = a
        for k in pad:  # padding rows carry accepts too; their null slots must be skipped
            acc_rows[k] = 1
        acc_t = torch.tensor(acc_rows, dtype=torch.int32, device=dev)
        want = [t.cpu().clone() for t in (self.wp, self.origin, self.flush)]
        spec_commit_ref(*want, idx.cpu(), acc_t.cpu(), window=T, ring_len=R, null_slot=self.null_slot)
        spec_commit(self.wp, self.origin, self.flush, idx, acc_t, window=T, ring_len=R, null_slot=self.null_slot)
        for name, got, exp in zip(("wp", "origin", "flush"), (self.wp, self.origin, self.flush), want):
            assert torch.equal(got.cpu(), exp), f"{tag} commit kernel {name} {got.tolist()} != reference {exp.tolist()}"
        check_spec_cursors(self.wp, self.origin, self.flush, window=T, ring_len=R, slots=self.slots)
        self.steps += 1
        return out


PRECISIONS = [(F32, F32), (F32, BF16), (BF16, BF16), (F16, F16)]
PREC_IDS = ["s32a32", "s32a16b", "s16b_a16b", "s16_a16"]


# the CPU run keeps T4B6 on two heads (and T1 in test_launch_variants_match_sequential_recurrence); the rest, T4B6
# on SMALL's four heads included: the GPU run's
@pytest.mark.parametrize("T,hist,geom", [pytest.param(1, 1, SMALL, marks=pytest.mark.slow),
                                         pytest.param(2, 3, SMALL, marks=pytest.mark.slow),
                                         pytest.param(3, 3, SMALL, marks=pytest.mark.slow), (4, 6, SMALL_H2),
                                         pytest.param(4, 6, SMALL, marks=pytest.mark.slow)],
                         ids=["T1B1", "T2B3", "T3B3", "T4B6", "T4B6h4"])
def test_stream_of_random_accepts_matches_sequential_recurrence(device, T, hist, geom):
    """44 verify+commit steps at fp32, random accept lengths, desynchronised rows, ring wrap-around."""
    h = SpecHarness(device, geom, T, hist, F32, F32, n_req=3)
    for _ in range(44):
        h.step()
    assert h.flushes >= 3, f"{h.tag()} the stream must cross several flushes, saw {h.flushes}"
    if T > 1:
        assert h.wraps >= 1, f"{h.tag()} the circular ring never wrapped"


@pytest.mark.parametrize("prec", [pytest.param(PRECISIONS[0], marks=pytest.mark.slow), *PRECISIONS[1:]],
                         ids=PREC_IDS)  # fp32 on ODD: the GPU run's (fp32 on SMALL: the stream test above)
def test_precisions_odd_geometry(device, prec):
    """Grouped heads, P and N not powers of two, N over two chunks, every state/act dtype."""
    h = SpecHarness(device, ODD, 3, 4, *prec, n_req=2)
    for _ in range(12):
        h.step()
    assert h.flushes >= 1


def test_full_accept_and_single_accept(device):
    """Always accepting everything (max cursor speed) and always one token (bonus only)."""
    for a in (4, 1):
        h = SpecHarness(device, SMALL, 4, 4, F32, F32, n_req=2)
        for _ in range(10):
            h.step(accept=a)
        assert h.flushes >= 2


def test_strided_pools_no_z_no_D(device):
    h = SpecHarness(device, SMALL, 2, 3, F32, BF16, n_req=2, strided=True, has_z=False, has_D=False)
    assert h.state.stride(0) != math.prod(h.state.shape[1:])
    for _ in range(10):
        h.step()


def test_null_slot_none_only_negative_rows_skipped(device):
    h = SpecHarness(device, SMALL, 2, 2, F32, F32, n_req=2, null_slot=None)
    for _ in range(6):
        h.step(pads=("neg",))


@pytest.mark.parametrize("what", ["x_ring", "B_ring", "dt_ring", "future"])
def test_teeth(device, what):
    """A corrupted committed ring entry must change the output; one past wp must not."""
    h = SpecHarness(device, SMALL, 2, 4, F32, F32, n_req=1, check_ref=False)
    for _ in range(2):
        h.step(accept=1)  # wp = 2 committed entries, no flush yet
    s = h.slots[0]
    w, o = int(h.wp[s]), int(h.origin[s])
    assert w >= 1 and int(h.flush[s]) == 0
    inp = h._inputs(1)
    d = {k: (None if v is None else v.to(device)) for k, v in inp.items()}
    idx = torch.tensor([s], dtype=torch.int32, device=device)

    def run():
        snap = {k: b.clone() for k, (b, _) in h.bases.items()}
        views = {k: view_like(v, snap[k]) for k, (_, v) in h.bases.items()}
        y = mamba2_verify(views["state"], views["x_ring"], views["B_ring"], views["dt_ring"], d["x"], d["dt"],
                          h.A, d["B"], d["C"], idx, h.wp, h.origin, h.flush, D=h.D, z=d["z"],
                          dt_bias=h.dt_bias)
        return y.cpu()

    clean = run()
    pos = (o + w) % h.R if what == "future" else (o + w - 1) % h.R
    name = "x_ring" if what == "future" else what
    t = h.bases[name][1]
    t[s, :, pos] = t[s, :, pos] + (5.0 if what != "dt_ring" else 0.5)
    dirty = run()
    if what == "future":
        assert torch.equal(bits(clean), bits(dirty)), "an entry past wp leaked into the output"
    else:
        r_, _ = mismatch(dirty, clean, 1e-4, 1e-4)
        assert r_ > 1, f"corrupting committed {what} went unnoticed"


def test_commit_reset_kernels_match_reference(device):
    """Random cursors, accepts (incl. 0 = no advance), null and padded rows, int64 slot ids."""
    gen, seed = make_gen()
    T, R, S = 3, 9, 12
    for trial in range(5):
        wp = torch.randint(0, R - T + 1, (S,), generator=gen)
        flush = (wp + 2 * T > R).to(torch.int64)
        origin = torch.randint(0, R, (S,), generator=gen)
        slots = torch.randperm(S, generator=gen)[:7]
        slots[0], slots[3] = -1, 0
        acc = torch.randint(0, T + 1, (7,), generator=gen)
        cur = [t.to(device=device, dtype=torch.int32) for t in (wp, origin, flush)]
        ref = [t.clone() for t in (wp, origin, flush)]
        spec_commit(*cur, slots.to(device), acc.to(device=device, dtype=torch.int32), window=T, ring_len=R)
        spec_commit_ref(*ref, slots, acc, window=T, ring_len=R)
        for c, r in zip(cur, ref):
            assert torch.equal(c.cpu().long(), r), f"[seed={seed}] commit mismatch {c.tolist()} vs {r.tolist()}"
        assert int(cur[0][0]) == int(wp[0]), f"[seed={seed}] the null slot's cursor moved"
        check_spec_cursors(*cur, window=T, ring_len=R)
        spec_reset(*cur, slots.to(device), window=T, ring_len=R)
        spec_reset_ref(*ref, slots, window=T, ring_len=R)
        for c, r in zip(cur, ref):
            assert torch.equal(c.cpu().long(), r), f"[seed={seed}] reset mismatch"
        live = slots[(slots > 0)]
        assert cur[0].cpu()[live].eq(0).all()


def test_commit_reads_strided_slot_and_accept_views(device):
    """Column views (SGLang's ``state_indices[:, 0]``, a strided accept tensor) are read through
    their strides; non-contiguous cursor tensors are refused."""
    wp = torch.zeros(6, dtype=torch.int32, device=device)
    org, fl = wp.clone(), wp.clone()
    idx = torch.tensor([[3, 9], [5, 9], [-1, 9]], dtype=torch.int32, device=device)
    acc = torch.tensor([[2, 7], [1, 7], [3, 7]], dtype=torch.int32, device=device)
    spec_commit(wp, org, fl, idx[:, 0], acc[:, 0], window=2, ring_len=6)
    assert wp.tolist() == [0, 0, 0, 2, 0, 1] and fl.tolist() == [0, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="contiguous"):
        spec_commit(torch.zeros(12, dtype=torch.int32, device=device)[::2], org, fl, idx[:, 0], None,
                    window=2, ring_len=6)


def test_commit_none_is_one_token_per_row(device):
    wp = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    org = torch.tensor([0, 1, 6], dtype=torch.int32, device=device)
    fl = torch.tensor([0, 0, 1], dtype=torch.int32, device=device)
    spec_commit(wp, org, fl, torch.tensor([1, 2], device=device), None, window=1, ring_len=6, null_slot=0)
    assert wp.tolist() == [0, 3, 1] and org.tolist() == [0, 1, 5] and fl.tolist() == [0, 0, 0]


def test_cursor_argument_errors(device):
    wp = torch.zeros(4, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="ring length"):
        spec_commit(wp, wp.clone(), wp.clone(), wp[:2], None, window=3, ring_len=5)
    with pytest.raises(ValueError, match="accepted"):
        spec_commit(wp, wp.clone(), wp.clone(), wp[:2], wp[:3], window=1, ring_len=4)
    with pytest.raises(ValueError, match="origin"):
        spec_reset(wp, wp[:3].clone(), wp.clone(), wp[:2], window=1, ring_len=4)
    with pytest.raises(ValueError, match="buffer length"):
        spec_ring_len(2, 3)
    with pytest.raises(AssertionError, match="slot 1"):
        check_spec_cursors(torch.tensor([0, 4]), torch.tensor([0, 0]), torch.tensor([0, 1]), window=2, ring_len=5)


def _args(device, H=4, P=16, N=16, G=2, R=6, T=2, S=3, batch=2):
    f = dict(device=device)
    return dict(
        state=torch.zeros(S, H, P, N, **f), x_ring=torch.zeros(S, H, R, P, **f), B_ring=torch.zeros(S, G, R, N, **f),
        dt_ring=torch.zeros(S, H, R, **f), x=torch.zeros(batch, T, H, P, **f), dt=torch.zeros(batch, T, H, **f),
        A=-torch.ones(H, **f), B=torch.zeros(batch, T, G, N, **f), C=torch.zeros(batch, T, G, N, **f),
        state_indices=torch.ones(batch, dtype=torch.int32, device=device),
        wp=torch.zeros(S, dtype=torch.int32, device=device), origin=torch.zeros(S, dtype=torch.int32, device=device),
        flush=torch.zeros(S, dtype=torch.int32, device=device))


def _call(a, **kw):
    order = ["state", "x_ring", "B_ring", "dt_ring", "x", "dt", "A", "B", "C", "state_indices", "wp", "origin",
             "flush"]
    return mamba2_verify(*[a[k] for k in order], **kw)


def test_strided_index_and_cursor_views_read_the_right_entries(device):
    """state_indices and the slot cursors as strided views (every other element of a longer tensor, zeros between):
    the same outputs as contiguous copies (the kernel reads row r and slot s at ptr + r / ptr + s; the wrapper makes
    them contiguous). Random inputs, slot 2 at ring position 3 with its origin at 1."""
    g = torch.Generator().manual_seed(3)
    a = {k: (torch.randn(v.shape, generator=g).to(v.dtype).to(device) if v.is_floating_point() else v)
         for k, v in _args(device).items()}
    a["A"] = -a["A"].abs()
    a["state_indices"] = torch.tensor([2, 1], dtype=torch.int32, device=device)
    a["wp"] = torch.tensor([0, 2, 3], dtype=torch.int32, device=device)
    a["origin"] = torch.tensor([0, 0, 1], dtype=torch.int32, device=device)
    wide = {k: torch.stack([a[k], torch.zeros_like(a[k])], 1).reshape(-1)[::2]
            for k in ("state_indices", "wp", "origin", "flush")}
    assert all(t.stride(0) == 2 for t in wide.values())
    b = dict(a, **wide)
    out_a, out_b = _call(a), _call(b)
    assert torch.isfinite(out_a).all() and torch.equal(out_a, out_b)


@pytest.mark.parametrize("name,bad,match", [
    ("x", lambda a: a["x"][:, :, :, :8], "x must have shape"),
    ("x_ring", lambda a: a["x_ring"][:, :, :3], "ring length"),
    ("B", lambda a: a["B"][:, :, :1].expand(2, 2, 3, 16), "multiple of the number of groups"),
    ("dt_ring", lambda a: a["dt_ring"].to(BF16), "dt_ring must be float32"),
    ("wp", lambda a: a["wp"][:2], "wp must have shape"),
    ("flush", lambda a: a["flush"].float(), "flush must be int32"),
    ("dt", lambda a: torch.zeros(2, 2, 4, 16, device=a["x"].device), "tied over P"),
    ("A", lambda a: torch.zeros(3, device=a["x"].device), "A must have shape"),
])
def test_validation_errors(device, name, bad, match):
    a = _args(device)
    a[name] = bad(a)
    with pytest.raises(ValueError, match=match):
        _call(a)


@pytest.mark.parametrize("entry,match", [("dot_precision: tf32", "tf32x3"), ("reduce: warp", "reduce must be one of"),
                                         ("bc: post", "bc must be one of"),
                                         ("inline_bc_max_batch: -1", "inline_bc_max_batch"), ("maxnreg: 1.5", "maxnreg"),
                                         ("nonflush: pipelined", "nonflush must be one of")])
def test_bad_launch_config_is_refused(device, tmp_path, monkeypatch, entry, match):
    f = tmp_path / "cfg.yaml"
    f.write_text("mamba2_verify:\n  default: {" + entry + "}\n")
    monkeypatch.setenv(common.ENV_CONFIG_FILE, str(f))
    with pytest.raises(ValueError, match=match):
        _call(_args(device))


@pytest.mark.slow
def test_nemotron_h_8b_geometry(device, tmp_path, monkeypatch):
    """Nemotron-H-8B heads (H=128, P=64, N=128, G=8), T=4, B=16, fp32 state, bf16 activations."""
    if common.interpreting():  # fewer, larger programs in the interpreter (same math)
        f = tmp_path / "cfg.yaml"
        f.write_text("mamba2_verify:\n  default: {BLOCK_M: 64, BLOCK_NC: 128}\n")
        monkeypatch.setenv(common.ENV_CONFIG_FILE, str(f))
    h = SpecHarness(device, (128, 64, 128, 8), 4, 16, F32, BF16, n_req=1, check_ref=False)
    for _ in range(2):
        h.step(accept=4, pads=())


def test_materialize_mid_stream_then_continue(device):
    """Radix caching / retract mid-stream: folding the committed history of a spec ring gives the
    oracle's committed state, resets the cursors, and verification then continues exactly."""
    from sglang_replayssm.kernels.materialize import mamba2_materialize

    h = SpecHarness(device, SMALL, 3, 4, F32, F32, n_req=3)
    for _ in range(7):
        h.step()
    slots = torch.tensor(h.slots, device=device)
    assert int(h.wp[slots].max()) > 0, "nothing pending to fold"
    mamba2_materialize(h.state, h.x_ring, h.B_ring, h.dt_ring, h.A, h.wp, slots,
                       spec_cursors=(h.origin, h.flush))
    for i, s in enumerate(h.slots):
        r_, k_ = mismatch(h.state[s].cpu(), h.oracle[i], 1e-4, 1e-4)
        assert r_ <= 1, f"{h.tag()} materialized slot {s} off by {r_:.3g}x at {k_}"
        assert int(h.wp[s]) == 0 and int(h.origin[s]) == 0 and int(h.flush[s]) == 0
    for _ in range(6):
        h.step()


def test_verify_and_commit_wrappers_never_sync_the_host(device, monkeypatch):
    """Graph safety of the spec path's Python side: with the Triton launches stubbed out, the
    wrappers of mamba2_verify, gdn_verify and spec_commit never read a device value on the host."""
    from sglang_replayssm.kernels import gdn_verify as gv
    from sglang_replayssm.kernels import mamba2_verify as mv
    from sglang_replayssm.kernels import spec_cursor as sc

    launched = []

    class _Stub:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *a, **k: launched.append(self.name)

    for mod, name in ((mv, "_mamba2_verify_kernel"), (gv, "_gdn_verify_kernel"), (sc, "_spec_commit_kernel")):
        monkeypatch.setattr(mod, name, _Stub(name))
    a = _args(device)
    H, HV, Hk, K, V, R, T, S, B = 4, 2, 1, 16, 16, 6, 2, 3, 2
    g = dict(mixed_qkv=torch.randn(B, T, 2 * Hk * K + HV * V, device=device), a=torch.randn(B, T, HV, device=device),
             b=torch.randn(B, T, HV, device=device), A_log=torch.zeros(HV, device=device),
             dt_bias=torch.zeros(HV, device=device), state=torch.zeros(S, HV, V, K, device=device),
             d_ring=torch.zeros(S, HV, R, V, device=device), k_ring=torch.zeros(S, Hk, R, K, device=device),
             g_ring=torch.zeros(S, HV, R, device=device))
    idx = torch.tensor([1, -1], dtype=torch.int32, device=device)

    def trap(*_a, **_k):
        raise AssertionError("host sync")

    for name in ("item", "tolist", "__bool__", "__int__", "__index__", "nonzero", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, trap)
    _call(a)
    gv.gdn_verify(*g.values(), idx, a["wp"], a["origin"], a["flush"])
    sc.spec_commit(a["wp"], a["origin"], a["flush"], idx, idx, window=T, ring_len=R)
    sc.spec_reset(a["wp"], a["origin"], a["flush"], idx, window=T, ring_len=R)
    monkeypatch.undo()
    assert launched == ["_mamba2_verify_kernel", "_gdn_verify_kernel", "_spec_commit_kernel", "_spec_commit_kernel"]


def test_commit_rule_invariant_property():
    """Pure cursor arithmetic (reference rule), many random streams: for every window T <= 9 and
    history block T <= B <= 40, random accepts (incl. none), interleaved resets: a verify never
    overflows the ring (wp + T <= R), never overwrites committed history, folds at most B entries,
    and logical positions map to distinct physical slots."""
    import random

    rnd = random.Random(int.from_bytes(os.urandom(4), "little"))
    for _ in range(300):
        T = rnd.randint(1, 9)
        B = rnd.randint(T, 40)
        R = spec_ring_len(B, T)
        wp, org, fl = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
        slot = torch.tensor([0])
        for _step in range(60):
            w, o, f = int(wp[0]), int(org[0]), int(fl[0])
            assert 0 <= w and w + T <= R and 0 <= o < R, (T, B, w, o)
            hist = {(o + j) % R for j in range(w)}
            win = {(o + w + t) % R for t in range(T)}
            assert len(hist) == w and len(win) == T and not hist & win, "window overwrites committed history"
            if f:
                assert w <= B, "folded more than the history block"
            if rnd.random() < 0.03:
                spec_reset_ref(wp, org, fl, slot, window=T, ring_len=R, null_slot=None)
                continue
            a = rnd.choice([0] + list(range(1, T + 1)) * 3)
            spec_commit_ref(wp, org, fl, slot, torch.tensor([a]), window=T, ring_len=R, null_slot=None)


def test_flushing_verify_with_no_accept_does_not_fold_twice(device):
    """A row whose verify folded its history (flush) but commits no token (a = 0) must not fold
    the same history again at its next verify: the checkpoint after two such verifies equals the
    oracle state of the committed stream."""
    h = SpecHarness(device, SMALL, 2, 2, F32, F32, n_req=1, check_ref=False)
    s = h.slots[0]
    for _ in range(6):
        h.step(accept=2)
        if int(h.flush[s]):
            break
    assert int(h.flush[s]) and int(h.wp[s]) > 0
    h.step(accept=0)   # flushes, commits nothing: the oracle keeps its committed state
    assert int(h.wp[s]) == 0
    for _ in range(4):
        h.step(accept=1)   # outputs and later flushes are checked against the oracle inside step()


# (the packaged config, token + pre + stream at BLOCK_M 32, is what the other tests run)
@pytest.mark.parametrize("variant", ["reduce: bcast, bc: inline, nonflush: chunked, BLOCK_M: 16, num_warps: 4",
                                     "reduce: token, bc: inline, nonflush: chunked",
                                     "reduce: bcast, bc: pre, bc_num_warps: 2, nonflush: chunked",
                                     "reduce: bcast, bc: inline, nonflush: stream",
                                     "reduce: token, bc: pre, nonflush: stream, BLOCK_M: 16",
                                     "reduce: token, bc: pre, nonflush: mma",
                                     "reduce: token, bc: pre, nonflush: stream, flush_split: 1",
                                     "reduce: token, bc: inline, nonflush: stream",
                                     "reduce: token, bc: pre, nonflush: mma, flush_split: 1",
                                     # four flush-loop stages with a 16-bit state too (the GPU run's T3odd-s16b)
                                     "reduce: token, bc: pre, nonflush: mma, flush_stages: 4"])
# the CPU run takes every variant at T1 on SMALL; the longer windows and the odd geometry are the GPU run's (slow)
@pytest.mark.parametrize("T,hist,geom,prec", [(1, 1, SMALL, (F32, F32)),
                                              pytest.param(4, 6, SMALL, (F32, F32), marks=pytest.mark.slow),
                                              pytest.param(3, 4, ODD, (F32, BF16), marks=pytest.mark.slow),
                                              pytest.param(3, 4, ODD, (BF16, BF16), marks=pytest.mark.slow)],
                         ids=["T1-s32", "T4-s32", "T3odd-s32a16b", "T3odd-s16b"])
def test_launch_variants_match_sequential_recurrence(device, tmp_path, monkeypatch, T, hist, geom, prec, variant):
    """Launch-config variants of the same math -- ``reduce: bcast / token`` (one 3-D broadcast per chunk or T
    two-dimensional row reductions), ``bc: inline / pre`` (the group-shared B·C dots in every program or once
    per (row, group) in a pre-kernel) and ``nonflush: chunked / stream`` (non-flush rows read the whole S_ck tile at
    once) -- under the same stream checks, flushes and wrap-around included."""
    f = tmp_path / "cfg.yaml"
    f.write_text("mamba2_verify:\n  default: {" + variant + "}\n")
    monkeypatch.setenv(common.ENV_CONFIG_FILE, str(f))
    h = SpecHarness(device, geom, T, hist, *prec, n_req=3)
    for _ in range(24 if T > 1 else 12):
        h.step()
    assert h.flushes >= 2, f"{h.tag()} the stream must cross flushes, saw {h.flushes}"


@pytest.mark.parametrize("variant", ["nonflush: stream, stream_chunk: 16", "nonflush: stream, stream_chunk: 32, bc: inline",
                                     "nonflush: stream, stream_chunk: 16, reduce: bcast",
                                     "flush_stages: 1, reduce: bcast",
                                     "nonflush: chunked, flush_stages: 3, bc: inline",
                                     "nonflush: mma", "nonflush: mma, bc: inline, BLOCK_M: 16",
                                     "flush_split: 1", "flush_split: 1, nonflush: chunked, bc: inline",
                                     "bc: inline", "nonflush: mma, flush_split: 1",
                                     # pdl: the interpreter runs it as off (the GPU run's)
                                     pytest.param("pdl: 1", marks=pytest.mark.slow),
                                     pytest.param("pdl: 1, nonflush: mma, flush_split: 1, flush_stages: 3",
                                                  marks=pytest.mark.slow)])
def test_nonflush_reads_and_flush_loop_match_sequential_recurrence(device, tmp_path, monkeypatch, variant):
    """How a non-flush row reads its S_ck tile (``stream_chunk``: per-token dots summed over column chunks first, on
    N 40: chunks of 16 with a partial and a fully masked one, or 32 with a partial one; ``nonflush: mma``: one tl.dot
    over the masked [BLOCK_M, 64] tile, which the interpreter computes in fp32) and the flush rows' N-chunk
    loop (``flush_stages``: its software pipeline on a GPU, which the interpreter does not model), beside bc inline
    and reduce bcast, and ``pdl`` (on a GPU the main kernel launched as the pre-kernel's dependent): the same stream
    checks, flushes included."""
    f = tmp_path / "cfg.yaml"
    f.write_text("mamba2_verify:\n  default: {" + variant + "}\n")
    monkeypatch.setenv(common.ENV_CONFIG_FILE, str(f))
    h = SpecHarness(device, ODD, 3, 4, F32, BF16, n_req=2)
    for _ in range(10):
        h.step()
    assert h.flushes >= 2, f"{h.tag()} the stream must cross flushes, saw {h.flushes}"


@pytest.mark.slow  # a launch-config choice (the packaged limit, 1, is what the other tests run)
def test_inline_bc_max_batch_keeps_small_batches_in_one_launch(device, tmp_path, monkeypatch):
    """bc: pre with inline_bc_max_batch: a batch above the limit launches the B·C pre-kernel, a batch
    within it computes the dots inline (one launch); both stay on the sequential recurrence."""
    from sglang_replayssm.kernels import mamba2_verify as mv

    f = tmp_path / "cfg.yaml"
    f.write_text("mamba2_verify:\n  default: {reduce: token, bc: pre, inline_bc_max_batch: 4, maxnreg: 128}\n")
    monkeypatch.setenv(common.ENV_CONFIG_FILE, str(f))
    launches = []
    orig = mv._mamba2_verify_bc_kernel
    monkeypatch.setattr(mv, "_mamba2_verify_bc_kernel", type("K", (), {
        "__getitem__": lambda self, grid: (launches.append(grid), orig[grid])[1]})())
    h = SpecHarness(device, ODD, 3, 4, F32, F32, n_req=3)
    for _ in range(8):  # 3 requests + a negative and a null row = 5 rows > 4: pre-kernel
        h.step()
    assert len(launches) == 8 and all(g[0] == 5 for g in launches)
    for _ in range(8):  # 3 requests + a negative row = 4 rows: inline
        h.step(pads=("neg",))
    assert len(launches) == 8, "the B·C pre-kernel ran for a batch within inline_bc_max_batch"
    assert h.flushes >= 2, f"{h.tag()} the stream must cross flushes, saw {h.flushes}"
