"""``python -m sglang_replayssm.launch_server [--replayssm-*] <any SGLang server flags>``.

Strips the ``--replayssm-*`` flags, validates them, exports them as
``SGLANG_REPLAYSSM_*`` (so SGLang's spawned scheduler processes inherit them, and the
plugin applies the patches there), then runs SGLang's own ``sglang.launch_server``
entry in this process: every SGLang flag behaves exactly as with stock SGLang.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from typing import List, Optional

from .config import CONFIG_FILE_ENV, ConfigError, ReplaySSMConfig, add_flags, from_flags

PROG = "python -m sglang_replayssm.launch_server"


def _own_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    add_flags(p)
    return p


def full_help() -> str:
    """SGLang's server flags and the --replayssm-* flags in one help text."""
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Launch an SGLang server with ReplaySSM decoding for hybrid Mamba2 / GDN models. "
                    "Takes every SGLang server flag plus the --replayssm-* flags below.")
    add_flags(p)
    try:
        from sglang.srt.server_args import ServerArgs

        ServerArgs.add_cli_args(p)
    except Exception as e:  # SGLang missing or broken: still document our own flags
        p.epilog = f"(SGLang server flags unavailable: {type(e).__name__}: {e})"
    return p.format_help()


def entry_point_registered() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value.startswith("sglang_replayssm.plugin") for ep in entry_points(group="sglang.srt.plugins"))


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


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, rest = _own_parser().parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        print(full_help())
        return 0
    try:
        cfg = resolve_spec_max_running(from_flags(ns), rest)
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if cfg.enable and not entry_point_registered():
        print(f"{PROG}: error: the sglang_replayssm plugin entry point is not registered, so SGLang's "
              "scheduler processes would run unpatched. Install the package (pip install -e . or "
              "pip install sglang-replayssm) in the environment that runs SGLang.", file=sys.stderr)
        return 2
    os.environ.update(cfg.to_env())
    if ns.replayssm_config:
        os.environ[CONFIG_FILE_ENV] = os.path.abspath(ns.replayssm_config)
    sys.argv = [PROG] + rest
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
