"""Tests of the Mamba2 ReplaySSM decode kernels (``mamba2_replay_decode``).

Runs on CUDA when present, else in Triton's CPU interpreter (tests/conftest.py).
Every test draws fresh random inputs from a torch.Generator seeded from os.urandom;
the seed is in every failure message (set REPLAYSSM_TEST_SEED to replay one).

Oracles
-------
* ``mamba2_step_oracle`` (fp64 sequential recurrence, no ring, no replay).  Per
  request the test keeps the oracle state in fp64.  At a flush step the kernel stores
  the checkpoint in the state dtype; the flushed state is checked against the exact
  oracle state, and the oracle then continues from that stored (rounded) checkpoint,
  i.e. it rounds exactly where the kernel rounds and nowhere else (``round_oracle``).
  The prefill test keeps the unrounded full recurrence instead (fp32 checkpoint).
* ``mamba2_replay_decode_ref`` (the same replay math in PyTorch fp32), run on a
  clone of the pools before every kernel call: outputs, checkpoints and ring
  contents must agree to about one unit of the rounding of the stored dtype.

Tolerances (rtol, atol) vs the fp64 oracle, outputs and flushed states, values O(1):
  state fp32 / act fp32 : 1e-4, 1e-4   (fp32 arithmetic; a single-pass TF32 dot, ~5e-4 relative
                                        per product, would not pass)
  state fp32 / act bf16 : 1.5e-2, 2e-3 (the output is stored in bf16: one ulp <= 2^-7 relative; the
                                        CPU interpreter truncates fp32 -> bf16, the GPU rounds)
  state fp32 / act fp16 : 2e-3, 5e-4   (fp16 output: half an ulp <= 2^-11)
  state bf16 / act bf16 : 2e-2, 2e-2   (bf16 checkpoint and output: one ulp <= 2^-7 relative)
  state fp16 / act fp16 : 4e-3, 4e-3
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from kernel_testlib import bits, make_gen, mismatch, view_like

from sglang_replayssm.kernels import common
from sglang_replayssm.kernels.mamba2_ref import mamba2_replay_decode_ref, mamba2_step_oracle
from sglang_replayssm.kernels.mamba2_replay import geometry_key, mamba2_replay_decode

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
F64 = torch.float64

# (state dtype, act dtype) -> (rtol, atol) vs the fp64 oracle
ORACLE_TOL = {
    (F32, F32): (1e-4, 1e-4),
    (F32, BF16): (1.5e-2, 2e-3),
    (F32, F16): (2e-3, 5e-4),
    (BF16, BF16): (2e-2, 2e-2),
    (F16, F16): (4e-3, 4e-3),
}
# dtype of a stored value -> (rtol, atol) kernel vs the fp32 PyTorch reference: two units in the
# last place of that dtype (fp32: summation order / tf32x3 residue).  Two, not one: Triton's CPU
# interpreter truncates fp32 -> bf16 casts where the GPU (and torch) round to nearest.
REF_TOL = {F32: (2e-5, 2e-5), BF16: (2.0 ** -6, 1e-5), F16: (2.0 ** -9, 1e-5)}
# processed Δ in the ring, kernel vs reference: fp32 softplus, GPU exp/log approximations
DT_RING_TOL = (1e-5, 1e-6)

PRECISIONS = [(F32, F32), (F32, BF16), (BF16, BF16), (F16, F16), (F32, F16)]
PREC_IDS = ["s32a32", "s32a16b", "s16b_a16b", "s16_a16", "s32_a16"]

SMALL = (4, 16, 16, 1)  # H, P, N, G
MEDIUM = (8, 64, 64, 2)
ODD = (6, 24, 24, 3)  # P, N not powers of two, 2 heads per group


class Harness:
    """Pools, rings, per-request oracle states and one checked decode step at a time."""

    def __init__(self, device, geom, L, state_dtype=F32, act_dtype=F32, *, n_req=2, strided=False,
                 has_D=True, has_z=True, D_per_dim=False, dt_softplus=True, round_oracle=True,
                 prefill_len=0, null_slot=0, check_ref=True):
        self.gen, self.seed = make_gen()
        self.device = device
        H, P, N, G = geom
        self.H, self.P, self.N, self.G, self.L = H, P, N, G, L
        self.sd, self.ad = state_dtype, act_dtype
        self.strided = strided
        self.dt_softplus = dt_softplus
        self.round_oracle = round_oracle
        self.null_slot = null_slot
        self.check_ref = check_ref
        self.n_slots = 2 * n_req + 3
        # request -> slot: distinct, never the null slot, some slots left unused
        free = [s for s in range(self.n_slots) if s != null_slot]
        perm = torch.randperm(len(free), generator=self.gen).tolist()
        self.slots = [free[i] for i in perm[:n_req]]
        self.count = [0] * n_req

        S = self.n_slots
        self.bases = {}
        self.state = self._pool("state", (S, H, P, N), state_dtype, fill=None)
        self.x_ring = self._pool("x_ring", (S, H, L, P), act_dtype)
        self.B_ring = self._pool("B_ring", (S, G, L, N), act_dtype)
        self.dt_ring = self._pool("dt_ring", (S, H, L), F32)

        # parameters: A = -exp(U(-1, 1)), dt_bias in [-4, 0]
        self.A_h = -torch.exp(self._rand(H) * 2 - 1)
        self.dtb_h = -4 * self._rand(H)
        self.D_hp = None
        if has_D:
            self.D_hp = self._randn(H, P) if D_per_dim else self._randn(H)[:, None].expand(H, P).contiguous()
        self.has_z = has_z
        if strided:
            self.A = self.A_h.to(device)[:, None, None].expand(H, P, N)
            self.dt_bias = self.dtb_h.to(device)[:, None].expand(H, P)
            self.D = None if self.D_hp is None else self.D_hp.to(device)
        else:
            self.A = self.A_h.to(device)
            self.dt_bias = self.dtb_h.to(device)
            self.D = None if self.D_hp is None else (self.D_hp.to(device) if D_per_dim else self.D_hp[:, 0].to(device))

        # checkpoints: random, or the oracle's final state of a prefill from zero
        init = self._randn(S, H, P, N) * 0.5
        self.oracle = []
        for i, s in enumerate(self.slots):
            if prefill_len:
                S_pre = torch.zeros(1, H, P, N, dtype=F64)
                for _ in range(prefill_len):
                    inp = self._inputs(1)
                    S_pre, _ = mamba2_step_oracle(S_pre, inp["x"], inp["dt"], self.A_h, inp["B"], inp["C"],
                                                  dt_bias=self.dtb_h, dt_softplus=dt_softplus)
                init[s] = S_pre[0].to(F32)
                self.oracle.append(S_pre[0].clone())  # not rounded: the exact full recurrence
            else:
                self.oracle.append(init[s].to(state_dtype).to(F64))
        self.state.copy_(init.to(device=device, dtype=state_dtype))

    # ---- allocation helpers -------------------------------------------------------------
    def _rand(self, *shape):
        return torch.rand(*shape, generator=self.gen)

    def _randn(self, *shape):
        return torch.randn(*shape, generator=self.gen)

    def _pool(self, name, shape, dtype, fill=float("nan")):
        """A pool tensor; strided: a view of layer 1 of a [3, S+1, d1+1, ...] tensor (stride(0) padded)."""
        if self.strided:
            big_shape = (3, shape[0] + 1, shape[1] + 1) + tuple(shape[2:-1]) + (shape[-1] + 3,)
            base = torch.full(big_shape, float("nan"), dtype=dtype, device=self.device)
            idx = (1, slice(1, None), slice(0, shape[1])) + (slice(None),) * (len(shape) - 3)
            view = base[idx][..., : shape[-1]]
            if name == "state":  # the kernel's state operand keeps a contiguous last dim
                assert view.stride(-1) == 1
        else:
            base = torch.full(shape, float("nan"), dtype=dtype, device=self.device)
            view = base
        assert tuple(view.shape) == tuple(shape)
        if fill is not None:
            view.fill_(fill)
        self.bases[name] = (base, view)
        return view

    def _inputs(self, batch):
        """Fresh per-token activations (CPU, act dtype): raw dt ~ N(0,1)."""
        H, P, N, G = self.H, self.P, self.N, self.G
        ad = self.ad
        return {
            "x": self._randn(batch, H, P).to(ad),
            "dt": self._randn(batch, H).to(ad),
            "B": self._randn(batch, G, N).to(ad),
            "C": (self._randn(batch, G, N) / math.sqrt(N)).to(ad),
            "z": self._randn(batch, H, P).to(ad) if self.has_z else None,
        }

    def _device_inputs(self, inp):
        """Device copies of the activations; strided: slices of one packed row tensor."""
        dev, H, P, N, G = self.device, self.H, self.P, self.N, self.G
        batch = inp["x"].shape[0]
        if not self.strided:
            out = {k: (None if v is None else v.to(dev)) for k, v in inp.items()}
            return out
        HP, GN = H * P, G * N
        width = HP + 2 * GN + H + 5
        packed = torch.full((batch, width), float("nan"), dtype=self.ad, device=dev)
        packed[:, :HP] = inp["x"].reshape(batch, HP).to(dev)
        packed[:, HP:HP + GN] = inp["B"].reshape(batch, GN).to(dev)
        packed[:, HP + GN:HP + 2 * GN] = inp["C"].reshape(batch, GN).to(dev)
        packed[:, HP + 2 * GN:HP + 2 * GN + H] = inp["dt"].to(dev)
        out = {
            "x": packed[:, :HP].unflatten(1, (H, P)),
            "B": packed[:, HP:HP + GN].unflatten(1, (G, N)),
            "C": packed[:, HP + GN:HP + 2 * GN].unflatten(1, (G, N)),
            # SGLang passes dt expanded over P with stride 0
            "dt": packed[:, HP + 2 * GN:HP + 2 * GN + H][:, :, None].expand(batch, H, P),
            "z": None,
        }
        if inp["z"] is not None:
            zb = torch.full((batch, H, P + 2), float("nan"), dtype=self.ad, device=dev)
            zb[..., :P] = inp["z"].to(dev)
            out["z"] = zb[..., :P]
        assert not out["x"].is_contiguous() and out["dt"].stride(2) == 0
        return out

    def write_pos(self, i):
        return self.count[i] % self.L

    # ---- one checked step ---------------------------------------------------------------
    def step(self, reqs, *, pads=("neg", "null"), pad_wpos=None, out_fill=float("nan"),
             idx_dtype=torch.int32, check_oracle=True):
        """Run one decode step for requests ``reqs`` (+ padding rows) and check everything."""
        H, P, L = self.H, self.P, self.L
        dev = self.device
        tag = f"[seed={self.seed} state={self.sd} act={self.ad} L={L}]"
        rows = list(reqs)
        # interleave padding rows: one at the front, one in the middle
        if "neg" in pads:
            rows.insert(0, "neg")
        if "null" in pads:
            rows.insert(len(rows) // 2 + 1, "null")
        batch = len(rows)
        slot_l, wpos_l = [], []
        for r in rows:
            if r == "neg":
                slot_l.append(-1)
            elif r == "null":
                slot_l.append(self.null_slot)
            else:
                slot_l.append(self.slots[r])
            if isinstance(r, str):
                wpos_l.append(int(torch.randint(0, L, (1,), generator=self.gen)) if pad_wpos is None else pad_wpos)
            else:
                wpos_l.append(self.write_pos(r))
        state_indices = torch.tensor(slot_l, dtype=idx_dtype, device=dev)
        write_pos = torch.tensor(wpos_l, dtype=torch.int32, device=dev)

        inp = self._inputs(batch)
        dinp = self._device_inputs(inp)
        if self.strided:
            ob = torch.full((batch, H + 1, P + 3), out_fill, dtype=self.ad, device=dev)
            out = ob[:, 1:, 2:P + 2]
        else:
            ob = torch.full((batch, H, P), out_fill, dtype=self.ad, device=dev)
            out = ob
        out_before = ob.clone()
        before = {k: b.clone() for k, (b, _) in self.bases.items()}

        kwargs = dict(D=self.D, z=dinp["z"], dt_bias=self.dt_bias, dt_softplus=self.dt_softplus,
                      null_slot=self.null_slot)
        args = (dinp["x"], dinp["dt"], self.A, dinp["B"], dinp["C"], state_indices, write_pos)

        ref = None
        if self.check_ref:
            ref = {k: b.clone() for k, b in before.items()}
            ref_views = {k: view_like(v, ref[k]) for k, (_, v) in self.bases.items()}
            ref_out = torch.full((batch, H, P), float("nan"), dtype=self.ad, device=dev)
            mamba2_replay_decode_ref(ref_views["state"], ref_views["x_ring"], ref_views["B_ring"],
                                     ref_views["dt_ring"], *args, out=ref_out, **kwargs)

        ret = mamba2_replay_decode(self.state, self.x_ring, self.B_ring, self.dt_ring, *args,
                                   out=out, **kwargs)
        assert ret is out, f"{tag} the returned tensor must be `out`"

        live = [k for k, r in enumerate(rows) if not isinstance(r, str)]
        pad = [k for k, r in enumerate(rows) if isinstance(r, str)]

        # --- nothing outside the expected write set changed (bit-identical) ---
        allowed = {k: torch.zeros(b.shape, dtype=torch.bool, device=dev) for k, (b, _) in self.bases.items()}
        for k in live:
            i = rows[k]
            s, w = self.slots[i], self.write_pos(i)
            if w == L - 1:
                view_like(self.state, allowed["state"])[s] = True
            else:
                view_like(self.x_ring, allowed["x_ring"])[s, :, w] = True
                view_like(self.B_ring, allowed["B_ring"])[s, :, w] = True
                view_like(self.dt_ring, allowed["dt_ring"])[s, :, w] = True
        for name, (b, _) in self.bases.items():
            keep = ~allowed[name]
            assert torch.equal(bits(b)[keep], bits(before[name])[keep]), \
                f"{tag} {name}: memory outside the rows' write set changed (padded rows, unused slots, " \
                f"non-flush state or ring positions != write_pos)"
        ob_keep = torch.ones(ob.shape, dtype=torch.bool, device=dev)
        view_like(out, ob_keep)[live] = False
        assert torch.equal(bits(ob)[ob_keep], bits(out_before)[ob_keep]), \
            f"{tag} out: padded rows or memory around `out` were written"
        assert torch.isfinite(out[live].float()).all(), f"{tag} out: some element of a live row was not written"

        # --- kernel vs PyTorch reference (same math, fp32) ---
        if ref is not None:
            rt, at = REF_TOL[self.ad]
            r_, k_ = mismatch(out[live], ref_out[live], rt, at)
            assert r_ <= 1, f"{tag} output vs reference: excess ratio {r_:.3g} at flat index {k_}"
            rt, at = REF_TOL[self.sd]
            sv, rv = self.state, view_like(self.state, ref["state"])
            fin = torch.isfinite(rv.float())
            r_, _ = mismatch(sv[fin], rv[fin], rt, at)
            assert r_ <= 1, f"{tag} state vs reference: excess ratio {r_:.3g}"
            for name in ("x_ring", "B_ring"):
                assert torch.equal(bits(self.bases[name][0]), bits(ref[name])), f"{tag} {name} differs from reference"
            dv, rdv = self.dt_ring, view_like(self.dt_ring, ref["dt_ring"])
            fin = torch.isfinite(rdv)
            assert torch.equal(fin, torch.isfinite(dv)), f"{tag} dt_ring written at other positions than reference"
            r_, _ = mismatch(dv[fin], rdv[fin], *DT_RING_TOL)
            assert r_ <= 1, f"{tag} dt_ring vs reference: excess ratio {r_:.3g}"

        # --- kernel vs fp64 sequential oracle ---
        rt, at = ORACLE_TOL[(self.sd, self.ad)]
        for k in live:
            i = rows[k]
            s, w = self.slots[i], self.write_pos(i)
            z = inp["z"][k:k + 1] if inp["z"] is not None else None
            S_new, y = mamba2_step_oracle(self.oracle[i][None], inp["x"][k:k + 1], inp["dt"][k:k + 1], self.A_h,
                                          inp["B"][k:k + 1], inp["C"][k:k + 1], D=self.D_hp, z=z,
                                          dt_bias=self.dtb_h, dt_softplus=self.dt_softplus)
            if check_oracle:
                r_, k_ = mismatch(out[k].cpu(), y[0], rt, at)
                assert r_ <= 1, (f"{tag} oracle: output of request {i} (slot {s}, write_pos {w}, step "
                                 f"{self.count[i]}) off by {r_:.3g}x tolerance at flat index {k_}")
            if w == L - 1:
                if check_oracle:
                    r_, k_ = mismatch(self.state[s].cpu(), S_new[0], rt, at)
                    assert r_ <= 1, (f"{tag} oracle: flushed state of request {i} (slot {s}, step {self.count[i]}) "
                                     f"off by {r_:.3g}x tolerance at flat index {k_}")
                # the checkpoint is stored in the state dtype: continue from the stored (rounded) state,
                # which was just checked to be within one rounding of the exact one.  Re-deriving the
                # rounding on the oracle side instead would let one-ulp rounding flips compound
                # (a bf16 ulp of a large element survives cancellation), a test artefact.
                self.oracle[i] = self.state[s].cpu().to(F64) if self.round_oracle else S_new[0]
            else:
                self.oracle[i] = S_new[0]
            self.count[i] += 1
        return out


# ======================================================================================
# 1 + 2 + 9: multi-step outputs and flushed states vs the oracle and the reference,
#            output poisoned before every call, padded rows in every batch
# ======================================================================================


@pytest.mark.parametrize("prec", PRECISIONS, ids=PREC_IDS)
@pytest.mark.parametrize("L", [1, 4, pytest.param(16, marks=pytest.mark.slow)])  # CPU L=16: test_desynchronised_rows
def test_decode_matches_oracle(device, L, prec):
    """2L+1 steps (two full flush cycles + one). L=16 runs one request to keep the CPU interpreter fast."""
    medium = L == 4 and prec == (F32, F32)  # several P-blocks per head with the default BLOCK_M
    reqs = [0] if (L == 16 or medium) else [0, 1]
    h = Harness(device, MEDIUM if medium else SMALL, L, *prec, n_req=len(reqs))
    for _ in range(2 * L + 1):
        h.step(reqs, pads=("neg", "null") if len(reqs) == 2 else ("null",))


@pytest.mark.parametrize("zd,prec", [("z_only", (F32, F32)), ("none", (F32, BF16)), ("D_only", (F32, F32)),
                                     ("D_per_dim", (F32, BF16))], ids=["z_only", "none", "D_only", "D_per_dim"])
def test_decode_z_and_D_variants(device, prec, zd):
    """z off and/or D off (every other test has both on), D varying over P; odd P, N, 3 groups."""
    h = Harness(device, ODD, 4, *prec, n_req=2, has_z=zd in ("z_only", "D_per_dim"),
                has_D=zd in ("D_only", "D_per_dim"), D_per_dim=zd == "D_per_dim")
    for _ in range(9):
        h.step([0, 1], pads=("neg",))


def test_no_softplus_int64_indices(device):
    """dt_softplus=False (Δ = dt + dt_bias, kept positive) and int64 state indices."""
    h = Harness(device, SMALL, 4, F32, F32, dt_softplus=False)
    h.dtb_h = h.dtb_h.abs() + 5.0  # raw dt ~ N(0,1) + 5 > 0
    h.dt_bias = h.dtb_h.to(device)
    for _ in range(9):
        h.step([0, 1], idx_dtype=torch.int64)


# ======================================================================================
# 3: L = 1 is the baseline update on every step
# ======================================================================================


def test_L1_equals_baseline(device):
    """L = 1: out and state after each step equal the baseline update (fp32 math from the stored
    state, new state stored in the state dtype), i.e. SGLang's selective_state_update semantics."""
    gen, seed = make_gen()
    H, P, N, G = MEDIUM
    S = 4
    for sd, ad in [(F32, F32), (BF16, BF16)]:
        tol = REF_TOL[ad]
        stol = REF_TOL[sd]
        state = (torch.randn(S, H, P, N, generator=gen) * 0.5).to(device=device, dtype=sd)
        x_ring = torch.full((S, H, 1, P), float("nan"), dtype=ad, device=device)
        B_ring = torch.full((S, G, 1, N), float("nan"), dtype=ad, device=device)
        dt_ring = torch.full((S, H, 1), float("nan"), dtype=F32, device=device)
        A = -torch.exp(torch.rand(H, generator=gen) * 2 - 1).to(device)
        dtb = (-4 * torch.rand(H, generator=gen)).to(device)
        D = torch.randn(H, generator=gen).to(device)
        slots = torch.tensor([2, 3], dtype=torch.int32, device=device)
        wp = torch.zeros(2, dtype=torch.int32, device=device)
        for _ in range(3):
            x = torch.randn(2, H, P, generator=gen).to(device=device, dtype=ad)
            dt = torch.randn(2, H, generator=gen).to(device=device, dtype=ad)
            B = torch.randn(2, G, N, generator=gen).to(device=device, dtype=ad)
            C = (torch.randn(2, G, N, generator=gen) / math.sqrt(N)).to(device=device, dtype=ad)
            z = torch.randn(2, H, P, generator=gen).to(device=device, dtype=ad)
            S_base, y_base = mamba2_step_oracle(state[slots.long()], x, dt, A, B, C, D=D, z=z, dt_bias=dtb,
                                                dtype=F32)
            out = mamba2_replay_decode(state, x_ring, B_ring, dt_ring, x, dt, A, B, C, slots, wp,
                                       D=D, z=z, dt_bias=dtb)
            r_, k_ = mismatch(out, y_base.to(ad), *tol)
            assert r_ <= 1, f"[seed={seed} {sd}/{ad}] L=1 output != baseline ({r_:.3g}x tol at {k_})"
            r_, k_ = mismatch(state[slots.long()], S_base.to(sd), *stol)
            assert r_ <= 1, f"[seed={seed} {sd}/{ad}] L=1 state != baseline ({r_:.3g}x tol at {k_})"
            assert torch.isnan(x_ring).all() and torch.isnan(dt_ring).all(), "L=1 must never append to the ring"


