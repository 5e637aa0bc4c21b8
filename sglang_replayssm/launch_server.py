"""``python -m sglang_replayssm.launch_server [--replayssm-*] <any SGLang server flags>``.

Strips the ``--replayssm-*`` flags, validates them, exports them as
``SGLANG_REPLAYSSM_*`` (so SGLang's spawned scheduler processes inherit them, and the
plugin applies the patches there), then runs SGLang's own ``sglang.launch_server``
entry in this process: every SGLang flag behaves exactly as with stock SGLang.

Everything that would otherwise fail late, or serve stock SGLang while claiming to be
patched, is refused first in one ``error:`` line with exit status 2, before SGLang is
imported: an unknown ``--replayssm-*`` flag, a bad setting, a kernel launch-config file
that does not exist or does not validate, SGLang missing or outside the supported range,
an ``SGLANG_PLUGINS`` allow-list without this plugin, a separate speculative draft model whose
``config.json`` is missing, unparsable or does not fit the target, and no CUDA device (unless
``--device`` names another device).

``SGLANG_PLUGINS`` is reported, not amended: it is an allow-list someone set on purpose
(often to keep other plugins out of a deployment), and rewriting it behind their back
would hide the conflict; the same rule holds for ``enable()`` and ``doctor``.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path
from typing import List, Optional

from .config import (CONFIG_FILE_ENV, DEPRECATED_ENV, ConfigError, ReplaySSMConfig, activate, add_flags, from_flags,
                     unknown_flag_error)

PROG = "python -m sglang_replayssm.launch_server"
PLUGINS_ENV = "SGLANG_PLUGINS"


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad ``--replayssm-*`` value as one ``prog: error:`` line (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _own_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog=PROG, add_help=False, allow_abbrev=False)
    add_flags(p)
    return p


def full_help() -> str:
    """SGLang's server flags and the --replayssm-* flags in one help text."""
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Launch an SGLang server with ReplaySSM decoding for hybrid Mamba2 / GDN models. "
                    "Takes every SGLang server flag plus the --replayssm-* flags below.",
        epilog="Streaming: with SGLang's default --stream-interval 1, SGLang's tokenizer-manager process caps the "
               "tokens/s that many concurrent streaming clients receive (stock SGLang too); --stream-interval 8 "
               "lifts it (docs/streaming.md).")
    add_flags(p)
    try:
        from sglang.srt.server_args import ServerArgs

        ServerArgs.add_cli_args(p)
    except Exception as e:  # SGLang missing or broken: still document our own flags
        p.epilog += f" (SGLang server flags unavailable: {type(e).__name__}: {e})"
    return p.format_help()


def _our_entry_points() -> List[str]:
    from importlib.metadata import entry_points

    return [ep.name for ep in entry_points(group="sglang.srt.plugins") if ep.value.startswith("sglang_replayssm.plugin")]


def entry_point_registered() -> bool:
    return bool(_our_entry_points())


def plugins_allowlist_problem(environ=None) -> Optional[str]:
    """Why SGLang would skip this plugin: ``SGLANG_PLUGINS`` set to a list that does not name it.

    SGLang 0.5.15, 0.5.17 and 0.5.23 read it alike (``sglang.srt.plugins.load_plugins_by_group``): a
    non-empty value is split on commas, entries stripped, and only the entry points named load, in
    every process; the patches would never be applied and the server would run stock."""
    environ = os.environ if environ is None else environ
    raw = environ.get(PLUGINS_ENV, "")
    allowed = {x.strip() for x in raw.split(",") if x.strip()}
    names = _our_entry_points()
    if not allowed or not names or allowed & set(names):
        return None
    return (f"{PLUGINS_ENV}={raw!r} does not name this plugin, so SGLang would load no ReplaySSM patches: "
            f"add {names[0]} to {PLUGINS_ENV} or unset it")


def kernel_config_problem(path: str) -> Optional[str]:
    """Why the kernel launch-config file ``path`` would fail at the first kernel call (one line), or None.

    The whole file is checked by ``kernels.common.validate_config_file`` (families, entries, parameter
    names and values); imported here, not at module import, as it pulls in torch and Triton."""
    if not Path(path).is_file():
        return f"kernel launch-config file {path!r} does not exist (--replayssm-kernel-config)"
    from .kernels.common import validate_config_file

    try:
        validate_config_file(path)
    except ValueError as e:
        return " ".join(str(e).split())
    return None


def sglang_problem(cfg: ReplaySSMConfig) -> Optional[str]:
    """SGLang missing, or (enabled) outside the versions the patches declare."""
    from .patches.registry import SGLANG_MISSING, PatchError, require_applicable, sglang_version

    if not cfg.enable:
        if sglang_version() == SGLANG_MISSING:
            return "SGLang is not installed (pip install sglang)"
        return None
    from .patches import active_patches

    try:
        require_applicable(active_patches(cfg.replay_ring, cfg.conv_verify_on))
    except PatchError as e:
        return str(e)
    return None


def _flag_value(argv: List[str], flag: str) -> Optional[str]:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def cuda_problem(sglang_argv: List[str], environ=None) -> Optional[str]:
    """No CUDA device while SGLang would serve on CUDA. ``--device <other>`` (cpu, xpu, npu, ...) or
    SGLang's ``SGLANG_USE_CPU_ENGINE=1`` leave the device to SGLang."""
    environ = os.environ if environ is None else environ
    device = _flag_value(sglang_argv, "--device")
    if (device and not device.startswith("cuda")) or environ.get("SGLANG_USE_CPU_ENGINE", "0") == "1":
        return None
    import torch

    if torch.cuda.is_available():
        return None
    return ("a CUDA GPU is required to serve (torch.cuda.is_available() is False); check the driver / "
            "CUDA_VISIBLE_DEVICES, or pass SGLang's --device for another device")


