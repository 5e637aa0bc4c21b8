"""Speculative verify on the Mamba2 spec ring against SGLang 0.5.17's own verify + commit, on CPU.

Stock: ``Mamba2AttnBackend.forward`` in TARGET_VERIFY mode (SGLang's ``selective_state_update``
writing one state snapshot per draft token into ``intermediate_ssm``), then
``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify`` (SGLang's scatter of the
accepted snapshot and conv window).  Patched: the same calls with the verify seam
(``mamba2_decode``: the chain-verify call goes to ``mamba2_verify``) and the commit seam
(``spec_commit``: conv rollback as SGLang + a cursor move).  Both runs see the same hidden
states and the same random accept lengths for many steps; every window position's output,
the conv state, and (after each flush) the checkpoint must agree.  Harness and CPU shims:
``test_mamba2_decode``.
"""

import pytest
import torch

from test_mamba2_decode import LAYER_IDS, MAMBA_SIZE, Harness, _clean, make_inputs, sgl  # noqa: F401

from sglang_replayssm.kernels.spec_cursor import check_spec_cursors
from sglang_replayssm.patches import mamba2_decode as m2d
from sglang_replayssm.patches import spec_commit
from sglang_replayssm.patches.registry import apply, unapply_all, verify
from sglang_replayssm.ring import Mamba2RingGeometry, ReplayRing
from test_mamba2_decode import G, H, N, P

D = 3          # draft tokens per verify (window T)
HIST = 4       # history block B: ring length R = 7


def _hybrid(sgl, h):
    """A HybridLinearAttnBackend over the harness's Mamba2 backend (fields the commit reads)."""
    hb = object.__new__(sgl.hlab.HybridLinearAttnBackend)
    hb.linear_attn_backend = h.backend
    return hb


def _attach_spec_ring(h):
    geom = Mamba2RingGeometry(H, P, N, G, HIST, act_dtype=torch.float32)
    ring = ReplayRing(geom, num_layers=len(LAYER_IDS), num_slots=MAMBA_SIZE + 1, spec_window=D)
    setattr(h.pool.mamba_pool, m2d.RING_ATTR, ring)
    return ring


SCHEDULE = [[2], [2, 5], [5, 2, -1], [2, 5], [4, 2, 5], [2, 5, 4, -1], [4, 2, 5], [5, 4, 2], [2, 4, 5],
            [4, 5, 2, -1], [2, 5, 4], [5, 2, 4], [2, 4], [4, 2, 5]]


def _accepts(schedule, seed=5):
    gen = torch.Generator().manual_seed(seed)
    return [torch.tensor([int(torch.randint(1, D + 1, (1,), generator=gen)) if s > 0 else 0 for s in slots])
            for slots in schedule]


def _run(sgl, schedule, inputs, accepts, patched):
    unapply_all()
    h = Harness(sgl, spec_tokens=D)
    hb = _hybrid(sgl, h)
    ring = None
    if patched:
        ring = _attach_spec_ring(h)
        apply(m2d.PATCHES + spec_commit.PATCHES)
        verify(m2d.PATCHES + spec_commit.PATCHES)
    trace = []
    for slots, hs, acc in zip(schedule, inputs, accepts):
        flags = None if ring is None else ring.flush.clone()
        outs = [o.clone() for o in h.forward(slots, hs, verify_tokens=D)]
        hb.update_mamba_state_after_mtp_verify((acc - 1).to(torch.int64), None, None, None)
        trace.append(dict(outs=outs, temporal=h.temporal.clone(), conv=h.conv.clone(), flags=flags,
                          cursors=None if ring is None else (ring.write_pos.clone(), ring.origin.clone())))
        if ring is not None:
            check_spec_cursors(ring.write_pos, ring.origin, ring.flush, window=D, ring_len=ring.ring_len,
                               slots=[s for s in slots if s > 0])
    return trace, h, ring