# ======================================================================================
# 4: prefill final state, then decode == the full recurrence
# ======================================================================================


@pytest.mark.parametrize("prec", [(F32, F32), (F32, BF16)], ids=["s32a32", "s32a16b"])
def test_prefill_then_decode_equals_full_recurrence(device, prec):
    """S_ck = exact recurrence over a 13-token prefix; decoding 2L+1 tokens through the ring must track
    the unrounded fp64 recurrence of the whole sequence (fp32 checkpoint)."""
    h = Harness(device, MEDIUM, 4, *prec, n_req=1, prefill_len=13, round_oracle=False)
    for _ in range(9):
        h.step([0], pads=())


# ======================================================================================
# 5: desynchronised write positions inside one batch
# ======================================================================================


@pytest.mark.parametrize("L", [4, 16])
def test_desynchronised_rows(device, L):
    h = Harness(device, SMALL, L, F32, F32, n_req=3)
    h.step([0], pads=())
    h.step([1, 0], pads=())
    h.step([2, 1, 0], pads=())
    assert len({h.write_pos(i) for i in range(3)}) == 3
    for _ in range(2 * L + 1):
        h.step([2, 0, 1], pads=())


# ======================================================================================
# 6: padded rows (slot -1 and the null slot) write nothing
# ======================================================================================


