"""Tests of the GDN ReplaySSM decode kernel (``kernels/gdn_replay.py``).

Runs on CUDA when present, else in Triton's CPU interpreter (conftest sets
TRITON_INTERPRET). Every test draws fresh random inputs from a seed taken from
os.urandom (printed, and shown by pytest on failure; set GDN_TEST_SEED=<n> to replay).

Oracles
  * ``gdn_step_oracle``: plain sequential fp64 recurrence, the math of SGLang's stock
    packed decode kernel. Per slot the test keeps the fp64 state; at every flush it is
    rounded to the state dtype, as the kernel's checkpoint is.
  * ``gdn_replay_decode_ref``: the same replay math in PyTorch. It is run on a copy of
    the pools taken right before each kernel launch, so the comparison covers exactly
    one step and can be tight; it also checks that nothing else in the pools changed.

Tolerances |x - ref| <= atol + rtol |ref| + scale max|ref| (outputs ~0.05-1, states <~5):
  vs oracle   fp32 state: atol 2e-5, rtol 2e-5 (out and state). The fork's tripwire was
              1e-3; a plain-TF32 reconstruction drifts ~1e-2. Measured: ~2e-6.
              bf16/fp16 state (eps = 2^-7 / 2^-10): rtol eps, and scale 2 eps (out) /
              4 eps (state) of the tensor's max magnitude. The checkpoint is rounded once
              per flush and the cached d is in the state dtype too, so errors of large
              entries reach small ones. Measured over many seeds: <= 0.5 eps (out) and
              ~1 eps (state) of the max magnitude.
  vs reference (one step, same pools): outputs 2e-6/1e-5, plus, with 16-bit activations, one unit of
              beta's rounding to b's dtype times |do/dbeta| (gdn_testlib.beta_rounding_atol: the two
              fp32 sigmoids may round to either side of a 16-bit tie); written d/state 1e-5/1e-5 in
              fp32, one ulp (rtol eps) in reduced precision; raw k exact.
"""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from gdn_testlib import ORACLE_TOL, PRECISIONS, REF_OUT_TOL, ULP_RTOL, beta_rounding_atol, bits, check_close, max_err

from sglang_replayssm.kernels import gdn_replay as gr
from sglang_replayssm.kernels.common import interpreting
from sglang_replayssm.kernels.gdn_ref import gdn_replay_decode_ref, gdn_step_oracle
from sglang_replayssm.kernels.gdn_replay import gdn_replay_decode

INTERP = interpreting()
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16



# ----------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------
@pytest.fixture
def seed(request):
    s = int(os.environ.get("GDN_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"[{request.node.name}] seed={s}  (replay: GDN_TEST_SEED={s})")
    return s


@pytest.fixture
def interp_launch(tmp_path, monkeypatch):
    """In the interpreter, pin launch params (BV) through a YAML file; no-op on CUDA.

    Interpreter time grows with the number of programs, so big geometries use one V
    tile there; small ones keep BV small enough to have several V tiles.
    """

    def use(always=False, **params):
        if not (INTERP or always):
            return
        f = tmp_path / "gdn_launch.yaml"
        body = "".join(f"    {k}: {v}\n" for k, v in params.items())
        f.write_text("gdn_decode:\n  default:\n" + body)
        monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))

    return use


# the flush modes every oracle test runs under: the fp32 CUDA-core rank-1 flush (the tensor-core "dot" flush:
# VARIANTS, test_flush_modes_agree and the K-chunk tests)
FLUSHES = ("rank1",)


@pytest.fixture
def flush_launch(interp_launch):
    """``interp_launch`` plus a flush mode. The interpreter gets the pinned tiles and the
    mode; on CUDA a non-default mode is written alone (everything else: the defaults and
    default.yaml), the default mode leaves the device's config in force."""

    def use(flush, **interp_params):
        if INTERP:
            interp_launch(flush=flush, **interp_params)
        elif flush != gr.GDN_DEFAULT_LAUNCH["flush"]:
            interp_launch(always=True, flush=flush)

    return use


