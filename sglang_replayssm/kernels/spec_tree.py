"""Tree speculation on the spec ring: parent indices, ancestor masks and the tree commit.

SGLang's EAGLE worker with ``--speculative-eagle-topk`` > 1 verifies a *tree* of T draft
positions per row: position 0 is the root (the last verified token) and every other
node's parent is an earlier position.  The tree verify kernels
(:mod:`mamba2_tree_verify`, :mod:`gdn_tree_verify`) take that shape as ``parents``
int [batch, T] (``parents[b, 0] = -1``, ``parents[b, s]`` in ``[0, s)``), write the
window's inputs to the ring at logical ``wp .. wp+T-1`` in node order (as the chain
verify does) and never write a cursor.  Pure math: no SGLang import.

* :func:`parents_from_retrieve` turns SGLang's ``retrive_next_token`` (first child of
  node i, -1: none) / ``retrive_next_sibling`` (next sibling, -1: none) layout into
  ``parents`` (pure torch, fixed work, no host sync).
* :func:`spec_commit_tree`: the accepted path (node indices ``accepted[b, :n]``, root
  first, ``n = n_accept[b]``) is gathered into consecutive logical positions
  ``wp .. wp+n-1`` of every ring tensor of the family (at most T entries per row), then
  the cursors move exactly as :func:`spec_cursor.spec_commit` moves them for a chain of
  ``n`` accepted tokens (flush / origin rule reused).  Afterwards the ring holds what a
  chain verify of the accepted path would have left: rollback stays a cursor move.

Bad values inside ``parents`` / ``accepted`` are the caller's bug: the host checks only
shape, dtype and device (no sync); kernels keep them in range for memory safety (a parent
outside ``[0, s)`` is read as the root, an accepted node is clamped to ``[0, T)``).  :func:`check_tree_parents` is the
host-side (syncing) check for tests and debugging.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from .common import INDEX_DTYPES as _INT_DTYPES
from .common import next_pow2
from .spec_cursor import spec_commit, spec_commit_ref

__all__ = ["parents_from_retrieve", "chain_parents", "tree_ancestors", "check_tree_parents", "check_parents_arg",
           "spec_commit_tree", "spec_commit_tree_ref", "tree_path"]


# ------------------------------------------------------------------------------------
# parents: builders and checks (torch)
# ------------------------------------------------------------------------------------
def chain_parents(batch: int, T: int, device=None) -> torch.Tensor:
    """``parents`` of a chain window (parents[s] = s - 1): the tree kernels then compute the chain verify."""
    return (torch.arange(T, dtype=torch.int32, device=device) - 1).expand(batch, T).contiguous()


@torch.no_grad()
def parents_from_retrieve(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """``parents`` int32 [batch, T] from SGLang's ``retrive_next_token`` / ``retrive_next_sibling`` [batch, T].

    ``next_token[b, i]``: first child of node i (-1: leaf); ``next_sibling[b, i]``: next child of i's parent
    (-1: last).  A first child gets its parent directly; later children inherit it along the sibling chain,
    one link per pass (T - 1 passes: fixed work, no host sync, CUDA-graph safe).  Nodes no chain reaches
    (padding) and the root get -1.
    """
    for name, t in (("next_token", next_token), ("next_sibling", next_sibling)):
        if not isinstance(t, torch.Tensor) or t.dtype not in _INT_DTYPES or t.dim() != 2:
            raise ValueError(f"parents_from_retrieve: {name} must be an int32/int64 [batch, T] tensor, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    if next_token.shape != next_sibling.shape or next_token.device != next_sibling.device:
        raise ValueError(f"parents_from_retrieve: next_token {tuple(next_token.shape)} on {next_token.device} and "
                         f"next_sibling {tuple(next_sibling.shape)} on {next_sibling.device} must match")
    batch, T = next_token.shape
    dev = next_token.device
    # one spare column T takes every write of a -1 (or out-of-range) link
    par = torch.full((batch, T + 1), -1, dtype=torch.int64, device=dev)
    node = torch.arange(T, dtype=torch.int64, device=dev).expand(batch, T)
    child = next_token.to(torch.int64)
    child = torch.where((child > 0) & (child < T), child, T)
    par.scatter_(1, child, node)
    sib = next_sibling.to(torch.int64)
    sib = torch.where((sib > 0) & (sib < T), sib, T)
    for _ in range(T - 1):
        par.scatter_(1, sib, par[:, :T].clone())  # a node's next sibling shares its parent
        par[:, T] = -1
    return par[:, :T].to(torch.int32)


def tree_ancestors(parents: torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self mask bool [batch, T, T]: ``anc[b, s, m]`` = node m is on the path root..s.

    Parents are clamped like the kernels clamp them (position 0 is the root; a parent outside
    ``[0, s)`` becomes 0).  Used by the references and tests."""
    batch, T = parents.shape
    p = parents.to(torch.int64).cpu()
    anc = torch.zeros(batch, T, T, dtype=torch.bool)
    for b in range(batch):
        for s in range(T):
            anc[b, s, s] = True
            if s > 0:
                q = int(p[b, s])
                q = q if 0 <= q < s else 0
                anc[b, s] |= anc[b, q]
    return anc.to(parents.device)