def test_padded_rows_write_nothing(device):
    """Pads at the flush position, a sentinel (42) in out; a custom null slot; an all-padding batch."""
    h = Harness(device, SMALL, 4, F32, F32, n_req=2, null_slot=3)
    for _ in range(5):
        h.step([0, 1], pad_wpos=3, out_fill=42.0)
    for _ in range(2):
        h.step([], pad_wpos=3, out_fill=42.0)  # batch made of padding rows only
    h.step([1], pads=("null",), pad_wpos=0, out_fill=42.0)


# ======================================================================================
# 7: strided views (pool layers, padded slot stride, packed activations, stride-0 params)
# ======================================================================================


@pytest.mark.parametrize("prec", [(F32, F32), (BF16, BF16), (F32, BF16)], ids=["s32a32", "s16b_a16b", "s32a16b"])
def test_strided_views(device, prec):
    h = Harness(device, ODD, 4, *prec, n_req=2, strided=True, D_per_dim=True)
    assert h.state.stride(0) != math.prod(h.state.shape[1:])
    for _ in range(9):
        h.step([0, 1])


# ======================================================================================
# 8: teeth: a corrupted cached value must make the oracle check fail
# ======================================================================================


@pytest.mark.parametrize("what", ["x", "B", "dt"])
def test_teeth_corrupted_ring_is_detected(device, what):
    h = Harness(device, SMALL, 8, F32, F32, n_req=1)
    for _ in range(3):
        h.step([0])
    s, j = h.slots[0], h.write_pos(0) - 1  # the most recent history entry
    hd = int(torch.argmax(h.dt_ring[s, :, j]))  # head with the largest Δ_j: the largest replay weight
    if what == "x":
        h.x_ring[s, hd, j, 0] += 10.0
    elif what == "B":
        h.B_ring[s, hd // (h.H // h.G), j, :] += 10.0
    else:
        h.dt_ring[s, hd, j] += 1.0
    with pytest.raises(AssertionError, match="oracle"):
        h.step([0])


def test_teeth_reference_disagreement_is_detected(device, monkeypatch):
    """The kernel-vs-reference check must also bite: corrupt only the reference's ring copy."""
    h = Harness(device, SMALL, 8, F32, F32, n_req=1)
    for _ in range(3):
        h.step([0])
    s, j = h.slots[0], h.write_pos(0) - 1
    real_ref = mamba2_replay_decode_ref

    def bad_ref(state, x_ring, *a, **k):
        x_ring[s, :, j, :] += 10.0
        return real_ref(state, x_ring, *a, **k)

    monkeypatch.setattr(sys.modules[__name__], "mamba2_replay_decode_ref", bad_ref)
    with pytest.raises(AssertionError, match="reference"):
        h.step([0], check_oracle=False)


# ======================================================================================
# launch configuration plumbing (any device): BLOCK_M not dividing P, both flush-loop forms
# ======================================================================================


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    def write(text):
        p = tmp_path / f"cfg_{len(list(tmp_path.iterdir()))}.yaml"
        p.write_text(text)
        monkeypatch.setenv(common.ENV_CONFIG_FILE, str(p))
        return p
    return write


@pytest.mark.parametrize("entry", ["{BLOCK_M: 32, num_warps: 2, BLOCK_NC: 16, flush_unroll: 1}",
                                   "{BLOCK_M: 64, dot_precision: ieee, BLOCK_NC: 16, flush_unroll: 0, num_stages: 2}",
                                   "{BLOCK_M: 64, num_warps: 2, BLOCK_NC: 32, flush_unroll: 0, maxnreg: 128}"],
                         ids=["unrolled", "loop-ieee", "loop-capped"])
def test_launch_config_partial_blocks(device, config_file, entry):
    """P=80 over 3 P-blocks (last one partial; or 2 of 64), N=40 over 16-column rebuild chunks (last one
    partial, and with the unrolled loop one fully masked), both flush-loop forms, ieee dot, a register cap (on the
    GPU only: the interpreter takes none)."""
    H, P, N, G = 4, 80, 40, 2
    config_file(f"mamba2_output_only:\n  {geometry_key(H, P, N, G, 4)}: {entry}\n")
    h = Harness(device, (H, P, N, G), 4, F32, F32, n_req=2)
    for _ in range(10):
        h.step([0, 1])


@pytest.mark.parametrize("prec", [(F32, F32), (F32, BF16)], ids=["s32a32", "s32a16b"])
def test_inline_bc_small_batch_single_launch(device, config_file, monkeypatch, prec):
    """inline_bc_max_batch: small batches compute B·C in the main kernel (one launch, no
    pre-kernel) with the same results; a batch above the limit still uses the pre-kernel."""
    from sglang_replayssm.kernels import mamba2_replay as mr

    config_file("mamba2_output_only:\n  default: {inline_bc_max_batch: 4}\n")
    launches = []
    orig = mr._mamba2_bc_kernel
    monkeypatch.setattr(mr, "_mamba2_bc_kernel", type("K", (), {
        "__getitem__": lambda self, grid: (launches.append(grid), orig[grid])[1]})())
    h = Harness(device, ODD, 4, *prec, n_req=3)
    for _ in range(6):  # 3 requests + 2 padding rows = 5 rows > 4: pre-kernel
        h.step([0, 1, 2])
    assert len(launches) == 6
    for _ in range(6):  # 2 requests + 1 padding row = 3 rows: inline
        h.step([0, 2], pads=("neg",))
    assert len(launches) == 6, "the pre-kernel ran for a batch within inline_bc_max_batch"


def _desynchronised_flushes(device, monkeypatch, prec, keys):
    """Three requests joining one step apart on ODD at L = 4 (every row flushes on its own phase), each step checked
    by the Harness; returns it and the ``keys`` launch keywords of every main-kernel launch."""
    from sglang_replayssm.kernels import mamba2_replay as mr

    flags = []
    orig = mr._mamba2_replay_kernel

    class Rec:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                flags.append(tuple(kw[k] for k in keys))
                return orig[grid](*a, **kw)
            return launch

    monkeypatch.setattr(mr, "_mamba2_replay_kernel", Rec())
    h = Harness(device, ODD, 4, *prec, n_req=3)
    h.step([0], pads=())
    h.step([1, 0])
    for _ in range(6):
        h.step([2, 0, 1])
    return h, flags


@pytest.mark.parametrize("first,inline,prec", [(1, 0, (F32, F32)), (1, 8, (F32, F32)), (1, 8, (BF16, BF16)),
                                               (0, 0, (F32, F32)), (0, 8, (BF16, BF16))],
                         ids=["pre-s32a32", "inline-s32a32", "inline-s16b_a16b", "window-first-pre-s32a32",
                              "window-first-inline-s16b_a16b"])
def test_state_first_matches_the_oracle(device, config_file, monkeypatch, first, inline, prec):
    """state_first 1 (the default): non-flush rows load the checkpoint tile (and, inline, the B window) before
    the window chain; 0: after it. Same results through flushes, desynchronised rows and padding."""
    config_file(f"mamba2_output_only:\n  default: {{state_first: {first}, inline_bc_max_batch: {inline}}}\n")
    h, flags = _desynchronised_flushes(device, monkeypatch, prec, ("STATE_FIRST", "INLINE_BC"))
    h.step([1], pads=("null", "neg"), pad_wpos=3, out_fill=42.0)
    assert flags and all(f == (bool(first), bool(inline)) for f in flags), flags


@pytest.mark.slow  # the interpreter runs pdl as off: the same launches as the rows above (the GPU run's)
@pytest.mark.parametrize("ff", [0, 4], ids=["grid-order", "flush-first"])
def test_pdl_matches_the_oracle(device, config_file, monkeypatch, ff):
    """pdl: the decode kernel launched as the B·C pre-kernel's programmatic dependent (on an sm90 GPU), in grid
    order and flush-first: the oracle holds through flushes on every phase, desynchronised rows and padding."""
    from sglang_replayssm.kernels.common import pdl_on

    config_file(f"mamba2_output_only:\n  default: {{pdl: 1, inline_bc_max_batch: 1, flush_first_max_batch: {ff}}}\n")
    h, flags = _desynchronised_flushes(device, monkeypatch, (F32, BF16), ("PDL", "INLINE_BC"))
    h.step([1], pads=("null", "neg"), pad_wpos=3, out_fill=42.0)
    on = pdl_on({"pdl": 1}, torch.device(device))
    assert flags[0] == (False, True) and all(f == (on, False) for f in flags[1:]), flags


def test_flush_first_order_matches_the_oracle(device, config_file, monkeypatch):
    """flush_first_max_batch: within the limit and above inline_bc_max_batch the grid is (M tiles, heads, rows) and
    each program reads its row from the flush-first order the B·C pre-kernel wrote; the oracle holds through
    flushes on every phase, desynchronised rows and padding rows (null, negative, at the flush position). A batch
    above the limit, or within inline_bc_max_batch (no pre-kernel), keeps the rows in grid order."""
    from sglang_replayssm.kernels import mamba2_replay as mr

    config_file("mamba2_output_only:\n  default: {flush_first_max_batch: 4, inline_bc_max_batch: 1}\n")
    grids, orders = [], []
    orig = mr._mamba2_replay_kernel

    class Recording:  # the grids; each flush-first launch's order against its write positions
        def __getitem__(self, grid):
            grids.append(grid)

            def launch(*args, **kw):
                ret = orig[grid](*args, **kw)
                if kw["FF"]:  # args: ..., slot_ptr (13), wpos_ptr (14), ...; L (19); the order last
                    w, L = args[14].cpu().tolist(), args[19]
                    flush = [r for r in range(len(w)) if max(w[r], 0) >= L - 1]
                    orders.append((args[-1].cpu().tolist(), flush + [r for r in range(len(w)) if r not in flush]))
                return ret
            return launch

    monkeypatch.setattr(mr, "_mamba2_replay_kernel", Recording())
    H, P = ODD[0], ODD[1]
    h = Harness(device, ODD, 4, F32, F32, n_req=3)
    h.step([0], pads=())  # batch 1: inline B·C, rows in grid order
    h.step([1, 0])  # 4 rows: flush-first
    for _ in range(6):  # 3 requests + 2 padding rows = 5 rows > 4: grid order
        h.step([2, 0, 1])
    for _ in range(5):  # 4 rows, every request's flush on its own phase: flush-first
        h.step([2, 0, 1], pads=("null",), pad_wpos=3)
    tiles = -(-P // 32)
    want = [(tiles, 1, H), (tiles, H, 4)] + [(tiles, 5, H)] * 6 + [(tiles, H, 4)] * 5
    assert grids == want, grids
    assert len(orders) == 6 and all(got == want for got, want in orders), orders
    assert any(want[0] != 0 for _, want in orders), "no launch put a flush row ahead of row 0"


# (entry of mamba2_output_only's default, what the error must name)
BAD_ENTRIES = [
    ("{BLOCK_M: 8}", "BLOCK_M"),
    ("{dot_precision: tf32}", "dot_precision"),
    ("{BLOCK_NC: 24}", "BLOCK_NC"),
    ("{num_warps: 3}", "num_warps"),
    ("{BLOCK_K: 24}", "unknown parameter 'BLOCK_K'"),
    # timed on the H200, lost and removed (eval/results/kernel-variants-h200/regcap/, round 3)
    ("{flush_unroll: 0, flush_prefetch: 1}", "unknown parameter 'flush_prefetch'"),
    # timed on the H100, lost and removed (eval/results/kernel-variants-h200/fold/ and tiles/)
    ("{fold_launch: 1}", "unknown parameter 'fold_launch'"),
    ("{flush_tiles: 1}", "unknown parameter 'flush_tiles'"),
]


def test_bad_launch_config_raises(device, config_file):
    h = Harness(device, SMALL, 4, F32, F32, n_req=1)
    for entry, match in BAD_ENTRIES:
        config_file(f"mamba2_output_only:\n  default: {entry}\n")
        with pytest.raises(ValueError, match=match):
            h.step([0])


def test_out_none_allocates_like_x(device):
    gen, seed = make_gen()
    H, P, N, G, L, S = 4, 16, 16, 2, 4, 3
    state = torch.randn(S, H, P, N, generator=gen).to(device)
    x_ring = torch.zeros(S, H, L, P, dtype=BF16, device=device)
    B_ring = torch.zeros(S, G, L, N, dtype=BF16, device=device)
    dt_ring = torch.zeros(S, H, L, device=device)
    x = torch.randn(2, H, P, generator=gen).to(device=device, dtype=BF16)
    out = mamba2_replay_decode(state, x_ring, B_ring, dt_ring, x, torch.randn(2, H, generator=gen).to(device),
                               -torch.ones(H, device=device), torch.randn(2, G, N, generator=gen).to(device, BF16),
                               torch.randn(2, G, N, generator=gen).to(device, BF16),
                               torch.tensor([1, 2], device=device), torch.tensor([0, 1], dtype=torch.int32,
                                                                                 device=device))
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert torch.isfinite(out.float()).all(), f"[seed={seed}]"


# ======================================================================================
# 10: real model geometries (batch 2, a few steps)
# ======================================================================================


@pytest.mark.slow
@pytest.mark.parametrize("state_dtype", [F32, BF16], ids=["s32", "s16b"])
@pytest.mark.parametrize("geom", [(128, 64, 128, 8), (256, 64, 128, 8)], ids=["super120b", "ultra"])
def test_real_geometries(device, geom, state_dtype, config_file):
    """Batch 2, L=2: append then flush (then append again from the new checkpoint for the benchmark
    geometry); bf16 activations, as served, with an fp32 state (the default) or a bf16 one (on the GPU: the
    GPU file's entry for that state dtype)."""
    if common.interpreting():
        # fewer, larger programs in the CPU interpreter (same math; BLOCK_M=64 covers P in one tile)
        config_file("mamba2_output_only:\n  default: {BLOCK_M: 64, BLOCK_NC: 128}\n")
    h = Harness(device, geom, 2, state_dtype, BF16, n_req=2, check_ref=False)
    for _ in range(3 if geom[0] == 128 else 2):
        h.step([0, 1], pads=())


# ======================================================================================
# 11: input validation
# ======================================================================================


def _valid_args(device, H=4, P=16, N=16, G=2, L=4, S=3, batch=2):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    return dict(
        state=r(S, H, P, N), x_ring=r(S, H, L, P), B_ring=r(S, G, L, N), dt_ring=r(S, H, L),
        x=r(batch, H, P), dt=r(batch, H), A=-r(H).abs(), B=r(batch, G, N), C=r(batch, G, N),
        state_indices=torch.tensor([1, 2], dtype=torch.int32, device=device),
        write_pos=torch.tensor([0, 1], dtype=torch.int32, device=device),
    )


def _call(a, **kw):
    order = ["state", "x_ring", "B_ring", "dt_ring", "x", "dt", "A", "B", "C", "state_indices", "write_pos"]
    return mamba2_replay_decode(*[a[k] for k in order], **kw)


def test_validation_raises_value_error(device):
    a = _valid_args(device)
    _call(a)  # the valid call works
    H, P, N, G, L, S, batch = 4, 16, 16, 2, 4, 3, 2
    bad = [
        ("state", a["state"][..., :8], {}),  # N mismatch with B
        ("state", a["state"][0], {}),  # 3-D state
        ("x_ring", a["x_ring"][:, :, :, :8], {}),  # P mismatch
        ("x_ring", a["x_ring"][:2], {}),  # slot count mismatch
        ("B_ring", a["B_ring"][:, :, :2], {}),  # L mismatch
        ("dt_ring", a["dt_ring"].to(BF16), {}),  # dt ring must be fp32
        ("dt_ring", a["dt_ring"][:, :3], {}),
        ("x", a["x"][:, :3], {}),
        ("dt", a["dt"][:, None], {}),  # wrong rank
        ("dt", torch.randn(batch, H, P, device=device), {}),  # not tied over P
        ("A", torch.randn(H, P, N, device=device), {}),  # not tied over P, N
        ("A", torch.randn(H + 1, device=device), {}),
        ("B", torch.randn(batch, 3, N, device=device), {}),  # H % G != 0
        ("C", torch.randn(batch, G, N + 1, device=device), {}),
        ("state_indices", a["state_indices"].float(), {}),
        ("state_indices", a["state_indices"][:1], {}),
        ("write_pos", torch.zeros(batch + 1, dtype=torch.int32, device=device), {}),
        ("x", a["x"].to(torch.int32), {}),
        (None, None, {"D": torch.randn(H + 1, device=device)}),
        (None, None, {"z": torch.randn(batch, H, P + 1, device=device)}),
        (None, None, {"dt_bias": torch.randn(H, P, device=device)}),  # not tied over P
        (None, None, {"out": torch.empty(batch, H, P - 1, device=device)}),
    ]
    for name, value, kw in bad:
        b = dict(a)
        if name is not None:
            b[name] = value
        with pytest.raises(ValueError):
            _call(b, **kw)
    if device.type == "cuda":
        b = dict(a)
        b["x"] = a["x"].cpu()
        with pytest.raises(ValueError, match="device|on cpu"):
            _call(b)


def test_strided_index_tensors_read_the_right_rows(device):
    """state_indices / write_pos as strided views (every other element of a longer tensor): the same outputs and
    state as contiguous copies (the kernels index rows at ptr + r; the wrapper makes them contiguous)."""
    a = _valid_args(device)
    a["write_pos"] = torch.tensor([1, 3], dtype=torch.int32, device=device)  # row 1 flushes (L = 4)
    wide = {k: torch.stack([a[k], torch.zeros_like(a[k])], 1).reshape(-1)[::2]  # read as ptr + r: row 1 -> 0
            for k in ("state_indices", "write_pos")}
    assert all(t.stride(0) == 2 for t in wide.values())
    b = dict(a, state=a["state"].clone(), **wide)
    out_a, out_b = _call(a), _call(b)
    assert torch.equal(out_a, out_b) and torch.equal(a["state"], b["state"])


def test_state_dtype_config_key(device, config_file, monkeypatch):
    """The wrapper asks for ``<geometry>_S<state dtype>`` first: a bf16-state entry picks the tiles of bf16
    checkpoints only (outputs still checked against the oracle)."""
    from sglang_replayssm.kernels import mamba2_replay as mr

    H, P, N, G = SMALL
    key = geometry_key(H, P, N, G, 4)
    config_file(f"mamba2_output_only:\n  {key}_Sbf16: {{BLOCK_M: 16, BLOCK_NC: 16}}\n")
    seen = []
    orig = mr.launch_config

    def spy(fam, keys, defaults=None, path=None):
        got = orig(fam, keys, defaults, path)
        seen.append((fam, tuple(keys), got["BLOCK_M"]))
        return got

    monkeypatch.setattr(mr, "launch_config", spy)
    for prec in ((BF16, BF16), (F32, BF16)):
        h = Harness(device, SMALL, 4, *prec, n_req=1)
        for _ in range(3):
            h.step([0])
    default_m = common.family_defaults("mamba2_output_only")["BLOCK_M"]
    assert seen == [("mamba2_output_only", (f"{key}_Sbf16", key, "default_Sbf16"), 16)] * 3 + \
        [("mamba2_output_only", (f"{key}_Sfp32", key, "default_Sfp32"), default_m)] * 3
