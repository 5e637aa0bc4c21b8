"""Speculative verify on the GDN spec ring against SGLang 0.5.17's own verify + commit, on CPU.

Stock: ``HybridLinearAttnBackend.forward`` -> ``GDNAttnBackend.forward_extend`` in
TARGET_VERIFY mode (SGLang's conv update with per-draft windows, then
``GDNKernelDispatcher.target_verify`` -> ``fused_sigmoid_gating_delta_rule_update`` writing
one state snapshot per draft token), then ``update_mamba_state_after_mtp_verify`` (scatter of
the accepted snapshot and conv window).  Patched: the same calls with the GDN seam
(``target_verify`` under a verify context -> ``gdn_verify`` on the spec ring) and the commit
seam (``spec_commit``).  Same hidden states and random accept lengths in both runs; every
window position's output, the conv state and each flushed checkpoint must agree.  Harness
and CPU shims: ``test_gdn_decode`` (plus the scatter shim of ``test_mamba2_decode``; the
stock verify kernel's ``exp`` global is rebound like the packed decode kernel's).
"""

import types

import pytest
import torch

from test_gdn_decode import HK, HV, K, LAYER_IDS, MAMBA_SIZE, QKV, V, Harness, _clean, _interp_exp, sgl  # noqa: F401
from test_mamba2_decode import _cpu_masked_scatter
from test_spec_mamba2 import TRACK, check_tracked_states, track_plan

from sglang_replayssm.kernels.spec_cursor import check_spec_cursors
from sglang_replayssm.patches import gdn_decode as gdn
from sglang_replayssm.patches import spec_commit
from sglang_replayssm.patches.registry import apply, unapply_all, verify
from sglang_replayssm.ring import GDNRingGeometry, ReplayRing

D = 3
HIST = 4


@pytest.fixture(autouse=True)
def _verify_shims(monkeypatch):
    import importlib.util

    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hlab
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as mss

    monkeypatch.setattr(mss, "fused_mamba_state_scatter_with_mask", _cpu_masked_scatter)
    monkeypatch.setattr(mss, "fused_conv_window_scatter_with_mask", _cpu_masked_scatter)
    if hasattr(hlab, "fused_conv_window_scatter_with_mask"):  # 0.5.23: the backend's own import
        monkeypatch.setattr(hlab, "fused_conv_window_scatter_with_mask", _cpu_masked_scatter)
    fsg_name = "sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent"  # gone in 0.5.23
    if importlib.util.find_spec(fsg_name) is not None:
        fsg = importlib.import_module(fsg_name)
        if hasattr(fsg, "exp"):
            monkeypatch.setattr(fsg, "exp", _interp_exp)


class SpecHarness(Harness):
    """The GDN harness with SGLang's verify scratch (per-draft snapshots and conv windows, CPU)."""

    def __init__(self, sgl, **kw):
        super().__init__(sgl, **kw)
        from sglang.srt.mem_cache.memory_pool import MambaPool

        cache = self.pool.mamba_pool.mamba_cache
        nl, ns = cache.temporal.shape[:2]
        self.pool.mamba_pool.mamba_cache = MambaPool.SpeculativeState(
            conv=cache.conv, temporal=cache.temporal,
            intermediate_ssm=torch.zeros((nl, ns, D) + tuple(cache.temporal.shape[2:])),
            intermediate_conv_window=[torch.zeros((nl, ns, D) + tuple(c.shape[2:]), dtype=c.dtype)
                                      for c in cache.conv])
        self.backend.verify_intermediate_state_indices = torch.arange(MAMBA_SIZE + 1, dtype=torch.int32)

    def attach_spec_ring(self):
        geom = GDNRingGeometry(HK, HV, K, V, HIST, act_dtype=self.act, state_dtype=torch.float32)
        self.ring = ReplayRing(geom, num_layers=len(LAYER_IDS), num_slots=MAMBA_SIZE + 1, spec_window=D)
        setattr(self.pool.mamba_pool, gdn.RING_ATTR, self.ring)
        return self.ring

    def verify_forward(self, slots, inputs):
        sgl = self.sgl
        bs = len(slots)
        self.backend.forward_metadata = sgl.ForwardMetadata(
            query_start_loc=torch.arange(0, bs * D + 1, D, dtype=torch.int32),
            mamba_cache_indices=torch.tensor(slots, dtype=torch.int32))
        fb = types.SimpleNamespace(forward_mode=sgl.ForwardMode.TARGET_VERIFY, mamba_track_mask=None,
                                   logical_forward_mode=sgl.ForwardMode.TARGET_VERIFY,  # read by 0.5.23
                                   batch_size=bs, spec_info=types.SimpleNamespace(draft_token_num=D),
                                   req_pool_indices=torch.arange(bs))  # read by 0.5.23 (PP scratch rows)
        return [self.layer(lid, inp, fb) for lid, inp in zip(LAYER_IDS, inputs)]


