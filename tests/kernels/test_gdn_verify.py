"""Tests of the GDN ReplaySSM speculative verify kernel (``kernels/gdn_verify.py``).

Runs on CUDA when present, else in Triton's CPU interpreter (conftest sets
TRITON_INTERPRET).  Every test draws fresh random inputs from a seed taken from
os.urandom (printed, and shown by pytest on failure; set GDN_VERIFY_TEST_SEED=<n> to
replay one).

Oracles
  * ``gdn_window_oracle`` (fp64 sequential GDN recurrence, token by token; itself
    checked against ``gdn_ref.gdn_step_oracle``).  The simulation keeps, per slot, the
    fp64 state after every *committed* token; every window output is compared with
    the recurrence run from it over the window prefix, and every flushed checkpoint
    with the state at the folded count.  With a reduced-precision state the oracle
    is re-anchored to the stored checkpoint after each checked flush (the kernel
    rounds there, and only there).
  * ``gdn_verify_ref`` (the same replay + UT-solve algebra in PyTorch), run on a clone
    of the pools taken right before each launch: outputs, ring writes and the
    checkpoint must agree to about one rounding of the stored dtype.
  * Histories are seeded either by running earlier verify steps (simulation) or by
    writing the ring from the oracle (d_j, raw k_j, g_j of a sequential run).

Tolerances |x - ref| <= atol + rtol |ref| + scale max|ref| (outputs ~0.05-1, states <~5):
  vs oracle   fp32 state: 2e-5 / 2e-5 (outputs and checkpoints; the fork's tripwire was
              1e-3, a single-pass TF32 fold drifts ~1e-2); bf16 activations change
              nothing (the oracle sees the same bf16 inputs), a bf16 output adds one ulp.
              Measured over many seeds (CPU interpreter): out <= 4e-7, checkpoint <= 2e-6.
              bf16/fp16 state: rtol eps, scale 2 eps (out) / 4 eps (state) of the max.
              Measured: bf16 out <= 3.5e-3, checkpoint <= 1.7e-2 (~0.5 eps of the max);
              fp16 out <= 4.5e-4, checkpoint <= 1.9e-3.
  vs reference (one launch, same pools): out 2e-6 / 1e-5 in fp32, one ulp of the
              stored dtype otherwise; ring d / checkpoint 1e-5 / 1e-5 (fp32) or one ulp;
              raw k bit-exact; g 1e-5 relative.  Measured fp32: out <= 4e-7, d and
              checkpoint <= 2e-6.  With a reduced-precision checkpoint the fold may round
              an entry one ulp apart from the reference's; out and d are then compared
              with a second reference pass started from the kernel's stored checkpoint.
"""

from __future__ import annotations

import os

import pytest
import torch

from gdn_testlib import EPS, ORACLE_TOL, PRECISIONS, REF_OUT_TOL, ULP_RTOL, bits, check_close, max_err

from sglang_replayssm.kernels import gdn_verify as gv
from sglang_replayssm.kernels.common import interpreting
from sglang_replayssm.kernels.gdn_ref import gdn_gates, gdn_step_oracle
from sglang_replayssm.kernels.gdn_replay import gdn_replay_decode
from sglang_replayssm.kernels.gdn_verify import gdn_verify
from sglang_replayssm.kernels.gdn_verify_ref import gdn_verify_ref, gdn_window_oracle
from sglang_replayssm.kernels.spec_cursor import (check_spec_cursors, spec_commit, spec_commit_ref, spec_reset,
                                                  spec_ring_len)

INTERP = interpreting()
F32, BF16, F16, F64 = torch.float32, torch.bfloat16, torch.float16, torch.float64



# ----------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------
@pytest.fixture
def seed(request):
    s = int(os.environ.get("GDN_VERIFY_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"[{request.node.name}] seed={s}  (replay: GDN_VERIFY_TEST_SEED={s})")
    return s


@pytest.fixture
def launch(tmp_path, monkeypatch):
    """Pin gdn_verify launch params through a YAML file (interpreter only unless ``always``).

    Interpreter time grows with the number of programs, so big geometries use one V
    tile there; small ones keep BV small enough to have several V tiles.
    """

    def use(always=False, **params):
        if not (INTERP or always):
            return
        f = tmp_path / "gdn_verify_launch.yaml"
        f.write_text("gdn_verify:\n  default:\n" + "".join(f"    {k}: {v}\n" for k, v in params.items()))
        monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))

    return use