class Sim:
    """Slot pools + fp64 oracle states + per-slot ring cursors for one geometry.

    ``strided=True`` makes every pool a strided view into a larger buffer and every
    per-step input a column slice of a wider tensor.
    """

    def __init__(self, device, seed, *, Hk, HV, K, V, L, n_slots, state_dtype, act_dtype,
                 strided=False, idx_dtype=torch.int32, use_qk_l2norm=True, decay=(1.0, 16.0)):
        self.dev = torch.device(device)
        self.gen = torch.Generator().manual_seed(seed)
        self.Hk, self.HV, self.K, self.V, self.L, self.S = Hk, HV, K, V, L, n_slots
        self.sd, self.ad = state_dtype, act_dtype
        self.strided = strided
        self.idx_dtype = idx_dtype
        self.l2 = use_qk_l2norm
        self.W = 2 * Hk * K + HV * V
        # realistic decays (A_log ~ log U(1, 16)) make old ring entries fade within a few
        # steps; v-head 0 gets a long memory (alpha ~ 0.9-0.99) so that the whole ring
        # stays visible above the tolerances there (the teeth test corrupts head 0).
        A = self.uniform((HV,), *decay)
        A[0] = self.uniform((1,), 0.02, 0.2)
        self.A_log = torch.log(A).to(self.dev)
        self.dt_bias = self.uniform((HV,), -2.0, 1.0).to(self.dev)
        S = n_slots
        if strided:  # pools carved out of larger buffers (all filled with junk)
            self.bases = {
                "state": self.randn((S, HV + 1, V, K), 2.0).to(state_dtype),
                "d": self.randn((S, HV, L + 2, V)).to(state_dtype),
                "k": self.randn((S, 2 * Hk, L, K)).to(act_dtype),
                "g": -self.uniform((S, HV, L + 3), 0.0, 4.0),
            }
            self.view_fns = {
                "state": lambda t: t[:, 1:],
                "d": lambda t: t[:, :, 1:L + 1],
                "k": lambda t: t[:, 1::2],
                "g": lambda t: t[:, :, 2:L + 2],
            }
        else:  # dense pools; ring contents start as junk (stale entries must be masked)
            self.bases = {
                "state": self.randn((S, HV, V, K), 2.0).to(state_dtype),
                "d": self.randn((S, HV, L, V)).to(state_dtype),
                "k": self.randn((S, Hk, L, K)).to(act_dtype),
                "g": -self.uniform((S, HV, L), 0.0, 4.0),
            }
            self.view_fns = {n: (lambda t: t) for n in self.bases}
        self.bases = {n: t.to(self.dev) for n, t in self.bases.items()}
        self.oracle = {}  # slot -> fp64 state [HV, V, K]
        self.wpos = {}  # slot -> ring fill
        self.max_errs = {}

    # random draws on a CPU generator (same numbers on every device)
    def randn(self, shape, std=1.0):
        return torch.randn(shape, generator=self.gen) * std

    def uniform(self, shape, lo, hi):
        return torch.rand(shape, generator=self.gen) * (hi - lo) + lo

    def pools(self, bases=None):
        bases = self.bases if bases is None else bases
        p = {n: self.view_fns[n](bases[n]) for n in bases}
        assert tuple(p["state"].shape) == (self.S, self.HV, self.V, self.K)
        return p

    def activate(self, slot, state=None):
        """Start a request in ``slot``: empty ring, oracle state = checkpoint (or ``state``)."""
        st = self.pools()["state"]
        if state is not None:
            st[slot].copy_(state.to(self.sd))
        self.oracle[slot] = st[slot].double().cpu()
        self.wpos[slot] = 0

    def inputs(self, B):
        def cols(n, width):
            if not self.strided:
                return self.randn((n, width)).to(self.ad).to(self.dev)
            wide = self.randn((n, width + 5)).to(self.ad).to(self.dev)
            return wide[:, 3:3 + width]  # column slice: row stride > width

        x, a, b = cols(B, self.W), cols(B, self.HV), cols(B, self.HV)
        if self.strided:
            assert x.stride(0) == self.W + 5 and x.stride(1) == 1
        return x, a, b

    def index_tensors(self, rows):
        wp = [self.wpos.get(s, int(torch.randint(0, self.L, (1,), generator=self.gen))) for s in rows]
        idx = torch.tensor(rows, dtype=self.idx_dtype, device=self.dev)
        wpt = torch.tensor(wp, dtype=torch.int32, device=self.dev)
        if self.strided:  # non-unit stride index tensors
            idx = torch.stack([idx, idx], 1).reshape(-1)[::2]
            wpt = torch.stack([wpt, wpt], 1).reshape(-1)[::2]
            assert idx.stride(0) == 2
        return idx, wpt

    def new_out(self, B, out_dtype, four_d=False):
        if four_d:
            return torch.full((B, 1, self.HV, self.V), float("nan"), dtype=out_dtype, device=self.dev)
        if self.strided:
            big = torch.full((B, self.HV + 1, self.V), float("nan"), dtype=out_dtype, device=self.dev)
            return big[:, 1:]
        return torch.full((B, self.HV, self.V), float("nan"), dtype=out_dtype, device=self.dev)

    def launch(self, fn, x, a, b, idx, wp, bases, out, null_slot=0, **kw):
        p = self.pools(bases)
        return fn(x, a, b, self.A_log, self.dt_bias, p["state"], p["d"], p["k"], p["g"], idx, wp,
                  use_qk_l2norm=self.l2, out=out, null_slot=null_slot, **kw)

    def note(self, key, val):
        self.max_errs[key] = max(self.max_errs.get(key, 0.0), val)

    def step(self, rows, *, null_slot=0, out_dtype=F32, four_d=False, check_ref=True):
        """One checked decode step. ``rows``: slot id per batch row (pads allowed)."""
        B = len(rows)
        live = [r for r, s in enumerate(rows) if s >= 0 and not (null_slot is not None and s == null_slot)]
        assert all(rows[r] in self.oracle for r in live), "live row on an inactive slot"
        x, a, b = self.inputs(B)
        idx, wp = self.index_tensors(rows)
        before = {n: t.clone() for n, t in self.bases.items()}
        out = self.new_out(B, out_dtype, four_d)
        poison = out.clone()
        ret = self.launch(gdn_replay_decode, x, a, b, idx, wp, self.bases, out, null_slot)
        assert ret is out
        out3 = out[:, 0] if four_d else out

        # padded / null rows: nothing written
        dead = [r for r in range(B) if r not in live]
        if dead:
            assert torch.equal(bits(out3[dead]), bits((poison[:, 0] if four_d else poison)[dead])), \
                "padded row output was written"
        # every live element written
        assert torch.isfinite(out3[live]).all(), "live output left unwritten (poison NaN survived)"

        # reference on the pre-step pools: same math, one step
        live_slots = {rows[r] for r in live}
        if check_ref:
            ref_bases = {n: t.clone() for n, t in before.items()}
            ref_out = self.new_out(B, out_dtype, four_d)
            dbeta = torch.zeros(B, self.HV, self.V, dtype=F32, device=self.dev)
            self.launch(gdn_replay_decode_ref, x, a, b, idx, wp, ref_bases, ref_out, null_slot, dbeta_out=dbeta)
            ref3 = ref_out[:, 0] if four_d else ref_out
            beta_tol = beta_rounding_atol(b[live], dbeta[live])  # beta rounded to a 16-bit b's dtype
            if out_dtype == F32:
                e = check_close(out3[live], ref3[live], REF_OUT_TOL[0] + beta_tol, REF_OUT_TOL[1], "out vs reference")
            else:
                e = check_close(out3[live], ref3[live], 1e-6 + beta_tol, ULP_RTOL[out_dtype], "out vs reference")
            self.note("out_vs_ref", e)
            for n in ("state", "d"):
                e = check_close(self.bases[n], ref_bases[n], 1e-5 if self.sd == F32 else 1e-6,
                                ULP_RTOL[self.sd], f"{n} pool vs reference")
                self.note(f"{n}_vs_ref", e)
            assert torch.equal(bits(self.bases["k"]), bits(ref_bases["k"])), "k ring differs from reference"
            check_close(self.bases["g"], ref_bases["g"], 1e-5, 1e-5, "g ring vs reference")
        # slots without a live row are bit-identical (null slot, unused slots)
        pools_now, pools_before = self.pools(), self.pools(before)
        untouched = [s for s in range(self.S) if s not in live_slots]
        for n in pools_now:
            assert torch.equal(bits(pools_now[n][untouched]), bits(pools_before[n][untouched])), \
                f"{n}: a slot without a live row was modified"
        if self.strided:  # nothing outside the views changed either
            for n in self.bases:
                mask = torch.ones_like(self.bases[n], dtype=torch.bool)
                self.view_fns[n](mask).fill_(False)
                assert torch.equal(bits(self.bases[n][mask]), bits(before[n][mask])), \
                    f"{n}: write outside the pool view"

        # sequential oracle
        if live:
            states = torch.stack([self.oracle[rows[r]] for r in live])
            o_orc, s_new = gdn_step_oracle(x[live].cpu(), a[live].cpu(), b[live].cpu(), self.A_log.cpu(),
                                           self.dt_bias.cpu(), states, num_k_heads=self.Hk,
                                           use_qk_l2norm=self.l2)
            tol = ORACLE_TOL[self.sd]
            otol = tol["out"]
            if out_dtype != F32:  # plus the rounding of the output itself
                otol = (otol[0], otol[1] + ULP_RTOL[out_dtype], otol[2] + ULP_RTOL[out_dtype])
            e = check_close(out3[live], o_orc, otol[0], otol[1], "out vs sequential oracle", scale=otol[2])
            self.note("out_vs_oracle", e)
            st = self.pools()["state"]
            for i, r in enumerate(live):
                s = rows[r]
                if self.wpos[s] == self.L - 1:  # flush: checkpoint = rounded full state
                    self.oracle[s] = s_new[i].to(self.sd).double()
                    at, rt, sc = tol["state"]
                    e = check_close(st[s], self.oracle[s], at, rt, f"flushed state (slot {s})", scale=sc)
                    self.note("state_vs_oracle", e)
                    self.wpos[s] = 0
                else:
                    self.oracle[s] = s_new[i]
                    self.wpos[s] += 1
        return out


def small_geom(L, **kw):
    g = dict(Hk=1, HV=2, K=64, V=64, L=L, n_slots=6)
    g.update(kw)
    return g


# ----------------------------------------------------------------------------------
# 1 + 2 + 3 + 9: per-step outputs and flushed states vs oracle and reference
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("flush", FLUSHES)
@pytest.mark.parametrize("L", [1, 4, pytest.param(16, marks=pytest.mark.slow)])  # slow: the GPU run's
@pytest.mark.parametrize("prec", list(PRECISIONS))
def test_decode_matches_oracle_and_reference(device, seed, flush_launch, L, prec, flush):
    flush_launch(flush, BV=32)  # V=64 -> two V tiles per head
    sd, ad = PRECISIONS[prec]
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, **small_geom(L))
    rows = [4, 1, 3]
    for s in rows:
        sim.activate(s)
    for _ in range(max(2 * L + 1, 4)):
        sim.step(rows)
    print(prec, f"L={L}", flush, {k: f"{v:.2e}" for k, v in sim.max_errs.items()})


# ----------------------------------------------------------------------------------
# every launch variant (score pre-kernel or inline, rank-1 or dot flush, V-tile loop)
# ----------------------------------------------------------------------------------
VARIANTS = {
    "inline-rank1": dict(scores="inline", flush="rank1"),
    "pre-rank1": dict(scores="pre", flush="rank1"),
    "inline-dot": dict(scores="inline", flush="dot"),
    "pre-dot-ieee": dict(scores="pre", flush="dot", dot_precision="ieee"),
    "pre-rank1-bv16": dict(scores="pre", flush="rank1", BV=16),  # V=64: four V tiles per head
    "pre-rank1-cvt": dict(scores="pre", flush="rank1", cast="cvt"),  # cvt: GPU only (interpreter: bits)
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_launch_variants(device, seed, interp_launch, variant):
    params = dict(BV=32, num_warps=4 if "dot" in variant else 1)
    params.update(VARIANTS[variant])
    interp_launch(always=True, **params)
    _two_rows_past_a_flush(device, seed)


def _two_rows_past_a_flush(device, seed, L=4):
    """Two live rows (slots 2 and 5) for L + 1 steps, each step checked against the oracle by Sim.step."""
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, **small_geom(L))
    rows = [2, 5]
    for s in rows:
        sim.activate(s)
    for _ in range(L + 1):
        sim.step(rows)


