"""Tree speculative verify + commit on the Mamba2 spec ring against SGLang 0.5.17's own tree path, on CPU.

Stock: ``Mamba2AttnBackend.forward`` in TARGET_VERIFY mode with SGLang's tree metadata
(``retrieve_next_token`` / ``retrieve_next_sibling``; its fused tree conv kernel fills ``retrieve_parent_token``,
its ``selective_state_update`` keeps one state snapshot per tree node), then
``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify`` with the last accepted node.
Ours: the same forwards with the Mamba2 verify seam wired for trees as ``docs/tree-speculation.md`` describes
(a verify call with ``retrieve_parent_token`` goes to ``spec_tree.mamba2_tree_verify_call``), and the commit
through ``spec_tree.commit_tree_around`` with SGLang's ``accept_index``.  The tree kernels are the kernels
package's pure-torch references (``mamba2_tree_verify_ref``, ``spec_commit_tree_ref``) and, when importable,
the Triton kernels themselves.  Every node's output, the conv state, each flushed checkpoint and the final
state (the ring folded) must equal SGLang's.  Harness and CPU shims: ``test_mamba2_decode``.
"""


from types import SimpleNamespace

import pytest
import torch

from test_mamba2_decode import LAYER_IDS, MAMBA_SIZE, Harness, _clean, make_inputs, sgl  # noqa: F401
from test_mamba2_decode import G, H, N, P

from sglang_replayssm.kernels.spec_cursor import check_spec_cursors
from sglang_replayssm.patches import mamba2_decode as m2d
from sglang_replayssm.patches import spec_tree
from sglang_replayssm.patches.registry import apply, unapply_all, verify
from sglang_replayssm.ring import Mamba2RingGeometry, ReplayRing

T = 4          # tree nodes per verify (root included): --speculative-num-draft-tokens
HIST = 5       # history block B: ring length R = 9
SCHEDULE = [[2], [2, 5], [5, 2, -1], [2, 5], [4, 2, 5], [2, 5, 4, -1], [4, 2, 5], [5, 4, 2], [2, 4, 5],
            [4, 5, 2, -1], [2, 5, 4]]


