"""What every module of the A/B harness shares: the repository root, the result schema and the log line."""

from __future__ import annotations

import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "replayssm-ab/1"


def log(msg: str) -> None:
    print(f"[ab {time.strftime('%H:%M:%S')}] {msg}", flush=True)