class Sim:
    """Slot pools, per-slot spec cursors and fp64 oracle states for one geometry.

    ``strided=True``: every pool is a strided view into a larger buffer (slot stride
    larger than the trailing dims) and every per-step input a slice of a wider tensor.
    Cursor tensors stay dense (the commit kernel addresses them densely).
    """

    def __init__(self, device, seed, *, Hk, HV, K, V, Bh, T, n_slots, state_dtype, act_dtype,
                 strided=False, round_beta=False, use_qk_l2norm=True, idx_dtype=torch.int32):
        self.dev = torch.device(device)
        self.gen = torch.Generator().manual_seed(seed)
        self.Hk, self.HV, self.K, self.V, self.T, self.S = Hk, HV, K, V, T, n_slots
        self.R = R = spec_ring_len(Bh, T)
        self.sd, self.ad = state_dtype, act_dtype
        self.strided, self.round_beta, self.l2, self.idx_dtype = strided, round_beta, use_qk_l2norm, idx_dtype
        self.W = 2 * Hk * K + HV * V
        # realistic decays: A = exp(A_log) ~ U(1, 16); v-head 0 keeps a long memory
        # (alpha ~ 0.9-0.99) so old ring entries stay visible there (the teeth tests).
        A = self.uniform((HV,), 1.0, 16.0)
        A[0] = self.uniform((1,), 0.02, 0.2)
        self.A_log = torch.log(A).to(self.dev)
        self.dt_bias = self.uniform((HV,), -1.0, 0.5).to(self.dev)
        S = n_slots
        if strided:  # pools carved out of larger buffers, filled with junk
            self.bases = {
                "state": self.randn((S, HV + 1, V, K), 2.0).to(state_dtype),
                "d": self.randn((S, HV, R + 2, V)).to(state_dtype),
                "k": self.randn((S, 2 * Hk, R, K)).to(act_dtype),
                "g": -self.uniform((S, HV, R + 3), 0.0, 4.0),
            }
            self.view_fns = {
                "state": lambda t: t[:, 1:],
                "d": lambda t: t[:, :, 1:R + 1],
                "k": lambda t: t[:, 1::2],
                "g": lambda t: t[:, :, 2:R + 2],
            }
        else:  # dense pools; ring contents start as junk (stale entries must be masked)
            self.bases = {
                "state": self.randn((S, HV, V, K), 2.0).to(state_dtype),
                "d": self.randn((S, HV, R, V)).to(state_dtype),
                "k": self.randn((S, Hk, R, K)).to(act_dtype),
                "g": -self.uniform((S, HV, R), 0.0, 4.0),
            }
            self.view_fns = {n: (lambda t: t) for n in self.bases}
        self.bases = {n: t.to(self.dev) for n, t in self.bases.items()}
        z = torch.zeros(S, dtype=torch.int32, device=self.dev)
        self.cur = {"wp": z.clone(), "origin": z.clone(), "flush": z.clone()}
        self.oracle = {}  # slot -> fp64 state after every committed token [HV, V, K]
        self.max_errs = {}
        self.flushes = 0  # flush verifies that folded a non-empty history
        self.wrapped = False  # some history or window crossed the physical end of the ring
        self.desync_steps = 0  # steps whose live rows sat at different cursor phases

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

    def inputs(self, B, T=None):
        T = self.T if T is None else T

        def cols(width, std=1.0):
            if not self.strided:
                return (self.randn((B, T, width)) * std).to(self.ad).to(self.dev)
            wide = (self.randn((B, T + 1, width + 5)) * std).to(self.ad).to(self.dev)
            return wide[:, 1:, 3:3 + width]  # row and token strides > width

        x, a, b = cols(self.W), cols(self.HV), cols(self.HV)
        if not self.l2:
            x = x * 0.1  # without normalisation keep k small so the delta rule stays contractive
        return x, a, b

    def activate(self, slot):
        """Start a request in ``slot`` (reset kernel: empty ring); oracle = its checkpoint."""
        spec_reset(self.cur["wp"], self.cur["origin"], self.cur["flush"],
                   torch.tensor([slot], dtype=torch.int32, device=self.dev), window=self.T, ring_len=self.R)
        self.oracle[slot] = self.pools()["state"][slot].double().cpu()

    def seed_history(self, slot, n, origin, flush=None):
        """Give ``slot`` ``n`` committed history tokens at physical ``origin`` (no kernel):
        the ring holds the oracle's (d_j, raw k_j, g_j) of a sequential run from the
        checkpoint; cursors wp = n, origin, flush (commit rule unless given)."""
        p = self.pools()
        ck = p["state"][slot].double().cpu()
        self.oracle[slot] = ck
        if n > 0:
            x, a, b = self.inputs(1, n)
            _, d, st = gdn_window_oracle(x.cpu(), a.cpu(), b.cpu(), self.A_log.cpu(), self.dt_bias.cpu(), ck[None],
                                         num_k_heads=self.Hk, use_qk_l2norm=self.l2, round_beta=self.round_beta)
            g, _ = gdn_gates(a[0].cpu(), b[0].cpu(), self.A_log.cpu(), self.dt_bias.cpu(), p["g"].dtype)  # [n, HV]
            kraw = x[0, :, self.Hk * self.K: 2 * self.Hk * self.K].reshape(n, self.Hk, self.K)
            for j in range(n):
                ph = (origin + j) % self.R
                p["d"][slot, :, ph] = d[0, j].to(self.sd).to(self.dev)
                p["k"][slot, :, ph] = kraw[j]
                p["g"][slot, :, ph] = g[j].to(self.dev)
            self.oracle[slot] = st[0, n - 1]
        self.cur["wp"][slot] = n
        self.cur["origin"][slot] = origin
        self.cur["flush"][slot] = int(n + 2 * self.T > self.R) if flush is None else int(flush)

    def index_tensor(self, rows):
        idx = torch.tensor(rows, dtype=self.idx_dtype, device=self.dev)
        if self.strided:  # non-unit stride index tensor
            idx = torch.stack([idx, idx], 1).reshape(-1)[::2]
            assert idx.stride(0) == 2
        return idx

    def new_out(self, B, dtype):
        if self.strided:
            big = torch.full((B, self.T, self.HV + 1, self.V), float("nan"), dtype=dtype, device=self.dev)
            return big[:, :, 1:]
        return torch.full((B, self.T, self.HV, self.V), float("nan"), dtype=dtype, device=self.dev)

    def launch(self, fn, x, a, b, idx, bases, cur, out, null_slot=0, **kw):
        p = self.pools(bases)
        return fn(x, a, b, self.A_log, self.dt_bias, p["state"], p["d"], p["k"], p["g"], idx,
                  cur["wp"], cur["origin"], cur["flush"], use_qk_l2norm=self.l2, round_beta=self.round_beta,
                  out=out, null_slot=null_slot, **kw)

    def note(self, key, val):
        self.max_errs[key] = max(self.max_errs.get(key, 0.0), val)

    def step(self, rows, *, accepts=None, null_slot=0, out_dtype=F32, check_ref=True, commit=True):
        """One checked verify (+ commit). ``rows``: slot id per batch row (pads allowed);
        ``accepts``: committed window tokens per row (random in [1, T] when None)."""
        B, T, R = len(rows), self.T, self.R
        live = [r for r, s in enumerate(rows) if s >= 0 and not (null_slot is not None and s == null_slot)]
        assert all(rows[r] in self.oracle for r in live), "live row on an inactive slot"
        x, a, b = self.inputs(B)
        idx = self.index_tensor(rows)
        before = {n: t.clone() for n, t in self.bases.items()}
        cur_before = {n: t.clone() for n, t in self.cur.items()}
        wpc, orc, flc = (self.cur[n].cpu().tolist() for n in ("wp", "origin", "flush"))
        out = self.new_out(B, out_dtype)
        poison = out.clone()
        ret = self.launch(gdn_verify, x, a, b, idx, self.bases, self.cur, out, null_slot)
        assert ret is out

        dead = [r for r in range(B) if r not in live]
        if dead:
            assert torch.equal(bits(out[dead]), bits(poison[dead])), "padded row output was written"
        assert torch.isfinite(out[live]).all(), "live output left unwritten (poison NaN survived)"
        # the kernel never writes a cursor
        for n in self.cur:
            assert torch.equal(self.cur[n], cur_before[n]), f"cursor {n} was written by the verify"

        live_slots = {rows[r] for r in live}
        if check_ref:
            ref_bases = {n: t.clone() for n, t in before.items()}
            ref_out = self.new_out(B, out_dtype)
            self.launch(gdn_verify_ref, x, a, b, idx, ref_bases, cur_before, ref_out, null_slot)
            e = check_close(self.bases["state"], ref_bases["state"], 1e-5 if self.sd == F32 else 1e-6,
                            ULP_RTOL[self.sd], "checkpoint vs reference")
            self.note("state_vs_ref", e)
            folded = [rows[r] for r in live if flc[rows[r]] and wpc[rows[r]] > 0]
            if self.sd != F32 and folded:
                # A reduced-precision checkpoint folded in fp32 by two associations may round an
                # entry one ulp apart, and the window starts from the stored value.  Second
                # reference pass from the kernel's checkpoint: the flush rows become empty-history
                # verifies whose window lands on the same physical positions.
                cur2 = {n: t.clone() for n, t in cur_before.items()}
                for s in folded:
                    cur2["wp"][s], cur2["origin"][s], cur2["flush"][s] = 0, (orc[s] + wpc[s]) % R, 0
                ref_bases = {n: t.clone() for n, t in before.items()}
                self.pools(ref_bases)["state"][folded] = self.pools()["state"][folded]
                ref_out = self.new_out(B, out_dtype)
                self.launch(gdn_verify_ref, x, a, b, idx, ref_bases, cur2, ref_out, null_slot)
            if out_dtype == F32 and self.sd == F32:
                e = check_close(out[live], ref_out[live], *REF_OUT_TOL, "out vs reference")
            else:
                e = check_close(out[live], ref_out[live], 1e-6, ULP_RTOL[out_dtype], "out vs reference")
            self.note("out_vs_ref", e)
            e = check_close(self.bases["d"], ref_bases["d"], 1e-5 if self.sd == F32 else 1e-6, ULP_RTOL[self.sd],
                            "d ring vs reference")
            self.note("d_vs_ref", e)
            assert torch.equal(bits(self.bases["k"]), bits(ref_bases["k"])), "k ring differs from reference"
            # the kernel's softplus is SGLang's log(1 + e^x) with the GPU's approximate log (~2e-7 absolute): a
            # small softplus carries a relative error above 1e-5 (an H200 run: -0.1596536 for -0.1596555), as in
            # the decode test's check
            check_close(self.bases["g"], ref_bases["g"], 1e-5, 1e-5, "g ring vs reference")
        # slots without a live row are bit-identical (null slot, unused slots)
        now, then = self.pools(), self.pools(before)
        untouched = [s for s in range(self.S) if s not in live_slots]
        for n in now:
            assert torch.equal(bits(now[n][untouched]), bits(then[n][untouched])), \
                f"{n}: a slot without a live row was modified"
        if self.strided:  # nothing outside the views changed either
            for n in self.bases:
                mask = torch.ones_like(self.bases[n], dtype=torch.bool)
                self.view_fns[n](mask).fill_(False)
                assert torch.equal(bits(self.bases[n][mask]), bits(before[n][mask])), \
                    f"{n}: memory outside the pool view was modified"

        # oracle: the sequential recurrence from each slot's committed state over the window
        tol = ORACLE_TOL[self.sd]
        if live:
            ls = [rows[r] for r in live]
            if len({(wpc[s], orc[s], flc[s]) for s in ls}) > 1:
                self.desync_steps += 1
            o_orc, _, st_orc = gdn_window_oracle(
                x[live].cpu(), a[live].cpu(), b[live].cpu(), self.A_log.cpu(), self.dt_bias.cpu(),
                torch.stack([self.oracle[s] for s in ls]), num_k_heads=self.Hk, use_qk_l2norm=self.l2,
                round_beta=self.round_beta)
            for i, (r, s) in enumerate(zip(live, ls)):
                w, o, f = wpc[s], orc[s], flc[s]
                if o + w > R or o + w + T > R:
                    self.wrapped = True
                if f:  # the checkpoint is the committed state (history folded, window excluded)
                    if w > 0:
                        self.flushes += 1
                        e = check_close(now["state"][s], self.oracle[s], *tol["state"][:2], f"flushed state slot {s}",
                                        scale=tol["state"][2])
                        self.note("state_vs_oracle", e)
                        if self.sd != F32:  # re-anchor where the kernel rounds
                            self.oracle[s] = now["state"][s].double().cpu()
                            o1, _, st1 = gdn_window_oracle(
                                x[r:r + 1].cpu(), a[r:r + 1].cpu(), b[r:r + 1].cpu(), self.A_log.cpu(),
                                self.dt_bias.cpu(), self.oracle[s][None], num_k_heads=self.Hk,
                                use_qk_l2norm=self.l2, round_beta=self.round_beta)
                            o_orc[i], st_orc[i] = o1[0], st1[0]
                    else:
                        assert torch.equal(bits(now["state"][s]), bits(then["state"][s])), \
                            "flush with an empty history changed the checkpoint"
                else:
                    assert torch.equal(bits(now["state"][s]), bits(then["state"][s])), \
                        "a verify without flush wrote the checkpoint"
            atol, rtol, scale = tol["out"]
            if out_dtype != F32:  # plus the rounding of the stored output
                rtol = max(rtol, ULP_RTOL[out_dtype])
            e = check_close(out[live], o_orc, atol, rtol, "out vs sequential oracle", scale=scale)
            self.note("out_vs_oracle", e)

        if not commit:
            return x, a, b, out
        # commit a random prefix of every live window (the Triton commit kernel), mirror on the host
        if accepts is None:
            accepts = [int(torch.randint(1, T + 1, (1,), generator=self.gen)) if r in live else 0
                       for r in range(B)]
        acc = torch.tensor(accepts, dtype=torch.int32, device=self.dev)
        host = {n: t.cpu().clone() for n, t in self.cur.items()}
        spec_commit(self.cur["wp"], self.cur["origin"], self.cur["flush"], idx.contiguous(), acc, window=T,
                    ring_len=R, null_slot=null_slot)
        spec_commit_ref(host["wp"], host["origin"], host["flush"], idx.cpu(), acc.cpu(), window=T, ring_len=R,
                        null_slot=null_slot)
        for n in self.cur:
            assert torch.equal(self.cur[n].cpu(), host[n]), f"commit kernel vs reference: cursor {n}"
        check_spec_cursors(self.cur["wp"], self.cur["origin"], self.cur["flush"], window=T, ring_len=R)
        for i, r in enumerate(live):
            self.oracle[rows[r]] = st_orc[i, accepts[r] - 1]
        return x, a, b, out


