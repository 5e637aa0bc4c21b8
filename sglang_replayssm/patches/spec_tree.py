"""Seam: tree speculative verify and commit (EAGLE ``--speculative-eagle-topk`` > 1) on the spec ring (no math).

Applied with the replay-ring seams (:func:`sglang_replayssm.patches.replay_ring_patches`); the launch check
accepts topk > 1 (``server_args.TREE_VERIFY_WIRED``).  The kernels are ``kernels.mamba2_verify.mamba2_tree_verify``,
``kernels.gdn_verify.gdn_tree_verify`` and ``kernels.spec_tree.spec_commit_tree``; CPU-tested with pure-torch
stand-ins of them and against SGLang's own tree verify + commit (``tests/patches/test_spec_tree*.py``).  The
design, and every SGLang function the tree path goes through, is in ``docs/tree-speculation.md``.

What SGLang 0.5.17 does for a tree, and what changes here
---------------------------------------------------------
* Verify: every Mamba2 / GDN layer first runs SGLang's fused tree conv kernel, which also fills
  ``forward_metadata.retrieve_parent_token`` (each node's parent; root entry 0), then the SSM update with
  ``retrieve_parent_token=`` and a per-node state snapshot buffer.  The chain verify seams
  (``mamba2_decode.selective_state_update_around``, ``gdn_decode.target_verify_around``) hand such a call to
  :func:`mamba2_tree_verify_call` / :func:`gdn_tree_verify_call`, which run the
  tree kernel on the layer's ring with ``parents = retrieve_parent_token`` (the kernels treat position 0 as
  the root whatever its entry holds).  No node state is written; the snapshot buffer has zero slots.
* Commit: ``spec_utils.commit_mamba_states_after_verify(target_worker, batch, accept_lens, accept_index,
  draft_token_num)`` gets the accepted path (``accept_index[b, j] = b*T + node``, root first, -1 padded).
  :func:`commit_tree_around` (AROUND; propagated to the by-name imports in ``eagle_worker_common`` /
  ``ngram_worker``) keeps SGLang's conv rollback (the last accepted node's conv window, the masked scatter the
  chain commit keeps too) and then calls ``spec_commit_tree``: the accepted path's ring entries are gathered
  to consecutive positions after the committed history (one launch per ring tensor for all layers) and the
  cursors move as for a chain of ``accept_lens`` tokens.  Chains (topk <= 1), pools without a spec ring and idle
  batches run the original (whose chain commit is ``spec_commit.commit_around``).

* Tracking (the extra_buffer radix strategy, ``batch.mamba_track_indices`` set): SGLang's own
  ``spec_utils._verify_commit_step_indices`` gives the tracked node per row (-1: none); its position on the
  accepted path is where ``accepted`` holds it, and after the path gather ``prefix_track.spec_track_commit``
  materialises the track slot exactly as for a chain (conv windows: SGLang's scatter at the node).

Refused (raise, naming the flag): a verify window larger than the ring's (the launch check prevents it), a tree
call that is not this layer's.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

import torch

from ._cursor import NULL_SLOT, RING_ATTR, LayerContext, ReplayDecodeError
from .registry import Patch

logger = logging.getLogger("sglang_replayssm.patches")

COMMIT_TARGET = "sglang.srt.speculative.spec_utils.commit_mamba_states_after_verify"

# the tree kernels, resolved on first use (``_IMPL`` entries win: tests put pure-torch stand-ins there)
KERNELS = {
    "mamba2_tree_verify": ("sglang_replayssm.kernels.mamba2_verify", "mamba2_tree_verify"),
    "gdn_tree_verify": ("sglang_replayssm.kernels.gdn_verify", "gdn_tree_verify"),
    "spec_commit_tree": ("sglang_replayssm.kernels.spec_tree", "spec_commit_tree"),
}
_IMPL: Dict[str, Callable] = {}


def kernel(name: str) -> Callable:
    fn = _IMPL.get(name)
    if fn is None:
        import importlib

        module, attr = KERNELS[name]
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ReplayDecodeError(f"tree speculation needs {module}.{attr} ({type(e).__name__}: {e}); "
                                    "use --speculative-eagle-topk 1") from None
        _IMPL[name] = fn
    return fn


# --------------------------------------------------------------------------------------
# verify: called by the chain seams' dispatchers for a call that carries retrieve_parent_token
# --------------------------------------------------------------------------------------
def _parents_problem(parents, batch: int, T: int, device) -> Optional[str]:
    if not isinstance(parents, torch.Tensor) or parents.dim() != 2:
        return "retrieve_parent_token is not a [batch, draft_tokens] tensor"
    if parents.shape[0] < batch or parents.shape[1] != T:
        return f"retrieve_parent_token has shape {tuple(parents.shape)}, expected ({batch}, {T})"
    if parents.device != device:
        return f"retrieve_parent_token is on {parents.device}, the window on {device}"
    return None


def mamba2_tree_verify_call(a: Dict[str, Any], ctx: LayerContext) -> None:
    """A Mamba2 tree verify call of ``mamba.selective_state_update`` (``a``: its bound arguments) under a verify
    context -> ``mamba2_tree_verify`` on the layer's ring; fills ``a["out"]``, counts the call."""
    from .mamba2_decode import _not_chain_verify

    x = a["x"]
    # the chain verify's checks (SGLang's target-verify call, this layer's window), then the parents
    why = _not_chain_verify(a, ctx) or _parents_problem(a.get("retrieve_parent_token"), x.shape[0], x.shape[1],
                                                        x.device)
    if why is not None:
        raise ReplayDecodeError(f"layer_id {ctx.layer_id}: unexpected tree verify call of selective_state_update: "
                                f"{why}")
    rv = ctx.ring_views
    parents = a["retrieve_parent_token"][:x.shape[0]]
    # the per-node snapshot buffer (intermediate_states_buffer, zero slots) is neither read nor written
    kernel("mamba2_tree_verify")(a["state"], rv["x"], rv["B"], rv["dt"], x, a["dt"], a["A"], a["B"], a["C"],
                                 a["state_batch_indices"], *ctx.spec, parents=parents, D=a.get("D"), z=a.get("z"),
                                 dt_bias=a.get("dt_bias"), dt_softplus=bool(a.get("dt_softplus")), out=a["out"],
                                 null_slot=NULL_SLOT)
    ctx.calls += 1


