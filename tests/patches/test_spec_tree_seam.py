"""The tree-speculation seam (patches/spec_tree.py; not applied by the launcher yet) with pure-torch stand-ins of
the tree kernels: the commit gathers the accepted path of SGLang's ``accept_index`` onto the replay ring and
moves the cursors as a chain commit of the path would, keeps SGLang's conv rollback with the last accepted node,
and leaves chains and ring-less pools to SGLang; the verify calls reach the tree kernels with the layer's ring,
cursors, slots and ``retrieve_parent_token`` as ``parents``."""

from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.kernels.spec_cursor import spec_commit_ref
from sglang_replayssm.patches import _cursor, spec_commit, spec_tree
from sglang_replayssm.patches.registry import apply, unapply_all
from sglang_replayssm.ring import make_ring

B_LEN, T, SLOTS, LAYERS = 6, 4, 7, 2


def commit_tree_stand_in(wp, origin, flush, slots, accepted, n_accept, rings, *, window, ring_len, null_slot=0,
                         layered=False):
    """Pure torch: copy logical wp+accepted[j] -> wp+j for j < n (read all, then write), then the chain rule;
    ``layered``: each ring carries a leading layer dimension."""
    R = ring_len
    if layered:
        rings = [r[i] for r in rings for i in range(r.shape[0])]
    for row, s in enumerate(slots.tolist()):
        if s < 0 or s == null_slot:
            continue
        n = int(n_accept[row])
        base = int(origin[s]) + int(wp[s])
        src = [(base + int(v)) % R for v in accepted[row, :n].tolist()]
        dst = [(base + j) % R for j in range(n)]
        for r in rings:
            vals = r[s][:, src].clone()
            r[s][:, dst] = vals
    spec_commit_ref(wp, origin, flush, slots, n_accept, window=window, ring_len=R, null_slot=null_slot)


def conv_scatter_stand_in(dst, src, slots, steps):
    """SGLang's fused_conv_window_scatter_with_mask: dst[:, slot_i] = src[:, i, step_i] where step_i >= 0."""
    for i, (s, st) in enumerate(zip(slots.tolist(), steps.tolist())):
        if st >= 0 and s >= 0:
            dst[:, s] = src[:, i, st]


class Mode:
    def __init__(self, idle=False):
        self.idle = idle

    def is_idle(self):
        return self.idle


def _setup(monkeypatch, topk=2, ring=True, wp=None, flush=None):
    r = make_ring("mamba2", LAYERS, SLOTS, spec_window=T, nheads=2, head_dim=3, dstate=4, ngroups=1,
                  buffer_len=B_LEN) if ring else None
    conv = torch.zeros(LAYERS, SLOTS, 5, 3)
    windows = torch.randn(LAYERS, 4, T, 5, 3)
    pool = SimpleNamespace(**({_cursor.RING_ATTR: r} if ring else {}))
    req_pool = SimpleNamespace(mamba_pool=pool, get_speculative_mamba2_params_all_layers=lambda: SimpleNamespace(
        conv=[conv], intermediate_conv_window=[windows]))
    slots = torch.tensor([3, 5, -1, 1], dtype=torch.int32)  # row 2 is padding
    lin = SimpleNamespace(topk=topk, req_to_token_pool=req_pool,
                          forward_metadata=SimpleNamespace(mamba_cache_indices=slots))
    worker = SimpleNamespace(model_runner=SimpleNamespace(req_to_token_pool=req_pool,
                                                          attn_backend=SimpleNamespace(linear_attn_backend=lin)))
    monkeypatch.setitem(spec_tree._IMPL, "spec_commit_tree", commit_tree_stand_in)
    monkeypatch.setattr(spec_commit, "_conv_scatter", lambda: conv_scatter_stand_in)
    if r is not None:
        R = r.ring_len
        if wp is not None:
            r.write_pos.copy_(torch.tensor(wp, dtype=torch.int32))
        if flush is not None:
            r.flush.copy_(torch.tensor(flush, dtype=torch.int32))
        r.origin.copy_(torch.tensor([0, 2, 0, R - 3, 0, R - 1, 0], dtype=torch.int32))  # some windows wrap
        for name, t in r.tensors.items():  # entry value: 1000 * layer + 100 * slot + physical position
            pos = torch.arange(R, dtype=torch.float32)
            for layer in range(LAYERS):
                for s in range(SLOTS):
                    view = t[layer, s]
                    view.copy_((1000 * layer + 100 * s + pos).view(*([1] * (view.dim() - 1) if name == "dt" else [1]),
                                                                  *([R] if name == "dt" else [R, 1])).expand_as(view))
    return r, conv, windows, slots, worker