def test_spec_verify_and_commit_match_sglang(sgl):
    """14 verify+commit steps, random accepts 1..D, rows joining/permuting, padded rows: outputs of
    every window position equal SGLang's; conv state identical; each flushed checkpoint equals SGLang's
    state at the folded (committed) count; the ring wraps around."""
    inputs = make_inputs(SCHEDULE, tokens_per_row=D)
    accepts = _accepts(SCHEDULE)
    ref, _, _ = _run(sgl, SCHEDULE, inputs, accepts, patched=False)
    got, h, ring = _run(sgl, SCHEDULE, inputs, accepts, patched=True)
    flushes = wraps = 0
    last_ref_state = {}
    for t, (slots, r, g) in enumerate(zip(SCHEDULE, ref, got)):
        live_rows = [i for i, s in enumerate(slots) if s > 0]
        tok = [i * D + j for i in live_rows for j in range(D)]
        for lo, ro in zip(g["outs"], r["outs"]):
            torch.testing.assert_close(lo[tok], ro[tok], rtol=3e-4, atol=3e-4, msg=f"step {t}: verify outputs")
        assert torch.equal(g["conv"], r["conv"]), f"step {t}: conv rollback differs from SGLang's"
        for s in (s for s in slots if s > 0):
            if int(g["flags"][s]):  # this verify folded slot s: checkpoint == SGLang's committed state before it
                flushes += 1
                torch.testing.assert_close(g["temporal"][:, s], last_ref_state[s], rtol=3e-4, atol=3e-4,
                                           msg=f"step {t} slot {s}: flushed checkpoint")
            last_ref_state[s] = r["temporal"][:, s]
        wp, org = g["cursors"]
        wraps += int(any(int(org[s]) + int(wp[s]) > ring.ring_len for s in slots if s > 0))
    assert flushes >= 4, f"the schedule must cross several flushes, saw {flushes}"
    assert wraps >= 1, "the circular ring never wrapped"
    # the finish fold (lifecycle) of the pending history gives SGLang's final state
    from sglang_replayssm.patches import lifecycle

    live = sorted({s for slots in SCHEDULE for s in slots if s > 0})
    try:
        assert int(ring.write_pos[live].max()) > 0
        lifecycle.fold_slots(h.pool.mamba_pool, torch.tensor(live))
        torch.testing.assert_close(h.temporal[:, live], ref[-1]["temporal"][:, live], rtol=3e-4, atol=3e-4)
        assert not ring.write_pos[live].any() and not ring.origin[live].any() and not ring.flush[live].any()
    finally:
        lifecycle.clear_layer_params(ring)


def test_verify_never_touches_the_snapshot_buffer(sgl):
    """The per-draft intermediate_ssm is neither read nor written by the ring verifier: poisoned
    with NaN, outputs stay finite and the buffer stays untouched."""
    h = Harness(sgl, spec_tokens=D)
    _attach_spec_ring(h)
    inter = h.pool.mamba_pool.mamba_cache.intermediate_ssm
    inter.fill_(float("nan"))
    apply(m2d.PATCHES + spec_commit.PATCHES)
    outs = h.forward([3, 1, -1], make_inputs([[3, 1, -1]], tokens_per_row=D)[0], verify_tokens=D)
    assert all(torch.isfinite(o[: 2 * D]).all() for o in outs)
    assert torch.isnan(inter).all()


def test_plain_decode_on_a_spec_ring_is_a_one_token_verify(sgl):
    """A DECODE forward on a spec ring (a request not speculating): outputs equal SGLang's decode,
    one token is committed per live row after the last layer, and the checkpoint is only written by
    folds: after the finish fold it equals SGLang's state."""
    schedule = [[2, 5], [5, 2, -1], [2, 5], [2, 5], [5, 2], [2, 5], [2, 5], [5, 2]]
    inputs = make_inputs(schedule, seed=3)
    unapply_all()
    ref = Harness(sgl)
    ref_outs = [[o.clone() for o in ref.forward(s, hs)] for s, hs in zip(schedule, inputs)]
    h = Harness(sgl)
    ring = _attach_spec_ring(h)
    apply(m2d.PATCHES + spec_commit.PATCHES)
    from sglang_replayssm.patches import lifecycle

    try:
        for t, (slots, hs) in enumerate(zip(schedule, inputs)):
            outs = h.forward(slots, hs)
            live = [i for i, s in enumerate(slots) if s > 0]
            for lo, ro in zip(outs, ref_outs[t]):
                torch.testing.assert_close(lo[live], ro[live], rtol=3e-4, atol=3e-4, msg=f"step {t}")
            check_spec_cursors(ring.write_pos, ring.origin, ring.flush, window=D, ring_len=ring.ring_len,
                               slots=[2, 5])
        lifecycle.fold_slots(h.pool.mamba_pool, torch.tensor([2, 5]))
        torch.testing.assert_close(h.temporal[:, [2, 5]], ref.temporal[:, [2, 5]], rtol=3e-4, atol=3e-4)
    finally:
        lifecycle.clear_layer_params(ring)


