"""Fixtures shared by the eval harness tests."""

import argparse

import pytest


@pytest.fixture(scope="session")
def sglang_parser():
    """SGLang's own server-flag parser (``ServerArgs.add_cli_args``): the harness's flags must parse with it."""
    sa = pytest.importorskip("sglang.srt.server_args")
    p = argparse.ArgumentParser()
    sa.ServerArgs.add_cli_args(p)
    return p