def test_tree_commit_gathers_the_accepted_path_and_moves_the_cursors(monkeypatch):
    r, conv, windows, slots, worker = _setup(monkeypatch, wp=[0, 0, 0, 2, 0, 5, 0], flush=[0, 1, 0, 0, 0, 1, 0])
    R = r.ring_len
    # SGLang's accept_index: flat b*T + node, root first, -1 padded; accept_lens = accepted drafts + 1
    paths = {0: [0, 2, 3], 1: [0, 1], 2: [0], 3: [0, 1, 2, 3]}
    accept_index = torch.full((4, T), -1, dtype=torch.int32)
    for b, p in paths.items():
        accept_index[b, :len(p)] = torch.tensor(p, dtype=torch.int32) + b * T
    accept_lens = torch.tensor([len(paths[b]) for b in range(4)], dtype=torch.int32)
    before = {name: t.clone() for name, t in r.tensors.items()}
    wp0, org0, fl0 = r.write_pos.clone(), r.origin.clone(), r.flush.clone()
    called = []
    batch = SimpleNamespace(forward_mode=Mode(), mamba_track_indices=None)
    out = spec_tree.commit_tree_around(lambda *a, **k: called.append(a), worker, batch, accept_lens, accept_index, T)
    assert out is None and not called  # SGLang's commit (snapshot scatter) is not reached
    for b, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        base = int(org0[s]) + int(wp0[s])
        for layer in range(LAYERS):
            for name in r.tensors:
                got = (r.tensors[name][layer, s][0] if name == "dt" else r.tensors[name][layer, s][0, :, 0])
                old = (before[name][layer, s][0] if name == "dt" else before[name][layer, s][0, :, 0])
                for j, node in enumerate(paths[b]):  # the j-th accepted node now sits right after the history
                    assert got[(base + j) % R] == old[(base + node) % R], (b, layer, name, j)
                touched = {(base + j) % R for j in range(len(paths[b]))}
                assert all(got[i] == old[i] for i in range(R) if i not in touched)
    # cursors: a chain commit of len(path) tokens per live row; padded row and other slots untouched
    wp_ref, org_ref, fl_ref = wp0.clone(), org0.clone(), fl0.clone()
    spec_commit_ref(wp_ref, org_ref, fl_ref, slots, accept_lens, window=T, ring_len=R, null_slot=0)
    assert torch.equal(r.write_pos, wp_ref) and torch.equal(r.origin, org_ref) and torch.equal(r.flush, fl_ref)
    assert int(r.write_pos[3]) == 2 + 3 and int(r.write_pos[5]) == 2 and int(r.origin[5]) == (R - 1 + 5) % R
    # conv rollback: the window of the last accepted node of each live row
    for b, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(conv[:, s], windows[:, b, paths[b][-1]])
    assert torch.equal(conv[:, [0, 2, 4, 6]], torch.zeros_like(conv[:, [0, 2, 4, 6]]))


def test_the_real_tree_commit_kernel_matches_the_stand_in(monkeypatch):
    """The same commit through ``kernels.spec_tree.spec_commit_tree`` (Triton interpreter), when it is there."""
    real = pytest.importorskip("sglang_replayssm.kernels.spec_tree").spec_commit_tree
    accept_index = torch.tensor([[0, 1, 3, -1], [4, 6, 7, -1], [-1, -1, -1, -1], [12, 13, -1, -1]], dtype=torch.int32)
    accept_lens = torch.tensor([3, 3, 1, 2], dtype=torch.int32)
    batch = SimpleNamespace(forward_mode=Mode(), mamba_track_indices=None)
    results = []
    for impl in (commit_tree_stand_in, real):
        torch.manual_seed(0)  # the same conv windows for both
        r, conv, _, _, worker = _setup(monkeypatch, wp=[0, 0, 0, 2, 0, 5, 0], flush=[0, 1, 0, 0, 0, 1, 0])
        monkeypatch.setitem(spec_tree._IMPL, "spec_commit_tree", impl)
        spec_tree.commit_tree_around(None, worker, batch, accept_lens, accept_index, T)
        results.append(({k: t.clone() for k, t in r.tensors.items()}, [c.clone() for c in r.verify_cursors], conv))
    (ra, ca, conva), (rb, cb, convb) = results
    assert all(torch.equal(ra[k], rb[k]) for k in ra) and all(torch.equal(x, y) for x, y in zip(ca, cb))
    assert torch.equal(conva, convb)


def test_commit_inputs_from_sglangs_accept_index():
    accept_index = torch.tensor([[0, 1, 3, -1], [4, 6, -1, -1], [-1, -1, -1, -1]], dtype=torch.int32)
    accepted, n, last = spec_tree.tree_commit_inputs(torch.tensor([3, 2, 0]), accept_index, 4)
    assert accepted[0].tolist() == [0, 1, 3, 0] and accepted[1, :2].tolist() == [0, 2]
    assert n.tolist() == [3, 2, 0] and last.tolist() == [3, 2, -1]


