"""Test setup: kernels run on CUDA when present, else in Triton's CPU interpreter.

TRITON_INTERPRET must be set before any @triton.jit function is decorated, so it is
set here, before the package's kernel modules are imported by the tests.

`slow` tests (the kernels' full launch-config grid and the real model geometries) are the GPU host's
(`make gpu-test`): in the CPU interpreter they are deselected unless REPLAYSSM_TEST_FULL=1 (`make test-full`)
or a -m expression names the marker. `gpu` tests are skipped without CUDA.
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

FULL_ENV = "REPLAYSSM_TEST_FULL"

# pytest-xdist workers (make test, eval/gpu_kernels.sh) share the CPU cores out for torch's threads unless
# OMP_NUM_THREADS says otherwise: torch's default, every core in every worker, oversubscribes them
_WORKERS = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
if _WORKERS.isdigit() and not os.environ.get("OMP_NUM_THREADS"):
    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(max(1, _CORES // int(_WORKERS)))


@pytest.fixture(autouse=True)
def _replayssm_config_per_test():
    """Each test starts from its own environment's ReplaySSM config: the package parses it once per process
    (``config.current``), so the cached one (and an activated kernel launch-config file) is dropped around
    every test. A test that changes the variables mid-test resets it itself (tests/patches/seam_env.py)."""
    from sglang_replayssm.config import reset_for_tests

    reset_for_tests()
    yield
    reset_for_tests()


@pytest.fixture
def device():
    return torch.device("cuda" if HAS_CUDA else "cpu")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "slow: the kernels' full launch-config grid and real model geometries; "
                                       f"CUDA only unless {FULL_ENV}=1 (minutes each in the CPU interpreter)")


def _run_slow(config) -> bool:
    """Whether `slow` tests stay in the run: always on CUDA; in the interpreter only when asked for."""
    full = os.environ.get(FULL_ENV, "").strip()
    if full not in ("", "0", "1"):
        raise pytest.UsageError(f"{FULL_ENV} must be 0 or 1 (1: run the slow kernel tests on the CPU too), "
                                f"got {full!r}")
    return HAS_CUDA or full == "1" or "slow" in (config.getoption("markexpr", "") or "")


def pytest_collection_modifyitems(config, items):
    if not _run_slow(config):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """REPLAYSSM_TEST_TIMES=<file>: append each test's call time and outcome as it finishes, so that a GPU-host
    run cut by its time limit still says where the time went. Under pytest-xdist the controlling process
    writes it (every worker's reports reach it; PYTEST_XDIST_WORKER is set in the workers), once per test."""
    path = os.environ.get("REPLAYSSM_TEST_TIMES")
    if path and report.when == "call" and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a") as f:
            f.write(f"{report.duration:8.2f} {report.outcome:7s} {report.nodeid}\n")