def small_geom(**kw):
    g = dict(Hk=1, HV=2, K=32, V=32, n_slots=6)
    g.update(kw)
    return g


# ----------------------------------------------------------------------------------
# the references themselves (no kernel): UT solve == sequential recurrence in fp64
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("round_beta", [False, True])
def test_window_oracle_is_the_stock_step(seed, round_beta):
    """gdn_window_oracle == gdn_step_oracle applied token by token (fp64)."""
    gen = torch.Generator().manual_seed(seed)
    Hk, HV, K, V, B, T = 2, 4, 16, 8, 3, 3
    x = torch.randn(B, T, 2 * Hk * K + HV * V, generator=gen).to(BF16)
    a = torch.randn(B, T, HV, generator=gen).to(BF16)
    b = torch.randn(B, T, HV, generator=gen).to(BF16)
    A_log = torch.log(torch.rand(HV, generator=gen) * 15 + 1)
    dt_bias = torch.rand(HV, generator=gen) - 0.5
    h0 = torch.randn(B, HV, V, K, generator=gen, dtype=F64)
    o, d, st = gdn_window_oracle(x, a, b, A_log, dt_bias, h0, num_k_heads=Hk, round_beta=round_beta)
    h = h0
    for i in range(T):
        # gdn_step_oracle rounds beta to b's dtype: an fp32 b gives the unrounded fp32 sigmoid
        bi = b[:, i] if round_beta else b[:, i].float()
        o_s, h = gdn_step_oracle(x[:, i], a[:, i], bi, A_log, dt_bias, h, num_k_heads=Hk)
        # (1e-6, not 1e-12: torch's fp32 sigmoid may differ by an ulp between tensor shapes)
        assert max_err(o[:, i], o_s) < 1e-6 and max_err(st[:, i], h) < 1e-6
    # the returned d_i are the delta-rule updates: S_i = alpha_i S_{i-1} + d_i k^_i^T, so
    # (S_i - alpha_i S_{i-1}) k^_i / |k^_i|^2 = d_i
    g, _ = gdn_gates(a[:, 0], b[:, 0], A_log, dt_bias, F64)
    k0 = x[:, 0, Hk * K: 2 * Hk * K].reshape(B, Hk, K).double()
    k0 = (k0 / torch.sqrt((k0 * k0).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(HV // Hk, 1)
    diff = st[:, 0] - torch.exp(g)[:, :, None, None] * h0
    assert max_err(torch.einsum("bhvk,bhk->bhv", diff, k0) / (k0 * k0).sum(-1)[..., None], d[:, 0]) < 1e-10
    # beta rounding is visible (the two modes differ)
    o2, _, _ = gdn_window_oracle(x, a, b, A_log, dt_bias, h0, num_k_heads=Hk, round_beta=not round_beta)
    assert max_err(o, o2) > 1e-6


@pytest.mark.parametrize("flush", [0, 1])
def test_reference_ut_solve_equals_sequential_fp64(seed, flush):
    """gdn_verify_ref in fp64 on fp64 pools == the sequential recurrence over
    checkpoint + circular history + window, to rounding (1e-10)."""
    sim = Sim("cpu", seed, state_dtype=F64, act_dtype=F32, Bh=6, T=4, **small_geom(Hk=2, HV=4, K=16, V=8))
    sim.bases["g"] = sim.bases["g"].double()  # fp64 log-decays: the whole check runs in fp64
    R = sim.R
    rows = [1, 3, 4]
    setups = [(5, 7), (2, 8), (0, 3)]  # (w, origin): history wraps for slot 1, window wraps for slot 3
    for s, (w, o) in zip(rows, setups):
        sim.seed_history(s, w, o, flush=flush)
    x, a, b = sim.inputs(len(rows))
    idx = torch.tensor(rows)
    p = sim.pools()
    out = torch.zeros(len(rows), sim.T, sim.HV, sim.V, dtype=F64)
    before = {n: t.clone() for n, t in p.items()}
    gdn_verify_ref(x, a, b, sim.A_log, sim.dt_bias, p["state"], p["d"], p["k"], p["g"], idx, sim.cur["wp"],
                   sim.cur["origin"], sim.cur["flush"], out=out, compute_dtype=F64)
    o_orc, d_orc, _ = gdn_window_oracle(x, a, b, sim.A_log, sim.dt_bias, torch.stack([sim.oracle[s] for s in rows]),
                                        num_k_heads=sim.Hk)
    assert max_err(out, o_orc) < 1e-10
    for r, (s, (w, o)) in enumerate(zip(rows, setups)):
        for i in range(sim.T):
            ph = (o + w + i) % R
            assert max_err(p["d"][s, :, ph], d_orc[r, i]) < 1e-10
            assert torch.equal(p["k"][s, :, ph], x[r, i, sim.Hk * sim.K: 2 * sim.Hk * sim.K].reshape(sim.Hk, sim.K))
        if flush and w > 0:
            assert max_err(p["state"][s], sim.oracle[s]) < 1e-10
        else:
            assert torch.equal(p["state"][s], before["state"][s])
        # history entries are untouched
        for j in range(w):
            assert torch.equal(p["d"][s, :, (o + j) % R], before["d"][s, :, (o + j) % R])


# ----------------------------------------------------------------------------------
# kernel vs reference vs oracle, one launch, rows in every phase
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("prec", ["s32-a32", "s32-a16b", "s16b-a16b", "s16-a16"])
def test_kernel_matches_reference_and_oracle(device, seed, launch, prec):
    launch(BV=16 if prec == "s32-a32" else 32)  # V=32: two V tiles per head, or one
    sd, ad = PRECISIONS[prec]
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, Bh=6, T=3, round_beta=prec == "s16-a16",
              **small_geom(Hk=2, HV=4, n_slots=7))
    # R = 9: non-flush rows hold w <= 3, flush rows fold w = 4..6
    setups = {1: (3, 7), 2: (6, 5), 3: (0, 4), 5: (4, 0), 6: (1, 8)}  # slot: (w, origin)
    for s, (w, o) in setups.items():
        sim.seed_history(s, w, o)
    rows = [1, -1, 2, 3, 0, 5, 6]
    flags = sim.cur["flush"].tolist()
    assert {flags[s] for s in setups} == {0, 1}
    sim.step(rows, out_dtype=F32 if sd == F32 else ad, commit=False)
    assert sim.flushes == 2
    print(prec, {k: f"{v:.2e}" for k, v in sim.max_errs.items()})


# ----------------------------------------------------------------------------------
# the 40-step speculative simulation: random accepts, commit kernel, flushes, wraps
# ----------------------------------------------------------------------------------
SIM_CASES = {  # T, history block, precision, steps
    "T1-B4-s32a32": (1, 4, "s32-a32", 40),
    "T2-B6-s32a16b": (2, 6, "s32-a16b", 40),
    "T3-B6-s32a32": (3, 6, "s32-a32", 40),  # R = 9: not a power of two, neither is T
    "T4-B4-s32a32": (4, 4, "s32-a32", 40),  # B = T: every verify after a commit flushes
    "T4-B6-s16ba16b": (4, 6, "s16b-a16b", 20),  # bf16 checkpoint and d ring (shorter: interpreter time)
}


def _desync_simulation(device, seed, case):
    """SIM_CASES[case]: three rows joining at steps 0, 1 and 3 (padded / null rows before), ``steps`` verify
    steps with random accepts, each checked by Sim.step; flushes, wraps and desynchronised rows asserted."""
    T, Bh, prec, steps = SIM_CASES[case]
    sd, ad = PRECISIONS[prec]
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, Bh=Bh, T=T, **small_geom(n_slots=5))
    slots, starts = [3, 1, 4], [0, 1, 3]  # desynchronised: row r joins at step starts[r]
    for t in range(steps):
        rows = []
        for s, t0 in zip(slots, starts):
            if t == t0:
                sim.activate(s)
            rows.append(s if t >= t0 else (-1 if t % 2 else 0))
        sim.step(rows)
    assert sim.flushes >= 3 and sim.wrapped and sim.desync_steps >= steps // 2
    return sim, slots, steps


# T1, T2 (bf16 activations) and T3 (R = 9) are the GPU run's (slow); test_T1_matches_fold_plus_step_and_standard_decode,
# test_kernel_matches_reference_and_oracle and test_launch_variants_match_reference_and_oracle (T=3, Bh=6) keep
# T=1, bf16 activations and R = 9 in the CPU run
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow)
                                  if c in ("T1-B4-s32a32", "T2-B6-s32a16b", "T3-B6-s32a32") else c for c in SIM_CASES])