def gdn_tree_verify_call(ctx: LayerContext, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices,
                         cache_steps, retrieve_parent_token, scale: float, use_qk_l2norm: bool) -> torch.Tensor:
    """A GDN tree verify call of ``GDNKernelDispatcher.target_verify`` under a verify context ->
    ``gdn_tree_verify`` on the layer's ring; returns the output in SGLang's layout ``[1, tokens, HV, V]``."""
    from .gdn_decode import verify_call_problem, verify_window

    g = ctx.geom
    seq = q.shape[1] if q.dim() == 4 else 0
    why = verify_call_problem(ctx, q, k, v, ssm_states, cache_indices, cache_steps)
    T = int(cache_steps or 1)
    bs = seq // T
    if why is None:
        why = _parents_problem(retrieve_parent_token, bs, T, q.device)
    if why is not None:
        raise ReplayDecodeError(f"layer_id {ctx.layer_id}: unexpected tree verify call of target_verify: {why}")
    HV, V = g.num_v_heads, g.head_v_dim
    mixed, out = verify_window(q, k, v, g, bs, T)
    rv = ctx.ring_views
    kernel("gdn_tree_verify")(mixed, a.reshape(bs, T, HV), b.reshape(bs, T, HV), A_log, dt_bias, ssm_states,
                              rv["d"], rv["k"], rv["g"], cache_indices[:bs], *ctx.spec,
                              parents=retrieve_parent_token[:bs], scale=scale, use_qk_l2norm=use_qk_l2norm,
                              round_beta=False, out=out, null_slot=NULL_SLOT)
    ctx.calls += 1
    return out.view(1, seq, HV, V)


# --------------------------------------------------------------------------------------
# commit
# --------------------------------------------------------------------------------------
def tree_commit_inputs(accept_lens: torch.Tensor, accept_index: torch.Tensor, draft_token_num: int):
    """``(accepted, n_accept, last)`` from SGLang's verify result, on device, no sync: ``accepted[b, j]`` the
    row-local node index of the j-th accepted node (padding clamped to 0, past ``n_accept``), ``n_accept =
    accept_lens`` (accepted drafts + 1), ``last`` the last accepted node (-1 for a row that accepted nothing:
    SGLang's masked conv scatter skips it)."""
    bs = accept_lens.shape[0]
    T = int(draft_token_num)
    offsets = torch.arange(bs, dtype=torch.int64, device=accept_index.device) * T
    accepted = (accept_index[:bs].to(torch.int64) - offsets[:, None]).clamp_(min=0)
    n_accept = accept_lens.to(torch.int64)
    rows = torch.arange(bs, dtype=torch.int64, device=accept_index.device)
    last_col = (n_accept - 1).clamp(min=0, max=accept_index.shape[1] - 1)
    last = torch.where(n_accept > 0, accepted[rows, last_col], torch.full_like(n_accept, -1))
    return accepted, n_accept, last