def tree_path(parents_row, node: int):
    """Node indices root..node (inclusive) of one row's ``parents`` (clamped like the kernels)."""
    p = [int(v) for v in (parents_row.tolist() if isinstance(parents_row, torch.Tensor) else parents_row)]
    path = [node]
    while path[-1] > 0:
        q = p[path[-1]]
        path.append(q if 0 <= q < path[-1] else 0)
    return path[::-1]


def check_parents_arg(fn: str, parents, batch: int, T: int, device) -> None:
    """Host-side checks of a ``parents`` argument (shape, dtype, device; the values are not read: no sync)."""
    if not isinstance(parents, torch.Tensor):
        raise ValueError(f"{fn}: parents must be a torch.Tensor, got {type(parents).__name__}")
    if parents.dtype not in _INT_DTYPES:
        raise ValueError(f"{fn}: parents must be int32 or int64, got {parents.dtype}")
    if tuple(parents.shape) != (batch, T):
        raise ValueError(f"{fn}: parents must have shape ({batch}, {T}) [batch, T], got {tuple(parents.shape)}")
    if parents.device != device:
        raise ValueError(f"{fn}: parents is on {parents.device} but the inputs are on {device}")


def check_tree_parents(parents: torch.Tensor) -> None:
    """Raise if a row is not a tree in node order (syncs; tests and debugging): parents[b, 0] == -1 and
    0 <= parents[b, s] < s for s > 0."""
    p = parents.cpu().long()
    T = p.shape[1]
    if T and bool((p[:, 0] != -1).any()):
        raise AssertionError(f"parents[:, 0] must be -1 (the root), got {p[:, 0].tolist()}")
    s = torch.arange(T)
    bad = (p[:, 1:] < 0) | (p[:, 1:] >= s[1:])
    if bool(bad.any()):
        b, i = (int(v) for v in bad.nonzero()[0])
        raise AssertionError(f"parents[{b}, {i + 1}] = {int(p[b, i + 1])} is not an earlier position")


# ------------------------------------------------------------------------------------
# in-kernel ancestor mask (shared by the tree verify kernels)
# ------------------------------------------------------------------------------------
@triton.jit
def _tree_ancestor_mask(par_row, stride_p, T, TP: tl.constexpr, LOG_TP: tl.constexpr):
    """fp32 0/1 [TP, TP] with M[m, s] = 1 when node m is on the path root..s (s itself included).

    Built in node order: parents precede children, so column s is column parent(s) plus s itself,
    one [TP, TP] select per node (no [TP, TP, TP] temporaries: they spill in the verify kernels).
    A parent outside [0, s) becomes the root (as :func:`tree_ancestors` / :func:`tree_path` read it), so
    that any input gives a tree; padded positions (s >= T) keep only themselves.  ``LOG_TP`` is unused
    (kept for the kernels' signature)."""
    o = tl.arange(0, TP)
    M = (o[:, None] == o[None, :]).to(tl.float32)
    for s in tl.static_range(1, TP):
        p = tl.load(par_row + s * stride_p, mask=s < T, other=0).to(tl.int32)
        p = tl.where((p >= 0) & (p < s), p, 0)
        col_p = tl.sum(tl.where(o[None, :] == p, M, 0.0), 1)  # [m]: the ancestors of parent(s)
        col_p = tl.where(s < T, col_p, 0.0)
        M = tl.where(o[None, :] == s, tl.maximum(M, col_p[:, None]), M)
    return M


