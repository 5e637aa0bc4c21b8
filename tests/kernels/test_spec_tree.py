"""Tests of the tree-speculation helpers (``kernels/spec_tree.py``): the parents builder from
SGLang's retrive_next_token / retrive_next_sibling layout, the ancestor masks and the tree
commit (ring gather + cursor move) against its host reference."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernel_testlib import bits, make_gen
from test_mamba2_tree_verify import random_tree

from sglang_replayssm.kernels.spec_cursor import check_spec_cursors, spec_commit_ref
from sglang_replayssm.kernels.spec_tree import (_tree_ancestor_mask, chain_parents, check_tree_parents,
                                                parents_from_retrieve, spec_commit_tree, spec_commit_tree_ref,
                                                tree_ancestors, tree_path)


def retrieve_layout(par, gen=None):
    """SGLang's (next_token, next_sibling) rows of a tree given as parents: each node's children in
    increasing order (as build_tree_kernel_efficient lays them out) or, with ``gen``, in a random order."""
    T = len(par)
    nt, ns = [-1] * T, [-1] * T
    for p in range(T):
        kids = [c for c in range(1, T) if par[c] == p]
        if gen is not None and len(kids) > 1:
            kids = [kids[i] for i in torch.randperm(len(kids), generator=gen).tolist()]
        if kids:
            nt[p] = kids[0]
            for c0, c1 in zip(kids, kids[1:]):
                ns[c0] = c1
    return nt, ns


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_parents_from_retrieve_rebuilds_random_trees(device, dtype):
    gen, seed = make_gen()
    for T in (1, 2, 5, 8, 16):
        trees = [random_tree(T, gen) for _ in range(6)]
        lay = [retrieve_layout(p, gen if i % 2 else None) for i, p in enumerate(trees)]
        nt = torch.tensor([l[0] for l in lay], dtype=dtype, device=device)
        ns = torch.tensor([l[1] for l in lay], dtype=dtype, device=device)
        got = parents_from_retrieve(nt, ns)
        assert got.dtype == torch.int32 and got.device == nt.device
        assert got.cpu().tolist() == trees, f"[seed={seed}] T={T}: {got.cpu().tolist()} != {trees}"
        check_tree_parents(got)


def test_parents_from_retrieve_padded_rows_are_roots_only(device):
    nt = torch.full((2, 4), -1, dtype=torch.int32, device=device)
    nt[1, 0] = 1
    got = parents_from_retrieve(nt, torch.full_like(nt, -1))
    assert got.cpu().tolist() == [[-1, -1, -1, -1], [-1, 0, -1, -1]]


def test_parents_from_retrieve_matches_sglang_conv_kernel():
    """SGLang's own derivation (the fused parent computation of its tree-aware causal_conv1d_update, run in
    the interpreter) gives the same parents (its root reads 0; ours -1)."""
    try:
        from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update
    except Exception as e:  # pragma: no cover - depends on the installed SGLang
        pytest.skip(f"SGLang's causal_conv1d_update is not importable here: {e}")
    if torch.cuda.is_available():
        pytest.skip("run on the CPU interpreter copy of SGLang's kernel only")
    gen, seed = make_gen()
    T, dim, width = 8, 16, 4
    trees = [random_tree(T, gen) for _ in range(4)]
    lay = [retrieve_layout(p) for p in trees]
    nt = torch.tensor([l[0] for l in lay], dtype=torch.int32)
    ns = torch.tensor([l[1] for l in lay], dtype=torch.int32)
    batch = len(trees)
    rp = torch.full((batch, T), -7, dtype=torch.int32)
    idx = torch.arange(1, batch + 1, dtype=torch.int32)
    causal_conv1d_update(torch.randn(batch, dim, T, generator=gen), torch.randn(batch + 1, dim, width - 1 + T - 1),
                         torch.randn(dim, width, generator=gen), None, "silu", conv_state_indices=idx,
                         intermediate_conv_window=torch.zeros(batch + 1, T, dim, width - 1),
                         intermediate_state_indices=idx, retrieve_next_token=nt, retrieve_next_sibling=ns,
                         retrieve_parent_token=rp)
    ours = parents_from_retrieve(nt, ns)
    assert torch.equal(ours[:, 1:], rp[:, 1:]), f"[seed={seed}] ours {ours.tolist()} vs SGLang {rp.tolist()}"


def test_parents_from_retrieve_validation():
    with pytest.raises(ValueError, match="next_token must be an int32/int64"):
        parents_from_retrieve(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="must match"):
        parents_from_retrieve(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int32))


def test_ancestors_and_paths():
    par = torch.tensor([[-1, 0, 0, 1, 2, 1, 3], [-1, 0, 1, 2, 3, 4, 5]], dtype=torch.int32)
    anc = tree_ancestors(par)
    assert tree_path(par[0], 6) == [0, 1, 3, 6]
    assert tree_path(par[0], 4) == [0, 2, 4]
    for b in range(2):
        for s in range(7):
            assert anc[b, s].nonzero().flatten().tolist() == tree_path(par[b], s)
    assert torch.equal(chain_parents(2, 7), par[1:2].expand(2, 7))
    with pytest.raises(AssertionError, match="root"):
        check_tree_parents(torch.tensor([[0, 0]]))
    with pytest.raises(AssertionError, match=r"parents\[0, 2\] = 2"):
        check_tree_parents(torch.tensor([[-1, 0, 2]]))


@triton.jit
def _ancestor_mask_probe(par_ptr, out_ptr, stride_b, T, TP: tl.constexpr, LOG_TP: tl.constexpr):
    b = tl.program_id(0)
    M = _tree_ancestor_mask(par_ptr + b * stride_b, 1, T, TP, LOG_TP)
    o = tl.arange(0, TP)
    tl.store(out_ptr + b * TP * TP + o[:, None] * TP + o[None, :], M)


@pytest.mark.parametrize("T,TP", [(1, 2), (5, 8), (8, 8), (13, 16)])
def test_in_kernel_ancestor_mask_matches_the_host_paths(device, T, TP):
    """The verify kernels' ancestor mask: M[m, s] = m on the path root..s, for random trees, chains, stars and
    parents out of range (clamped as the host helper clamps them); positions past T keep only themselves."""
    gen, seed = make_gen()
    rows = [random_tree(T, gen) for _ in range(6)] + [list(range(-1, T - 1)), [-1] + [0] * (T - 1)]
    bad = torch.randint(-3, T + 3, (T,), generator=gen).tolist()
    bad[0] = -1
    rows.append(bad)  # out-of-range parents: the kernel clamps them to [0, s)
    par = torch.tensor(rows, dtype=torch.int32)
    out = torch.full((len(rows), TP, TP), float("nan"))
    out_d = out.to(device)
    _ancestor_mask_probe[(len(rows),)](par.to(device), out_d, par.stride(0), T, TP=TP, LOG_TP=TP.bit_length() - 1)
    got = out_d.cpu()
    want = torch.zeros(len(rows), TP, TP)
    want[:, :T, :T] = tree_ancestors(par).transpose(1, 2).float()  # [b, m, s]
    for k in range(T, TP):
        want[:, k, k] = 1.0
    assert torch.equal(got, want), f"seed {seed}"


def _cursors(gen, S, T, R, device):
    wp = torch.randint(0, R - T + 1, (S,), generator=gen)
    flush = (wp + 2 * T > R).to(torch.int32)
    origin = torch.randint(0, R, (S,), generator=gen)
    return [t.to(device=device, dtype=torch.int32) for t in (wp, origin, flush)]


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_tree_commit_matches_reference(device, idx_dtype):
    """Random cursors (ring wrap included), trees, accepted paths (incl. n = 0 and chain-shaped prefixes), padded
    and null rows; rings of every family shape; only the accepted entries move."""
    gen, seed = make_gen()
    T, R, S = 6, 13, 9
    for trial in range(4):
        cur = _cursors(gen, S, T, R, device)
        rings = [torch.randn(S, 3, R, 40, generator=gen).to(device),                   # x / d: [S, heads, R, width]
                 torch.randn(S, 1, R, 24, generator=gen).to(torch.bfloat16).to(device),  # B / k
                 torch.randn(S, 3, R, generator=gen).to(device)]                        # Δ / g: [S, heads, R]
        slots = torch.randperm(S, generator=gen)[:6].to(idx_dtype)
        slots[0], slots[4] = -1, 0  # a padded row and the null slot
        accepted = torch.randint(0, T, (6, T), generator=gen, dtype=torch.int32)
        n_acc = torch.zeros(6, dtype=torch.int32)
        for r in range(6):
            par = random_tree(T, gen)
            path = tree_path(par, int(torch.randint(0, T, (1,), generator=gen)))
            if r == 2:
                path = [0, 1, 2][:min(3, T)]  # already in place: nothing moves
            accepted[r, :len(path)] = torch.tensor(path, dtype=torch.int32)
            n_acc[r] = len(path) if r != 5 else 0
        c_before = [t.cpu().clone() for t in cur]
        want_c = [t.cpu().clone() for t in cur]
        want_r = [r.cpu().clone() for r in rings]
        before = [r.cpu().clone() for r in rings]
        spec_commit_tree_ref(*want_c, slots, accepted, n_acc, want_r, window=T, ring_len=R)
        spec_commit_tree(*cur, slots.to(device), accepted.to(device), n_acc.to(device), rings, window=T, ring_len=R)
        for name, got, exp in zip(("wp", "origin", "flush"), cur, want_c):
            assert torch.equal(got.cpu(), exp), f"[seed={seed}] {name}: {got.tolist()} != {exp.tolist()}"
        for i, (got, exp) in enumerate(zip(rings, want_r)):
            assert torch.equal(bits(got.cpu()), bits(exp)), f"[seed={seed}] ring {i} differs from the reference"
        check_spec_cursors(*cur, window=T, ring_len=R)
        # the reference itself: row r's logical wp + j now holds the old entry of node accepted[r, j]
        # (physical (origin + .) % R of the pre-commit cursors), every other entry is unchanged
        c_old = [t.clone() for t in c_before]
        for r, s in enumerate(slots.tolist()):
            if s <= 0:
                continue
            w, o = int(c_old[0][s]), int(c_old[1][s])
            moved = set()
            for j in range(int(n_acc[r])):
                dst, src = (o + w + j) % R, (o + w + int(accepted[r, j])) % R
                moved.add(dst)
                for got, old in zip(want_r, before):
                    assert torch.equal(bits(got[s][:, dst]), bits(old[s][:, src])), f"[seed={seed}] row {r} j {j}"
            keep = [p for p in range(R) if p not in moved]
            for got, old in zip(want_r, before):
                assert torch.equal(bits(got[s][:, keep]), bits(old[s][:, keep])), f"[seed={seed}] row {r} kept"
        # the cursors moved exactly as the chain commit moves them for n accepted tokens
        chain = [t.clone() for t in c_old]
        spec_commit_ref(*chain, slots, n_acc, window=T, ring_len=R)
        for got, exp in zip(cur, chain):
            assert torch.equal(got.cpu(), exp), f"[seed={seed}] cursors differ from the chain commit of n tokens"


def test_tree_commit_gathers_the_path_into_consecutive_positions(device):
    """A hand-made case: wp = 3, origin = 6 on a ring of 10 (the window wraps), path 0 -> 2 -> 5."""
    T, R = 4, 10
    wp = torch.tensor([0, 3], dtype=torch.int32, device=device)
    origin = torch.tensor([0, 6], dtype=torch.int32, device=device)
    flush = torch.tensor([0, 0], dtype=torch.int32, device=device)
    ring = torch.arange(2 * R, dtype=torch.float32, device=device).reshape(2, 1, R, 1).expand(2, 1, R, 2).contiguous()
    g = torch.arange(2 * R, dtype=torch.float32, device=device).reshape(2, 1, R)
    slots = torch.tensor([1], dtype=torch.int32, device=device)
    accepted = torch.tensor([[0, 2, 3, 1]], dtype=torch.int32, device=device)  # n = 3: path 0 -> 2 -> 3
    n = torch.tensor([3], dtype=torch.int32, device=device)
    spec_commit_tree(wp, origin, flush, slots, accepted, n, [ring, g], window=T, ring_len=R)
    # window logical 3..6 -> physical 9, 0, 1, 2; path nodes 0, 2, 3 -> physical 9, 1, 2 into 9, 0, 1
    want = list(range(R, 2 * R))
    want[0], want[1] = R + 1, R + 2
    assert g[1, 0].tolist() == want
    assert ring[1, 0, :, 1].tolist() == want and ring[0].flatten().tolist() == [v for v in range(R) for _ in (0, 1)]
    assert (int(wp[1]), int(origin[1]), int(flush[1])) == (6, 6, int(6 + 2 * T > R))


def test_tree_commit_validation(device):
    z = torch.zeros(4, dtype=torch.int32, device=device)
    ring = torch.zeros(4, 1, 8, 2, device=device)
    sl = torch.tensor([1], dtype=torch.int32, device=device)
    acc = torch.zeros(1, 3, dtype=torch.int32, device=device)
    n = torch.ones(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="accepted must be an int32/int64"):
        spec_commit_tree(z, z.clone(), z.clone(), sl, acc.float(), n, [ring], window=3, ring_len=8)
    with pytest.raises(ValueError, match=r"n_accept \[batch\] must match"):
        spec_commit_tree(z, z.clone(), z.clone(), sl, acc, n[:0], [ring], window=3, ring_len=8)
    with pytest.raises(ValueError, match=r"ring #0 must be \[S=4, heads, R=8"):
        spec_commit_tree(z, z.clone(), z.clone(), sl, acc, n, [ring[:, :, :7]], window=3, ring_len=8)
    with pytest.raises(ValueError, match="window T=2 must be an int >= 1 and >= accepted.shape"):
        spec_commit_tree(z, z.clone(), z.clone(), sl, acc, n, [ring], window=2, ring_len=8)


def test_tree_commit_layered_rings_match_per_layer_commits(device):
    """``layered=True`` (ReplayRing's stacked [layers, S, heads, R(, width)] tensors, one launch per tensor) moves
    exactly what one commit per layer moves, and matches the reference."""
    gen, seed = make_gen()
    T, R, S, L = 4, 9, 6, 3
    cur = _cursors(gen, S, T, R, device)
    stacked = [torch.randn(L, S, 2, R, 24, generator=gen).to(device), torch.randn(L, S, 2, R, generator=gen).to(device)]
    slots = torch.tensor([3, 0, 1, -1], dtype=torch.int32)
    accepted = torch.tensor([[0, 2, 3, 1], [0, 1, 2, 3], [0, 1, 3, 0], [0, 0, 0, 0]], dtype=torch.int32)
    n_acc = torch.tensor([3, 2, 3, 1], dtype=torch.int32)
    per_layer = [r.clone() for r in stacked]
    cur2 = [t.clone() for t in cur]
    ref_c = [t.cpu().clone() for t in cur]
    ref_r = [r.cpu().clone() for r in stacked]
    spec_commit_tree(*cur, slots.to(device), accepted.to(device), n_acc.to(device), stacked, window=T, ring_len=R,
                     layered=True)
    # the same commit per layer: the gathers of every layer, then one cursor move
    layer_views = [r[i] for r in per_layer for i in range(L)]
    spec_commit_tree(*cur2, slots.to(device), accepted.to(device), n_acc.to(device), layer_views, window=T,
                     ring_len=R)
    spec_commit_tree_ref(*ref_c, slots, accepted, n_acc, ref_r, window=T, ring_len=R, layered=True)
    for a, b, c in zip(stacked, per_layer, ref_r):
        assert torch.equal(bits(a.cpu()), bits(b.cpu())), f"[seed={seed}] layered vs per-layer commit"
        assert torch.equal(bits(a.cpu()), bits(c)), f"[seed={seed}] layered commit vs reference"
    for a, b, c in zip(cur, cur2, ref_c):
        assert torch.equal(a.cpu(), b.cpu()) and torch.equal(a.cpu(), c)
    with pytest.raises(ValueError, match=r"ring #1 must be \[layers, S=6, heads, R=9"):
        spec_commit_tree(*cur, slots.to(device), accepted.to(device), n_acc.to(device), [stacked[0], stacked[1][0]],
                         window=T, ring_len=R, layered=True)
