"""The run's plan: the servers (arms, spec-parity and reference servers) in order, and the batch sizes.

Pure functions of the command line, so ``--dry-run`` prints a plan and tests check one without a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple


# stock: plain SGLang; patched: our launcher with ``--replayssm-replay-ring false`` (the launch checks only,
# SGLang's own SSM kernels); staged: our launcher as users run it (its default: the replay-ring seams,
# decode and verify); upstream: plain SGLang with its own GDN replay kernel (``--enable-linear-replayssm``)
ARM_KINDS = ("stock", "patched", "staged", "upstream")
STOCK_KINDS = ("stock", "upstream")  # plain SGLang launcher, no replayssm plugin
SPEC_ALGOS = {"none": None, "nextn": "NEXTN", "eagle": "EAGLE"}


@dataclass
class Phase:
    label: str                  # unique: "stock", "stock-2", "patched", "patched-spec-parity", ...
    kind: str                   # one of ARM_KINDS
    spec: bool                  # speculative flags on
    sim_acc_len: Optional[float]
    bench: bool
    parity: bool
    role: str = "arm"           # "arm" | "spec-parity" | "reference"
    kernel_config: Optional[str] = None  # this arm's kernel launch-config YAML (patched/staged ``@FILE``)


def parse_arms(text: str) -> List[Tuple[str, str, bool, Optional[str]]]:
    """``"stock,stock,patched"`` -> [("stock", "stock", False, None), ("stock-2", "stock", False, None),
    ("patched", "patched", False, None)].  A ``:nospec`` suffix (``stock:nospec``) runs that arm without
    the speculative flags of a ``--spec`` run (label ``stock-nospec``): the non-speculative
    baseline measured in the same run.  A patched or staged arm may end in ``@FILE``: that server runs
    with FILE as its kernel launch-config YAML (``SGLANG_REPLAYSSM_KERNEL_CONFIG``; label
    ``staged-<file stem>``), so launch variants are compared inside the server in one run."""
    items = [a.strip() for a in text.split(",") if a.strip()]
    if not items:
        raise ValueError("--arms is empty")
    out, seen = [], {}
    for item in items:
        head, at, cfg = item.partition("@")
        kind, _, mod = head.partition(":")
        if kind not in ARM_KINDS or mod not in ("", "nospec") or (at and not cfg):
            raise ValueError(f"unknown arm {item!r}; accepted: {', '.join(ARM_KINDS)}, each optionally with "
                             ":nospec, and patched or staged with @<kernel launch-config YAML>")
        if cfg and kind in STOCK_KINDS:
            raise ValueError(f"arm {item!r}: a kernel launch-config file (@FILE) applies to patched and staged "
                             "arms only (stock servers do not run the replay kernels)")
        if cfg and not Path(cfg).is_file():
            raise ValueError(f"arm {item!r}: kernel launch-config file {cfg!r} not found")
        base = f"{kind}-nospec" if mod else kind
        if cfg:
            base += "-" + (re.sub(r"[^A-Za-z0-9]+", "-", Path(cfg).stem).strip("-") or "config")
        seen[base] = seen.get(base, 0) + 1
        label = base if seen[base] == 1 else f"{base}-{seen[base]}"
        while label in {o[0] for o in out}:  # e.g. staged,staged,staged@2.yaml: "staged-2" twice
            seen[base] += 1
            label = f"{base}-{seen[base]}"
        out.append((label, kind, bool(mod), str(Path(cfg).resolve()) if cfg else None))
    return out


def spec_shape(args) -> Tuple[int, int, int]:
    """``(steps, topk, draft_tokens)`` of a ``--spec`` run, checked (a ValueError names the flag).

    A chain (``--spec-topk 1``) verifies ``--spec-steps`` + 1 tokens: SGLang resets any other
    ``--speculative-num-draft-tokens`` to that, so another ``--spec-draft-tokens`` is refused rather than
    silently changed.  A tree (``--spec-topk K > 1``) needs ``--spec-draft-tokens N`` (its nodes, root
    included), at most what ``--spec-steps`` x K can hold (``tree_max_nodes``)."""
    from sglang_replayssm.patches.server_args import tree_max_nodes

    steps, topk, n = args.spec_steps, getattr(args, "spec_topk", 1), getattr(args, "spec_draft_tokens", 0) or 0
    if args.spec == "none":
        if topk != 1 or n:
            raise ValueError("--spec-topk / --spec-draft-tokens shape a speculative run: add --spec nextn|eagle")
        return steps, topk, n
    if steps < 1 or topk < 1 or n < 0:
        raise ValueError(f"--spec-steps and --spec-topk take positive integers and --spec-draft-tokens a "
                         f"non-negative one, got {steps}, {topk} and {n}")
    if topk == 1:
        if n and n != steps + 1:
            raise ValueError(f"--spec-draft-tokens {n}: a chain (--spec-topk 1) verifies --spec-steps + 1 = "
                             f"{steps + 1} tokens; drop --spec-draft-tokens or pass {steps + 1}")
        return steps, 1, steps + 1
    most = tree_max_nodes(steps, topk)
    if not 2 <= n <= most:
        raise ValueError(f"--spec-topk {topk} (a tree) needs --spec-draft-tokens N with 2 <= N <= {most} (the most "
                         f"nodes --spec-steps {steps} x --spec-topk {topk} can hold), got {n or 'none'}")
    return steps, topk, n


def parse_batches(text: str, flag: str = "--batch") -> List[int]:
    try:
        b = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not b or any(x < 1 for x in b):
        raise ValueError(f"{flag} takes positive integers, got {text!r}")
    return sorted(set(b))


def plan_phases(args) -> List[Phase]:
    spec = args.spec != "none"
    sim = args.sim_acc_len if spec and args.sim_acc_len else None
    # a whole accept length under "match-expected" accepts the same draft tokens on every server,
    # so simulated runs are comparable token for token (multi-token accepts, rollback, flushes)
    # (not for a tree: SGLang's fixed token mode makes every output one token id, and stock commits the last listed
    # node's own snapshot while the ring commits the listed nodes as a path: the outputs differ by design)
    repeatable = sim is None or (float(sim).is_integer() and args.sim_acc_method == "match-expected"
                                 and int(getattr(args, "spec_topk", 1) or 1) == 1)
    phases = [Phase(label, kind, spec and not nospec, None if nospec else sim, bench=not args.no_bench,
                    parity=(not args.no_parity) and repeatable and not (spec and nospec), kernel_config=cfg)
              for label, kind, nospec, cfg in parse_arms(args.arms)]
    if spec and not args.no_parity and args.spec_parity:
        if sim is not None:
            for kind in dict.fromkeys(p.kind for p in phases if p.spec):
                phases.append(Phase(f"{kind}-spec-parity", kind, True, None, bench=False, parity=True,
                                    role="spec-parity"))
        phases.append(Phase("stock-nospec-reference", "stock", False, None, bench=False, parity=True,
                            role="reference"))
    return phases
