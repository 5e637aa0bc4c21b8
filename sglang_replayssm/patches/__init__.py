"""One module per SGLang seam (no math); :func:`all_patches` is the registry's content."""

from __future__ import annotations

from typing import List

from .registry import Patch, PatchError, apply, status, unapply_all, verify  # noqa: F401


def all_patches() -> List[Patch]:
    """The launch checks: applied in every process whenever the package is enabled."""
    from . import request_validation, server_args

    return list(server_args.PATCHES) + list(request_validation.PATCHES)


def staged_patches() -> List[Patch]:
    """The replay-ring seams (pool, Mamba2/GDN decode and verify, spec commit, slot lifecycle).

    Applied with the launch checks unless ``--replayssm-staged false``.  They are CPU-tested against
    real SGLang classes and have run end to end on an H200: decode and NEXTN, CUDA graphs on and off,
    the overlap scheduler, the radix cache (``no_buffer``), forced retraction and a bf16 state
    (``eval/results/e2e-h200``).
    """
    from . import gdn_decode, lifecycle, mamba2_decode, pool, spec_commit

    return (list(pool.PATCHES) + list(mamba2_decode.PATCHES) + list(gdn_decode.PATCHES)
            + list(lifecycle.PATCHES) + list(spec_commit.PATCHES))


def active_patches(staged: bool) -> List[Patch]:
    """What an enabled process applies: the launch checks, plus the seams when ``staged``."""
    return all_patches() + (staged_patches() if staged else [])