def _every_position_under_configs(sim, L, tmp_path, monkeypatch, out_dtype, configs):
    """One launch with a row at every write position 0..L-1 (slots 1..L, one flush row), run on
    clones of the same pools under each ``configs[name]`` (YAML flow entries of gdn_decode).
    Returns ({name: (out, pool bases)}, bases before)."""
    rows = list(range(1, L + 1))
    for s in rows:
        sim.activate(s)
        sim.wpos[s] = s - 1
    x, a, b = sim.inputs(len(rows))
    idx, wp = sim.index_tensors(rows)
    before = {n: t.clone() for n, t in sim.bases.items()}
    got = {}
    for name, entries in configs.items():
        f = tmp_path / f"{name}.yaml"
        f.write_text(f"gdn_decode:\n  default: {{BV: 32, {entries}}}\n")
        monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
        bases = {n: t.clone() for n, t in before.items()}
        got[name] = (sim.launch(gdn_replay_decode, x, a, b, idx, wp, bases, sim.new_out(len(rows), out_dtype)), bases)
    return got, before


def _filled_ring_sim(device, seed, prec, L):
    """A Sim (Hk 2, HV 4) whose d and g rings hold random data in every position (for one-launch comparisons)."""
    sd, ad = PRECISIONS[prec]
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, **small_geom(L, Hk=2, HV=4, n_slots=L + 2))
    p = sim.pools()
    p["d"].copy_((sim.randn(p["d"].shape, 0.5)).to(sd))
    p["g"].copy_(-torch.exp(sim.A_log.cpu())[None, :, None] * torch.rand(p["g"].shape, generator=sim.gen))
    return sim


def _same_step(sim, L, before, ref, new, what):
    """Two launches of one every-position step (one flush row, slot L) agree: outputs within the reference
    tolerance, the flushed state and the d appends within rounding (fp32 ~1e-7 relative, 16-bit one ulp), the
    same k and g appends, no other state written. ``ref``/``new``: (out, pool bases). Returns the state error."""
    (o_ref, b_ref), (o_new, b_new) = ref, new
    p_ref, p_new = sim.pools(b_ref), sim.pools(b_new)
    check_close(o_new, o_ref, *REF_OUT_TOL, f"out: {what}")
    flushed = L  # the slot of the row at write position L - 1
    assert not torch.equal(bits(p_new["state"][flushed]), bits(before["state"][flushed])), "flush row wrote no state"
    tol = (1e-6, 2e-6) if sim.sd == F32 else (1e-6, ULP_RTOL[sim.sd])
    e = check_close(p_new["state"], p_ref["state"], *tol, f"flushed state: {what}")
    others = [s for s in range(sim.S) if s != flushed]
    assert torch.equal(bits(p_new["state"][others]), bits(before["state"][others])), "another slot's state changed"
    check_close(p_new["d"], p_ref["d"], 1e-6, ULP_RTOL[sim.sd], f"d ring: {what}")
    for n in ("k", "g"):
        assert torch.equal(bits(p_new[n]), bits(p_ref[n])), f"{n} ring differs: {what}"
    return e


@pytest.mark.parametrize("scores", ["pre", "inline"])
@pytest.mark.parametrize("prec", ["s32-a16b", pytest.param("s16b-a16b", marks=pytest.mark.slow),
                                  pytest.param("s16-a16", marks=pytest.mark.slow)])
def test_flush_modes_agree(device, seed, tmp_path, monkeypatch, prec, scores):
    """dot (ieee fp32 tl.dot) vs rank1 on identical pools, one launch with every write position
    (one flush row): the same output pass, the flushed state within rounding-order
    differences (fp32: ~1e-7 relative; 16-bit states: at most one ulp), the same ring
    appends, nothing else written."""
    L = 8
    sim = _filled_ring_sim(device, seed, prec, L)
    got, before = _every_position_under_configs(
        sim, L, tmp_path, monkeypatch, F32, {fl: f"scores: {scores}, flush: {fl}, dot_precision: ieee"
                                              for fl in ("rank1", "dot")})
    e = _same_step(sim, L, before, got["rank1"], got["dot"], "dot vs rank1")
    print(prec, scores, f"max |state diff| {e:.2e}")


@pytest.mark.parametrize("flush", FLUSHES)
@pytest.mark.parametrize("prec", ["s32-a16b", "s16b-a16b", "s16-a16"])
def test_cast_modes_bit_identical(device, seed, tmp_path, monkeypatch, prec, flush):
    """cast=cvt (the GPU's cvt.rn) and cast=bits (_cast_rtne's bit arithmetic) store the
    same bits: outputs in the activation dtype, d appends and the flushed state. In the
    interpreter both run the bit arithmetic (it truncates otherwise); the GPU compares the
    two roundings for real."""
    sd, ad = PRECISIONS[prec]
    L = 8
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, **small_geom(L, Hk=2, HV=4, n_slots=L + 2))
    got, before = _every_position_under_configs(
        sim, L, tmp_path, monkeypatch, ad, {c: f"flush: {flush}, cast: {c}" for c in ("bits", "cvt")})
    assert torch.equal(bits(got["cvt"][0]), bits(got["bits"][0])), "outputs differ between cast modes"
    for n in before:
        assert torch.equal(bits(got["cvt"][1][n]), bits(got["bits"][1][n])), f"{n} pool differs between cast modes"
    assert not torch.equal(bits(got["bits"][1]["state"]), bits(before["state"]))  # the flush row wrote


# ----------------------------------------------------------------------------------
# 2: kernel vs reference at every write position in one launch (realistic ring data)
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("flush", FLUSHES)
@pytest.mark.parametrize("prec", ["s32-a16b", "s16b-a16b"])
def test_every_write_position_matches_reference(device, seed, flush_launch, prec, flush):
    flush_launch(flush, BV=32)
    sd, ad = PRECISIONS[prec]
    L = 8
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, **small_geom(L, Hk=2, HV=4, n_slots=L + 2))
    rows = list(range(1, L + 1))  # row r at write position r - 1 (incl. the flush row)
    p = sim.pools()
    p["d"].copy_((sim.randn(p["d"].shape, 0.5)).to(sd))
    p["g"].copy_(-torch.exp(sim.A_log.cpu())[None, :, None] * torch.rand(p["g"].shape, generator=sim.gen))
    for s in rows:
        sim.activate(s)
        sim.wpos[s] = s - 1
    B = len(rows)
    x, a, b = sim.inputs(B)
    idx, wp = sim.index_tensors(rows)
    before = {n: t.clone() for n, t in sim.bases.items()}
    out = sim.launch(gdn_replay_decode, x, a, b, idx, wp, sim.bases, sim.new_out(B, F32))
    dbeta = torch.zeros(B, sim.HV, sim.V, dtype=F32, device=sim.dev)
    ref = sim.launch(gdn_replay_decode_ref, x, a, b, idx, wp, before, sim.new_out(B, F32), dbeta_out=dbeta)
    check_close(out, ref, REF_OUT_TOL[0] + beta_rounding_atol(b, dbeta), REF_OUT_TOL[1], "out vs reference")
    check_close(sim.bases["state"], before["state"], 1e-5 if sd == F32 else 1e-6, ULP_RTOL[sd], "state")
    check_close(sim.bases["d"], before["d"], 1e-5 if sd == F32 else 1e-6, ULP_RTOL[sd], "d ring")
    assert torch.equal(bits(sim.bases["k"]), bits(before["k"]))
    check_close(sim.bases["g"], before["g"], 1e-5, 1e-5, "g ring")
    # exactly one state written (the flush row's slot), exactly L-1 ring appends
    changed = [s for s in range(sim.S) if not torch.equal(bits(sim.pools()["state"][s]),
                                                            bits(sim.pools(before)["state"][s]))]
    assert changed in ([], [L]), changed  # [] only if the flushed state happened to be identical