def test_commit_without_spec_ring_is_sglangs(sgl):
    """No ring, or a standard-decode ring: the commit hook calls SGLang's scatter unchanged."""
    for attach in (False, True):
        unapply_all()
        h = Harness(sgl, spec_tokens=D)
        if attach:
            h.attach_ring(4)
        apply(spec_commit.PATCHES)
        inter = h.pool.mamba_pool.mamba_cache.intermediate_ssm
        inter.copy_(torch.randn(inter.shape))
        h.set_metadata([3, 1], verify_tokens=D)
        _hybrid(sgl, h).update_mamba_state_after_mtp_verify(torch.tensor([1, 0]), None, None, None)
        assert torch.equal(h.temporal[:, 3], inter[:, 0, 1]) and torch.equal(h.temporal[:, 1], inter[:, 1, 0])


TRACK = {2: 1, 4: 3, 5: 6}   # live slot -> its track slot (SGLang's ping-pong slot for this verify)


def track_plan(schedule, accepts, seed=13):
    """Per step: SGLang's ``mamba_track_indices`` and ``mamba_steps_to_track`` for the rows (a random window step
    of the accepted ones, or -1: no boundary crossed; padded rows -1), with the first and the last accepted step
    each forced once."""
    gen = torch.Generator().manual_seed(seed)
    plan = []
    for t, (slots, acc) in enumerate(zip(schedule, accepts)):
        idx, steps = [], []
        for s, a in zip(slots, acc.tolist()):
            idx.append(TRACK.get(s, -1))
            if s <= 0 or a <= 0 or int(torch.randint(0, 3, (1,), generator=gen)) == 0:
                steps.append(-1)
            else:
                steps.append({1: 0, 2: a - 1}.get(t, int(torch.randint(0, a, (1,), generator=gen))))
        plan.append((torch.tensor(idx, dtype=torch.int64), torch.tensor(steps, dtype=torch.int64)))
    return plan


def check_tracked_states(schedule, ref, got, plan, tol):
    """Each step's conv states (live and track slots) equal SGLang's, and every track slot the plan names holds
    stock's state; returns (track slots checked, of them on verifies that folded the history)."""
    tracked = on_flush = 0
    for t, (slots, r, g, (idx, steps)) in enumerate(zip(schedule, ref, got, plan)):
        assert torch.equal(g["conv"], r["conv"]), f"step {t}: conv (live and track slots) differs from SGLang's"
        for s, d, st in zip(slots, idx.tolist(), steps.tolist()):
            if st < 0:
                continue
            tracked += 1
            on_flush += int(g["flags"][s])
            torch.testing.assert_close(g["temporal"][:, d], r["temporal"][:, d], rtol=tol, atol=tol,
                                       msg=f"step {t} slot {s} -> track {d} (window step {st})")
    return tracked, on_flush


def _run_tracked(sgl, schedule, inputs, accepts, plan, patched):
    unapply_all()
    h = Harness(sgl, spec_tokens=D)
    hb = _hybrid(sgl, h)
    ring = None
    if patched:
        ring = _attach_spec_ring(h)
        ring.write_pos[list(TRACK.values())] = 2       # stale cursors a recycled track slot may carry
        ring.origin[list(TRACK.values())] = 5
        apply(m2d.PATCHES + spec_commit.PATCHES)
    trace = []
    for slots, hs, acc, (idx, steps) in zip(schedule, inputs, accepts, plan):
        flags = None if ring is None else ring.flush.clone()
        h.forward(slots, hs, verify_tokens=D)
        hb.update_mamba_state_after_mtp_verify((acc - 1).to(torch.int64), idx, steps, None)
        trace.append(dict(temporal=h.temporal.clone(), conv=h.conv.clone(), flags=flags))
        if ring is not None:
            tracked = [int(i) for i, st in zip(idx, steps) if st >= 0]
            assert not ring.write_pos[tracked].any() and not ring.origin[tracked].any()
            check_spec_cursors(ring.write_pos, ring.origin, ring.flush, window=D, ring_len=ring.ring_len,
                               slots=[s for s in slots if s > 0])
    return trace, h, ring