def test_speculative_simulation(device, seed, launch, case):
    launch(BV=32)
    sim, slots, _ = _desync_simulation(device, seed, case)
    wps = sim.cur["wp"][slots].tolist()
    print(case, "final wp", wps, "flushes", sim.flushes, {k: f"{v:.2e}" for k, v in sim.max_errs.items()})


# ----------------------------------------------------------------------------------
# padded / null rows, strided pools and inputs
# ----------------------------------------------------------------------------------
def test_padded_rows_and_strided_pools(device, seed, launch):
    launch(BV=16)
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, Bh=4, T=2, strided=True, idx_dtype=torch.int64,
              **small_geom(n_slots=5))
    p = sim.pools()
    assert p["state"].stride(0) > sim.HV * sim.V * sim.K  # a view into a bigger pool
    assert not any(p[n].is_contiguous() for n in p)
    for s in (3, 4):
        sim.activate(s)
    for t in range(8):
        rows = [-1, 3, 0, 4] if t % 2 else [4, 0, -1, 3]  # -1: pad, 0: the null slot
        sim.step(rows)
    assert sim.flushes >= 2
    print({k: f"{v:.2e}" for k, v in sim.max_errs.items()})


# ----------------------------------------------------------------------------------
# teeth: a corrupted committed entry is seen, a stale entry past wp is not
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("ring", ["d", "k", "g"])
@pytest.mark.parametrize("phase", ["verify", "flush"])
def test_corrupted_ring_entry_is_detected(device, seed, launch, ring, phase):
    launch(BV=32)
    T, Bh = 2, 6  # R = 8: verify rows hold w <= 4, flush rows w >= 5
    sim = Sim(device, seed, state_dtype=F32, act_dtype=F32, Bh=Bh, T=T, **small_geom(n_slots=5))
    R = sim.R
    w, org = (3, 6) if phase == "verify" else (6, 5)  # both histories wrap around the ring end
    clean, bad, stale = 1, 2, 3
    sim.seed_history(clean, w, org)
    assert int(sim.cur["flush"][clean]) == (phase == "flush")
    p = sim.pools()
    for s in (bad, stale):  # identical copies of the clean slot
        for n in p:
            p[n][s] = p[n][clean]
        for n in sim.cur:
            sim.cur[n][s] = sim.cur[n][clean]
    x1, a1, b1 = sim.inputs(1)
    x, a, b = (t.expand(3, *t.shape[1:]).contiguous() for t in (x1, a1, b1))  # one window, three rows

    def corrupt(slot, logical):
        ph = (org + logical) % R
        r = p[ring]
        if ring == "d":
            r[slot, 0, ph] += 20.0
        elif ring == "k":  # the cached key := the window's first query direction
            r[slot, 0, ph] = x1[0, 0, : sim.K].to(r.dtype)
        else:
            r[slot, 0, ph] += 5.0

    corrupt(bad, w - 1)  # the newest committed entry (replay weight 1: cannot decay away)
    corrupt(stale, w)  # a rejected-draft position: overwritten by this window
    if w + T < R:
        corrupt(stale, w + T)  # past the window: never read
    before = {n: t.clone() for n, t in p.items()}
    out = sim.launch(gdn_verify, x, a, b, torch.tensor([clean, bad, stale], device=sim.dev), sim.bases, sim.cur,
                     sim.new_out(3, F32))
    o_orc, _, _ = gdn_window_oracle(x1.cpu(), a1.cpu(), b1.cpu(), sim.A_log.cpu(), sim.dt_bias.cpu(),
                                    sim.oracle[clean][None], num_k_heads=sim.Hk)
    tol = ORACLE_TOL[F32]
    check_close(out[0], o_orc[0], *tol["out"][:2], "clean row vs oracle")
    err = max_err(out[1, :, 0], o_orc[0, :, 0])
    assert err > 100 * tol["out"][0], f"corrupted committed {ring}[{w - 1}] went unnoticed (err {err:.2e})"
    if phase == "flush":
        check_close(p["state"][clean], sim.oracle[clean], *tol["state"][:2], "clean flushed state")
        err_s = max_err(p["state"][bad, 0], sim.oracle[clean][0])
        assert err_s > 100 * tol["state"][0], f"corrupted {ring} not visible in the flushed state ({err_s:.2e})"
    else:
        assert torch.equal(bits(p["state"][bad]), bits(before["state"][bad]))
    # the stale row is bit-identical to the clean one: outputs, checkpoint, window ring entries
    assert torch.equal(bits(out[2]), bits(out[0])), "an entry past wp changed the outputs"
    assert torch.equal(bits(p["state"][stale]), bits(p["state"][clean]))
    for i in range(T):
        ph = (org + w + i) % R
        for n in ("d", "k", "g"):
            assert torch.equal(bits(p[n][stale, :, ph]), bits(p[n][clean, :, ph])), f"window {n}[{i}]"