# ----------------------------------------------------------------------------------
# 3: L = 1 is SGLang's stock packed decode (optional: run the stock kernel itself)
# ----------------------------------------------------------------------------------
@triton.jit
def _jit_exp(x):
    return tl.exp(x)


@pytest.mark.parametrize("act", [F32, BF16])
def test_L1_matches_sglang_stock_kernel(device, seed, act, monkeypatch):
    fr = pytest.importorskip("sglang.kernels.ops.attention.fla.fused_recurrent")
    if INTERP:  # the stock module binds `exp = tl.exp` at import, which the interpreter can't call
        monkeypatch.setattr(fr, "exp", _jit_exp)
    gen = torch.Generator().manual_seed(seed)
    Hk, HV, K, V, B, S = 2, 4, 32, 32, 3, 5
    A_log = torch.log(torch.rand(HV, generator=gen) * 15 + 1).to(device)
    dt_bias = (torch.rand(HV, generator=gen) * 3 - 2).to(device)
    state0 = (torch.randn(S, HV, V, K, generator=gen) * 2).to(device)
    idx = torch.tensor([3, 1, 4], dtype=torch.int32, device=device)
    ours, stock = state0.clone(), state0.clone()
    rings = (torch.zeros(S, HV, 1, V, device=device), torch.zeros(S, Hk, 1, K, dtype=act, device=device),
             torch.zeros(S, HV, 1, device=device))
    for _ in range(3):
        x = torch.randn(B, 2 * Hk * K + HV * V, generator=gen).to(act).to(device)
        a = torch.randn(B, HV, generator=gen).to(act).to(device)
        # b in fp32: Triton's interpreter truncates fp32->bf16, so a bf16 b would round
        # beta differently in the (unmodified) stock kernel than on a GPU.
        b = torch.randn(B, HV, generator=gen).to(device)
        o_stock = torch.empty(B, 1, HV, V, dtype=act, device=device)
        fr.fused_recurrent_gated_delta_rule_packed_decode(
            x, a, b, A_log, dt_bias, K ** -0.5, stock, o_stock, idx, use_qk_l2norm_in_kernel=True)
        o_ours = torch.empty(B, 1, HV, V, dtype=act, device=device)
        gdn_replay_decode(x, a, b, A_log, dt_bias, ours, *rings, idx, torch.zeros(B, dtype=torch.int32,
                          device=device), out=o_ours)
        check_close(o_ours, o_stock, 2e-6 if act == F32 else 1e-6, 1e-5 if act == F32 else 2.0 ** -7,
                    "out vs stock")
        check_close(ours, stock, 1e-5, 1e-5, "state vs stock")


# ----------------------------------------------------------------------------------
# 4: prefill final state, then decode == the full recurrence
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("prec", ["s32-a16b", "s16b-a16b"])
def test_prefill_then_decode_equals_full_recurrence(device, seed, interp_launch, prec):
    interp_launch(BV=32)
    sd, ad = PRECISIONS[prec]
    L, P = 4, 7
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, **small_geom(L))
    rows = [2, 5]
    # "prefill": the sequential recurrence over P prompt tokens from a zero state
    h = torch.zeros(len(rows), sim.HV, sim.V, sim.K, dtype=torch.float64)
    for _ in range(P):
        x, a, b = sim.inputs(len(rows))
        _, h = gdn_step_oracle(x.cpu(), a.cpu(), b.cpu(), sim.A_log.cpu(), sim.dt_bias.cpu(), h,
                               num_k_heads=sim.Hk)
    for i, s in enumerate(rows):
        sim.activate(s, state=h[i])  # the prefill writes its final state into the slot
        sim.oracle[s] = h[i].to(sd).double()  # ... rounded to the state dtype, as a prefill kernel would
    for _ in range(2 * L + 1):
        sim.step(rows)


# ----------------------------------------------------------------------------------
# 5 + 6: desynchronised write positions, padded rows, null slot
# ----------------------------------------------------------------------------------
def _staggered_rows(sim, slots, starts, t):
    """The batch at step t: row r decodes slot slots[r] from step starts[r] on (activated then) and is padding
    before (-1 and the null slot 0 in turn)."""
    rows = []
    for slot, t0 in zip(slots, starts):
        if t == t0:
            sim.activate(slot)
        rows.append(slot if t >= t0 else (-1 if t % 2 else 0))
    return rows


def test_desynchronised_write_positions(device, seed, interp_launch):
    interp_launch(BV=32)
    L = 4
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, idx_dtype=torch.int64, **small_geom(L))
    slots = [1, 5, 3, 2]
    starts = [0, 1, 2, 3]  # row r starts decoding at step r; before that it is padding
    for t in range(2 * L + 4):
        sim.step(_staggered_rows(sim, slots, starts, t))
        phases = {sim.wpos[s] for s in slots if s in sim.wpos}
        if t >= 3:
            assert len(phases) == 4  # four distinct cursors in one batch


@pytest.mark.parametrize("null_slot", [0, None])
def test_padded_rows_write_nothing(device, seed, interp_launch, null_slot):
    interp_launch(BV=32)
    L = 4
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, **small_geom(L))
    live = [3, 4] + ([0] if null_slot is None else [])  # with null_slot=None slot 0 is a normal slot
    for s in live:
        sim.activate(s)
    for t in range(L + 2):
        rows = [-1, 3, 0, -7, 4] if t % 2 else [3, 0, -1, 4]
        sim.step(rows, null_slot=null_slot)
    if null_slot == 0:
        assert sim.wpos.get(0) is None


def test_all_rows_padded(device, seed, interp_launch):
    interp_launch(BV=32)
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, **small_geom(4))
    sim.step([-1, 0, -1])


# ----------------------------------------------------------------------------------
# 7: strided views everywhere
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("prec", ["s32-a16b", "s16-a16"])
def test_strided_views(device, seed, interp_launch, prec):
    interp_launch(BV=32)
    sd, ad = PRECISIONS[prec]
    L = 4
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, strided=True, **small_geom(L))
    p = sim.pools()
    assert not p["state"].is_contiguous() and not p["d"].is_contiguous()
    assert not p["k"].is_contiguous() and not p["g"].is_contiguous()
    rows = [2, 5, 1]
    for s in rows:
        sim.activate(s)
    for t in range(2 * L + 1):
        sim.step(rows + [-1])


def test_out_layouts_and_default_out(device, seed, interp_launch):
    interp_launch(BV=32)
    L = 4
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, **small_geom(L))
    rows = [1, 2]
    for s in rows:
        sim.activate(s)
    for t in range(L + 1):
        sim.step(rows, out_dtype=BF16, four_d=bool(t % 2))
    # out=None: allocated [B, HV, V] in the activation dtype
    x, a, b = sim.inputs(2)
    idx, wp = sim.index_tensors(rows)
    p = sim.pools()
    o = gdn_replay_decode(x, a, b, sim.A_log, sim.dt_bias, p["state"], p["d"], p["k"], p["g"], idx, wp)
    assert o.shape == (2, sim.HV, sim.V) and o.dtype == BF16 and torch.isfinite(o).all()