# ------------------------------------------------------------------------------------
# tree commit
# ------------------------------------------------------------------------------------
@triton.jit
def _tree_gather_kernel(ring, slot_ptr, acc_ptr, n_ptr, wp_ptr, org_ptr,
                        NA, null_slot, T, R, W,
                        s_rl, s_r0, s_r1, s_r2, s_slot, s_acc0, s_acc1, s_n,
                        TP: tl.constexpr, BW: tl.constexpr, W_CHUNKS: tl.constexpr):
    """ring[slot, h, wp + j] <- ring[slot, h, wp + accepted[j]] for j < n (logical positions, physical
    (origin + .) % R); all of a tile's sources are loaded before any store, and the path's nodes are
    increasing, so the in-place gather never reads an entry it wrote."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    layer = tl.program_id(2).to(tl.int64)
    slot = tl.load(slot_ptr + row * s_slot).to(tl.int64)
    if (slot < 0) | (slot == null_slot):
        return
    wp = tl.minimum(tl.maximum(tl.load(wp_ptr + slot).to(tl.int32), 0), R - T)
    org = tl.minimum(tl.maximum(tl.load(org_ptr + slot).to(tl.int32), 0), R - 1)
    n = tl.minimum(tl.load(n_ptr + row * s_n).to(tl.int32), NA)
    o = tl.arange(0, TP)
    use = o < n
    node = tl.load(acc_ptr + row * s_acc0 + o * s_acc1, mask=use, other=0).to(tl.int32)
    node = tl.minimum(tl.maximum(node, 0), T - 1)
    move = use & (node != o)  # entries already in place (a chain-shaped prefix) are not copied
    src = ((org + wp + node) % R).to(tl.int64)
    dst = ((org + wp + o) % R).to(tl.int64)
    base = ring + layer * s_rl + slot * s_r0 + h * s_r1
    for c in tl.static_range(W_CHUNKS):
        ow = c * BW + tl.arange(0, BW)
        m2 = move[:, None] & (ow < W)[None, :]
        vals = tl.load(base + src[:, None] * s_r2 + ow[None, :], mask=m2, other=0)
        tl.debug_barrier()
        tl.store(base + dst[:, None] * s_r2 + ow[None, :], vals, mask=m2)


def _ring_view(fn, name, t, n_slots, R, layered):
    """A ring tensor as [layers, S, heads, R, width]: width 1 for [(layers,) S, heads, R], layers 1 unless
    ``layered``; last dim contiguous."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{fn}: ring {name} must be a torch.Tensor, got {type(t).__name__}")
    lead = 1 if layered else 0
    if t.dim() == 3 + lead:
        t = t.unsqueeze(-1)
    if not layered:
        t = t.unsqueeze(0)
    want = f"[{'layers, ' if layered else ''}S={n_slots}, heads, R={R}(, width)]"
    if t.dim() != 5 or t.shape[1] != n_slots or t.shape[3] != R:
        raise ValueError(f"{fn}: ring {name} must be {want}, got {tuple(t.shape[1 - lead:])}")
    if t.shape[4] > 1 and t.stride(4) != 1:
        raise ValueError(f"{fn}: ring {name} must be contiguous in its last dim, got strides {tuple(t.stride())}")
    return t