def _trees(schedule, seed=11):
    """Per step: parents [rows, T] (each node's parent an earlier node) and an accepted root path per row."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for slots in schedule:
        parents = torch.full((len(slots), T), -1, dtype=torch.int64)
        paths = []
        for r in range(len(slots)):
            for s in range(1, T):
                parents[r, s] = int(torch.randint(0, s, (1,), generator=gen))
            path = [0]
            while True:
                kids = [s for s in range(1, T) if int(parents[r, s]) == path[-1]]
                if not kids or int(torch.randint(0, 3, (1,), generator=gen)) == 0:
                    break
                path.append(kids[int(torch.randint(0, len(kids), (1,), generator=gen))])
            paths.append(path if slots[r] > 0 else [])
        out.append((parents, paths))
    return out


def _links(parents):
    """SGLang's ``retrive_next_token`` (first child) / ``retrive_next_sibling`` (next child of the same parent,
    increasing, as its tree conv kernel walks them) of a parents tensor."""
    nxt = torch.full(parents.shape, -1, dtype=torch.int32)
    sib = torch.full(parents.shape, -1, dtype=torch.int32)
    for r in range(parents.shape[0]):
        for node in range(T):
            kids = [s for s in range(1, T) if int(parents[r, s]) == node]
            if kids:
                nxt[r, node] = kids[0]
                for a, b in zip(kids, kids[1:]):
                    sib[r, a] = b
    return nxt, sib


def _tree_forward(h, slots, hs, parents):
    fb = h.set_metadata(slots, verify_tokens=T)
    md = h.backend.forward_metadata
    md.retrieve_next_token, md.retrieve_next_sibling = _links(parents)
    md.retrieve_parent_token = torch.full((len(slots), T), 7, dtype=torch.int32)  # stale: the conv kernel fills it
    return [h.layer(lid, x, fb).clone() for lid, x in zip(LAYER_IDS, hs)]


def _wired_patches():
    """The Mamba2 seams as the launcher applies them (a verify call carrying retrieve_parent_token goes to the
    tree call)."""
    return list(m2d.PATCHES)


def _accept(paths):
    accept_index = torch.full((len(paths), T), -1, dtype=torch.int32)
    for b, p in enumerate(paths):
        if p:
            accept_index[b, :len(p)] = torch.tensor(p, dtype=torch.int32) + b * T
    return torch.tensor([len(p) for p in paths], dtype=torch.int32), accept_index


class _Mode:
    def is_idle(self):
        return False


def _run(sgl, inputs, trees, patched, tracks=None):
    """``tracks``: per step ``(seq_lens, track slots)`` for the extra_buffer strategy (SGLang derives the tracked
    node from them, ``spec_utils._verify_commit_step_indices``), or None."""
    unapply_all()
    h = Harness(sgl, spec_tokens=T)
    hb = object.__new__(sgl.hlab.HybridLinearAttnBackend)
    hb.linear_attn_backend = h.backend
    ring = None
    if patched:
        ring = ReplayRing(Mamba2RingGeometry(H, P, N, G, HIST, act_dtype=torch.float32),
                          num_layers=len(LAYER_IDS), num_slots=MAMBA_SIZE + 1, spec_window=T)
        setattr(h.pool.mamba_pool, m2d.RING_ATTR, ring)
        h.backend.topk = 2
        patches = _wired_patches()
        apply(patches)
        verify(patches)
    from types import SimpleNamespace

    worker = SimpleNamespace(model_runner=SimpleNamespace(req_to_token_pool=h.pool, attn_backend=hb))
    batch = SimpleNamespace(forward_mode=_Mode(), mamba_track_indices=None)
    trace = []
    for step, (slots, hs, (parents, paths)) in enumerate(zip(SCHEDULE, inputs, trees)):
        flags = None if ring is None else ring.flush.clone()
        outs = _tree_forward(h, slots, hs, parents)
        accept_lens, accept_index = _accept(paths)
        if tracks is not None:
            batch = SimpleNamespace(forward_mode=_Mode(), seq_lens=tracks[step][0], mamba_track_indices=tracks[step][1],
                                    tree_cache=SimpleNamespace(page_size=1))   # 0.5.23 reads the track grid there
        if ring is None:
            last = torch.tensor([p[-1] if p else -1 for p in paths], dtype=torch.int64)
            nodes = None
            if tracks is not None:
                from sglang.srt.speculative.spec_utils import _verify_commit_step_indices

                _, nodes = _verify_commit_step_indices(batch=batch, accept_index=accept_index,
                                                       accept_lens=accept_lens, draft_token_num=T)
            hb.update_mamba_state_after_mtp_verify(last, batch.mamba_track_indices, nodes, None)
        else:
            spec_tree.commit_tree_around(lambda *a: pytest.fail("SGLang's commit reached"), worker, batch,
                                         accept_lens, accept_index, T)
            check_spec_cursors(ring.write_pos, ring.origin, ring.flush, window=T, ring_len=ring.ring_len,
                               slots=[s for s in slots if s > 0])
        trace.append(dict(outs=outs, temporal=h.temporal.clone(), conv=h.conv.clone(), flags=flags))
    return trace, h, ring


def _kernel_sets():
    from sglang_replayssm.kernels.mamba2_verify_ref import mamba2_tree_verify_ref
    from sglang_replayssm.kernels.spec_tree import spec_commit_tree, spec_commit_tree_ref

    sets = [pytest.param({"mamba2_tree_verify": mamba2_tree_verify_ref, "spec_commit_tree": spec_commit_tree_ref},
                         id="torch-references")]
    try:
        from sglang_replayssm.kernels.mamba2_verify import mamba2_tree_verify
    except ImportError:
        return sets
    return sets + [pytest.param({"mamba2_tree_verify": mamba2_tree_verify, "spec_commit_tree": spec_commit_tree},
                                id="triton-kernels", marks=pytest.mark.slow)]  # the interpreter: minutes


@pytest.mark.parametrize("impl", _kernel_sets())
def test_tree_verify_and_commit_match_sglangs_tree_path(sgl, monkeypatch, impl):
    for name, fn in impl.items():
        monkeypatch.setitem(spec_tree._IMPL, name, fn)
    inputs = make_inputs(SCHEDULE, tokens_per_row=T)
    trees = _trees(SCHEDULE)
    ref, _, _ = _run(sgl, inputs, trees, patched=False)
    got, h, ring = _run(sgl, inputs, trees, patched=True)
    flushes = 0
    last_ref_state = {}
    for t, (slots, r, g) in enumerate(zip(SCHEDULE, ref, got)):
        rows = [i for i, s in enumerate(slots) if s > 0]
        tok = [i * T + j for i in rows for j in range(T)]  # every node of every live row
        for lo, ro in zip(g["outs"], r["outs"]):
            torch.testing.assert_close(lo[tok], ro[tok], rtol=3e-4, atol=3e-4, msg=f"step {t}: tree node outputs")
        assert torch.equal(g["conv"], r["conv"]), f"step {t}: conv rollback differs from SGLang's"
        for s in (s for s in slots if s > 0):
            if int(g["flags"][s]):  # this verify folded slot s: checkpoint == SGLang's committed state before it
                flushes += 1
                torch.testing.assert_close(g["temporal"][:, s], last_ref_state[s], rtol=3e-4, atol=3e-4,
                                           msg=f"step {t} slot {s}: flushed checkpoint")
            last_ref_state[s] = r["temporal"][:, s]
    assert flushes >= 2, f"the schedule must cross flushes, saw {flushes}"
    assert any(len(p) > 1 and p != list(range(len(p))) for _, paths in trees for p in paths), \
        "some accepted path must leave the first-child chain"
    from sglang_replayssm.patches import lifecycle  # the finish fold of the committed paths = SGLang's state

    live = sorted({s for slots in SCHEDULE for s in slots if s > 0})
    try:
        lifecycle.fold_slots(h.pool.mamba_pool, torch.tensor(live))
        torch.testing.assert_close(h.temporal[:, live], ref[-1]["temporal"][:, live], rtol=3e-4, atol=3e-4)
    finally:
        lifecycle.clear_layer_params(ring)


TRACK_INTERVAL = 8   # > T: at most one boundary per verify
TRACK = {2: 1, 4: 3, 5: 6}


def track_interval(monkeypatch):
    """SGLang's track interval as TRACK_INTERVAL where its step-index function reads it: the runtime config
    (0.5.17) or ``mamba_track_grid(page_size)`` (0.5.23)."""
    from sglang.srt.speculative import spec_utils

    monkeypatch.setattr(spec_utils, "get_exec", lambda: SimpleNamespace(
        mamba=SimpleNamespace(mamba_track_interval=TRACK_INTERVAL)), raising=False)
    if hasattr(spec_utils, "mamba_track_grid"):
        monkeypatch.setattr(spec_utils, "mamba_track_grid", lambda page_size: TRACK_INTERVAL)


def _track_plan(trees, seed=17):
    """Per step, SGLang's ``seq_lens`` before the verify and the rows' track slots: a row whose accepted path
    crosses a multiple of TRACK_INTERVAL at path position p has ``seq_lens = k*I - p - 1``; the others start on a
    boundary and stay below the next.  Returns the plan and the expected tracked path positions."""
    gen = torch.Generator().manual_seed(seed)
    plan, want = [], []
    for slots, (_, paths) in zip(SCHEDULE, trees):
        seq, pos = [], []
        for s, path in zip(slots, paths):
            k = 1 + int(torch.randint(0, 5, (1,), generator=gen))
            if s > 0 and path and int(torch.randint(0, 3, (1,), generator=gen)) > 0:
                p = int(torch.randint(0, 2 * len(path), (1,), generator=gen))
                p = min(p, len(path) - 1)      # the last accepted node half of the time: most often off-chain
                seq.append(k * TRACK_INTERVAL - p - 1)
                pos.append(p)
            else:
                seq.append(k * TRACK_INTERVAL if s > 0 else 0)
                pos.append(-1)
        plan.append((torch.tensor(seq, dtype=torch.int64),
                     torch.tensor([TRACK.get(s, -1) for s in slots], dtype=torch.int64)))
        want.append(pos)
    return plan, want


def check_tree_tracked_states(ref, got, trees, want, ring, tol):
    """Each commit's conv states equal SGLang's; every tracked slot holds stock's snapshot of the tracked node,
    folded (cursors 0).  Returns (track slots checked, of them for nodes off the first-child chain)."""
    tracked = off_chain = 0
    for t, (slots, r, g, (_, paths), pos) in enumerate(zip(SCHEDULE, ref, got, trees, want)):
        assert torch.equal(g["conv"], r["conv"]), f"step {t}: conv (live and track slots) differs from SGLang's"
        for s, path, p in zip(slots, paths, pos):
            if p < 0:
                continue
            tracked += 1
            off_chain += int(path[p] != p)
            d = TRACK[s]
            torch.testing.assert_close(g["temporal"][:, d], r["temporal"][:, d], rtol=tol, atol=tol,
                                       msg=f"step {t} slot {s} -> track {d} (path position {p}, node {path[p]})")
            assert int(ring.write_pos[d]) == 0 and int(ring.origin[d]) == 0
    return tracked, off_chain


def test_tree_extra_buffer_track_states_match_sglang(sgl, monkeypatch):
    """extra_buffer under tree speculation: SGLang's own step-index function picks the tracked node per row from
    ``seq_lens`` and the accepted paths; stock scatters that node's snapshot and conv window into the track slot.
    On the ring (the path gathered by the tree commit) the track slot must hold the same state, for nodes off the
    first-child chain too, with stale cursors in the recycled track slots."""
    from sglang_replayssm.kernels.mamba2_verify_ref import mamba2_tree_verify_ref
    from sglang_replayssm.kernels.spec_tree import spec_commit_tree_ref

    monkeypatch.setitem(spec_tree._IMPL, "mamba2_tree_verify", mamba2_tree_verify_ref)
    monkeypatch.setitem(spec_tree._IMPL, "spec_commit_tree", spec_commit_tree_ref)
    track_interval(monkeypatch)
    inputs = make_inputs(SCHEDULE, tokens_per_row=T)
    trees = _trees(SCHEDULE)
    plan, want = _track_plan(trees)
    ref, _, _ = _run(sgl, inputs, trees, patched=False, tracks=plan)
    got, h, ring = _run(sgl, inputs, trees, patched=True, tracks=plan)
    try:
        tracked, off_chain = check_tree_tracked_states(ref, got, trees, want, ring, tol=3e-4)
        assert tracked >= 10 and off_chain >= 2, (tracked, off_chain)
    finally:
        from sglang_replayssm.patches import lifecycle

        lifecycle.clear_layer_params(ring)


def test_path_position():
    accepted = torch.tensor([[0, 2, 3, 0], [0, 1, 0, 0], [0, 0, 0, 0]])
    n = torch.tensor([3, 2, 0])
    assert spec_tree.path_position(accepted, n, torch.tensor([3, 1, 0])).tolist() == [2, 1, -1]
    assert spec_tree.path_position(accepted, n, torch.tensor([-1, 3, -1])).tolist() == [-1, -1, -1]
    assert spec_tree.path_position(accepted, n, torch.tensor([0, 0, 0])).tolist() == [0, 0, -1]