# ----------------------------------------------------------------------------------
# 8: teeth
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("ring", ["d", "k", "g"])
@pytest.mark.parametrize("phase", ["nonflush", "flush"] + [f"flush-{f}" for f in FLUSHES[1:]])
def test_corrupted_ring_entry_is_detected(device, seed, flush_launch, ring, phase):
    flush_launch(phase[len("flush-"):] if phase.startswith("flush-") else FLUSHES[0], BV=32)
    phase = "flush" if phase.startswith("flush") else phase
    L = 4
    sim = Sim(device, seed, state_dtype=F32, act_dtype=F32, **small_geom(L, Hk=2, HV=4))
    rows = [2, 4]
    for s in rows:
        sim.activate(s)
    w = 2 if phase == "nonflush" else L - 1
    for _ in range(w):
        sim.step(rows)
    x, a, b = sim.inputs(len(rows))
    idx, wp = sim.index_tensors(rows)
    assert wp.tolist() == [w, w]
    victim = rows[1]

    def run(corrupt_pos):
        bases = {n: t.clone() for n, t in sim.bases.items()}
        if corrupt_pos is not None:
            r = sim.pools(bases)[ring]
            if ring == "d":
                r[victim, 0, corrupt_pos] += 20.0
            elif ring == "k":  # cached key := the current query direction (k^.q^ becomes large)
                r[victim, 0, corrupt_pos] = x[1, : sim.K].to(r.dtype)
            else:
                r[victim, 0, corrupt_pos] += 5.0
        out = sim.launch(gdn_replay_decode, x, a, b, idx, wp, bases, sim.new_out(2, F32))
        return out, sim.pools(bases)["state"]

    o_orc, s_orc = gdn_step_oracle(x.cpu(), a.cpu(), b.cpu(), sim.A_log.cpu(), sim.dt_bias.cpu(),
                                   torch.stack([sim.oracle[s] for s in rows]), num_k_heads=sim.Hk)
    clean, st_clean = run(None)
    bad, st_bad = run(w - 1)  # the newest cached entry: weight e^0 = 1, can't decay away
    stale, st_stale = run(w)  # position >= write_pos: must be masked
    tol = ORACLE_TOL[F32]
    check_close(clean, o_orc, *tol["out"][:2], "clean run vs oracle")
    # the corrupted v-head (0) of the victim row is off by far more than the tolerance ...
    err = max_err(bad[1, 0], o_orc[1, 0])
    assert err > 10 * tol["out"][0], f"corrupted {ring}[{w - 1}] went unnoticed (err {err:.2e})"
    if phase == "flush":
        err_s = max_err(st_bad[victim, 0], s_orc[1, 0])
        assert err_s > 10 * tol["state"][0], f"corrupted {ring} not visible in the flushed state ({err_s:.2e})"
    # ... the other row and the heads of the other k-head are untouched
    assert torch.equal(bits(bad[0]), bits(clean[0])) and torch.equal(bits(bad[1, 2:]), bits(clean[1, 2:]))
    # a stale entry changes nothing
    assert torch.equal(bits(stale), bits(clean)) and torch.equal(bits(st_stale), bits(st_clean))


# ----------------------------------------------------------------------------------
# 10: geometries
# ----------------------------------------------------------------------------------
GEOMS = {
    "Hk2-HV4-K64": dict(Hk=2, HV=4, K=64, V=64, BV=32),
    "Hk1-HV2-K32": dict(Hk=1, HV=2, K=32, V=32, BV=16),
    "Hk1-HV3-K48-V80": dict(Hk=1, HV=3, K=48, V=80, BV=32),  # non-power-of-two K and V
}


@pytest.mark.parametrize("flush", FLUSHES)
@pytest.mark.parametrize("geom", list(GEOMS))
def test_small_geometries(device, seed, flush_launch, geom, flush):
    g = dict(GEOMS[geom])
    flush_launch(flush, BV=g.pop("BV"))
    L = 4
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, L=L, n_slots=5, **g)
    rows = [1, 4, 2]
    for s in rows:
        sim.activate(s)
    for _ in range(L + 2):
        sim.step(rows)


@pytest.mark.slow
@pytest.mark.parametrize("geom", ["qwen3-next", "qwen3.5-122b"])
def test_real_geometries(device, seed, interp_launch, geom):
    HV = {"qwen3-next": 32, "qwen3.5-122b": 64}[geom]
    interp_launch(BV=128)  # one V tile per head: the interpreter's cost is per program
    L = 4
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, Hk=16, HV=HV, K=128, V=128, L=L, n_slots=3)
    rows = [2, 1]
    for s in rows:
        sim.activate(s)
    for _ in range(L + 1):
        sim.step(rows)


@pytest.mark.gpu
@pytest.mark.parametrize("flush", FLUSHES)
@pytest.mark.parametrize("prec", ["s32-a16b", "s16b-a16b"])
def test_qwen3_next_full_cycles_gpu(device, seed, flush_launch, prec, flush):
    """Full L=16 cycles at batch 16 with the default launch config (CUDA only); a
    non-default flush mode replaces the device's config by the defaults + that mode."""
    flush_launch(flush)
    sd, ad = PRECISIONS[prec]
    L = 16
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, Hk=16, HV=32, K=128, V=128, L=L, n_slots=20)
    rows = list(range(3, 19))
    for s in rows:
        sim.activate(s)
    for _ in range(2 * L + 1):
        sim.step(rows)
    print(prec, flush, {k: f"{v:.2e}" for k, v in sim.max_errs.items()})


@pytest.mark.parametrize("flush", FLUSHES)
def test_no_l2norm(device, seed, flush_launch, flush):
    flush_launch(flush, BV=32)
    L = 4
    sim = Sim(device, seed, state_dtype=F32, act_dtype=F32, use_qk_l2norm=False, **small_geom(L))
    # without normalisation keep k small so the delta rule stays contractive
    rows = [1, 3]
    for s in rows:
        sim.activate(s)
    orig_inputs = sim.inputs

    def small_inputs(B):
        x, a, b = orig_inputs(B)
        return x * 0.1, a, b

    sim.inputs = small_inputs
    for _ in range(L + 2):
        sim.step(rows)


# ----------------------------------------------------------------------------------
# 11: validation
# ----------------------------------------------------------------------------------
def _valid_args(device, B=2, Hk=1, HV=2, K=32, V=32, L=4, S=3, sd=F32, ad=BF16):
    return dict(
        mixed_qkv=torch.randn(B, 2 * Hk * K + HV * V, device=device).to(ad),
        a=torch.randn(B, HV, device=device).to(ad), b=torch.randn(B, HV, device=device).to(ad),
        A_log=torch.zeros(HV, device=device), dt_bias=torch.zeros(HV, device=device),
        state=torch.zeros(S, HV, V, K, dtype=sd, device=device),
        d_ring=torch.zeros(S, HV, L, V, dtype=sd, device=device),
        k_ring=torch.zeros(S, Hk, L, K, dtype=ad, device=device),
        g_ring=torch.zeros(S, HV, L, device=device),
        state_indices=torch.tensor([-1] * B, dtype=torch.int32, device=device),
        write_pos=torch.zeros(B, dtype=torch.int32, device=device),
    )


def _call(args, **kw):
    names = ["mixed_qkv", "a", "b", "A_log", "dt_bias", "state", "d_ring", "k_ring", "g_ring",
             "state_indices", "write_pos"]
    return gdn_replay_decode(*[args[n] for n in names], **kw)


BAD_ARGS = {
    "qkv width": lambda A: A.update(mixed_qkv=A["mixed_qkv"][:, 1:]),
    "qkv 3d": lambda A: A.update(mixed_qkv=A["mixed_qkv"][:, None]),
    "qkv not last-contiguous": lambda A: A.update(
        mixed_qkv=torch.empty(A["mixed_qkv"].shape[1], 2, dtype=A["mixed_qkv"].dtype,
                              device=A["mixed_qkv"].device).t()),
    "a shape": lambda A: A.update(a=A["a"][:, :1]),
    "b batch": lambda A: A.update(b=A["b"][:1]),
    "A_log shape": lambda A: A.update(A_log=A["A_log"][:1]),
    "state 3d": lambda A: A.update(state=A["state"][0]),
    "d_ring L": lambda A: A.update(d_ring=A["d_ring"][:, :, :2]),
    "d_ring dtype": lambda A: A.update(d_ring=A["d_ring"].to(F16)),
    "k_ring dtype": lambda A: A.update(k_ring=A["k_ring"].float()),
    "k_ring K": lambda A: A.update(k_ring=A["k_ring"][..., :16]),
    "g_ring dtype": lambda A: A.update(g_ring=A["g_ring"].to(BF16)),
    "g_ring slots": lambda A: A.update(g_ring=A["g_ring"][:2]),
    "HV not multiple of Hk": lambda A: A.update(k_ring=torch.zeros(3, 3, 4, 32, dtype=BF16,
                                                                     device=A["k_ring"].device)),
    "indices dtype": lambda A: A.update(state_indices=A["state_indices"].float()),
    "indices length": lambda A: A.update(state_indices=A["state_indices"][:1]),
    "write_pos 2d": lambda A: A.update(write_pos=A["write_pos"][:, None]),
    "state int": lambda A: A.update(state=A["state"].to(torch.int32)),
}


