"""``sglang-replayssm`` / ``python -m sglang_replayssm``: doctor, launch, flags."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import List, Optional


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "not installed"


def doctor(as_json: bool = False, apply_patches: bool = False) -> int:
    from . import __version__
    from .config import ConfigError, from_env
    from .launch_server import entry_point_registered
    from .patches import active_patches, all_patches, apply, staged_patches, status, verify
    from .patches.registry import sglang_version

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
    rc = 0
    cfg = None
    try:
        cfg = from_env()
        info["config"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.as_dict().items()}
        info["config_source"] = dict(cfg.source)
    except ConfigError as e:
        info["config_error"] = str(e)
        rc = 1
    # what a server with this config applies: the launch checks, and the seams unless staged is false
    seams_on = cfg.staged if cfg is not None else True
    if apply_patches:
        try:
            active = active_patches(seams_on)
            apply(active)
            verify(active)
        except Exception as e:
            info["apply_error"] = str(e)
            rc = 1
    rows = status(all_patches())
    info["targets"] = [{"target": t, "state": s, "detail": d} for t, s, d in rows]
    staged = status(staged_patches())
    info["staged_targets"] = [{"target": t, "state": s, "detail": d} for t, s, d in staged]
    if any(s == "missing" for _, s, _ in rows) or (seams_on and any(s == "missing" for _, s, _ in staged)):
        rc = 1
    if as_json:
        print(json.dumps(info, indent=2))
        return rc
    print("sglang_replayssm doctor")
    for k in ("sglang_replayssm", "python", "sglang", "torch", "triton", "cuda", "entry_point_registered"):
        print(f"  {k:<24} {info[k]}")
    if "config" in info:
        print("  config in force:")
        for k, v in info["config"].items():
            print(f"    {k:<16} {v!s:<28} ({info['config_source'].get(k, 'default')})")
    else:
        print(f"  config error: {info['config_error']}")
    if "apply_error" in info:
        print(f"  apply error: {info['apply_error']}")
    print(f"  patch targets ({len(rows)}):")
    for t, s, d in rows:
        print(f"    [{s:<8}] {t}" + (f"  -- {d}" if d and s != "resolved" and s != "patched" else ""))
    print(f"  replay-ring seams, applied unless --replayssm-staged false ({len(staged)}"
          + ("" if seams_on else "; off in this config") + "):")
    for t, s, d in staged:
        print(f"    [{s:<8}] {t}" + (f"  -- {d}" if s == "missing" else ""))
    print("  status:", "OK" if rc == 0 else "PROBLEMS FOUND")
    return rc


def serve_command(model: str, extra: List[str], stock: bool = False) -> List[str]:
    """The server command line for ``serve`` (built-in models get dummy weights and no tokenizer)."""
    from . import models

    cmd = [sys.executable, "-m", "sglang.launch_server" if stock else "sglang_replayssm.launch_server"]
    if model in models.names():
        path = models.materialize(model)
        cmd += ["--model-path", path, "--load-format", "dummy", "--skip-tokenizer-init",
                "--attention-backend", models.ATTENTION_BACKEND[model], "--disable-radix-cache",
                "--mem-fraction-static", "0.5", "--context-length", "4096"]
    else:
        cmd += ["--model-path", model]
    return cmd + list(extra)


def serve(model: str, extra: List[str], stock: bool = False) -> int:
    import subprocess

    cmd = serve_command(model, extra, stock)
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="sglang-replayssm",
                                description="ReplaySSM decoding for hybrid models in stock SGLang.")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="versions, config in force, and each patch target: resolved / patched / missing")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.add_argument("--apply", action="store_true", help="also apply and verify the patches in this process")
    sub.add_parser("launch", help="same as python -m sglang_replayssm.launch_server", add_help=False)
    sub.add_parser("flags", help="list the --replayssm-* flags and their environment variables")
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

        print(flags_help())
        return 0
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
