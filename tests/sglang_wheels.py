"""Where the tests find SGLang release wheels to check patch targets against (``make sglang-wheels``)."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEELS = Path(os.environ.get("REPLAYSSM_TEST_SGLANG_WHEELS", ROOT / ".cache" / "sglang-wheels"))


def wheel_for(version: str) -> Path:
    """The cached ``sglang-<version>`` wheel; fails the test (not skips) when it is missing."""
    found = sorted((WHEELS / version).glob(f"sglang-{version}-*.whl"))
    if not found:
        pytest.fail(f"no SGLang {version} wheel under {WHEELS / version}: run `make sglang-wheels` "
                    f"(pip download --no-deps sglang=={version})")
    return found[0]