@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_validation_raises(device, case):
    args = _valid_args(device)
    _call(args)  # the valid baseline passes (all rows padded: nothing runs)
    BAD_ARGS[case](args)
    with pytest.raises(ValueError, match="gdn_replay_decode"):
        _call(args)


@pytest.mark.parametrize("bad_out", ["shape", "dtype"])
def test_validation_out(device, bad_out):
    args = _valid_args(device)
    out = torch.empty(2, 2, 33, device=device) if bad_out == "shape" else \
        torch.empty(2, 2, 32, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="out"):
        _call(args, out=out)


def test_validation_device_mismatch():
    if not torch.cuda.is_available():
        pytest.skip("needs two devices")
    args = _valid_args("cuda")
    args["A_log"] = args["A_log"].cpu()
    with pytest.raises(ValueError, match="device"):
        _call(args)


@pytest.mark.parametrize("entry,match", [("dot_precision: tf32", "tf32"), ("BV: 24", "BV"),
                                         ("flush: rank2", "flush"), ("cast: truncate", "cast")])
def test_launch_config_rejects_bad_values(tmp_path, monkeypatch, entry, match):
    f = tmp_path / "bad.yaml"
    f.write_text(f"gdn_decode:\n  default:\n    {entry}\n")
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
    with pytest.raises(ValueError, match=match):
        gr.gdn_launch_params(2, 1, 32, 32, 4)


def test_launch_config_accepts_every_advertised_flush(tmp_path, monkeypatch):
    for flush in gr.GDN_LAUNCH_CHOICES["flush"]:  # every advertised mode is accepted
        f4 = tmp_path / f"ok-{flush}.yaml"
        f4.write_text(f"gdn_decode:\n  default:\n    flush: {flush}\n")
        monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f4))
        assert gr.gdn_launch_params(2, 1, 32, 32, 4)["flush"] == flush


def test_default_yaml_keeps_the_built_in_defaults(monkeypatch):
    """A GPU without its own file runs the registered decode defaults (default.yaml sets nothing of the decode
    kernel)."""
    from sglang_replayssm.kernels.common import CONFIG_DIR

    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(CONFIG_DIR / "default.yaml"))
    assert gr.gdn_launch_params(32, 16, 128, 128, 16, torch.float32) == gr.GDN_DEFAULT_LAUNCH
    assert gr.GDN_DEFAULT_LAUNCH["dot_precision"] in ("tf32x3", "ieee")


def test_launch_config_state_dtype_key_wins(tmp_path, monkeypatch):
    """A ``<geometry>_S<dtype>`` entry overrides the geometry entry for that state dtype only
    (a bf16 checkpoint moves half the bytes per tile); other dtypes keep the geometry entry."""
    f = tmp_path / "cfg.yaml"
    f.write_text("gdn_decode:\n  default: {BV: 16}\n  HV2_HK1_K32_V32_L4: {BV: 32, num_warps: 2}\n"
                 "  HV2_HK1_K32_V32_L4_Sbf16: {BV: 64}\n")
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
    bf = gr.gdn_launch_params(2, 1, 32, 32, 4, torch.bfloat16)
    fp = gr.gdn_launch_params(2, 1, 32, 32, 4, torch.float32)
    plain = gr.gdn_launch_params(2, 1, 32, 32, 4)
    assert (bf["BV"], bf["num_warps"]) == (64, 2)
    assert (fp["BV"], fp["num_warps"]) == (32, 2) and plain == fp
    assert gr.gdn_launch_params(2, 1, 32, 32, 8, torch.bfloat16)["BV"] == 16


def _record_launch_kwarg(monkeypatch, kernel: str, key: str):
    """The value of launch keyword ``key`` in each launch of gdn_replay's Triton kernel ``kernel`` (it still runs)."""
    import sglang_replayssm.kernels.gdn_replay as mod

    seen, real = [], getattr(mod, kernel)

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append(kw[key])
                return real[grid](*args, **kw)
            return launch

    monkeypatch.setattr(mod, kernel, Recording())
    return seen


def _count_launches(monkeypatch, kernel: str):
    """Record the launch grids of gdn_replay's Triton kernel ``kernel`` (it still runs)."""
    import sglang_replayssm.kernels.gdn_replay as mod

    launches = []
    real = getattr(mod, kernel)

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    monkeypatch.setattr(mod, kernel, Counting())
    return launches


@pytest.mark.parametrize("limit,want_pre", [(0, True), (1, True), (2, False), (8, False)])
def test_inline_scores_max_batch_skips_the_pre_kernel(device, seed, tmp_path, monkeypatch, limit, want_pre):
    """With ``scores: pre``, a batch of at most ``inline_scores_max_batch`` rows launches only the decode
    kernel (the scores inline), a larger one the score pre-kernel too; both stay on the oracle."""
    f = tmp_path / "cfg.yaml"
    f.write_text(f"gdn_decode:\n  default: {{BV: 32, scores: pre, inline_scores_max_batch: {limit}}}\n")
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
    launches = _count_launches(monkeypatch, "_gdn_history_scores_kernel")
    _two_rows_past_a_flush(device, seed)
    assert bool(launches) is want_pre, (limit, launches)


@pytest.mark.parametrize("limit,want_bv", [(1, 32), (2, 16)])
def test_inline_bv_is_the_tile_of_small_batches(device, seed, tmp_path, monkeypatch, limit, want_bv):
    """``inline_BV`` replaces BV for batches of at most ``inline_scores_max_batch`` rows only (a bf16 state
    is fastest with BV 32 at batch >= 32 and 16 at batch 1); either tile stays on the oracle."""
    f = tmp_path / "cfg.yaml"
    f.write_text(f"gdn_decode:\n  default: {{BV: 32, inline_BV: 16, scores: pre, inline_scores_max_batch: {limit}}}\n")
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
    tiles = _record_launch_kwarg(monkeypatch, "_gdn_replay_decode_kernel", "BV")
    _two_rows_past_a_flush(device, seed)  # batch 2 on every step
    assert tiles and set(tiles) == {want_bv}, (limit, tiles)


@pytest.mark.parametrize("limit,want_warps", [(1, 1), (2, 2)])
def test_inline_num_warps_are_the_warps_of_small_batches(device, seed, tmp_path, monkeypatch, limit, want_warps):
    """``inline_num_warps`` replaces num_warps for batches of at most ``inline_scores_max_batch`` rows only; the
    launches stay on the oracle."""
    f = tmp_path / f"cfg-warps-{limit}.yaml"
    f.write_text("gdn_decode:\n  default: {BV: 32, inline_BV: 16, num_warps: 1, inline_num_warps: 2, scores: pre, "
                 f"inline_scores_max_batch: {limit}}}\n")
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
    warps = _record_launch_kwarg(monkeypatch, "_gdn_replay_decode_kernel", "num_warps")
    _two_rows_past_a_flush(device, seed)  # batch 2 on every step
    assert warps and set(warps) == {want_warps}, (limit, warps)


def test_inline_bv_must_be_a_power_of_two(tmp_path, monkeypatch):
    f = tmp_path / "cfg.yaml"
    f.write_text("gdn_decode:\n  default: {inline_BV: 24}\n")
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
    with pytest.raises(ValueError, match="inline_BV must be 0 or a power of two"):
        gr.gdn_launch_params(2, 1, 32, 32, 4)


