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


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
