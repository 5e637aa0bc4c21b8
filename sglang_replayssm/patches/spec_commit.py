"""Seam: the commit after a speculative verify -> a cursor move on the spec ring (no math).

A replay-ring seam: listed by :func:`sglang_replayssm.patches.replay_ring_patches`, applied by
the launcher unless ``--replayssm-replay-ring false`` (run end to end on an H200).

How SGLang commits (0.5.17; 0.5.15 and 0.5.23 reach the same method)
--------------------------------------------------------------------
After the target verify, ``spec_utils.commit_mamba_states_after_verify`` (called from
``eagle_worker_common.run_eagle_verify`` and the n-gram worker; 0.5.15 from
``eagle_worker_v2``) computes ``last_correct_step_indices`` (for a chain:
``accept_lens - 1``, ``accept_lens`` counting the bonus token) and, when the pool has
none of SGLang's own ``replayssm_*`` rings, calls
``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify(last_correct_step_indices,
mamba_track_indices, mamba_steps_to_track, model[, req_pool_indices])``.  Stock SGLang
then scatters ``intermediate_ssm[row, last]`` into ``temporal[slot]`` and
``intermediate_conv_window[row, last]`` into ``conv[slot]`` for the slots
``linear_attn_backend.forward_metadata.mamba_cache_indices[:n]``.

With a spec ring the verify wrote no per-draft snapshots: the checkpoint holds only
committed tokens and the window's inputs sit in the ring.  The AROUND hook here
(pool with a spec ring only; otherwise SGLang's method runs untouched):

1. keeps SGLang's conv rollback: ``fused_conv_window_scatter_with_mask`` per conv state,
   exactly the call stock makes (the backend module's own import in 0.5.15; in 0.5.17 and
   0.5.23 the module that defines its ``scatter_mamba_states_after_mtp_verify``);
2. moves the cursors: ``spec_commit(wp, origin, flush, slots, last_correct + 1)`` (one
   device launch, no sync; ``kernels/spec_cursor.py`` has the rule, incl. the strict
   early flush).  Rows with ``last_correct < 0`` commit no token, as the masked scatter
   (a row whose verify folded its history still moves past it: it is in the checkpoint).

3. with ``mamba_track_indices`` (the extra_buffer radix strategy; SGLang's
   ``mamba_steps_to_track`` gives, per row, the window step whose state goes to the track
   slot, -1 for none): ``prefix_track.spec_track_commit`` after the cursor move, i.e. the
   track slot gets the live slot's checkpoint + ring up to that step, folded, and SGLang's
   conv-window scatter for the track slots, as stock's scatter does.  For a chain the window
   step is the position on the accepted path.
"""

from __future__ import annotations

import logging
import sys
from typing import List

from ._cursor import NULL_SLOT, RING_ATTR, ReplayDecodeError
from .registry import Patch

logger = logging.getLogger("sglang_replayssm.patches")

BACKEND_MODULE = "sglang.srt.layers.attention.hybrid_linear_attn_backend"
TARGET = BACKEND_MODULE + ".HybridLinearAttnBackend.update_mamba_state_after_mtp_verify"
CONV_SCATTER = "fused_conv_window_scatter_with_mask"


def _conv_scatter():
    """SGLang's masked conv-window scatter: imported into the backend module (0.5.15), or next to
    the backend's ``scatter_mamba_states_after_mtp_verify`` (0.5.17, 0.5.23)."""
    backend_mod = sys.modules.get(BACKEND_MODULE)
    fn = getattr(backend_mod, CONV_SCATTER, None)
    if fn is None:
        stock = getattr(backend_mod, "scatter_mamba_states_after_mtp_verify", None)
        fn = getattr(sys.modules.get(getattr(stock, "__module__", ""), None), CONV_SCATTER, None)
    if fn is None:
        from .registry import sglang_version

        raise ReplayDecodeError(
            f"{CONV_SCATTER} not found in {BACKEND_MODULE} nor beside its scatter_mamba_states_after_mtp_verify "
            f"(SGLang {sglang_version()}): the spec commit cannot keep SGLang's conv rollback")
    return fn


def commit_around(original, self, last_correct_step_indices, mamba_track_indices, mamba_steps_to_track, model,
                  *args, **kwargs):
    """AROUND ``update_mamba_state_after_mtp_verify``: conv rollback as SGLang + spec cursor commit."""
    lin = getattr(self, "linear_attn_backend", None)
    pool = getattr(getattr(lin, "req_to_token_pool", None), "mamba_pool", None)
    ring = getattr(pool, RING_ATTR, None)
    if ring is None or ring.spec_window is None:
        return original(self, last_correct_step_indices, mamba_track_indices, mamba_steps_to_track, model,
                        *args, **kwargs)
    if mamba_track_indices is not None and mamba_steps_to_track is None:
        raise ReplayDecodeError("spec commit: mamba_track_indices without mamba_steps_to_track (SGLang passes both "
                                "for the extra_buffer radix strategy)")
    from ..kernels.spec_cursor import spec_commit

    n = last_correct_step_indices.shape[0]
    slots = lin.forward_metadata.mamba_cache_indices[:n]
    caches = lin.req_to_token_pool.get_speculative_mamba2_params_all_layers()
    scatter = _conv_scatter()
    for conv, window in zip(caches.conv, caches.intermediate_conv_window):
        scatter(conv, window, slots, last_correct_step_indices)
    spec_commit(*ring.verify_cursors, slots, last_correct_step_indices + 1,
                window=ring.spec_window, ring_len=ring.ring_len, null_slot=NULL_SLOT)
    if mamba_track_indices is not None:
        from .prefix_track import spec_track_commit

        steps = mamba_steps_to_track[:n]
        spec_track_commit(ring, pool, slots, last_correct_step_indices + 1, steps, steps, mamba_track_indices[:n],
                          caches)
    return None


PATCHES: List[Patch] = [
    Patch(TARGET, "around", commit_around,
          params=("self", "last_correct_step_indices", "mamba_track_indices", "mamba_steps_to_track", "model"),
          description="spec verify commit: SGLang's conv rollback + a cursor move on the replay ring"),
]