def test_chains_ringless_pools_and_idle_batches_are_sglangs(monkeypatch):
    args = (torch.tensor([2]), torch.tensor([[0, 1, -1, -1]], dtype=torch.int32), T)
    for kw in (dict(topk=1), dict(ring=False)):
        _, conv, _, _, worker = _setup(monkeypatch, **kw)
        seen = []
        batch = SimpleNamespace(forward_mode=Mode(), mamba_track_indices=None)
        assert spec_tree.commit_tree_around(lambda *a: seen.append(a) or "stock", worker, batch, *args) == "stock"
        assert seen and seen[0][0] is worker and seen[0][2] is args[0]
    r, conv, _, _, worker = _setup(monkeypatch)
    wp = r.write_pos.clone()
    idle = SimpleNamespace(forward_mode=Mode(idle=True), mamba_track_indices=None)
    assert spec_tree.commit_tree_around(lambda *a: pytest.fail("called"), worker, idle, *args) is None
    assert torch.equal(r.write_pos, wp) and not conv.any()


def test_oversized_windows_are_refused(monkeypatch):
    """(Tracking under a tree, the extra_buffer strategy, is served: test_spec_tree_mamba2.py.)"""
    _, _, _, _, worker = _setup(monkeypatch)
    args = (torch.tensor([2]), torch.tensor([[0, 1, -1, -1]], dtype=torch.int32))
    batch = SimpleNamespace(forward_mode=Mode(), mamba_track_indices=None)
    with pytest.raises(_cursor.ReplayDecodeError, match="--replayssm-buffer-len"):
        spec_tree.commit_tree_around(None, worker, batch, *args, T + 1)


# --------------------------------------------------------------------------------
# verify routing
# --------------------------------------------------------------------------------
def _mamba2_ctx(ring, state, slots, layer=1):
    return _cursor.LayerContext(ring_views=ring.layer(layer), slots=slots, wp_rows=None, state_ptr=state.data_ptr(),
                                num_slots=state.shape[0], pool_idx=layer, layer_id=7, mode="verify",
                                spec=ring.verify_cursors)


def test_mamba2_tree_verify_call_reaches_the_kernel_with_the_rings_and_parents(monkeypatch):
    ring = make_ring("mamba2", LAYERS, SLOTS, spec_window=T, nheads=2, head_dim=3, dstate=4, ngroups=1,
                     buffer_len=B_LEN)
    state = torch.zeros(SLOTS, 2, 3, 4)
    slots = torch.tensor([3, 5], dtype=torch.int32)
    parents = torch.tensor([[0, 0, 0, 1], [0, 0, 1, 2], [9, 9, 9, 9]], dtype=torch.int32)
    seen = {}

    def kernel(state_, x_ring, B_ring, dt_ring, x, dt, A, B, C, idx, wp, origin, flush, *, parents, out, **kw):
        seen.update(x_ring=x_ring, wp=wp, origin=origin, flush=flush, parents=parents, idx=idx, kw=kw)
        out.fill_(1.0)

    monkeypatch.setitem(spec_tree._IMPL, "mamba2_tree_verify", kernel)
    ctx = _mamba2_ctx(ring, state, slots)
    a = dict(state=state, x=torch.randn(2, T, 2, 3), dt=torch.randn(2, T, 2, 3), A=torch.randn(2, 3, 4),
             B=torch.randn(2, T, 1, 4), C=torch.randn(2, T, 1, 4), D=torch.ones(2, 3), z=None,
             dt_bias=torch.zeros(2, 3),
             dt_softplus=True, state_batch_indices=slots, pad_slot_id=-1, out=torch.zeros(2, T, 2, 3),
             disable_state_update=True, intermediate_states_buffer=torch.zeros(0), cache_steps=T,
             retrieve_parent_token=parents, intermediate_state_indices=torch.arange(2))
    spec_tree.mamba2_tree_verify_call(a, ctx)
    assert ctx.calls == 1 and bool((a["out"] == 1).all())
    assert seen["x_ring"].data_ptr() == ring.tensors["x"][1].data_ptr()  # pool layer 1's ring
    assert seen["wp"] is ring.write_pos and seen["origin"] is ring.origin and seen["flush"] is ring.flush
    assert seen["idx"] is slots and torch.equal(seen["parents"], parents[:2])
    assert seen["kw"]["null_slot"] == _cursor.NULL_SLOT and seen["kw"]["dt_softplus"] is True
    for bad, needle in ((dict(retrieve_parent_token=parents[:, :3]), "expected (2, 4)"),
                        (dict(disable_state_update=False), "not SGLang's target-verify call"),
                        (dict(state_batch_indices=slots.clone()), "decode-row slots")):
        with pytest.raises(_cursor.ReplayDecodeError) as e:
            spec_tree.mamba2_tree_verify_call({**a, **bad}, ctx)
        assert "layer_id 7: unexpected tree verify call" in str(e.value) and needle in str(e.value)
    assert ctx.calls == 1