def make_verify_inputs(schedule, seed=11):
    gen = torch.Generator().manual_seed(seed)
    return [[(torch.randn(len(s) * D, QKV, generator=gen), torch.randn(len(s) * D, HV, generator=gen),
              torch.randn(len(s) * D, HV, generator=gen)) for _ in LAYER_IDS] for s in schedule]


SCHEDULE = [[2], [2, 5], [5, 2, -1], [2, 5], [4, 2, 5], [2, 5, 4, -1], [4, 2, 5], [5, 4, 2], [2, 4, 5],
            [4, 5, 2], [2, 5, 4], [5, 2, 4]]


def _run(sgl, schedule, inputs, accepts, patched):
    unapply_all()
    h = SpecHarness(sgl)
    ring = None
    if patched:
        ring = h.attach_spec_ring()
        apply(gdn.PATCHES + spec_commit.PATCHES)
        verify(gdn.PATCHES + spec_commit.PATCHES)
    trace = []
    for slots, inp, acc in zip(schedule, inputs, accepts):
        flags = None if ring is None else ring.flush.clone()
        outs = [o.clone() for o in h.verify_forward(slots, inp)]
        h.hybrid.update_mamba_state_after_mtp_verify((acc - 1).to(torch.int64), None, None, None)
        trace.append(dict(outs=outs, temporal=h.temporal.clone(), conv=h.conv.clone(), flags=flags))
        if ring is not None:
            check_spec_cursors(ring.write_pos, ring.origin, ring.flush, window=D, ring_len=ring.ring_len,
                               slots=[s for s in slots if s > 0])
    return trace, h, ring


def test_gdn_spec_verify_and_commit_match_sglang(sgl):
    gen = torch.Generator().manual_seed(3)
    accepts = [torch.tensor([int(torch.randint(1, D + 1, (1,), generator=gen)) if s > 0 else 0 for s in slots])
               for slots in SCHEDULE]
    inputs = make_verify_inputs(SCHEDULE)
    ref, _, _ = _run(sgl, SCHEDULE, inputs, accepts, patched=False)
    got, h, ring = _run(sgl, SCHEDULE, inputs, accepts, patched=True)
    flushes = 0
    last = {}
    for t, (slots, r, g) in enumerate(zip(SCHEDULE, ref, got)):
        tok = [i * D + j for i, s in enumerate(slots) if s > 0 for j in range(D)]
        for lo, ro in zip(g["outs"], r["outs"]):
            lo, ro = lo.reshape(-1, HV * V), ro.reshape(-1, HV * V)
            torch.testing.assert_close(lo[tok], ro[tok], rtol=2e-3, atol=2e-3, msg=f"step {t}: verify outputs")
        assert torch.equal(g["conv"], r["conv"]), f"step {t}: conv rollback differs from SGLang's"
        for s in (s for s in slots if s > 0):
            if int(g["flags"][s]):
                flushes += 1
                torch.testing.assert_close(g["temporal"][:, s], last[s], rtol=2e-3, atol=2e-3,
                                           msg=f"step {t} slot {s}: flushed checkpoint")
            last[s] = r["temporal"][:, s]
    assert flushes >= 4, f"saw {flushes} flushes"
    from sglang_replayssm.patches import lifecycle

    live = sorted({s for slots in SCHEDULE for s in slots if s > 0})
    try:
        lifecycle.fold_slots(h.pool.mamba_pool, torch.tensor(live))
        torch.testing.assert_close(h.temporal[:, live], ref[-1]["temporal"][:, live], rtol=2e-3, atol=2e-3)
    finally:
        lifecycle.clear_layer_params(ring)


