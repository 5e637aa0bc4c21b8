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
    """REPLAYSSM_TEST_SHARD=i/n keeps the i-th (0-based) of n shards of the collected tests, by
    REPLAYSSM_TEST_SHARD_ORDER: "blocks" (default), n contiguous blocks: eval/gpu_kernels.sh runs n pytest
    processes side by side on the GPU host, whose test time is Triton compiles on the CPU cores (contiguous blocks
    keep a test's parametrisations, which share compiled kernels, in one process); "stride", every n-th test from
    the i-th: `make test` (tests/run_shards.sh) on the CPU, where the interpreter compiles nothing and the slow
    kernel tests sit together in a few files. It cuts the collection before pytest's own -k / -m deselection, so
    shards of a filtered run are uneven."""
    spec = os.environ.get("REPLAYSSM_TEST_SHARD", "").strip()
    if not spec:
        return None
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        i, n = -1, 0
    if not 0 <= i < n:
        raise pytest.UsageError(f"REPLAYSSM_TEST_SHARD must be i/n with 0 <= i < n, got {spec!r}")
    order = os.environ.get("REPLAYSSM_TEST_SHARD_ORDER", "").strip() or "blocks"
    if order not in ("blocks", "stride"):
        raise pytest.UsageError(f"REPLAYSSM_TEST_SHARD_ORDER must be blocks or stride, got {order!r}")
    return i, n, order


def pytest_collection_modifyitems(config, items):
    shard = _test_shard()
    if shard is not None:
        i, n, order = shard
        if order == "stride":
            keep = set(range(i, len(items), n))
        else:
            keep = set(range(len(items) * i // n, len(items) * (i + 1) // n))
        config.hook.pytest_deselected(items=[it for k, it in enumerate(items) if k not in keep])
        items[:] = [it for k, it in enumerate(items) if k in keep]
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """REPLAYSSM_TEST_TIMES=<file>: append each test's call time and outcome as it finishes (a GPU-host run
    cut by its time limit still says where the time went)."""
    path = os.environ.get("REPLAYSSM_TEST_TIMES")
    if path and report.when == "call":
        with open(path, "a") as f:
            f.write(f"{report.duration:8.2f} {report.outcome:7s} {report.nodeid}\n")
