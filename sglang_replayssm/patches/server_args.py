"""Seam: ``ServerArgs.check_server_args`` -- reject unsupported combinations at launch.

No math. An AFTER hook: SGLang validates its own arguments first, then this rejects what
sglang_replayssm cannot serve correctly, with one message that lists every problem and
what to change. It runs in the launcher process (before any scheduler starts) and again
in every scheduler process.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Optional, Tuple

from ..config import ReplaySSMConfig, current
from .registry import Patch

# chain-draft algorithms whose verify + commit run through the seams this package hooks
# (NEXTN is SGLang's alias of EAGLE; MTP drafts are NEXTN layers). STANDALONE is left out: a
# hybrid standalone draft model would run SGLang's own kernels on the shared mamba pool.
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")

logger = logging.getLogger("sglang_replayssm.patches")

TARGET = "sglang.srt.server_args.ServerArgs.check_server_args"


class UnsupportedConfigError(ValueError):
    """SGLang server arguments that sglang_replayssm does not support."""


def extra_buffer_on(args) -> bool:
    """Whether ``args`` serve SGLang's extra_buffer / extra_buffer_lazy mamba radix strategy (its resolved
    ServerArgs answer themselves; a plain namespace by its strategy field)."""
    extra = getattr(args, "enable_mamba_extra_buffer", None)
    return extra() if callable(extra) else str(getattr(args, "mamba_radix_cache_strategy", None) or "").startswith(
        "extra_buffer")


def unsupported_reasons(args, cfg: ReplaySSMConfig) -> List[str]:
    """Every reason why ``args`` (a ServerArgs) cannot run with ReplaySSM ``cfg``."""
    g = lambda name, default=None: getattr(args, name, default)  # noqa: E731
    out: List[str] = []
    if g("enable_linear_replayssm") or g("enable_linear_replayssm_spec"):
        out.append("--enable-linear-replayssm / --enable-linear-replayssm-spec (SGLang's own GDN replay ring) "
                   "cannot be combined with sglang_replayssm; drop those flags or use --replayssm-disable")
    if (g("disaggregation_mode") or "null") != "null":
        out.append(f"--disaggregation-mode {g('disaggregation_mode')}: PD disaggregation moves mamba state "
                   "without the replay ring; not supported")
    if g("enable_hierarchical_cache"):
        out.append("--enable-hierarchical-cache: host round trips of mamba state bypass the replay ring; not supported")
    extra_on = extra_buffer_on(args)
    algo = g("speculative_algorithm")
    speculative = bool(algo) and str(algo).upper() != "NONE"
    if extra_on and speculative and cfg.extra_buffer and not cfg.spec:
        out.append(f"--mamba-radix-cache-strategy {g('mamba_radix_cache_strategy')} with speculative decoding and "
                   "--replayssm-spec false: the tracked verify states are materialised by the ring verifier's "
                   "commit; drop --replayssm-spec false, or use --mamba-radix-cache-strategy no_buffer "
                   "--disable-overlap-schedule")
    elif extra_on and not cfg.extra_buffer:
        out.append(f"--mamba-radix-cache-strategy {g('mamba_radix_cache_strategy')} (SGLang's default prefix "
                   "caching) with --replayssm-extra-buffer false: drop that setting, or use "
                   "--mamba-radix-cache-strategy no_buffer --disable-overlap-schedule, or --disable-radix-cache")
    if g("enable_int8_mamba_checkpoint"):
        out.append("--enable-int8-mamba-checkpoint: the int8 checkpoint pool loads cached states into slots without "
                   "clearing or copying them, so their replay-ring cursors would be stale; not supported")
    if g("enable_streaming_session"):
        out.append("--enable-streaming-session: a session keeps a request's mamba slot across turns without the "
                   "radix cache's fold of the replay ring; not supported")
    if g("enable_unified_memory"):
        out.append("--enable-unified-memory: the unified mamba pool is not supported yet")
    # tensor parallelism (--tp-size N) is supported: every rank's pool holds its shard of the SSM heads and
    # gets a ring of that shard's geometry (patches/pool.py); the other ways of splitting a model are not
    if (g("pp_size") or 1) > 1:
        out.append(f"--pp-size {g('pp_size')}: pipeline parallelism is not supported (PP=1 only); split the "
                   "model with --tp-size instead, or use --replayssm-disable")
    if g("enable_dp_attention"):
        out.append("--enable-dp-attention: data-parallel attention is not supported; use --tp-size without it, "
                   "or --replayssm-disable")
    for name, flag in (("attn_cp_size", "--attn-cp-size"), ("dcp_size", "--dcp-size")):
        if (g(name) or 1) > 1:
            out.append(f"{flag} {g(name)}: context parallelism is not supported; use --tp-size without it, "
                       "or --replayssm-disable")
    if g("enable_mixed_chunk"):
        out.append("--enable-mixed-chunk: SGLang runs the running decode rows of a mixed batch through the "
                   "prefill scan, which reads the checkpoint without the replay ring; drop the flag")
    if speculative:
        out += spec_reasons(args, cfg)
    return out


# --------------------------------------------------------------------------------------
# speculative decoding: tree shape, ring window, separate draft model
# --------------------------------------------------------------------------------------
# Tree verify (--speculative-eagle-topk > 1) runs on the replay ring: the verify seams hand a call that carries
# retrieve_parent_token to patches/spec_tree.py, whose commit seam is in replay_ring_patches()
# (docs/tree-speculation.md).  False refuses topk > 1 at launch (tests flip it to check the refusal).
TREE_VERIFY_WIRED = True

# EAGLE-family algorithms whose draft consumes the target's hidden states and shares its embedding
HIDDEN_STATE_DRAFTS = ("EAGLE", "EAGLE3", "NEXTN")


def tree_max_nodes(steps: int, topk: int) -> int:
    """Most nodes (root included) an EAGLE tree of ``steps`` x ``topk`` can hold: SGLang picks the T - 1 draft
    nodes as the top scores of ``topk + (steps - 1) * topk**2`` candidates (``eagle_utils.organize_draft_results``)."""
    return 1 + topk + max(steps - 1, 0) * topk * topk


def tree_tracking_available() -> bool:
    """Whether SGLang's ``spec_utils`` has ``_verify_commit_step_indices`` (0.5.17+), which the tree commit seam
    calls to find the tracked node under the extra_buffer strategy (``patches/spec_tree.py``)."""
    try:
        from sglang.srt.speculative import spec_utils
    except Exception:  # SGLang missing or broken: the version checks report it
        return True
    return hasattr(spec_utils, "_verify_commit_step_indices")


def spec_reasons(args, cfg: ReplaySSMConfig) -> List[str]:
    """Why the speculative settings of ``args`` cannot run on the replay ring (chains and trees alike).

    The spec ring of a slot holds ``R = B + T`` entries (``B`` = ``--replayssm-buffer-len``, ``T`` = the
    largest verify window, SGLang's ``--speculative-num-draft-tokens``: all tree nodes, root included;
    ``patches/pool.py`` ``spec_window``, ``kernels/spec_cursor.py``).  A verify writes all ``T`` window inputs
    behind the committed history, and the history block must hold one whole window (``B >= T``): a tree of
    more nodes than ``B`` does not fit the ring."""
    g = lambda name, default=None: getattr(args, name, default)  # noqa: E731
    out: List[str] = []
    algo = str(g("speculative_algorithm")).upper()
    topk, steps = g("speculative_eagle_topk"), g("speculative_num_steps")
    ndraft = g("speculative_num_draft_tokens")
    if topk is not None and topk > 1:
        if not TREE_VERIFY_WIRED:
            out.append(f"--speculative-eagle-topk {topk}: tree verify is not supported yet; use "
                       "--speculative-eagle-topk 1")
        if steps and ndraft and ndraft > tree_max_nodes(steps, topk):
            out.append(f"--speculative-num-draft-tokens {ndraft}: a tree of --speculative-num-steps {steps} x "
                       f"--speculative-eagle-topk {topk} has at most {tree_max_nodes(steps, topk)} nodes; lower "
                       "--speculative-num-draft-tokens or raise --speculative-num-steps / --speculative-eagle-topk")
        if cfg.spec and extra_buffer_on(args) and not tree_tracking_available():
            out.append(f"--speculative-eagle-topk {topk} with --mamba-radix-cache-strategy "
                       f"{g('mamba_radix_cache_strategy')}: this SGLang has no spec_utils._verify_commit_step_indices, "
                       "which the tree commit needs to track states; use --speculative-eagle-topk 1 or "
                       "--mamba-radix-cache-strategy no_buffer --disable-overlap-schedule")
    if cfg.spec and algo not in SPEC_ALGORITHMS:
        out.append(f"--speculative-algorithm {algo}: the replay-ring verifier serves EAGLE-family drafts "
                   f"({'/'.join(SPEC_ALGORITHMS)}); use one of those or --replayssm-spec false")
    for name in ("speculative_num_draft_tokens", "max_speculative_num_draft_tokens"):
        n = g(name)
        if cfg.spec and n is not None and cfg.buffer_len < n:
            flag = "--" + name.replace("_", "-")
            out.append(f"--replayssm-buffer-len {cfg.buffer_len} is smaller than {flag} {n}: the spec ring's history "
                       f"block must hold one whole verify window ({'tree nodes' if (topk or 1) > 1 else 'tokens'}, "
                       f"root included); raise --replayssm-buffer-len to {n} or more, or lower {flag}")
    problem = draft_model_problem(g("model_path"), g("speculative_draft_model_path"), algo)
    if problem:
        out.append(problem)
    return out


def _local_dir(path: Optional[str]) -> Optional[str]:
    """``path`` as a local directory when it names one (or looks like a local path); None for a hub id."""
    if not path:
        return None
    p = os.path.expanduser(str(path))
    if os.path.isdir(p) or os.path.isabs(p) or p.startswith((".", "~")) or os.path.exists(p):
        return p
    return None


def _read_config(directory: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """``(config, None)`` or ``(None, why)`` for ``directory/config.json`` (the file named in ``why``)."""
    f = os.path.join(directory, "config.json")
    if not os.path.isdir(directory):
        return None, f"draft model directory {directory} does not exist"
    if not os.path.isfile(f):
        return None, f"{f} is missing"
    try:
        with open(f, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except json.JSONDecodeError as e:
        return None, f"{f} is not valid JSON (line {e.lineno} column {e.colno}: {e.msg})"
    except (OSError, UnicodeDecodeError) as e:
        return None, f"{f} cannot be read ({type(e).__name__}: {e})"
    if not isinstance(cfg, dict):
        return None, f"{f} holds a JSON {type(cfg).__name__}, not an object"
    return cfg, None


def _text_config(cfg: Dict[str, Any]) -> Dict[str, Any]:
    sub = cfg.get("text_config")
    return sub if isinstance(sub, dict) and "hidden_size" not in cfg else cfg


def draft_model_problem(model_path: Optional[str], draft_path: Optional[str],
                        algorithm: Optional[str]) -> Optional[str]:
    """One line naming the file, when a separate draft model's ``config.json`` cannot serve the target, else None.

    Checked offline, before SGLang reads either file: a local draft directory must exist and hold a parsable
    ``config.json`` object; its ``vocab_size`` must equal the target's (drafted token ids are verified by the
    target), and for EAGLE-family drafts (EAGLE, EAGLE3, NEXTN) the hidden size the draft consumes must equal
    the target's (``hidden_size``; an EAGLE-3 draft's ``target_hidden_size`` when it sets one): the draft reads
    the target's hidden states, and an EAGLE-1 draft also takes over the target's embedding and LM head.
    A draft that is the target itself (MTP layers) and hub ids (not on disk yet) are not checked here."""
    draft = _local_dir(draft_path)
    if draft is None:
        return None
    target = _local_dir(model_path)
    if target is not None and os.path.isdir(target) and os.path.isdir(draft) \
            and os.path.samefile(target, draft):
        return None
    flag = "(--speculative-draft-model-path)"
    dcfg, why = _read_config(draft)
    if why:
        return f"{why} {flag}"
    if target is None or not os.path.isdir(target):
        return None
    tcfg, twhy = _read_config(target)
    if twhy:
        return None  # the target's own config is SGLang's to report
    d, t = _text_config(dcfg), _text_config(tcfg)
    dfile, tfile = os.path.join(draft, "config.json"), os.path.join(target, "config.json")
    for key in ("vocab_size", "hidden_size"):
        if key == "hidden_size" and str(algorithm).upper() not in HIDDEN_STATE_DRAFTS:
            continue
        dkey = "target_hidden_size" if key == "hidden_size" and "target_hidden_size" in d else key
        dv, tv = d.get(dkey), t.get(key)
        if dv is None:
            return f"{dfile} has no {dkey} {flag}"
        if tv is not None and dv != tv:
            why = ("the draft proposes token ids the target verifies" if key == "vocab_size" else
                   "an EAGLE draft reads the target's hidden states and shares its embedding")
            return (f"{dfile}: {dkey} {dv} differs from the target's {key} {tv} ({tfile}); {why}: use a draft made "
                    f"for this target {flag}")
    return None


def check_server_args_after(result, self, *args, **kwargs):
    cfg = current()
    if not cfg.enable:
        return None
    reasons = unsupported_reasons(self, cfg)
    if reasons:
        raise UnsupportedConfigError(
            "sglang_replayssm cannot run with these SGLang settings:\n  - " + "\n  - ".join(reasons)
            + "\n(launch stock SGLang with `python -m sglang.launch_server`, or add --replayssm-disable)")
    logger.debug("sglang_replayssm: server args accepted")
    return None


PATCHES = [
    Patch(TARGET, "after", check_server_args_after, params=("self",),
          description="reject unsupported SGLang combinations at launch"),
]
