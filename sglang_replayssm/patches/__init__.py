"""One module per SGLang seam (no math); :func:`all_patches` is the registry's content."""

from __future__ import annotations

from typing import List

from .registry import Patch, PatchError, apply, status, unapply_all, verify  # noqa: F401


def all_patches() -> List[Patch]:
    from . import server_args

    return list(server_args.PATCHES)


def staged_patches() -> List[Patch]:
    """Seams that are written and CPU-tested but NOT active in servers yet.

    The plugin applies :func:`all_patches` only.  A staged seam moves there once the
    whole decode path it belongs to is complete and validated on a GPU (CUDA graphs
    included); until then tests and tools apply these explicitly.
    """
    from . import gdn_decode, lifecycle, mamba2_decode, pool, spec_commit

    return (list(pool.PATCHES) + list(mamba2_decode.PATCHES) + list(gdn_decode.PATCHES)
            + list(lifecycle.PATCHES) + list(spec_commit.PATCHES))