def spec_commit_tree(wp, origin, flush, slots, accepted, n_accept, rings: Sequence[torch.Tensor], *,
                     window: int, ring_len: int, null_slot: Optional[int] = 0, layered: bool = False) -> None:
    """Commit one tree verify: gather the accepted path into the ring, then move the cursors.

    ``accepted`` int [batch, >= 1]: node indices of the accepted path, root (0) first, increasing (SGLang's
    ``accept_index`` made row-local); ``n_accept`` int [batch]: its length (accepted drafts + 1; <= 0: none).
    ``rings``: every ring tensor of the family, each [S, heads, R, width] or [S, heads, R] (Mamba2: x, B, Δ;
    GDN: d, k, g).  ``layered=True``: each ring carries a leading layer dimension ([layers, S, heads, R(, width)],
    :class:`ring.ReplayRing`'s stacked tensors), so one launch covers every layer.  One gather launch per ring
    tensor plus the chain commit; no host sync.
    """
    fn = "spec_commit_tree"
    if not isinstance(accepted, torch.Tensor) or accepted.dtype not in _INT_DTYPES or accepted.dim() != 2:
        raise ValueError(f"{fn}: accepted must be an int32/int64 [batch, n] tensor")
    if not isinstance(n_accept, torch.Tensor) or n_accept.dtype not in _INT_DTYPES:
        raise ValueError(f"{fn}: n_accept must be an int32/int64 tensor")
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1:
        raise ValueError(f"{fn}: slots must be a 1-D tensor")
    batch = slots.shape[0]
    if accepted.shape[0] != batch or tuple(n_accept.shape) != (batch,):
        raise ValueError(f"{fn}: accepted [batch, n] and n_accept [batch] must match slots ({batch},), got "
                         f"{tuple(accepted.shape)} and {tuple(n_accept.shape)}")
    for name, t in (("accepted", accepted), ("n_accept", n_accept), ("slots", slots)):
        if t.device != wp.device:
            raise ValueError(f"{fn}: {name} is on {t.device} but wp is on {wp.device}")
    T, R = window, ring_len
    if not isinstance(T, int) or T < 1 or accepted.shape[1] > T:
        raise ValueError(f"{fn}: window T={T!r} must be an int >= 1 and >= accepted.shape[1]={accepted.shape[1]}")
    views = [_ring_view(fn, f"#{i}", r, wp.shape[0], R, layered) for i, r in enumerate(rings)]
    for v in views:
        if v.device != wp.device:
            raise ValueError(f"{fn}: a ring is on {v.device} but wp is on {wp.device}")
    if batch and accepted.shape[1] > 1:
        TP = max(2, next_pow2(accepted.shape[1]))
        null = -1 if null_slot is None else int(null_slot)
        for v in views:
            W = v.shape[4]
            BW = min(128, max(16, next_pow2(W)))
            _tree_gather_kernel[(batch, v.shape[2], v.shape[0])](
                v, slots, accepted, n_accept, wp, origin, accepted.shape[1], null, T, R, W,
                v.stride(0), v.stride(1), v.stride(2), v.stride(3), slots.stride(0), accepted.stride(0),
                accepted.stride(1),
                n_accept.stride(0), TP=TP, BW=BW, W_CHUNKS=triton.cdiv(W, BW), num_warps=1,
            )
    spec_commit(wp, origin, flush, slots, n_accept, window=T, ring_len=R, null_slot=null_slot)


def spec_commit_tree_ref(wp, origin, flush, slots, accepted, n_accept, rings, *, window, ring_len, null_slot=0,
                         layered=False):
    """Host-loop reference of :func:`spec_commit_tree` (same writes)."""
    T, R = window, ring_len
    if layered:  # one ring per layer
        rings = [r[i] for r in rings for i in range(r.shape[0])]
    for row, s in enumerate(slots.tolist()):
        if s < 0 or (null_slot is not None and s == null_slot):
            continue
        w = min(max(int(wp[s]), 0), R - T)
        o = min(max(int(origin[s]), 0), R - 1)
        n = min(int(n_accept[row]), T, accepted.shape[1])
        nodes = [min(max(int(v), 0), T - 1) for v in accepted[row, :max(n, 0)].tolist()]
        for r in rings:
            src = [(o + w + v) % R for v in nodes]
            dst = [(o + w + j) % R for j in range(len(nodes))]
            vals = r[s][:, src].clone()
            r[s][:, dst] = vals
    spec_commit_ref(wp, origin, flush, slots, n_accept, window=T, ring_len=R, null_slot=null_slot)
