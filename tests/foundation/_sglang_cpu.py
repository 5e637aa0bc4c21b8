"""Helpers to run SGLang's real entry points on a CPU-only machine in a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

from sglang_replayssm import models

ROOT = Path(__file__).resolve().parents[2]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_REPLAYSSM_")}
    env.pop("SGLANG_PLUGINS", None)
    env.update(extra)
    return env


def run_py(code: str, env=None, timeout=300):
    return subprocess.run([sys.executable, "-c", code], env=env or clean_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def cpu_server_argv(tmp_path, *extra):
    path = models.materialize("tiny-qwen3-next", root=tmp_path)
    return ["--model-path", path, "--load-format", "dummy", "--skip-tokenizer-init", "--device", "cpu",
            "--disable-radix-cache", *extra]


def last_json(stdout: str):
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in output:\n{stdout}")
