"""Register the SGLang plugin entry points without pip (offline GPU host).

SGLang finds plugins through ``importlib.metadata.entry_points(group="sglang.srt.plugins")``,
which scans every ``*.dist-info`` directory on ``sys.path``.  Where ``pip install -e .`` is
not possible (no index, no build isolation), writing a minimal dist-info into a directory
that is put on ``PYTHONPATH`` (inherited by SGLang's spawned schedulers) registers them:

* ``sglang_replayssm-<version>.dist-info``: ``replayssm = sglang_replayssm.plugin:register``
  (only when not already registered, e.g. by an installed package);
* ``replayssm_eval-<version>.dist-info``: ``replayssm_eval_weights = eval.weights:register``
  (the harness's opt-in random-weights hook) and ``replayssm_eval_sync_debug = eval.sync_debug:register``
  (its opt-in host-sync census, ``eval.ab --sync-debug``).

The repository root must be importable too (the harness puts it on ``PYTHONPATH``).

    python3 -m eval.entry_points --dest /tmp/replayssm-ep      # prints the directory
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional

GROUP = "sglang.srt.plugins"
PACKAGE_DIST = "sglang_replayssm"
EVAL_DIST = "replayssm_eval"
PACKAGE_EP = ("replayssm", "sglang_replayssm.plugin:register")
EVAL_EP = ("replayssm_eval_weights", "eval.weights:register")
SYNC_EP = ("replayssm_eval_sync_debug", "eval.sync_debug:register")  # inert unless REPLAYSSM_EVAL_SYNC_DEBUG=1
ROOT = Path(__file__).resolve().parents[1]


def package_version() -> str:
    text = (ROOT / "pyproject.toml").read_text() if (ROOT / "pyproject.toml").is_file() else ""
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    return m.group(1) if m else "0.0.0"


def registered(value_prefix: str, path: Optional[List[str]] = None) -> bool:
    """Whether an entry point in GROUP whose value starts with ``value_prefix`` is visible
    (on ``path`` instead of ``sys.path`` when given)."""
    from importlib.metadata import distributions

    dists = distributions(path=path) if path is not None else distributions()
    for d in dists:
        for ep in d.entry_points:
            if ep.group == GROUP and ep.value.startswith(value_prefix):
                return True
    return False


def write_dist_info(dest: Path, dist: str, version: str, eps: Dict[str, str], summary: str) -> Path:
    d = dest / f"{dist}-{version}.dist-info"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\nSummary: {summary}\n")
    lines = [f"[{GROUP}]"] + [f"{k} = {v}" for k, v in eps.items()]
    (d / "entry_points.txt").write_text("\n".join(lines) + "\n")
    (d / "RECORD").write_text("")
    return d


def install(dest, package: Optional[bool] = None, eval_weights: bool = True) -> Path:
    """Write the dist-info directories into ``dest``; returns ``dest``.

    ``package=None``: write the package's entry point only if no visible distribution
    registers it already.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if package is None:
        package = not registered("sglang_replayssm.plugin")
    version = package_version()
    if package:
        write_dist_info(dest, PACKAGE_DIST, version, dict([PACKAGE_EP]),
                        "sglang_replayssm plugin entry point (written by eval/entry_points.py)")
    if eval_weights:
        write_dist_info(dest, EVAL_DIST, version, dict([EVAL_EP, SYNC_EP]),
                        "A/B harness random-weights and host-sync census plugins (written by eval/entry_points.py)")
    return dest


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.entry_points", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dest", required=True, help="directory to put on PYTHONPATH")
    p.add_argument("--package", choices=("auto", "yes", "no"), default="auto",
                   help="write the sglang_replayssm entry point (auto: only if not registered)")
    p.add_argument("--no-eval-weights", action="store_true", help="skip the random-weights plugin")
    a = p.parse_args(argv)
    pkg = {"auto": None, "yes": True, "no": False}[a.package]
    print(install(a.dest, package=pkg, eval_weights=not a.no_eval_weights))
    return 0


if __name__ == "__main__":
    sys.exit(main())