@pytest.mark.parametrize("limit,inline_bkc,want_chunked", [(1, 0, True), (2, 0, False), (2, -1, True), (2, 16, True)])
def test_inline_bkc_is_the_chunk_of_small_batches(device, seed, tmp_path, monkeypatch, limit, inline_bkc,
                                                  want_chunked):
    """``inline_BKC`` replaces BKC for batches of at most ``inline_scores_max_batch`` rows (0: the whole-tile
    kernel, -1: BKC); the batch of 2 below launches exactly one of the two decode kernels and stays on the
    oracle either way."""
    f = tmp_path / f"cfg-bkc-{limit}-{inline_bkc}.yaml"
    f.write_text("gdn_decode:\n  default: {BV: 32, BKC: 32, flush: dot, scores: pre, "
                 f"inline_scores_max_batch: {limit}, inline_BKC: {inline_bkc}}}\n")
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
    chunks = _record_launch_kwarg(monkeypatch, "_gdn_replay_decode_kchunk_kernel", "BKC")
    whole = _count_launches(monkeypatch, "_gdn_replay_decode_kernel")
    _two_rows_past_a_flush(device, seed)
    assert bool(chunks) is want_chunked and bool(whole) is not want_chunked, (limit, inline_bkc, chunks, whole)
    if want_chunked:  # the small-batch chunk when it applies (batch 2 <= limit), BKC otherwise
        assert set(chunks) == {inline_bkc if limit >= 2 and inline_bkc > 0 else 32}, (limit, inline_bkc, chunks)


@pytest.mark.parametrize("value,msg", [(-2, "inline_BKC must be -1, 0 or a power of two >= 16"),
                                       (24, "inline_BKC must be -1, 0 or a power of two >= 16"),
                                       (8, r"inline_BKC must be -1, 0 or a power of two >= 16 "
                                           r"\(-1: BKC, 0: the whole tile\), got 8")])
def test_inline_bkc_is_checked(tmp_path, monkeypatch, value, msg):
    f = tmp_path / f"cfg-bad-bkc{value}.yaml"
    f.write_text(f"gdn_decode:\n  default: {{inline_BKC: {value}}}\n")
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
    with pytest.raises(ValueError, match=msg):
        gr.gdn_launch_params(2, 1, 32, 32, 4)


# ----------------------------------------------------------------------------------
# the K-chunked tile (launch option BKC > 0: _gdn_replay_decode_kchunk_kernel)
# ----------------------------------------------------------------------------------
# the CPU run keeps s32-a16b / pre / rank1; the edge cases below take dot, inline and 16-bit state in the CPU run
@pytest.mark.parametrize("flush", ["rank1", pytest.param("dot", marks=pytest.mark.slow)])
@pytest.mark.parametrize("scores", ["pre", pytest.param("inline", marks=pytest.mark.slow)])
@pytest.mark.parametrize("prec", ["s32-a16b", pytest.param("s16b-a16b", marks=pytest.mark.slow)])
def test_k_chunked_tile_on_the_oracle(device, seed, interp_launch, monkeypatch, prec, scores, flush):
    """BKC 16 over K 64 (four chunks, two pipeline stages): the output pass streams the checkpoint tile and a
    flush row re-reads it chunk by chunk. Every step is checked by Sim.step (reference, sequential oracle,
    padded and null rows write nothing, other slots and the memory around the strided pool views untouched),
    with desynchronised rows through two flushes each."""
    interp_launch(always=True, BV=32, BKC=16, num_stages=2, flush=flush, scores=scores)
    launches = _count_kchunk_launches(monkeypatch)
    sd, ad = PRECISIONS[prec]
    L = 4
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, strided=True, **small_geom(L, Hk=2, HV=4, n_slots=7))
    slots, starts = [1, 5, 3], [0, 1, 3]
    for t in range(2 * L + 3):
        sim.step(_staggered_rows(sim, slots, starts, t))
    assert sim.max_errs, "no step was checked"
    assert len(launches) == 2 * L + 3, "the K-chunked kernel did not run on every step"


def _count_kchunk_launches(monkeypatch):
    """The K-chunked kernel's launch grids (a test of BKC > 0 must not pass on the whole-tile kernel)."""
    return _count_launches(monkeypatch, "_gdn_replay_decode_kchunk_kernel")


KCHUNK_EDGE_CASES = {  # name: (Sim geometry overrides, launch entries, state, use_qk_l2norm)
    # a partial last K chunk (48 = 32 + 16) and a partial last V tile (80 = 2 x 32 + 16)
    "partial-chunk-and-tile": (dict(K=48, V=80), dict(BV=32, BKC=32, num_stages=1), "s32-a16b", True),
    "partial-dot-inline": (dict(K=48, V=80), dict(BV=32, BKC=32, flush="dot", scores="inline"), "s32-a16b", True),
    "no-l2norm": (dict(K=64, V=64), dict(BV=32, BKC=16), "s32-a32", False),
    "no-l2norm-inline": (dict(K=64, V=64), dict(BV=32, BKC=16, scores="inline"), "s32-a32", False),
    "fp16-state": (dict(K=64, V=64), dict(BV=16, BKC=32), "s16-a16", True),
    "chunk-past-K": (dict(K=20, V=24), dict(BV=16, BKC=128), "s32-a16b", True),  # clamped to BK = 32
    # the packaged fp32 entry's dot flush with the score pre-kernel, partial last chunk; and a bf16 state
    "partial-dot-pre": (dict(K=48, V=80), dict(BV=32, BKC=32, flush="dot"), "s32-a16b", True),
    "bf16-state-dot": (dict(K=64, V=64), dict(BV=32, BKC=16, flush="dot"), "s16b-a16b", True),
}


@pytest.mark.parametrize("case", list(KCHUNK_EDGE_CASES))
def test_k_chunked_tile_edge_cases(device, seed, interp_launch, monkeypatch, case):
    """Odd K and V (partial chunks and tiles), no q/k L2 norm, a 16-bit state, a chunk wider than K: two
    desynchronised rows through a flush, every step on the reference and the oracle (Sim.step), and the
    K-chunked kernel is the one that ran."""
    geom, entries, prec, l2 = KCHUNK_EDGE_CASES[case]
    interp_launch(always=True, **entries)
    launches = _count_kchunk_launches(monkeypatch)
    sd, ad = PRECISIONS[prec]
    L = 4
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, use_qk_l2norm=l2, **small_geom(L, **geom))
    if not l2:  # as test_no_l2norm: small raw keys keep the delta rule contractive
        orig_inputs = sim.inputs
        sim.inputs = lambda B: (lambda x, a, b: (x * 0.1, a, b))(*orig_inputs(B))
    sim.activate(2)
    for t in range(L + 2):
        if t == 1:
            sim.activate(5)
        sim.step([2, 5] if t >= 1 else [2, -1])
    assert len(launches) == L + 2, launches


