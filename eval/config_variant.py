"""Write a kernel launch-config YAML: a base file (default: the packaged file for this machine's GPU) with
some families' entries changed.

``SGLANG_REPLAYSSM_KERNEL_CONFIG`` (and an ``eval.ab`` arm's ``@FILE``) *replaces* the packaged file, so a
launch variant must carry every tuned entry, not just the ones it changes.  A variant names only what it
changes, as a YAML mapping ``{family: {geometry key or default: {param: value}}}``:

    python -m eval.config_variant --base sglang_replayssm/kernels/configs/h200.yaml --out sf.yaml \\
        'mamba2_output_only: {default: {state_first: 1}}'
    python -m eval.ab --model nemotron-h-8b --arms stock,staged,staged@sf.yaml --batch 1 --profile-batch 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import yaml


def merged(base: Dict[str, Any], changes: Dict[str, Any]) -> Dict[str, Any]:
    """``base`` with each (family, key) entry of ``changes`` updated parameter by parameter (new copies)."""
    out = {fam: {k: dict(v) for k, v in sec.items()} for fam, sec in (base or {}).items()}
    for fam, sec in (changes or {}).items():
        if not isinstance(sec, dict) or not all(isinstance(v, dict) for v in sec.values()):
            raise ValueError(f"variant: {fam!r} must map geometry keys (or default) to parameter mappings, "
                             f"got {sec!r}")
        for key, entry in sec.items():
            out.setdefault(fam, {}).setdefault(key, {}).update(entry)
    return out


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.config_variant", description=__doc__.split("\n\n")[0])
    ap.add_argument("changes", help="YAML mapping {family: {key: {param: value}}} of what the variant changes")
    ap.add_argument("--out", required=True, help="the variant's YAML file")
    ap.add_argument("--base", default=None, help="the file to start from (default: the packaged file for this "
                                                 "machine's GPU, kernels/common.config_file(); a GPU without one "
                                                 "runs default.yaml and the built-in defaults alone, so the variant "
                                                 "starts from nothing)")
    args = ap.parse_args(argv)
    if args.base is None:
        from sglang_replayssm.kernels import common

        gpu_file = common.config_file()
        base_path = gpu_file if gpu_file.is_file() else None
    else:
        base_path = Path(args.base)
        if not base_path.is_file():
            ap.error(f"--base {args.base}: no such file")
    try:
        changes = yaml.safe_load(args.changes) or {}
        if not isinstance(changes, dict):
            raise ValueError(f"variant: expected a mapping, got {changes!r}")
        base = (yaml.safe_load(base_path.read_text()) or {}) if base_path else {}
        doc = merged(base, changes)
    except (yaml.YAMLError, ValueError) as e:
        ap.error(str(e))
    out = Path(args.out)
    out.write_text(f"# {base_path.name if base_path else 'no GPU file (default.yaml)'} with {args.changes!r} "
                   "(python -m eval.config_variant)\n"
                   + yaml.safe_dump(doc, sort_keys=False))
    from sglang_replayssm.kernels import common

    try:  # a variant the kernels would refuse at their first call is refused here
        common.validate_config_file(out)
    except ValueError as e:
        out.unlink()
        ap.error(str(e))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
