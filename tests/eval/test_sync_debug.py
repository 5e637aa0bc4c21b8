"""eval/sync_debug.py (``eval.ab --sync-debug``): the host-sync census of SGLang's processes, on CPU.

PyTorch's sync warnings are simulated with ``warnings.warn`` carrying its text (there is no CUDA here); the
census counts them by call site, reports cumulative lines at most every REPORT_EVERY_S seconds, and the harness
reads each process's last line back from a server log.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval import ab, sync_debug  # noqa: E402


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(sync_debug, "_counts", sync_debug.Counter())
    monkeypatch.setattr(sync_debug, "_state", {"last_report": 0.0, "reported": None})
    return sync_debug


def test_counts_by_site_and_reports_only_when_due_and_changed(fresh):
    lines = []
    out = lambda s, flush=True: lines.append(s)  # noqa: E731
    fresh.note("a.py:1", now=100.0, out=out)  # due (first): reported
    for t in (101.0, 102.0, 103.0):
        fresh.note("b.py:2", now=t, out=out)  # not due
    fresh.note("b.py:2", now=111.0, out=out)  # due: b x4, a x1
    assert len(lines) == 2 and lines[-1].split("cumulative): ", 1)[1] == "b.py:2 x4, a.py:1 x1"
    census = fresh.last_census("noise\n" + "\n".join(f"[sched] {x}" for x in lines))
    assert list(census.values()) == [{"b.py:2": 4, "a.py:1": 1}]


def test_last_census_keeps_each_process_last_line_and_drops_the_overflow_note():
    text = "\n".join([
        f"{sync_debug.MARKER} (pid 7, cumulative): x.py:1 x2",
        f"{sync_debug.MARKER} (pid 9, cumulative): y.py:3 x5, z.py:4 x1 (+3 more sites)",
        f"{sync_debug.MARKER} (pid 7, cumulative): x.py:1 x9, w.py:2 x1",
    ])
    assert sync_debug.last_census(text) == {"7": {"x.py:1": 9, "w.py:2": 1}, "9": {"y.py:3": 5, "z.py:4": 1}}


def test_install_routes_torch_sync_warnings_to_the_census(fresh, monkeypatch):
    import torch

    modes = []
    monkeypatch.setattr(torch._C, "_cuda_set_sync_debug_mode", lambda m: modes.append(m))
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: pytest.fail("CUDA initialised by the census"))
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    with warnings.catch_warnings():
        fresh.install()
        fresh.install()  # idempotent: one hook
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation", UserWarning)
        with pytest.warns(UserWarning, match="something else"):
            warnings.warn("something else", UserWarning)
    assert modes == [1, 1]
    (site, n), = fresh._counts.items()
    assert n == 3 and site.endswith("test_sync_debug.py:" + site.rsplit(":", 1)[1])


def test_register_is_inert_without_the_variable_or_in_the_launcher(monkeypatch):
    called = []
    monkeypatch.setattr(sync_debug, "install", lambda: called.append(1))
    monkeypatch.delenv(sync_debug.ENV, raising=False)
    sync_debug.register()
    monkeypatch.setenv(sync_debug.ENV, "1")
    sync_debug.register()  # the test process has no parent process: the launcher's place
    assert called == []


def test_harness_flag(capsys):
    assert ab.main(["--model", "tiny-nemotron-h", "--batch", "4", "--sync-debug", "--dry-run"]) == 0
    envs = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("env:")]
    assert envs and all(f"{sync_debug.ENV}=1" in ln for ln in envs)
    assert ab.main(["--batch", "4", "--sync-debug", "--no-random-weights", "--dry-run"]) == 2
    assert "--sync-debug" in capsys.readouterr().err
