"""Named workloads of ``python -m eval.ab --workload NAME``: the flags of a standard measurement, so that every
run of it is alike and ``eval.e2e_summary`` can tell its runs from the others.

``standard-decode`` (issue 24): bench_serving random token ids, 1024 in / 1024 out, two waves (prompts = 2 x
concurrency) at concurrency 256 and at 1; arms stock, staged (ours), upstream (SGLang's own GDN replay kernel,
GDN models only) and a second stock server for the stock-vs-stock noise floor; ``--stream-interval 8`` on every
server, because at SGLang's default of 1 its tokenizer-manager process caps what a streaming client receives
(stock and ours alike) far below these servers' decode rates (docs/streaming.md,
eval/results/e2e-h200/streaming-cap/README.md), and the run would measure that process instead of decoding.  Flags not given on the command
line take the preset's values; a flag given keeps the given value (and the run is then no longer the standard
one where it changes the workload: ``e2e_summary`` compares the recorded flags).

``shared-prefix`` (issue 19): bench_serving's generated-shared-prefix dataset (``--gsp-groups`` groups of
``--gsp-prompts-per-group`` text prompts, each a group's ``--gsp-system-len``-token system prompt + its own
``--gsp-question-len``-token question, ``--output-len`` out), prefix cache flushed after each run's warm-up;
``--radix-cache default`` (no radix flag: each server on its own defaults, i.e. SGLang's extra_buffer strategy with
the overlap scheduler, what a user who gives no flag gets), arms stock,staged; greedy
parity on prompts that share prefixes, hit against cold (eval/ab/parity.py).  ``--radix-cache off`` gives the
run without caching (a second run: every arm of one run has the same SGLang flags).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List, Sequence, Set

WORKLOADS: Dict[str, Dict[str, Any]] = {
    # min_prompts 1: batch 1 runs two waves too (prompts = max(batch x rounds, --min-prompts))
    "standard-decode": {"input_len": 1024, "output_len": 1024, "rounds": 2, "batch": "1,256", "min_prompts": 1,
                        "stream_interval": 8},
    # upstream (--enable-linear-replayssm) serves no_buffer only, so it is no arm of the default; named in --arms it
    # gets --mamba-radix-cache-strategy no_buffer --disable-overlap-schedule (eval.ab.servers.arm_launch)
    "shared-prefix": {"output_len": 256, "batch": "16,64", "radix_cache": "default", "arms": "stock,staged"},
}
# the in/out/waves that make a run the standard decode workload (eval/e2e_summary.py reads them)
STANDARD_DECODE = {k: WORKLOADS["standard-decode"][k] for k in ("input_len", "output_len", "rounds", "stream_interval")}


def is_gdn(model: str) -> bool:
    """A Gated-DeltaNet model: a built-in geometry of that family, or a model directory whose config has the
    GDN (``linear_*``) keys of Qwen3-Next / Qwen3.5."""
    from eval import models

    g = models.GEOMETRIES.get(model)
    if g is not None:
        return g.family == "gdn"
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "linear_num_value_heads" in cfg


def preset_arms(model: str) -> str:
    return "stock,staged" + (",upstream" if is_gdn(model) else "") + ",stock"


def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> Set[str]:
    """The destinations of the flags given in ``argv`` (argparse fills a default only into a namespace that lacks
    the attribute, so a namespace pre-filled with a marker keeps the marker where no flag was given)."""
    marker = object()
    # actions that add to what is there (--server-arg, append) start from None instead: None means not given
    adding = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction, argparse._ExtendAction)
    ns = argparse.Namespace(**{a.dest: None if isinstance(a, adding) else marker
                               for a in parser._actions if a.dest != argparse.SUPPRESS})
    parser.parse_known_args(list(argv), namespace=ns)
    return {k for k, v in vars(ns).items() if v is not marker and v is not None}


def apply_workload(args, parser: argparse.ArgumentParser, argv: Sequence[str]) -> List[str]:
    """Give the flags the ``--workload`` preset sets its values where ``argv`` does not give them; returns what
    it set (``flag=value``), for the log and the record."""
    name = getattr(args, "workload", "none") or "none"
    if name == "none":
        return []
    if name not in WORKLOADS:
        raise ValueError(f"--workload {name!r}: known workloads are none, {', '.join(WORKLOADS)}")
    values = dict(WORKLOADS[name])
    values.setdefault("arms", preset_arms(args.model))
    given = given_flags(parser, argv)
    done = []
    for key, value in values.items():
        if key not in given:
            setattr(args, key, value)
            done.append(f"--{key.replace('_', '-')}={value}")
    return done