# ----------------------------------------------------------------------------------
# T = 1: flush == fold + one sequential step; verify == the standard decode kernel
# ----------------------------------------------------------------------------------
def test_T1_matches_fold_plus_step_and_standard_decode(device, seed, launch):
    launch(BV=32)
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, Bh=4, T=1, round_beta=True, **small_geom(Hk=1, HV=2))
    assert sim.R == 5  # flush iff w >= 4
    sim.seed_history(1, 4, 3)  # flush, wraps
    sim.seed_history(2, 2, 0)  # verify, linear (origin 0): the standard decode ring layout
    sim.seed_history(4, 0, 0)
    assert sim.cur["flush"][[1, 2, 4]].tolist() == [1, 0, 0]
    folded = sim.oracle[1].clone()
    pre = {n: t.clone() for n, t in sim.bases.items()}
    x, a, b, out = sim.step([1, 2, 4], commit=False)
    # flush row: the checkpoint is the fold, the output one stock step from it
    p = sim.pools()
    check_close(p["state"][1], folded, 2e-5, 2e-5, "T=1 flushed checkpoint vs fold")
    o_step, _ = gdn_step_oracle(x[0:1, 0].cpu(), a[0:1, 0].cpu(), b[0:1, 0].cpu(), sim.A_log.cpu(),
                                sim.dt_bias.cpu(), folded[None], num_k_heads=sim.Hk)
    check_close(out[0, 0], o_step[0], 2e-5, 2e-5, "T=1 flush output vs fold + stock step")
    # verify rows: gdn_replay_decode (standard decode, linear ring of length L = R) on the pre-step pools
    dec = {n: t.clone() for n, t in pre.items()}
    q = sim.pools(dec)
    o_dec = torch.full((2, sim.HV, sim.V), float("nan"), device=sim.dev)
    gdn_replay_decode(x[1:, 0], a[1:, 0], b[1:, 0], sim.A_log, sim.dt_bias, q["state"], q["d"], q["k"], q["g"],
                      torch.tensor([2, 4], dtype=torch.int32, device=sim.dev),
                      torch.tensor([2, 0], dtype=torch.int32, device=sim.dev), out=o_dec)
    check_close(out[1:, 0], o_dec, *REF_OUT_TOL, "T=1 verify vs standard decode")
    for s, w in ((2, 2), (4, 0)):  # the same ring append
        check_close(p["d"][s, :, w], q["d"][s, :, w], 1e-5, 1e-5, "d append vs standard decode")
        assert torch.equal(bits(p["k"][s, :, w]), bits(q["k"][s, :, w]))
        check_close(p["g"][s, :, w], q["g"][s, :, w], 0.0, 1e-5, "g append vs standard decode")
    assert torch.equal(bits(p["state"][[2, 4]]), bits(q["state"][[2, 4]]))


# ----------------------------------------------------------------------------------
# SGLang's stock target-verify kernel, run from the committed states
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("act", [F32, BF16])
def test_matches_sglang_stock_target_verify(device, seed, launch, act):
    fs = pytest.importorskip("sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent")
    launch(BV=32)
    sim = Sim(device, seed, state_dtype=F32, act_dtype=act, Bh=6, T=3, **small_geom(Hk=2, HV=4))
    sim.seed_history(1, 0, 2)  # empty history: S_c = S_ck
    sim.seed_history(2, 3, 7)  # verify, wraps
    sim.seed_history(4, 5, 4)  # flush, wraps
    rows = [1, 2, 4]
    committed = torch.stack([sim.oracle[s] for s in rows]).float().to(sim.dev)
    x, a, b, out = sim.step(rows, commit=False, out_dtype=act)
    B, T, Hk, HV, K, V = len(rows), sim.T, sim.Hk, sim.HV, sim.K, sim.V
    q = x[..., : Hk * K].reshape(B, T, Hk, K)
    k = x[..., Hk * K: 2 * Hk * K].reshape(B, T, Hk, K)
    v = x[..., 2 * Hk * K:].reshape(B, T, HV, V)
    o_stock = fs.fused_sigmoid_gating_delta_rule_update(
        sim.A_log, a, sim.dt_bias, 1.0, 20.0, q, k, v, b, committed,
        torch.arange(B, dtype=torch.int32, device=sim.dev), scale=K ** -0.5, use_qk_l2norm_in_kernel=True,
        disable_state_update=True)
    assert o_stock.shape == out.shape
    if act == F32:
        check_close(out, o_stock, 2e-5, 2e-5, "verify vs stock target verify")
    else:  # both round the output to bf16 once
        check_close(out, o_stock, 1e-6, 2 * EPS[BF16], "verify vs stock target verify")


# ----------------------------------------------------------------------------------
# real geometry (Qwen3-Next per TP rank), history block 16, window 4
# ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_real_geometry_qwen3_next(device, seed, launch):
    launch(BV=128)  # one V tile per head: the interpreter's cost is per program
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, Hk=16, HV=32, K=128, V=128, Bh=16, T=4, n_slots=3)
    assert sim.R == 20
    sim.seed_history(1, 13, 15)  # flush (13 + 8 > 20), history wraps
    sim.seed_history(2, 5, 17)  # verify, history and window wrap
    assert sim.cur["flush"][[1, 2]].tolist() == [1, 0]
    for _ in range(2):
        sim.step([1, 2])
    assert sim.flushes >= 1
    print({k: f"{v:.2e}" for k, v in sim.max_errs.items()})


@pytest.mark.gpu
@pytest.mark.parametrize("batch,steps,entries", [
    (16, 40, None),
    (16, 40, dict(BV=16, num_warps=1, reduce="token", scores="pre", maxnreg=168, flush="dot", v_loop=1)),
    (64, 12, None),
    (64, 12, dict(window_dot="fma")),
    (64, 12, dict(flush_rows="fused")),
    (64, 12, dict(flush_rows="separate"))],
    ids=["b16-packaged", "b16-dot", "b64-packaged", "b64-fma-dots", "b64-fused", "b64-separate"])
@pytest.mark.parametrize("prec", ["s32-a16b", "s16b-a16b"])
def test_qwen3_next_gpu(device, seed, launch, prec, batch, steps, entries):
    """Verify + commit steps over random history lengths on the Qwen3-Next geometry with the packaged launch config
    (at batch 16 the one-tile kernel, at 64 the looping one), and with the H200 entry changed to the dot flush (the
    fold as one tl.dot in tf32x3, which runs only on a GPU; the interpreter computes it in fp32) (CUDA only)."""
    if entries:
        launch(always=True, **entries)
    sd, ad = PRECISIONS[prec]
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, Hk=16, HV=32, K=128, V=128, Bh=16, T=4,
              n_slots=batch + 4)
    rows = list(range(3, batch + 3))
    for i, s in enumerate(rows):
        sim.seed_history(s, i % 13, (3 * i) % sim.R)
    for _ in range(steps):
        sim.step(rows)
    assert sim.flushes >= batch // 4
    print(prec, {k: f"{v:.2e}" for k, v in sim.max_errs.items()})


