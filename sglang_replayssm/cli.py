"""``sglang-replayssm`` / ``python -m sglang_replayssm``: doctor, launch, flags."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import List, Optional


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "not installed"


def _kernel_config_in_force(cfg) -> Optional[str]:
    """The launch-config file the kernels would read (named, else the GPU's packaged one), or None
    when the kernels cannot be imported here."""
    try:
        from .kernels.common import config_file
    except Exception:
        return None
    return str(config_file(cfg.kernel_config))


def doctor(as_json: bool = False, apply_patches: bool = False) -> int:
    from . import __version__
    from .config import ConfigError, from_env
    from .launch_server import entry_point_registered, kernel_config_problem, plugins_allowlist_problem
    from .patches import (active_patches, apply, conv_verify_patches, launch_check_patches, replay_ring_patches,
                          status, verify)
    from .patches.registry import SGLANG_MISSING, PatchError, require_applicable, sglang_version

    info = {
        "sglang_replayssm": __version__,
        "python": platform.python_version(),
        "sglang": sglang_version(),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "entry_point_registered": entry_point_registered(),
    }
    try:
        import torch

        info["cuda"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    except Exception as e:  # pragma: no cover
        info["cuda"] = f"unknown ({e})"
    problems: List[str] = []
    cfg = None
    try:
        cfg = from_env()
        info["config"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.as_dict().items()}
        info["config_source"] = dict(cfg.source)
    except ConfigError as e:
        info["config_error"] = str(e)
        problems.append(f"config error: {e}")
    # what a server with this config applies: the launch checks, and the seams unless replay_ring is false
    seams_on = cfg.replay_ring if cfg is not None else True
    conv_on = cfg.conv_verify_on if cfg is not None else True
    info["conv_verify_on"] = conv_on
    missing = info["sglang"] == SGLANG_MISSING
    try:  # SGLang missing or outside every patch's range: enabling would patch nothing
        require_applicable(active_patches(seams_on, conv_on))
    except PatchError as e:
        problems.append(str(e))
    if not info["entry_point_registered"]:
        problems.append("the sglang.srt.plugins entry point is not registered (pip install the package), so "
                        "SGLang's processes would run unpatched")
    allow = plugins_allowlist_problem()
    if allow:
        problems.append(allow)
    if cfg is not None:
        kfile = _kernel_config_in_force(cfg) or cfg.kernel_config
        info["kernel_config"] = kfile
        bad = kernel_config_problem(kfile) if kfile and (cfg.kernel_config or Path(kfile).is_file()) else None
        if bad:
            problems.append(bad)
    if apply_patches and not missing:
        try:
            active = active_patches(seams_on, conv_on)
            apply(active)
            verify(active)
        except Exception as e:
            info["apply_error"] = str(e)
            problems.append(f"apply error: {e}")
    rows = [] if missing else status(launch_check_patches())
    info["targets"] = [{"target": t, "state": s, "detail": d} for t, s, d in rows]
    seams = [] if missing else status(replay_ring_patches())
    info["replay_ring_targets"] = [{"target": t, "state": s, "detail": d} for t, s, d in seams]
    convs = [] if missing else status(conv_verify_patches())
    info["conv_verify_targets"] = [{"target": t, "state": s, "detail": d} for t, s, d in convs]
    gone = [t for t, s, _ in rows + (seams if seams_on else []) + (convs if conv_on else []) if s == "missing"]
    if gone:
        problems.append(f"{len(gone)} patch target(s) missing in SGLang {info['sglang']}: {', '.join(gone)}")
    info["problems"] = problems
    rc = 1 if problems else 0
    if as_json:
        print(json.dumps(info, indent=2))
        return rc
    print("sglang_replayssm doctor")
    for k in ("sglang_replayssm", "python", "sglang", "torch", "triton", "cuda", "entry_point_registered"):
        print(f"  {k:<24} {info[k]}")
    if "config" in info:
        print("  config in force:")
        for k, v in info["config"].items():
            if k == "conv_verify" and v is None:  # auto, shown with what it resolves to
                v = f"auto ({'on' if conv_on else 'off'})"
            print(f"    {k:<16} {v!s:<28} ({info['config_source'].get(k, 'default')})")
        if info.get("kernel_config"):
            print(f"  kernel launch-config file: {info['kernel_config']}")
    if not missing:
        print(f"  patch targets ({len(rows)}):")
        for t, s, d in rows:
            print(f"    [{s:<8}] {t}" + (f"  -- {d}" if d and s != "resolved" and s != "patched" else ""))
        print(f"  replay-ring seams, applied unless --replayssm-replay-ring false ({len(seams)}"
              + ("" if seams_on else "; off in this config") + "):")
        for t, s, d in seams:
            print(f"    [{s:<8}] {t}" + (f"  -- {d}" if s == "missing" else ""))
        print(f"  conv1d verify seam, applied with the replay ring (--replayssm-conv-verify auto) or true ({len(convs)}"
              + ("" if conv_on else "; off in this config") + "):")
        for t, s, d in convs:
            print(f"    [{s:<8}] {t}" + (f"  -- {d}" if s == "missing" else ""))
    for msg in problems:
        print(f"  error: {msg}")
    print("  status:", "OK" if rc == 0 else "PROBLEMS FOUND")
    return rc


def serve_command(model: str, extra: List[str], stock: bool = False, root: Optional[str] = None) -> List[str]:
    """The server command line for ``serve`` (built-in models get dummy weights and no tokenizer; their
    config.json is written under ``root``, a fresh temporary directory when None)."""
    from . import models

    cmd = [sys.executable, "-m", "sglang.launch_server" if stock else "sglang_replayssm.launch_server"]
    if model in models.names():
        path = models.materialize(model, root=root)
        cmd += ["--model-path", path, "--load-format", "dummy", "--skip-tokenizer-init",
                "--attention-backend", models.ATTENTION_BACKEND[model],
                "--mem-fraction-static", "0.5", "--context-length", "4096"]
    else:
        cmd += ["--model-path", model]
    return cmd + list(extra)


def serve(model: str, extra: List[str], stock: bool = False) -> int:
    """Run the server as a child process; a built-in model's config directory lives only as long as it."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="replayssm-serve-") as root:
        cmd = serve_command(model, extra, stock, root=root)
        print("+ " + " ".join(cmd), flush=True)
        try:
            return subprocess.call(cmd)
        except KeyboardInterrupt:  # the child got the same Ctrl-C; the directory is still removed
            return 130


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="sglang-replayssm",
                                description="ReplaySSM decoding for hybrid models in stock SGLang.")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="versions, config in force, and each patch target: resolved / patched / missing")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.add_argument("--apply", action="store_true", help="also apply and verify the patches in this process")
    sub.add_parser("launch", help="same as python -m sglang_replayssm.launch_server", add_help=False)
    sub.add_parser("flags", help="list the launcher's --replayssm-* flags and their environment variables")
    sv = sub.add_parser("serve", help="GPU host: launch the patched server on a built-in tiny model "
                        "(dummy weights, no download) or on --model PATH; extra args go to SGLang")
    sv.add_argument("--model", default="tiny-nemotron-h",
                    help="built-in model name (tiny-nemotron-h, tiny-qwen3-next) or a model path")
    sv.add_argument("--stock", action="store_true", help="launch stock SGLang instead (for A/B)")
    if argv and argv[0] == "launch":
        from .launch_server import main as launch_main

        return launch_main(argv[1:])
    if argv and argv[0] == "serve":
        args, rest = p.parse_known_args(argv)
        return serve(args.model, rest, stock=args.stock)
    args = p.parse_args(argv)
    if args.cmd == "doctor":
        return doctor(as_json=args.json, apply_patches=args.apply)
    if args.cmd == "flags":
        from .config import flags_help

        print("the launcher's --replayssm-* flags (python -m sglang_replayssm.launch_server / sglang-replayssm "
              "launch), each with its environment variable:")
        print(flags_help())
        return 0
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
