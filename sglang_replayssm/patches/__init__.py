"""One module per SGLang seam (no math); :func:`all_patches` is the registry's content."""

from __future__ import annotations

from typing import List

from .registry import Patch, PatchError, apply, status, unapply_all, verify  # noqa: F401


def all_patches() -> List[Patch]:
    from . import server_args

    return list(server_args.PATCHES)


def staged_patches() -> List[Patch]:
    """Seams applied only with ``--replayssm-staged true`` (or explicitly by tests and tools).

    They are CPU-tested and have run end to end on an H200 (decode and NEXTN, CUDA graphs and the
    overlap scheduler on; ``eval/results/e2e-h200``).  They move into :func:`all_patches` once
    the remaining paths (CUDA graphs off, the radix cache, retraction) have run on a GPU too.
    """
    from . import gdn_decode, lifecycle, mamba2_decode, pool, spec_commit

    return (list(pool.PATCHES) + list(mamba2_decode.PATCHES) + list(gdn_decode.PATCHES)
            + list(lifecycle.PATCHES) + list(spec_commit.PATCHES))
