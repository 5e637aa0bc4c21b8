"""Built-in model configs (config.json only; served with ``--load-format dummy``).

``tiny-nemotron-h`` (Mamba2 hybrid) and ``tiny-qwen3-next`` (Gated DeltaNet hybrid) let a
GPU host run the whole server path with no download. The layer mix follows the public
NemotronH / Qwen3-Next config schemas at toy sizes.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent

# attention backend each built-in model needs on the offline Hopper bundle
ATTENTION_BACKEND: Dict[str, str] = {"tiny-nemotron-h": "flashinfer", "tiny-qwen3-next": "triton"}


def names() -> List[str]:
    return sorted(p.stem for p in HERE.glob("*.json"))


def config(name: str) -> dict:
    p = HERE / f"{name}.json"
    if not p.is_file():
        raise ValueError(f"unknown built-in model {name!r}; accepted: {', '.join(names())}")
    return json.loads(p.read_text())


def materialize(name: str, root: str | os.PathLike | None = None, **overrides) -> str:
    """Write the model's config.json (with ``overrides``) into a fresh directory; return its path."""
    cfg = config(name)
    cfg.update(overrides)
    d = Path(tempfile.mkdtemp(prefix=f"replayssm-{name}-", dir=root))
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return str(d)
