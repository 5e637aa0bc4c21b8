"""Tree speculative verify + commit on the GDN spec ring against SGLang 0.5.17's own tree path, on CPU.

Stock: ``HybridLinearAttnBackend.forward`` -> ``GDNAttnBackend.forward_extend`` in TARGET_VERIFY mode with
SGLang's tree metadata (its conv update walks ``retrieve_next_token`` / ``retrieve_next_sibling`` and fills
``retrieve_parent_token``; ``GDNKernelDispatcher.target_verify`` keeps one state snapshot per node), then
``update_mamba_state_after_mtp_verify`` with the last accepted node.  Ours: the GDN verify seam wired for trees
as ``docs/tree-speculation.md`` describes (a ``target_verify`` call with ``retrieve_parent_token`` goes to
``spec_tree.gdn_tree_verify_call``) and the commit through ``spec_tree.commit_tree_around``.  The tree kernels
are the kernels package's pure-torch references and, when importable, the Triton kernels.  Every node's output,
the conv state, each flushed checkpoint and the final state (ring folded) must equal SGLang's.  Harness and
CPU shims: ``test_gdn_decode`` and ``test_spec_gdn``.
"""

import types

import pytest
import torch

from test_gdn_decode import HK, HV, K, LAYER_IDS, MAMBA_SIZE, QKV, V, Harness, _clean, sgl  # noqa: F401
from test_spec_gdn import _verify_shims  # noqa: F401  (CPU twins of SGLang's post-verify scatters)
from test_spec_tree_mamba2 import (SCHEDULE, T, _accept, _links, _Mode, _track_plan, _trees,
                                   check_tree_tracked_states, track_interval)

from sglang_replayssm.kernels.spec_cursor import check_spec_cursors
from sglang_replayssm.patches import gdn_decode as gdn
from sglang_replayssm.patches import spec_tree
from sglang_replayssm.patches.registry import apply, unapply_all, verify
from sglang_replayssm.ring import GDNRingGeometry, ReplayRing

HIST = 5


class TreeHarness(Harness):
    """The GDN harness with SGLang's verify scratch for T tree nodes (per-node snapshots and conv windows)."""

    def __init__(self, sgl, **kw):
        super().__init__(sgl, **kw)
        from sglang.srt.mem_cache.memory_pool import MambaPool

        cache = self.pool.mamba_pool.mamba_cache
        nl, ns = cache.temporal.shape[:2]
        self.pool.mamba_pool.mamba_cache = MambaPool.SpeculativeState(
            conv=cache.conv, temporal=cache.temporal,
            intermediate_ssm=torch.zeros((nl, ns, T) + tuple(cache.temporal.shape[2:])),
            intermediate_conv_window=[torch.zeros((nl, ns, T) + tuple(c.shape[2:]), dtype=c.dtype)
                                      for c in cache.conv])
        self.backend.verify_intermediate_state_indices = torch.arange(MAMBA_SIZE + 1, dtype=torch.int32)

    def tree_forward(self, slots, inputs, parents):
        sgl = self.sgl
        bs = len(slots)
        nxt, sib = _links(parents)
        self.backend.forward_metadata = sgl.ForwardMetadata(
            query_start_loc=torch.arange(0, bs * T + 1, T, dtype=torch.int32),
            mamba_cache_indices=torch.tensor(slots, dtype=torch.int32), retrieve_next_token=nxt,
            retrieve_next_sibling=sib, retrieve_parent_token=torch.full((bs, T), 7, dtype=torch.int32))
        fb = types.SimpleNamespace(forward_mode=sgl.ForwardMode.TARGET_VERIFY, mamba_track_mask=None,
                                   logical_forward_mode=sgl.ForwardMode.TARGET_VERIFY, batch_size=bs,
                                   spec_info=types.SimpleNamespace(draft_token_num=T),
                                   req_pool_indices=torch.arange(bs))
        return [self.layer(lid, inp, fb).clone() for lid, inp in zip(LAYER_IDS, inputs)]


def _wired_patches():
    """The GDN seams as the launcher applies them (a verify call carrying retrieve_parent_token goes to the
    tree call)."""
    return list(gdn.PATCHES)


def make_tree_inputs(schedule, seed=13):
    gen = torch.Generator().manual_seed(seed)
    return [[(torch.randn(len(s) * T, QKV, generator=gen), torch.randn(len(s) * T, HV, generator=gen),
              torch.randn(len(s) * T, HV, generator=gen)) for _ in LAYER_IDS] for s in schedule]


