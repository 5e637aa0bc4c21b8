"""One module per SGLang seam (no math). The registry's content: :func:`launch_check_patches` (applied whenever
the package is enabled), :func:`replay_ring_patches` (the replay-ring seams, unless ``--replayssm-replay-ring
false``) and :func:`conv_verify_patches` (``--replayssm-conv-verify``); :func:`active_patches` is what an enabled
process applies."""

from __future__ import annotations

import logging
from typing import List

from .registry import Patch, PatchError, apply, status, unapply_all, verify  # noqa: F401


def launch_check_patches() -> List[Patch]:
    """The launch checks: applied in every process whenever the package is enabled."""
    from . import request_validation, server_args

    return list(server_args.PATCHES) + list(request_validation.PATCHES)


def replay_ring_patches() -> List[Patch]:
    """The replay-ring seams (pool, Mamba2/GDN decode and verify, spec commit, slot lifecycle, prefix tracking).

    Applied with the launch checks unless ``--replayssm-replay-ring false``.  They are CPU-tested against
    real SGLang classes and have run end to end on an H200: decode and NEXTN, CUDA graphs on and off,
    the overlap scheduler, the radix cache (``no_buffer``), forced retraction and a bf16 state
    (``eval/results/e2e-h200``).
    """
    from . import gdn_decode, lifecycle, mamba2_decode, pool, prefix_track, spec_commit, spec_tree

    # spec_tree before spec_commit: the tree commit wraps SGLang's commit_mamba_states_after_verify, whose chain
    # calls (and idle batches, ringless pools) it passes through to SGLang and so to the chain commit seam
    return (list(pool.PATCHES) + list(mamba2_decode.PATCHES) + list(gdn_decode.PATCHES)
            + list(lifecycle.PATCHES) + list(spec_tree.PATCHES) + list(spec_commit.PATCHES)
            + list(prefix_track.PATCHES))


def conv_verify_patches() -> List[Patch]:
    """The target verify's conv1d on the package's kernel (``--replayssm-conv-verify``). The seam needs no replay
    ring; with ``auto`` (the default) it follows the ring's setting (``ReplaySSMConfig.conv_verify_on``)."""
    from . import conv_verify

    return list(conv_verify.PATCHES)


def active_patches(replay_ring: bool, conv_verify: bool = False) -> List[Patch]:
    """What an enabled process applies: the launch checks, plus the replay-ring seams when ``replay_ring`` and the
    conv1d verify seam when ``conv_verify``."""
    return (launch_check_patches() + (replay_ring_patches() if replay_ring else [])
            + (conv_verify_patches() if conv_verify else []))


# the old names, for one release: each logs one deprecation line per process
_WARNED: set = set()


def _deprecated(old: str, new) -> List[Patch]:
    if old not in _WARNED:
        _WARNED.add(old)
        logging.getLogger("sglang_replayssm").warning(
            "sglang_replayssm.patches.%s() is deprecated and will be removed in the next release; use %s()",
            old, new.__name__)
    return new()


def all_patches() -> List[Patch]:
    """Deprecated name of :func:`launch_check_patches` (it never returned all patches)."""
    return _deprecated("all_patches", launch_check_patches)


def staged_patches() -> List[Patch]:
    """Deprecated name of :func:`replay_ring_patches`."""
    return _deprecated("staged_patches", replay_ring_patches)