# ----------------------------------------------------------------------------------
# variants: no L2 norm, default out, the dot flush
# ----------------------------------------------------------------------------------
def test_no_l2norm_and_default_out(device, seed, launch):
    launch(BV=32)
    sim = Sim(device, seed, state_dtype=F32, act_dtype=F32, Bh=4, T=2, use_qk_l2norm=False, **small_geom())
    sim.seed_history(1, 3, 4)  # flush
    sim.seed_history(2, 1, 5)
    sim.step([2, 1])
    # out=None: allocated [B, T, HV, V] in the activation dtype
    sim16 = Sim(device, seed, state_dtype=F32, act_dtype=BF16, Bh=4, T=2, **small_geom())
    sim16.seed_history(3, 2, 1)
    x, a, b = sim16.inputs(2)
    p = sim16.pools()
    o = gdn_verify(x, a, b, sim16.A_log, sim16.dt_bias, p["state"], p["d"], p["k"], p["g"],
                   torch.tensor([3, -1], device=sim16.dev), sim16.cur["wp"], sim16.cur["origin"], sim16.cur["flush"])
    assert o.shape == (2, 2, sim16.HV, sim16.V) and o.dtype == BF16 and torch.isfinite(o[0]).all()


@pytest.mark.parametrize("precision", ["tf32x3", "ieee"])
def test_dot_flush_variant(device, seed, launch, precision):
    launch(always=True, BV=16, num_warps=4, flush="dot", dot_precision=precision, v_loop=1)
    sim = Sim(device, seed, state_dtype=F32, act_dtype=BF16, Bh=6, T=2, **small_geom(Hk=2, HV=4))
    sim.seed_history(1, 6, 3)  # flush: R = 8, w = 6 (history wraps)
    sim.seed_history(2, 5, 0)  # flush
    sim.seed_history(4, 2, 7)  # verify
    sim.step([1, 2, 4])
    assert sim.flushes == 2


# ----------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------
def _valid_args(device, B=2, T=2, Hk=1, HV=2, K=32, V=32, R=6, S=3, sd=F32, ad=BF16):
    return dict(
        mixed_qkv=torch.randn(B, T, 2 * Hk * K + HV * V, device=device).to(ad),
        a=torch.randn(B, T, HV, device=device).to(ad), b=torch.randn(B, T, HV, device=device).to(ad),
        A_log=torch.zeros(HV, device=device), dt_bias=torch.zeros(HV, device=device),
        state=torch.zeros(S, HV, V, K, dtype=sd, device=device),
        d_ring=torch.zeros(S, HV, R, V, dtype=sd, device=device),
        k_ring=torch.zeros(S, Hk, R, K, dtype=ad, device=device),
        g_ring=torch.zeros(S, HV, R, device=device),
        state_indices=torch.tensor([-1] * B, dtype=torch.int32, device=device),
        wp=torch.zeros(S, dtype=torch.int32, device=device),
        origin=torch.zeros(S, dtype=torch.int32, device=device),
        flush=torch.zeros(S, dtype=torch.int32, device=device),
    )


_ARG_NAMES = ["mixed_qkv", "a", "b", "A_log", "dt_bias", "state", "d_ring", "k_ring", "g_ring", "state_indices",
              "wp", "origin", "flush"]


def _call(args, **kw):
    return gdn_verify(*[args[n] for n in _ARG_NAMES], **kw)


BAD_ARGS = {  # case: (argument named in the error, mutation)
    "qkv width": ("mixed_qkv", lambda A: A.update(mixed_qkv=A["mixed_qkv"][..., 1:])),
    "qkv 2d": ("mixed_qkv", lambda A: A.update(mixed_qkv=A["mixed_qkv"][:, 0])),
    "qkv not last-contiguous": ("mixed_qkv", lambda A: A.update(
        mixed_qkv=A["mixed_qkv"].transpose(1, 2).contiguous().transpose(1, 2))),
    "qkv dtype": ("mixed_qkv", lambda A: A.update(mixed_qkv=A["mixed_qkv"].double())),
    "a heads": ("a", lambda A: A.update(a=A["a"][..., :1])),
    "b window": ("b", lambda A: A.update(b=A["b"][:, :1])),
    "A_log shape": ("A_log", lambda A: A.update(A_log=A["A_log"][:1])),
    "dt_bias int": ("dt_bias", lambda A: A.update(dt_bias=A["dt_bias"].to(torch.int32))),
    "state 3d": ("state", lambda A: A.update(state=A["state"][0])),
    "state int": ("state", lambda A: A.update(state=A["state"].to(torch.int32))),
    "d_ring dtype": ("d_ring", lambda A: A.update(d_ring=A["d_ring"].to(F16))),
    "d_ring V": ("d_ring", lambda A: A.update(d_ring=A["d_ring"][..., :16])),
    "ring shorter than 2T": ("d_ring", lambda A: A.update(
        d_ring=A["d_ring"][:, :, :3], k_ring=A["k_ring"][:, :, :3], g_ring=A["g_ring"][:, :, :3])),
    "k_ring length": ("k_ring", lambda A: A.update(k_ring=A["k_ring"][:, :, :5])),
    "k_ring dtype": ("k_ring", lambda A: A.update(k_ring=A["k_ring"].float())),
    "HV not multiple of Hk": ("k_ring", lambda A: A.update(
        k_ring=torch.zeros(3, 3, 6, 32, dtype=BF16, device=A["k_ring"].device))),
    "g_ring dtype": ("g_ring", lambda A: A.update(g_ring=A["g_ring"].to(BF16))),
    "g_ring slots": ("g_ring", lambda A: A.update(g_ring=A["g_ring"][:2])),
    "indices dtype": ("state_indices", lambda A: A.update(state_indices=A["state_indices"].float())),
    "indices length": ("state_indices", lambda A: A.update(state_indices=A["state_indices"][:1])),
    "wp length": ("wp", lambda A: A.update(wp=A["wp"][:2])),
    "origin dtype": ("origin", lambda A: A.update(origin=A["origin"].float())),
    "flush 2d": ("flush", lambda A: A.update(flush=A["flush"][:, None])),
    "cursor not a tensor": ("origin", lambda A: A.update(origin=[0, 0, 0])),
}


@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_validation_raises(device, case):
    args = _valid_args(device)
    _call(args)  # the valid baseline passes (all rows padded: nothing is written)
    name, mutate = BAD_ARGS[case]
    mutate(args)
    with pytest.raises(ValueError, match=rf"gdn_verify: .*\b{name}\b"):
        _call(args)


@pytest.mark.parametrize("bad_out", ["shape", "dtype", "strided last dim"])
def test_validation_out(device, bad_out):
    args = _valid_args(device)
    out = {"shape": lambda: torch.empty(2, 2, 2, 33, device=device),
           "dtype": lambda: torch.empty(2, 2, 2, 32, dtype=torch.int32, device=device),
           "strided last dim": lambda: torch.empty(2, 2, 2, 64, device=device)[..., ::2]}[bad_out]()
    with pytest.raises(ValueError, match="gdn_verify: .*out"):
        _call(args, out=out)


def test_launch_config_validation(tmp_path, monkeypatch):
    for n, (body, what) in enumerate((("{v_loop: 2, reduce: bcast}", "v_loop: 1"),
                       ("fold_stages: 2", "unknown"), ("dot_precision: tf32", "tf32"), ("BV: 24", "BV"), ("flush: fancy", "flush"),
                       ("num_warps: 0", "num_warps"), ("BLOCK_Q: 4", "unknown"),
                       ("flush: mma", "flush must be one of"), ("flush: split", "flush"), ("fold_BV: 32", "fold_BV"),
                       ("reduce: dot", "reduce"))):
        f = tmp_path / f"cfg_{n}.yaml"  # one file per case (configs are cached by path)
        f.write_text("gdn_verify:\n  default:\n    " + body + "\n")
        monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
        with pytest.raises(ValueError, match=what):
            gv.gdn_verify_launch_params(2, 1, 32, 32, 6, 2)
    monkeypatch.delenv("SGLANG_REPLAYSSM_KERNEL_CONFIG")
    cfg = gv.gdn_verify_launch_params(32, 16, 128, 128, 20, 4)
    assert set(cfg) == set(gv.GDN_VERIFY_DEFAULT_LAUNCH) and cfg["dot_precision"] in ("tf32x3", "ieee")
    assert gv.gdn_verify_key(32, 16, 128, 128, 20, 4) == "HV32_HK16_K128_V128_R20_T4"


