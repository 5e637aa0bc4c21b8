"""Seam: ``ServerArgs.check_server_args`` -- reject unsupported combinations at launch.

No math. An AFTER hook: SGLang validates its own arguments first, then this rejects what
sglang_replayssm cannot serve correctly, with one message that lists every problem and
what to change. It runs in the launcher process (before any scheduler starts) and again
in every scheduler process.
"""

from __future__ import annotations

import logging
from typing import List

from ..config import ReplaySSMConfig, from_env
from .registry import Patch

# chain-draft algorithms whose verify + commit run through the seams this package hooks
# (NEXTN is SGLang's alias of EAGLE; MTP drafts are NEXTN layers). STANDALONE is left out: a
# hybrid standalone draft model would run SGLang's own kernels on the shared mamba pool.
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")

logger = logging.getLogger("sglang_replayssm.patches")

TARGET = "sglang.srt.server_args.ServerArgs.check_server_args"


class UnsupportedConfigError(ValueError):
    """SGLang server arguments that sglang_replayssm does not support."""


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
    extra = getattr(args, "enable_mamba_extra_buffer", None)
    extra_on = extra() if callable(extra) else str(g("mamba_radix_cache_strategy") or "").startswith("extra_buffer")
    if extra_on:
        # the tracked states themselves are materialised (patches/prefix_track.py, CPU-tested); what is
        # missing is the decode seams taking a tracked decode forward (they refuse mamba_track_mask)
        out.append(f"--mamba-radix-cache-strategy {g('mamba_radix_cache_strategy')}: the replay ring's decode path "
                   "does not run SGLang's extra_buffer state tracking yet; use --mamba-radix-cache-strategy "
                   "no_buffer --disable-overlap-schedule (prefix caching kept), or --disable-radix-cache")
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
    algo = g("speculative_algorithm")
    if algo and str(algo).upper() != "NONE":
        topk = g("speculative_eagle_topk")
        if topk is not None and topk > 1:
            out.append(f"--speculative-eagle-topk {topk}: tree verify is not supported; use topk 1")
        if cfg.spec and str(algo).upper() not in SPEC_ALGORITHMS:
            out.append(f"--speculative-algorithm {algo}: the replay-ring verifier serves chain drafts of "
                       f"{'/'.join(SPEC_ALGORITHMS)}; use one of those or --replayssm-spec false")
        windows = [(name, g(name)) for name in ("speculative_num_draft_tokens", "max_speculative_num_draft_tokens")]
        for name, ndraft in windows:
            if cfg.spec and ndraft is not None and cfg.buffer_len < ndraft:
                out.append(f"--replayssm-buffer-len {cfg.buffer_len} is smaller than --{name.replace('_', '-')} "
                           f"{ndraft}: the ring history block must hold at least one verify window")
    return out


def check_server_args_after(result, self, *args, **kwargs):
    cfg = from_env()
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