def test_gdn_plain_decode_on_a_spec_ring(sgl):
    """Decode forwards on a spec ring equal SGLang's packed decode; the finish fold gives its state."""
    from test_gdn_decode import make_inputs, run_stock

    schedule = [[2, 5], [5, 2, -1], [2, 5], [2, 5], [5, 2], [2, 5], [2, 5], [5, 2], [2, 5]]
    inputs = make_inputs(schedule, seed=5)
    ref_outs, ref_temporal, _ = run_stock(sgl, schedule, inputs)
    h = Harness(sgl)
    geom = GDNRingGeometry(HK, HV, K, V, HIST, act_dtype=torch.float32, state_dtype=torch.float32)
    ring = ReplayRing(geom, num_layers=len(LAYER_IDS), num_slots=MAMBA_SIZE + 1, spec_window=D)
    setattr(h.pool.mamba_pool, gdn.RING_ATTR, ring)
    apply(gdn.PATCHES)
    from sglang_replayssm.patches import lifecycle

    try:
        for t, (slots, inp) in enumerate(zip(schedule, inputs)):
            outs = h.forward(slots, inp)
            rows = [i for i, s in enumerate(slots) if s > 0]
            for lo, ro in zip(outs, ref_outs[t]):
                torch.testing.assert_close(lo.reshape(len(slots), -1)[rows], ro.reshape(len(slots), -1)[rows],
                                           rtol=2e-4, atol=2e-4, msg=f"step {t}")
        lifecycle.fold_slots(h.pool.mamba_pool, torch.tensor([2, 5]))
        torch.testing.assert_close(h.temporal[:, [2, 5]], ref_temporal[-1][:, [2, 5]], rtol=2e-4, atol=2e-4)
    finally:
        lifecycle.clear_layer_params(ring)


def _run_tracked(sgl, schedule, inputs, accepts, plan, patched):
    unapply_all()
    h = SpecHarness(sgl)
    ring = None
    if patched:
        ring = h.attach_spec_ring()
        ring.write_pos[list(TRACK.values())] = 3       # stale cursors a recycled track slot may carry
        ring.origin[list(TRACK.values())] = 2
        apply(gdn.PATCHES + spec_commit.PATCHES)
    trace = []
    for slots, inp, acc, (idx, steps) in zip(schedule, inputs, accepts, plan):
        flags = None if ring is None else ring.flush.clone()
        h.verify_forward(slots, inp)
        h.hybrid.update_mamba_state_after_mtp_verify((acc - 1).to(torch.int64), idx, steps, None)
        trace.append(dict(temporal=h.temporal.clone(), conv=h.conv.clone(), flags=flags))
        if ring is not None:
            tracked = [int(i) for i, st in zip(idx, steps) if st >= 0]
            assert not ring.write_pos[tracked].any() and not ring.origin[tracked].any()
    return trace, h, ring


def test_gdn_extra_buffer_track_states_match_sglang(sgl):
    """extra_buffer under speculation on the GDN spec ring: every track slot SGLang names at a commit holds
    stock's state at that window step (its snapshot scatter) and its conv window; live slots are unchanged by
    the tracking.  The Mamba2 twin and the plan: ``test_spec_mamba2.test_extra_buffer_track_states_match_sglang``."""
    gen = torch.Generator().manual_seed(3)
    accepts = [torch.tensor([int(torch.randint(1, D + 1, (1,), generator=gen)) if s > 0 else 0 for s in slots])
               for slots in SCHEDULE]
    inputs = make_verify_inputs(SCHEDULE)
    plan = track_plan(SCHEDULE, accepts)
    ref, _, _ = _run_tracked(sgl, SCHEDULE, inputs, accepts, plan, patched=False)
    got, h, ring = _run_tracked(sgl, SCHEDULE, inputs, accepts, plan, patched=True)
    try:
        tracked, on_flush = check_tracked_states(SCHEDULE, ref, got, plan, tol=2e-3)
        assert tracked >= 12 and on_flush >= 2, (tracked, on_flush)
    finally:
        from sglang_replayssm.patches import lifecycle

        lifecycle.clear_layer_params(ring)