def commit_tree_around(original, target_worker, batch, accept_lens, accept_index, draft_token_num, *args, **kwargs):
    """AROUND ``spec_utils.commit_mamba_states_after_verify``: a tree commit on the spec ring (see the module
    docstring); anything else runs SGLang's function (and, for chains, the chain commit seam under it)."""
    runner = getattr(target_worker, "model_runner", None)
    lin = getattr(getattr(runner, "attn_backend", None), "linear_attn_backend", None)
    pool = getattr(getattr(runner, "req_to_token_pool", None), "mamba_pool", None)
    ring = getattr(pool, RING_ATTR, None)
    if ring is None or ring.spec_window is None or lin is None or (getattr(lin, "topk", 0) or 0) <= 1:
        return original(target_worker, batch, accept_lens, accept_index, draft_token_num, *args, **kwargs)
    if batch.forward_mode.is_idle() or accept_index.numel() == 0:
        return None
    T = int(draft_token_num)
    if T > ring.spec_window:
        raise ReplayDecodeError(f"a verify window of {T} tree nodes does not fit the spec ring (window "
                                f"{ring.spec_window}); raise --replayssm-buffer-len or lower "
                                "--speculative-num-draft-tokens")
    accepted, n_accept, last = tree_commit_inputs(accept_lens, accept_index, T)
    slots = lin.forward_metadata.mamba_cache_indices[:accept_lens.shape[0]]
    from .spec_commit import _conv_scatter

    caches = lin.req_to_token_pool.get_speculative_mamba2_params_all_layers()
    scatter = _conv_scatter()
    for conv, window in zip(caches.conv, caches.intermediate_conv_window):
        scatter(conv, window, slots, last)
    # the ring's stacked [layers, slots, ...] tensors: one gather launch per tensor covers every layer
    kernel("spec_commit_tree")(*ring.verify_cursors, slots, accepted, n_accept, list(ring.tensors.values()),
                               window=ring.spec_window, ring_len=ring.ring_len, null_slot=NULL_SLOT, layered=True)
    track = getattr(batch, "mamba_track_indices", None)
    if track is not None:
        from .prefix_track import spec_track_commit

        nodes = tracked_nodes(batch, accept_index, accept_lens, T)
        spec_track_commit(ring, pool, slots, n_accept, path_position(accepted, n_accept, nodes), nodes,
                          track[:accept_lens.shape[0]], caches)
    return None


def tracked_nodes(batch, accept_index: torch.Tensor, accept_lens: torch.Tensor, draft_token_num: int) -> torch.Tensor:
    """Per row, the tree node whose state SGLang tracks in this commit (-1: none): SGLang's own
    ``spec_utils._verify_commit_step_indices``."""
    import sys

    mod = sys.modules.get(COMMIT_TARGET.rsplit(".", 1)[0])
    fn = getattr(mod, "_verify_commit_step_indices", None)
    if fn is None:
        from .registry import sglang_version

        raise ReplayDecodeError(f"spec_utils._verify_commit_step_indices not found (SGLang {sglang_version()}): the "
                                "tree commit cannot track states for the extra_buffer radix strategy; use "
                                "--mamba-radix-cache-strategy no_buffer")
    _, steps = fn(batch=batch, accept_index=accept_index, accept_lens=accept_lens, draft_token_num=draft_token_num)
    return steps


def path_position(accepted: torch.Tensor, n_accept: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """Where on each row's accepted path (``accepted[b, :n_accept[b]]``) node ``nodes[b]`` sits; -1 when it is
    not on it or ``nodes[b] < 0``.  Device ops, no sync."""
    cols = torch.arange(accepted.shape[1], device=accepted.device)
    hit = (accepted == nodes.to(accepted.dtype)[:, None]) & (cols[None, :] < n_accept[:, None]) & \
        (nodes[:, None] >= 0)
    first = torch.where(hit, cols[None, :], torch.full_like(accepted, accepted.shape[1])).min(dim=1).values
    return torch.where(first < accepted.shape[1], first, torch.full_like(first, -1))


PATCHES: List[Patch] = [
    Patch(COMMIT_TARGET, "around", commit_tree_around,
          params=("target_worker", "batch", "accept_lens", "accept_index", "draft_token_num"), propagate=True,
          description="tree spec commit: SGLang's conv rollback + the accepted path gathered on the replay ring"),
]