@pytest.mark.parametrize("bkc,pads", [(0, 0), (32, 0), (32, 13)], ids=["whole-7", "kchunk-7", "kchunk-20"])
def test_flush_first_order_writes_what_grid_order_writes(device, seed, tmp_path, monkeypatch, bkc, pads):
    """``flush_first_max_batch``: the programs of the flush rows start first (grid (V tiles, v-heads, ranks), each
    program reading its row from the order the score pre-kernel wrote). Over 7 rows with two flush rows out of row
    order, a null-slot row at a write position past the ring (a flush position once clamped) and a padded row at a
    negative one (and, "-20", 13 more padded rows: an order wider than 16), the order is the flush rows then the
    others, each in row order; the outputs and every pool are bit-identical to the grid-order launch, for the
    whole-tile and the K-chunked kernel; a batch above the limit, or scores computed inline (no pre-kernel to write
    the order), keeps the grid order. ``pdl`` (on an sm90 GPU the decode kernel launched as the pre-kernel's
    programmatic dependent) writes the same bits, in both orders, and so does ``pdl_wait: scores`` (the scores read
    after the output pass; each flush-first program finds its row from the write positions, the pre-kernel writes
    no order), with and without pdl."""
    import sglang_replayssm.kernels.gdn_replay as mod

    L = 4
    sim = _filled_ring_sim(device, seed, "s32-a16b", L)
    kernel = "_gdn_replay_decode_kchunk_kernel" if bkc else "_gdn_replay_decode_kernel"
    real = getattr(mod, kernel)
    grids, orders = [], []

    class Recording:  # the launch grids, and the order each flush-first launch read
        def __getitem__(self, grid):
            grids.append(grid)

            def launch(*args, **kw):
                ret = real[grid](*args, **kw)
                if kw["FF"] and args[-1] is not None:
                    orders.append(args[-1].cpu().tolist())
                return ret
            return launch

    monkeypatch.setattr(mod, kernel, Recording())
    for slot, w in {1: 0, 2: L - 1, 3: 1, 4: 2, 5: L - 1}.items():
        sim.activate(slot)
        sim.wpos[slot] = w
    sim.wpos[0], sim.wpos[-1] = L + 3, -2  # the null slot past the ring, the padded rows below it
    rows = [3, -1, 5, 1, 0, 2, 4] + [-1] * pads  # flush: batch rows 2, 4 (null, clamped) and 5
    B = len(rows)
    x, a, b = sim.inputs(B)
    idx, wp = sim.index_tensors(rows)
    before = {n: t.clone() for n, t in sim.bases.items()}
    got = {}
    for name, extra in (("grid", ""), ("flush-first", f", flush_first_max_batch: {B}"),
                        ("above-limit", f", flush_first_max_batch: {B - 1}"),
                        ("inline", ", scores: inline"),
                        ("inline-flush-first", f", scores: inline, flush_first_max_batch: {B}"),
                        ("grid-pdl", ", pdl: 1"), ("flush-first-pdl", f", flush_first_max_batch: {B}, pdl: 1"),
                        ("grid-late", ", pdl_wait: scores"),
                        ("flush-first-late", f", flush_first_max_batch: {B}, pdl_wait: scores"),
                        ("flush-first-pdl-late", f", flush_first_max_batch: {B}, pdl: 1, pdl_wait: scores")):
        f = tmp_path / f"{name}.yaml"
        f.write_text(f"gdn_decode:\n  default: {{BV: 32, BKC: {bkc}{extra}}}\n")
        monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
        bases = {n: t.clone() for n, t in before.items()}
        got[name] = (sim.launch(gdn_replay_decode, x, a, b, idx, wp, bases, sim.new_out(B, F32)), bases)
    tiles = triton.cdiv(sim.V, 32)
    in_order, flush_first = (tiles, B, sim.HV), (tiles, sim.HV, B)
    assert grids == [in_order, flush_first, in_order, in_order, in_order, in_order, flush_first,
                     in_order, flush_first, flush_first], grids
    assert orders == [[2, 4, 5, 0, 1, 3, 6] + list(range(7, B))] * 2, orders  # the late launches read no order
    out_ref, pools_ref = got["grid"]
    flushed = sim.pools(pools_ref)["state"][5]
    assert not torch.equal(bits(flushed), bits(sim.pools(before)["state"][5])), "no flush row wrote its state"
    live = [0, 2, 3, 5, 6]
    assert torch.isfinite(out_ref[live]).all() and torch.isnan(out_ref[[r for r in range(B) if r not in live]]).all()
    for name, ref in (("flush-first", "grid"), ("above-limit", "grid"), ("inline-flush-first", "inline"),
                      ("grid-pdl", "grid"), ("flush-first-pdl", "grid"), ("grid-late", "grid"),
                      ("flush-first-late", "grid"), ("flush-first-pdl-late", "grid")):
        (out, pools), (out_ref, pools_ref) = got[name], got[ref]
        assert torch.equal(bits(out), bits(out_ref)), f"{name}: outputs differ"
        for n in pools:
            assert torch.equal(bits(pools[n]), bits(pools_ref[n])), f"{name}: pool {n} differs"


def test_k_chunked_tile_with_l1(device, seed, interp_launch, monkeypatch):
    """L = 1 (no ring: every step flushes) under BKC: the stock update on every step."""
    interp_launch(always=True, BV=16, BKC=16)
    launches = _count_kchunk_launches(monkeypatch)
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, **small_geom(1))
    for s in (1, 3):
        sim.activate(s)
    for _ in range(3):
        sim.step([1, 3, 0])
    assert len(launches) == 3


@pytest.mark.parametrize("prec", [pytest.param("s32-a16b", marks=pytest.mark.slow),
                                  pytest.param("s16b-a16b", marks=pytest.mark.slow), "s16-a16"])
def test_k_chunked_tile_agrees_with_the_whole_tile(device, seed, tmp_path, monkeypatch, prec):
    """One launch with a row at every write position (one flush row) on identical pools, BKC 16 against the
    whole-tile kernel: outputs within the reference tolerance (only the order of the K sums differs), the
    flushed state and the d append within rounding, the same k and g appends, nothing else written."""
    L = 8
    sim = _filled_ring_sim(device, seed, prec, L)
    got, before = _every_position_under_configs(sim, L, tmp_path, monkeypatch, F32,
                                                {"whole": "BKC: 0", "chunked": "BKC: 16, num_stages: 2",
                                                 "chunked-32": "BKC: 32"})
    for name in ("chunked", "chunked-32"):
        _same_step(sim, L, before, got["whole"], got[name], f"{name} vs whole tile")


@pytest.mark.parametrize("entry,msg", [("BKC: 24", "BKC must be 0 or a power of two >= 16"),
                                       ("BKC: 8", "BKC must be 0 or a power of two >= 16"),
                                       ("inline_BKC: 8", "inline_BKC must be -1, 0 or a power of two >= 16"),
                                       ("{BKC: 32, flush: rank1_fold}", "flush must be one of"),
                                       ("{BKC: 32, prefetch: 1}", "unknown parameter 'prefetch'"),
                                       ("{BKC: 32, l2_hints: 1}", "unknown parameter 'l2_hints'"),
                                       ("{v_tiles: 2}", "unknown parameter 'v_tiles'"),
                                       ("{BKC: 32, flush_prefetch: 1}", "unknown parameter 'flush_prefetch'")])
def test_k_chunk_config_is_checked(tmp_path, monkeypatch, entry, msg):
    f = tmp_path / "cfg.yaml"
    body = entry if entry.startswith("{") else "{" + entry + "}"
    f.write_text(f"gdn_decode:\n  default: {body}\n")
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
    with pytest.raises(ValueError, match=msg):
        gr.gdn_launch_params(2, 1, 32, 32, 4)


@pytest.mark.gpu
# (the chunk-16, BV-64 and num_stages-2 variants were slower on the H200 and take 50-170 s each here; chunk 16
# and num_stages 2 keep CPU tests)
@pytest.mark.parametrize("entries", [dict(BV=32, BKC=32), dict(BV=32, BKC=32, flush="dot")],
                         ids=["bv32-c32", "bv32-c32-dot"])
@pytest.mark.parametrize("prec", ["s32-a16b", "s16b-a16b"])
def test_qwen3_next_kchunk_cycles_gpu(device, seed, interp_launch, monkeypatch, prec, entries):
    """The K-chunked candidates at the Qwen3-Next geometry on CUDA (the interpreter cannot afford K = 128 with many
    rows, and runs tl.dot in plain fp32): 16 rows joining one step apart, so every launch mixes flush and
    non-flush rows, through two full L = 16 cycles, every step on the reference and the oracle."""
    interp_launch(always=True, **entries)
    launches = _count_kchunk_launches(monkeypatch)
    sd, ad = PRECISIONS[prec]
    L = 16
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, Hk=16, HV=32, K=128, V=128, L=L, n_slots=20)
    slots = list(range(3, 19))
    for t in range(2 * L + len(slots)):
        sim.step(_staggered_rows(sim, slots, list(range(len(slots))), t))
    assert len(launches) == 2 * L + len(slots)
    print(prec, entries, {k: f"{v:.2e}" for k, v in sim.max_errs.items()})