# ----------------------------------------------------------------------------------
# launch config reduce: bcast / token (one [BV, T, K] broadcast or T two-dimensional reductions) x scores:
# inline / pre (the packaged config, token + pre, is what the other tests run)
# ----------------------------------------------------------------------------------
VARIANTS = {"bcast-inline": dict(reduce="bcast", scores="inline", num_warps=4, v_loop=1),
            "token-inline": dict(reduce="token", scores="inline"),
            "bcast-pre": dict(reduce="bcast", scores="pre", v_loop=1),
            "token-pre": dict(reduce="token", scores="pre", scores_num_warps=2),
            "token-pre-dotflush": dict(reduce="token", scores="pre", flush="dot", v_loop=1),
            "vloop-pre": dict(reduce="token", scores="pre", v_loop=2, v_loop_min_batch=1),
            "vloop-inline-stages": dict(reduce="token", scores="inline", v_loop=4, v_stages=2, k_parts=4,
                                        v_loop_min_batch=1),
            "vloop-whole-k": dict(reduce="token", scores="pre", v_loop=2, k_parts=1, v_loop_min_batch=1),
            "vloop-fma-dots": dict(reduce="token", scores="pre", v_loop=2, window_dot="fma", v_loop_min_batch=1),
            "vloop-inline-fma-dots": dict(reduce="token", scores="inline", v_loop=2, window_dot="fma",
                                          v_loop_min_batch=1),
            "vloop-window-split": dict(reduce="token", scores="inline", v_loop=2, window_dot="split",
                                       v_loop_min_batch=1),
            "vloop-fused": dict(reduce="token", scores="pre", v_loop=2, flush_rows="fused", v_loop_min_batch=1),
            "vloop-separate": dict(reduce="token", scores="pre", v_loop=2, flush_rows="separate", v_loop_min_batch=1),
            "vloop-separate-inline-fma-dots": dict(reduce="token", scores="inline", v_loop=2, flush_rows="separate",
                                                   flush_v_stages=2, window_dot="fma", v_loop_min_batch=1)}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("prec", ["s32-a32", pytest.param("s16b-a16b", marks=pytest.mark.slow)])
def test_launch_variants_match_reference_and_oracle(device, seed, launch, prec, variant):
    """reduce: token (T two-dimensional reductions instead of [BV, T, K] broadcasts) and scores: pre (the
    key scores once per (row, k-head) in a pre-kernel): verify and flush rows, padded and null rows."""
    launch(always=True, BV=16, **VARIANTS[variant])
    sd, ad = PRECISIONS[prec]
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, Bh=6, T=3, **small_geom(Hk=2, HV=4, n_slots=7))
    for s, (w, o) in {1: (3, 7), 2: (6, 5), 3: (0, 4), 5: (4, 0)}.items():
        sim.seed_history(s, w, o)
    sim.step([1, -1, 2, 3, 0, 5], out_dtype=F32 if sd == F32 else ad, commit=False)
    assert sim.flushes == 2


def _odd_geometry_verify(device, seed):
    """One verify at V = 40, K = 24 (fp32 then bf16 state): two flush rows among verify, empty-history, padded and
    null rows, checked against the reference and the fp64 oracle."""
    for sd, ad in (PRECISIONS["s32-a32"], PRECISIONS["s16b-a16b"]):
        sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, Bh=6, T=3, **small_geom(Hk=2, HV=4, K=24, V=40, n_slots=7))
        for s, (w, o) in {1: (3, 7), 2: (6, 5), 3: (0, 4), 5: (4, 0)}.items():
            sim.seed_history(s, w, o)
        sim.step([1, -1, 2, 3, 0, 5], out_dtype=F32 if sd == F32 else ad, commit=False)
        assert sim.flushes == 2


@pytest.mark.parametrize("v_loop,window_dot,flush_rows", [(2, "fma", "fused"), (3, "fma", "fused"), (3, "split", "fused"),
                                                          (2, "split", "fused"), (3, "fma", "separate"),
                                                          (2, "split", "separate")])
def test_v_loop_odd_geometry_masked_tiles(device, seed, launch, v_loop, window_dot, flush_rows):
    """v_loop at V = 40, K = 24 with BV = 16: a program's last tiles are part or wholly past V (masked), the
    prologue's scalars serve every tile; verify and flush rows, padded and null rows, fp32 and bf16 states."""
    launch(always=True, BV=16, v_loop=v_loop, v_stages=2, v_loop_min_batch=6, window_dot=window_dot,
           flush_rows=flush_rows)
    _odd_geometry_verify(device, seed)


def test_k_parts_keep_slices_at_least_32_wide(device, seed, launch, monkeypatch):
    """The looping kernel's K slices are at least MIN_K_SLICE (32) wide: k_parts 4 at K = 24 (BK 32) holds the row
    whole (on the H200 the CUDA-core window dots over 16-wide slices came out wrong), and the verify stays on the
    reference and oracle; wider rows keep their k_parts."""
    assert gv.MIN_K_SLICE == 32
    assert [gv.k_slices(p, bk) for p, bk in ((2, 32), (4, 32), (2, 64), (4, 64), (2, 128), (4, 128), (1, 128))] == \
        [1, 1, 2, 2, 2, 4, 1]
    launch(always=True, BV=16, v_loop=3, v_stages=2, v_loop_min_batch=6, window_dot="fma", k_parts=4)
    ks = _record_verify_launches(monkeypatch, key="KS")
    _odd_geometry_verify(device, seed)
    assert ks and set(ks) == {1}, ks


def test_v_loop_min_batch_keeps_small_batches_one_tile_a_program(device, seed, launch, monkeypatch):
    """v_loop with v_loop_min_batch: a batch of fewer rows launches the one-tile-a-program kernel, a batch at the
    limit the looping one; both match the reference and oracle."""
    launch(always=True, BV=16, v_loop=2, v_loop_min_batch=5)
    launches = _record_verify_launches(monkeypatch)
    sim = Sim(device, seed, state_dtype=F32, act_dtype=F32, Bh=4, T=3, **small_geom(Hk=2, HV=4, n_slots=7))
    for s in (1, 2, 3, 5):
        sim.activate(s)
    for _ in range(6):  # 5 rows: the loop, one program per (row, v-head)
        sim.step([1, -1, 2, 3, 5])
    assert launches and all(vl == 2 and g[0] == 1 for vl, g in launches), launches
    launches.clear()
    for _ in range(6):  # 4 rows: one tile a program
        sim.step([1, 2, 0, 5])
    assert launches and all(vl == 1 and g[0] == 2 for vl, g in launches), launches
    assert sim.flushes >= 2


def _record_verify_launches(monkeypatch, rows=None, key=None):
    """(VL, grid) of every main verify launch from now on (the kernel still runs); ``rows``: (ROWS, V_STAGES);
    ``key``: that launch argument alone."""
    launches = []
    orig = gv._gdn_verify_kernel

    class Rec:
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                launches.append(kwargs[key] if key else
                                (kwargs["VL"], grid) if rows is None else (kwargs["ROWS"], kwargs["V_STAGES"]))
                return orig[grid](*args, **kwargs)
            return run

    monkeypatch.setattr(gv, "_gdn_verify_kernel", Rec())
    return launches