def _run(sgl, inputs, trees, patched, tracks=None):
    """``tracks``: per step ``(seq_lens, track slots)`` for the extra_buffer strategy, or None."""
    unapply_all()
    h = TreeHarness(sgl)
    ring = None
    if patched:
        geom = GDNRingGeometry(HK, HV, K, V, HIST, act_dtype=h.act, state_dtype=torch.float32)
        ring = ReplayRing(geom, num_layers=len(LAYER_IDS), num_slots=MAMBA_SIZE + 1, spec_window=T)
        setattr(h.pool.mamba_pool, gdn.RING_ATTR, ring)
        h.backend.topk = 2
        patches = _wired_patches()
        apply(patches)
        verify(patches)
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(req_to_token_pool=h.pool, attn_backend=h.hybrid))
    batch = types.SimpleNamespace(forward_mode=_Mode(), mamba_track_indices=None)
    trace = []
    for step, (slots, inp, (parents, paths)) in enumerate(zip(SCHEDULE, inputs, trees)):
        flags = None if ring is None else ring.flush.clone()
        outs = h.tree_forward(slots, inp, parents)
        accept_lens, accept_index = _accept(paths)
        if tracks is not None:
            batch = types.SimpleNamespace(forward_mode=_Mode(), seq_lens=tracks[step][0],
                                          mamba_track_indices=tracks[step][1],
                                          tree_cache=types.SimpleNamespace(page_size=1))
        if ring is None:
            last = torch.tensor([p[-1] if p else -1 for p in paths], dtype=torch.int64)
            nodes = None
            if tracks is not None:
                from sglang.srt.speculative.spec_utils import _verify_commit_step_indices

                _, nodes = _verify_commit_step_indices(batch=batch, accept_index=accept_index,
                                                       accept_lens=accept_lens, draft_token_num=T)
            h.hybrid.update_mamba_state_after_mtp_verify(last, batch.mamba_track_indices, nodes, None)
        else:
            spec_tree.commit_tree_around(lambda *a: pytest.fail("SGLang's commit reached"), worker, batch,
                                         accept_lens, accept_index, T)
            check_spec_cursors(ring.write_pos, ring.origin, ring.flush, window=T, ring_len=ring.ring_len,
                               slots=[s for s in slots if s > 0])
        trace.append(dict(outs=outs, temporal=h.temporal.clone(), conv=h.conv.clone(), flags=flags))
    return trace, h, ring


def _kernel_sets():
    from sglang_replayssm.kernels.spec_tree import spec_commit_tree, spec_commit_tree_ref

    sets = []
    try:
        from sglang_replayssm.kernels.gdn_verify_ref import gdn_tree_verify_ref
    except ImportError:
        gdn_tree_verify_ref = None
    if gdn_tree_verify_ref is not None:
        sets.append(pytest.param({"gdn_tree_verify": gdn_tree_verify_ref, "spec_commit_tree": spec_commit_tree_ref},
                                 id="torch-references"))
    try:
        from sglang_replayssm.kernels.gdn_verify import gdn_tree_verify
    except ImportError:
        gdn_tree_verify = None
    if gdn_tree_verify is not None:
        sets.append(pytest.param({"gdn_tree_verify": gdn_tree_verify, "spec_commit_tree": spec_commit_tree},
                                 id="triton-kernels", marks=pytest.mark.slow))  # the interpreter: minutes
    return sets or [pytest.param(None, marks=pytest.mark.skip(reason="no GDN tree verify kernel in the package"))]


@pytest.mark.parametrize("impl", _kernel_sets())
def test_gdn_tree_verify_and_commit_match_sglangs_tree_path(sgl, monkeypatch, impl):
    for name, fn in impl.items():
        monkeypatch.setitem(spec_tree._IMPL, name, fn)
    inputs = make_tree_inputs(SCHEDULE)
    trees = _trees(SCHEDULE)
    ref, _, _ = _run(sgl, inputs, trees, patched=False)
    got, h, ring = _run(sgl, inputs, trees, patched=True)
    flushes = 0
    last = {}
    for t, (slots, r, g) in enumerate(zip(SCHEDULE, ref, got)):
        tok = [i * T + j for i, s in enumerate(slots) if s > 0 for j in range(T)]  # every node of every live row
        for lo, ro in zip(g["outs"], r["outs"]):
            lo, ro = lo.reshape(-1, HV * V), ro.reshape(-1, HV * V)
            torch.testing.assert_close(lo[tok], ro[tok], rtol=2e-3, atol=2e-3, msg=f"step {t}: tree node outputs")
        assert torch.equal(g["conv"], r["conv"]), f"step {t}: conv rollback differs from SGLang's"
        for s in (s for s in slots if s > 0):
            if int(g["flags"][s]):
                flushes += 1
                torch.testing.assert_close(g["temporal"][:, s], last[s], rtol=2e-3, atol=2e-3,
                                           msg=f"step {t} slot {s}: flushed checkpoint")
            last[s] = r["temporal"][:, s]
    assert flushes >= 2, f"saw {flushes} flushes"
    from sglang_replayssm.patches import lifecycle

    live = sorted({s for slots in SCHEDULE for s in slots if s > 0})
    try:
        lifecycle.fold_slots(h.pool.mamba_pool, torch.tensor(live))
        torch.testing.assert_close(h.temporal[:, live], ref[-1]["temporal"][:, live], rtol=2e-3, atol=2e-3)
    finally:
        lifecycle.clear_layer_params(ring)


def test_gdn_tree_extra_buffer_track_states_match_sglang(sgl, monkeypatch):
    """The GDN twin of ``test_spec_tree_mamba2.test_tree_extra_buffer_track_states_match_sglang``: every track
    slot SGLang names at a tree commit holds stock's snapshot of the tracked node, its conv window equal too."""
    from sglang_replayssm.kernels.gdn_verify_ref import gdn_tree_verify_ref
    from sglang_replayssm.kernels.spec_tree import spec_commit_tree_ref

    monkeypatch.setitem(spec_tree._IMPL, "gdn_tree_verify", gdn_tree_verify_ref)
    monkeypatch.setitem(spec_tree._IMPL, "spec_commit_tree", spec_commit_tree_ref)
    track_interval(monkeypatch)
    inputs = make_tree_inputs(SCHEDULE)
    trees = _trees(SCHEDULE)
    plan, want = _track_plan(trees)
    ref, _, _ = _run(sgl, inputs, trees, patched=False, tracks=plan)
    got, h, ring = _run(sgl, inputs, trees, patched=True, tracks=plan)
    try:
        tracked, _ = check_tree_tracked_states(ref, got, trees, want, ring, tol=2e-3)
        assert tracked >= 10, tracked
    finally:
        from sglang_replayssm.patches import lifecycle

        lifecycle.clear_layer_params(ring)
