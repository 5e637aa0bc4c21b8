"""One module per SGLang seam (no math); :func:`all_patches` is the registry's content."""

from __future__ import annotations

from typing import List

from .registry import Patch, PatchError, apply, status, unapply_all, verify  # noqa: F401


def all_patches() -> List[Patch]:
    from . import server_args

    return list(server_args.PATCHES)