def test_extra_buffer_track_states_match_sglang(sgl):
    """extra_buffer under speculation: SGLang hands the commit a track slot and a window step per row; stock
    scatters that step's snapshot and conv window into the track slot.  On the ring the track slot must hold the
    same state (checkpoint + ring up to that step, folded; conv from SGLang's scatter), on steps whose verify
    folded the history and on steps that did not, at the first and the last accepted step, while the live slots
    go on exactly as without tracking."""
    inputs = make_inputs(SCHEDULE, tokens_per_row=D)
    accepts = _accepts(SCHEDULE)
    plan = track_plan(SCHEDULE, accepts)
    ref, _, _ = _run_tracked(sgl, SCHEDULE, inputs, accepts, plan, patched=False)
    got, h, ring = _run_tracked(sgl, SCHEDULE, inputs, accepts, plan, patched=True)
    plain, _, _ = _run(sgl, SCHEDULE, inputs, accepts, patched=True)
    try:
        for t, (slots, g, p) in enumerate(zip(SCHEDULE, got, plain)):
            live = [s for s in slots if s > 0]
            torch.testing.assert_close(g["temporal"][:, live], p["temporal"][:, live], rtol=0, atol=0,
                                       msg=f"step {t}: tracking changed a live slot's checkpoint")
        tracked, on_flush = check_tracked_states(SCHEDULE, ref, got, plan, tol=3e-4)
        assert tracked >= 15 and on_flush >= 3, (tracked, on_flush)
    finally:
        from sglang_replayssm.patches import lifecycle

        lifecycle.clear_layer_params(ring)


def test_tree_verify_call_goes_to_the_tree_seam(sgl, monkeypatch):
    """A verify call with parent indices (tree drafts, topk > 1) under a spec ring goes to the tree call, which
    refuses parents of the wrong shape naming retrieve_parent_token (the tree kernels' parity with SGLang's own
    tree path is tests/patches/test_spec_tree_mamba2.py)."""
    h = Harness(sgl, spec_tokens=D)
    _attach_spec_ring(h)
    apply(m2d.PATCHES)
    fb = h.set_metadata([3], verify_tokens=D)
    h.backend.forward_metadata.retrieve_parent_token = torch.zeros(1, D + 1, dtype=torch.int64)
    with pytest.raises(m2d.ReplayDecodeError, match=r"tree verify call .*retrieve_parent_token has shape \(1, 4\)"):
        h.layer(LAYER_IDS[0], make_inputs([[3]], tokens_per_row=D)[0][0], fb)


def test_spec_commit_is_a_seam_apart_from_the_checks():
    from sglang_replayssm.patches import launch_check_patches, replay_ring_patches

    seams = {p.target for p in replay_ring_patches()}
    assert spec_commit.TARGET in seams
    assert spec_commit.TARGET not in {p.target for p in launch_check_patches()}


@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_spec_commit_targets_exist_in_other_releases(version):
    """The commit method with its leading parameters, and the conv scatter it reuses, next to the
    backend's ``scatter_mamba_states_after_mtp_verify`` in that release."""
    from sglang_wheels import wheel_for

    from sglang_replayssm.patches.source_check import WheelSource, check, locate

    wheel = str(wheel_for(version))
    assert check(spec_commit.PATCHES, wheel, version) == []
    src = WheelSource(wheel)
    p2, w2 = locate(src, spec_commit.BACKEND_MODULE + "." + spec_commit.CONV_SCATTER)
    if p2 is None:  # not imported by the backend: beside its scatter_mamba_states_after_mtp_verify
        params, where = locate(src, spec_commit.BACKEND_MODULE + ".scatter_mamba_states_after_mtp_verify")
        assert params is not None, where
        module = where.split(":")[0][:-3].replace("/", ".")
        p2, w2 = locate(src, module + "." + spec_commit.CONV_SCATTER)
    assert p2 is not None and p2[:4] == ("dst", "src", "dst_indices_raw", "step_indices_raw"), w2
