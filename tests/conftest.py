"""Test setup: kernels run on CUDA when present, else in Triton's CPU interpreter.

TRITON_INTERPRET must be set before any @triton.jit function is decorated, so it is
set here, before the package's kernel modules are imported by the tests.
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture
def device():
    return torch.device("cuda" if HAS_CUDA else "cpu")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "slow: real model geometries; minutes in the CPU interpreter")


def _test_shard():
    """REPLAYSSM_TEST_SHARD=i/n keeps every n-th collected test from the i-th (0-based): eval/gpu_kernels.sh runs
    n pytest processes side by side on the GPU host, whose test time is Triton compiles on the CPU cores."""
    spec = os.environ.get("REPLAYSSM_TEST_SHARD", "").strip()
    if not spec:
        return None
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        i, n = -1, 0
    if not 0 <= i < n:
        raise pytest.UsageError(f"REPLAYSSM_TEST_SHARD must be i/n with 0 <= i < n, got {spec!r}")
    return i, n


def pytest_collection_modifyitems(config, items):
    shard = _test_shard()
    if shard is not None:
        i, n = shard
        keep = [item for k, item in enumerate(items) if k % n == i]
        config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % n != i])
        items[:] = keep
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
