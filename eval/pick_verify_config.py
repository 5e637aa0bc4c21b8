"""Pick each verify kernel's fastest launch-config variant from ``eval.bench_spec`` runs.

``eval/gpu_spec_variants.sh`` runs the benchmark once per variant; this reads those result
JSONs and, per family (``mamba2`` -> ``mamba2_verify``, ``gdn`` -> ``gdn_verify``), picks the
variant with the lowest geometric mean of our amortised time over the batch 1, 32 and 256 cases
(``--quick`` times exactly these), among the runs whose correctness check passed for that family.
Batch 1 keeps a variant that wins at 256 by losing badly at 1 from being picked; batch 32 keeps a
few microseconds at batch 1 from outvoting a large loss at serving batches (round 2 on the H200:
GDN's dot flush won the batch-1/256 geomean by 2.7 us at batch 1 while losing 67 us at 256).  It writes a YAML with the layout of
``sglang_replayssm/kernels/configs/<gpu>.yaml``: the base file, with the picked variant's launch
parameters as the family's ``default`` entry.  A later GPU call can serve with it at once
(``SGLANG_REPLAYSSM_KERNEL_CONFIG=<file>``) and the file is what to commit after review::

    python -m eval.pick_verify_config $OUT/spec-*.json --out $OUT/h200-picked.yaml
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from eval import report

FAMILY_KEY = {"mamba2": "mamba2_verify", "gdn": "gdn_verify"}
PICK_BATCHES = (1, 32, 256)


def score(doc: Dict[str, Any], family: str, state_dtype: str = "fp32") -> Optional[float]:
    """Geometric mean of ``t_ours_us`` over the family's cases at PICK_BATCHES (None when any is missing
    or the run's correctness check for the family did not pass)."""
    checks = [c for c in doc.get("correctness") or [] if c.get("family") == family]
    if not checks or not all(c.get("passed") for c in checks):
        return None
    times = [c.get("t_ours_us") for c in doc.get("cases") or []
             if c.get("family") == family and c.get("state_dtype") == state_dtype and c.get("batch") in PICK_BATCHES]
    if len(times) < len(PICK_BATCHES) or not all(t and t > 0 for t in times):
        return None
    return math.exp(sum(math.log(t) for t in times) / len(times))


def pick(docs: Sequence[Dict[str, Any]], names: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """family -> {variant, score_us, config, all: {variant: score}} for the families any run measured."""
    out: Dict[str, Dict[str, Any]] = {}
    for family in FAMILY_KEY:
        scored = [(score(d, family), n, d) for d, n in zip(docs, names)]
        table = {n: s for s, n, _ in scored}
        valid = [x for x in scored if x[0] is not None]
        if not valid:
            continue
        best, name, doc = min(valid, key=lambda x: x[0])
        cfg = ((doc.get("ours") or {}).get(family) or {}).get("config")
        if not cfg:
            raise ValueError(f"{name}: the run does not record the {family} launch config it used")
        out[family] = {"variant": name, "score_us": best, "config": dict(cfg), "all": table}
    return out


def write_yaml(picked: Dict[str, Dict[str, Any]], base: Path, out: Path) -> None:
    import yaml

    doc = yaml.safe_load(base.read_text()) or {}
    for family, p in picked.items():
        section = doc.setdefault(FAMILY_KEY[family], {})
        section["default"] = dict(p["config"])
    header = "".join(f"# {FAMILY_KEY[f]}: variant {p['variant']} (geomean of bs {'/'.join(map(str, PICK_BATCHES))} "
                     f"fp32 amortised time {p['score_us']:.1f} us; all: "
                     + ", ".join(f"{k} {report.fmt(v, 1)}" for k, v in p["all"].items()) + ")\n"
                     for f, p in picked.items())
    out.write_text(f"# picked by eval.pick_verify_config from {base}\n" + header + yaml.safe_dump(doc, sort_keys=False))


def main(argv: Optional[List[str]] = None) -> int:
    from sglang_replayssm.kernels.common import CONFIG_DIR

    ap = argparse.ArgumentParser(prog="python -m eval.pick_verify_config", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="bench_spec JSONs, one per variant (spec-<variant>.json, or .json.gz)")
    ap.add_argument("--out", required=True, help="YAML to write")
    ap.add_argument("--base", default=str(CONFIG_DIR / "h200.yaml"), help="launch-config file the pick goes into")
    args = ap.parse_args(argv)
    paths = [Path(p) for p in args.results]
    names = [p.name[len("spec-"):] if p.name.startswith("spec-") else p.name for p in paths]
    names = [n.removesuffix(".gz").removesuffix(".json") for n in names]
    picked = pick([report.read_json(p) for p in paths], names)
    if not picked:
        batches = "/".join(map(str, PICK_BATCHES))
        print(f"pick_verify_config: no run passed its correctness check with batch {batches} timed", file=sys.stderr)
        return 1
    write_yaml(picked, Path(args.base), Path(args.out))
    for f, p in picked.items():
        print(f"{FAMILY_KEY[f]}: {p['variant']} ({p['score_us']:.1f} us) {p['config']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