@pytest.mark.parametrize("flush_rows", ["fused", "separate"])
def test_flush_rows_separate_launches_verify_then_flush_rows(device, seed, launch, monkeypatch, flush_rows):
    """flush_rows: separate launches the looping kernel twice per verify, compiled for verify rows (ROWS 1) and
    then for folding rows (ROWS 2, at flush_v_stages); fused launches it once for every row (ROWS 0). Rows at
    mixed ring positions (some flush, some not, in one batch) stay on the reference and oracle either way."""
    launch(always=True, BV=16, v_loop=2, v_loop_min_batch=1, v_stages=3, flush_v_stages=2, flush_rows=flush_rows)
    launches = _record_verify_launches(monkeypatch, rows=True)
    sim = Sim(device, seed, state_dtype=F32, act_dtype=F32, Bh=6, T=3, **small_geom(Hk=2, HV=4, n_slots=7))
    for s, (w, o) in {1: (3, 7), 2: (6, 5), 3: (0, 4), 5: (4, 0)}.items():
        sim.seed_history(s, w, o)
    sim.seed_history(4, 0, 2, flush=1)  # a flush of an empty history: a verify from the checkpoint (launch 1)
    # two folding rows among verify, padded and null rows
    sim.step([1, -1, 2, 3, 0, 5, 4], commit=False)
    assert sim.flushes >= 2
    sim = Sim(device, seed, state_dtype=F32, act_dtype=F32, Bh=4, T=3, **small_geom(Hk=2, HV=4, n_slots=7))
    sim.activate(1)
    for step in range(8):  # a stream whose rows reach their flushes at different steps
        if step in (2, 4):
            sim.activate(step // 2 + 1)
        sim.step([s for s in (1, 2, 3) if step >= 2 * (s - 1)])
    want = [(1, 3), (2, 2)] if flush_rows == "separate" else [(0, 3)]
    assert launches == want * 9, launches  # 1 + 8 steps
    assert sim.flushes >= 4


@pytest.mark.parametrize("cfg", [
    dict(flush_rows="separate", window_dot="fma"),
    dict(flush_rows="fused", window_dot="split"),
    dict(flush_rows="separate", window_dot="fma", scores="inline"),
    dict(flush_rows="separate", window_dot="fma", v_loop=1),  # one tile a program
    # pdl: the interpreter runs these as the rows above (the GPU run's)
    pytest.param(dict(flush_rows="separate", window_dot="fma", pdl=1), marks=pytest.mark.slow),
    pytest.param(dict(flush_rows="fused", window_dot="split", pdl=1), marks=pytest.mark.slow),
    pytest.param(dict(flush_rows="separate", window_dot="fma", scores="inline", pdl=1), marks=pytest.mark.slow),
    pytest.param(dict(flush_rows="separate", window_dot="fma", v_loop=1, pdl=1), marks=pytest.mark.slow),
], ids=["sep-fma", "fused-split", "inline-scores", "vl1", "sep-fma-pdl", "fused-split-pdl", "inline-scores-pdl",
        "vl1-pdl"])
def test_load_order_stays_on_the_reference(device, seed, launch, monkeypatch, cfg):
    """The looping kernel's prologue loads before its math and ring stores, a flush's key norms in one read (with
    and without the scores pre-kernel, split and fused flush launches, one tile a program): folding, padded and null
    rows among verify rows (some history ring positions wrapped), and a stream across flushes, stay on the
    reference and oracle. ``pdl`` (on a GPU: each main launch after the scores pre-kernel or the verify rows' launch
    is that kernel's programmatic dependent, waiting before its scores and stores; the interpreter runs it as off)
    the same."""
    params = dict(BV=16, v_loop=2, v_loop_min_batch=1, v_stages=2, flush_v_stages=2)
    params.update(cfg)
    launch(always=True, **params)
    launches = _record_verify_launches(monkeypatch, key="VL")
    sim = Sim(device, seed, state_dtype=F32, act_dtype=F32, Bh=6, T=3, **small_geom(Hk=2, HV=4, n_slots=7))
    for s, (w, o) in {1: (3, 7), 2: (6, 5), 3: (0, 4), 5: (4, 0)}.items():
        sim.seed_history(s, w, o)
    sim.seed_history(4, 0, 2, flush=1)
    sim.step([1, -1, 2, 3, 0, 5, 4], commit=False)
    sim = Sim(device, seed, state_dtype=F32, act_dtype=F32, Bh=4, T=3, **small_geom(Hk=2, HV=4, n_slots=7))
    for s in (1, 2, 3):
        sim.activate(s)
    for _ in range(6):
        sim.step([1, 2, 3])
    assert sim.flushes >= 2
    assert launches and set(launches) == {cfg.get("v_loop", 2)}, launches


def test_v_loop_max_window_keeps_long_windows_one_tile_a_program(device, seed, launch, monkeypatch):
    """v_loop_max_window: a window of more tokens launches the one-tile-a-program kernel."""
    launch(always=True, BV=16, v_loop=2, v_loop_min_batch=1, v_loop_max_window=2)
    launches = _record_verify_launches(monkeypatch)
    for T, vl in ((2, 2), (3, 1)):
        launches.clear()
        sim = Sim(device, seed, state_dtype=F32, act_dtype=F32, Bh=4, T=T, **small_geom(Hk=2, HV=4, n_slots=7))
        for s in (1, 2, 3):
            sim.activate(s)
        for _ in range(4):
            sim.step([1, 2, 3])
        assert launches and {v for v, _ in launches} == {vl}, (T, launches)


@pytest.mark.slow  # the launch-config grid: the GPU run's (each variant's CPU test is the one above)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("case", ["T3-B6-s32a32", "T4-B4-s32a32"])
def test_launch_variants_speculative_simulation(device, seed, launch, case, variant):
    launch(always=True, BV=32, **VARIANTS[variant])
    T, Bh, prec, steps = SIM_CASES[case]
    sd, ad = PRECISIONS[prec]
    sim = Sim(device, seed, state_dtype=sd, act_dtype=ad, Bh=Bh, T=T, **small_geom(n_slots=5))
    for s in (3, 1, 4):
        sim.activate(s)
    for _ in range(24):
        sim.step([3, 1, 4, 0])
    assert sim.flushes >= 3 and sim.wrapped


@pytest.mark.parametrize("entry,match", [("reduce: warp", "reduce must be one of"),
                                         ("scores: post", "scores must be one of"), ("scores_num_warps: 0", "scores_num_warps"),
                                         ("inline_scores_max_batch: -1", "inline_scores_max_batch"),
                                         ("maxnreg: -8", "maxnreg")])
def test_unknown_launch_choice_is_refused(tmp_path, monkeypatch, entry, match):
    f = tmp_path / "cfg.yaml"
    f.write_text("gdn_verify:\n  default:\n    " + entry + "\n")
    monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))
    with pytest.raises(ValueError, match=match):
        gv.gdn_verify_launch_params(2, 1, 32, 32, 6, 2)


@pytest.mark.slow  # a launch-config choice (the packaged limit, 1, is what the other tests run)
def test_inline_scores_max_batch_keeps_small_batches_in_one_launch(device, seed, launch, monkeypatch):
    """scores: pre with inline_scores_max_batch: a batch above the limit launches the scores pre-kernel,
    a batch within it computes the scores inline (one launch); both match the reference and oracle."""
    launch(always=True, BV=16, reduce="token", scores="pre", inline_scores_max_batch=4, maxnreg=168)
    launches = []
    orig = gv._gdn_verify_scores_kernel
    monkeypatch.setattr(gv, "_gdn_verify_scores_kernel", type("K", (), {
        "__getitem__": lambda self, grid: (launches.append(grid), orig[grid])[1]})())
    sim = Sim(device, seed, state_dtype=F32, act_dtype=F32, Bh=4, T=3, **small_geom(Hk=2, HV=4, n_slots=7))
    for s in (1, 2, 3, 5):
        sim.activate(s)
    for _ in range(8):  # 5 rows > 4: pre-kernel
        sim.step([1, -1, 2, 3, 5])
    assert len(launches) == 8 and all(g[0] == 5 for g in launches)
    for _ in range(8):  # 4 rows: inline
        sim.step([1, 2, 0, 5])
    assert len(launches) == 8, "the scores pre-kernel ran for a batch within inline_scores_max_batch"
    assert sim.flushes >= 2