def test_gdn_tree_verify_call_packs_qkv_and_returns_sglangs_layout(monkeypatch):
    from sglang_replayssm.ring import GDNRingGeometry

    g = GDNRingGeometry(num_k_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=3, buffer_len=B_LEN)
    ring = make_ring("gdn", LAYERS, SLOTS, spec_window=T, num_k_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=3,
                     buffer_len=B_LEN)
    state = torch.zeros(SLOTS, 2, 3, 4)
    slots = torch.tensor([2, 4, -1], dtype=torch.int32)
    bs, seq = 3, 3 * T
    q, k, v = torch.randn(1, seq, 1, 4), torch.randn(1, seq, 1, 4), torch.randn(1, seq, 2, 3)
    parents = torch.tensor([[0, 0, 1, 1]] * bs, dtype=torch.int32)
    seen = {}

    def kernel(mixed, a, b, A_log, dt_bias, state_, d, k_ring, g_ring, idx, wp, origin, flush, *, parents, out, **kw):
        seen.update(mixed=mixed, a=a, parents=parents, idx=idx, kw=kw, d=d)
        out.copy_(torch.arange(out.numel(), dtype=out.dtype).view_as(out))

    monkeypatch.setitem(spec_tree._IMPL, "gdn_tree_verify", kernel)
    ctx = _cursor.LayerContext(ring_views=ring.layer(0), slots=slots, wp_rows=None, state_ptr=state.data_ptr(),
                               num_slots=SLOTS, pool_idx=0, layer_id=3, geom=g, mode="verify", spec=ring.verify_cursors)
    out = spec_tree.gdn_tree_verify_call(ctx, torch.zeros(2), torch.zeros(2), q, k, v, torch.randn(seq, 2),
                                         torch.randn(seq, 2), ssm_states=state, cache_indices=slots, cache_steps=T,
                                         retrieve_parent_token=parents, scale=0.5, use_qk_l2norm=True)
    assert tuple(out.shape) == (1, seq, 2, 3) and ctx.calls == 1
    assert torch.equal(out.view(-1), torch.arange(seq * 6, dtype=out.dtype))
    assert tuple(seen["mixed"].shape) == (bs, T, 4 + 4 + 6) and tuple(seen["a"].shape) == (bs, T, 2)
    assert torch.equal(seen["mixed"][1, 2, :4], q[0, T + 2, 0])
    assert torch.equal(seen["mixed"][1, 2, 8:], v[0, T + 2].reshape(-1))
    assert torch.equal(seen["parents"], parents) and seen["kw"]["scale"] == 0.5 and seen["kw"]["round_beta"] is False
    assert seen["d"].data_ptr() == ring.tensors["d"][0].data_ptr()
    with pytest.raises(_cursor.ReplayDecodeError, match="does not divide"):
        spec_tree.gdn_tree_verify_call(ctx, None, None, q, k, v, None, None, ssm_states=state, cache_indices=slots,
                                       cache_steps=5, retrieve_parent_token=parents, scale=0.5, use_qk_l2norm=True)


# --------------------------------------------------------------------------------
# registry: the commit patch resolves against SGLang, reaches its by-name importers, is not applied by default
# --------------------------------------------------------------------------------
def test_commit_patch_is_a_replay_ring_seam_that_applies_and_propagates():
    import importlib

    from sglang_replayssm import patches

    names = [p.target for p in patches.active_patches(True)]
    assert spec_tree.COMMIT_TARGET in names and spec_tree.COMMIT_TARGET not in \
        [p.target for p in patches.active_patches(False)]
    assert names.index(spec_tree.COMMIT_TARGET) < names.index(spec_commit.TARGET)
    spec_utils = importlib.import_module("sglang.srt.speculative.spec_utils")
    worker_common = importlib.import_module("sglang.srt.speculative.eagle_worker_common")
    stock = spec_utils.commit_mamba_states_after_verify
    try:
        assert apply(spec_tree.PATCHES) == [spec_tree.COMMIT_TARGET]
        assert spec_utils.commit_mamba_states_after_verify is not stock
        assert worker_common.commit_mamba_states_after_verify is spec_utils.commit_mamba_states_after_verify
        assert spec_utils.commit_mamba_states_after_verify.__wrapped__ is stock
    finally:
        unapply_all()
    assert spec_utils.commit_mamba_states_after_verify is stock
    assert worker_common.commit_mamba_states_after_verify is stock