def _any_flag_value(argv: List[str], *flags: str) -> Optional[str]:
    for flag in flags:
        value = _flag_value(argv, flag)
        if value is not None:
            return value
    return None


def draft_model_problem(sglang_argv: List[str]) -> Optional[str]:
    """A separate speculative draft model whose ``config.json`` is missing, unparsable, or does not fit the
    target (vocab, hidden size), in one line naming the file (``patches.server_args.draft_model_problem``: no
    SGLang import), before SGLang reads it; the server-args hook repeats the check for plugin-only launches."""
    algo = _flag_value(sglang_argv, "--speculative-algorithm")
    if not algo or algo.upper() == "NONE":
        return None
    from .patches.server_args import draft_model_problem as problem

    return problem(_any_flag_value(sglang_argv, "--model-path", "--model"),
                   _any_flag_value(sglang_argv, "--speculative-draft-model-path", "--speculative-draft-model"), algo)


def _has_flag(argv: List[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def resolve_spec_max_running(cfg: ReplaySSMConfig, sglang_argv: List[str]) -> ReplaySSMConfig:
    """The launcher's default for ``spec_max_running``: ``auto`` unless the user gave
    ``--max-running-requests`` (an explicit SGLang flag always wins).  Setting ``auto``
    explicitly together with ``--max-running-requests`` is a contradiction and raises."""
    explicit = _has_flag(sglang_argv, "--max-running-requests")
    if "spec_max_running" in cfg.source:
        if explicit and cfg.spec_max_running == "auto":
            raise ConfigError("--replayssm-spec-max-running auto sizes max running requests from memory; "
                              "it cannot be combined with --max-running-requests (drop one of them)")
        return cfg
    return cfg.replace(spec_max_running="sglang" if explicit else "auto")


def streaming_note(cfg: ReplaySSMConfig, sglang_argv: List[str]) -> Optional[str]:
    """One log line when SGLang will stream every token (``--stream-interval`` 1, its default) to a server that
    decodes on the replay ring: above some thousands of streamed tokens/s SGLang's tokenizer-manager process caps what
    streaming clients receive, for stock SGLang too (docs/streaming.md). Advice only: the flag stays the user's."""
    if not (cfg.enable and cfg.replay_ring):
        return None
    value = "1"  # SGLang's argparse keeps the last of repeated flags
    for i, a in enumerate(sglang_argv):
        if a == "--stream-interval" and i + 1 < len(sglang_argv):
            value = sglang_argv[i + 1]
        elif a.startswith("--stream-interval="):
            value = a.split("=", 1)[1]
    try:
        if int(value) != 1:
            return None
    except ValueError:
        return None  # SGLang refuses it
    return ("sglang_replayssm: --stream-interval 1 (SGLang's default): with many concurrent streaming requests, "
            "SGLang's tokenizer-manager process (one CPU core) caps the tokens/s that streaming clients receive, for "
            "stock SGLang and this launcher alike, so faster decoding does not reach them there (measured on an H200 "
            "host: 12-16k tokens/s with 512-token outputs); --stream-interval 8 lifts the cap "
            "(the first token still goes out at once, later ones in groups of 8), as does a request's own "
            "\"stream_interval\" sampling parameter; see docs/streaming.md")


def _error(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return 2


def launch_problem(cfg: ReplaySSMConfig, sglang_argv: List[str]) -> Optional[str]:
    """The first reason not to start SGLang with ``cfg`` (one line), or None."""
    if cfg.enable:
        if not entry_point_registered():
            return ("the sglang_replayssm plugin entry point is not registered, so SGLang's scheduler processes "
                    "would run unpatched. Install the package (pip install -e . or pip install sglang-replayssm) "
                    "in the environment that runs SGLang.")
        problem = plugins_allowlist_problem()
        if problem:
            return problem
    problem = sglang_problem(cfg)
    if problem:
        return problem
    if cfg.enable and cfg.kernel_config:
        problem = kernel_config_problem(cfg.kernel_config)
        if problem:
            return problem
    if cfg.enable:
        problem = draft_model_problem(sglang_argv)
        if problem:
            return problem
    return cuda_problem(sglang_argv)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, rest = _own_parser().parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        print(full_help())
        return 0
    unknown = unknown_flag_error(rest)
    if unknown:
        return _error(unknown)
    try:
        cfg = resolve_spec_max_running(from_flags(ns), rest)
    except ConfigError as e:
        return _error(str(e))
    problem = launch_problem(cfg, rest)
    if problem:
        return _error(problem)
    for k in DEPRECATED_ENV:  # read into cfg; SGLang's processes get the new names only (no second warning)
        os.environ.pop(k, None)
    os.environ.update(cfg.to_env())
    if ns.replayssm_config:
        os.environ[CONFIG_FILE_ENV] = os.path.abspath(ns.replayssm_config)
    activate(cfg)  # this process's config (SGLang's plugin hook here finds it instead of parsing the env again)
    note = streaming_note(cfg, rest)
    if note:
        from .plugin import logger, setup_logging

        setup_logging(cfg)
        logger.info(note)
    sys.argv = [PROG] + rest
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
