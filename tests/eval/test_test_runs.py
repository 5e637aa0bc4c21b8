"""How the test suite runs: `make test` (pytest-xdist workers, a per-test time limit, no test collected is a
failure), the `slow` cut of tests/conftest.py (the kernels' launch-config grid and real geometries stay out of the
CPU interpreter unless REPLAYSSM_TEST_FULL=1) and the GPU host's eval/gpu_kernels.sh (one pytest-xdist run, its
summary, per-test times and exit status), exercised on the CPU with small throw-away test files."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERNELS = ROOT / "tests" / "kernels"

PASS_FAIL_SLOW = """
import pytest


def test_a():
    pass


@pytest.mark.slow
def test_heavy():
    pass


def test_b():
    assert 1 == 2


def test_c():
    pass
"""


def _env(**extra):
    """This process's environment without the outer run's settings that the runs below must not inherit."""
    drop = ("REPLAYSSM_TEST_FULL", "REPLAYSSM_TEST_TIMES", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER",
            "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")
    e = {k: v for k, v in os.environ.items() if k not in drop}
    e.update(extra)
    return e


def _pytest(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=_env(**(env or {})), capture_output=True, text=True, timeout=timeout)


def _collected(*args, env=None):
    r = _pytest("--collect-only", "-q", *args, env=env)
    assert r.returncode in (0, 5), r.stdout[-2000:] + r.stderr[-2000:]
    return [line for line in r.stdout.splitlines() if "::" in line]


@pytest.fixture
def tests_file(tmp_path):
    t = tmp_path / "test_sample.py"
    t.write_text(PASS_FAIL_SLOW)
    return t


# ---- the slow cut (tests/conftest.py) ----
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the cut applies in the CPU interpreter")
def test_slow_tests_are_left_out_on_the_cpu_unless_asked_for(tests_file):
    own = ("-p", "tests.conftest", str(tests_file))  # the conftest's hooks, for a test file outside tests/
    names = lambda got: sorted(line.split("::")[1] for line in got)  # noqa: E731
    assert names(_collected(*own)) == ["test_a", "test_b", "test_c"]
    assert names(_collected(*own, env={"REPLAYSSM_TEST_FULL": "1"})) == ["test_a", "test_b", "test_c", "test_heavy"]
    assert names(_collected(*own, "-m", "slow")) == ["test_heavy"]  # a -m expression naming the marker wins
    r = _pytest("--collect-only", "-q", *own, env={"REPLAYSSM_TEST_FULL": "yes"})
    assert r.returncode == 4 and "REPLAYSSM_TEST_FULL must be 0 or 1" in r.stdout + r.stderr, r.stdout[-500:]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the cut applies in the CPU interpreter")
def test_every_kernel_test_file_keeps_cpu_tests_and_the_gpu_run_keeps_all():
    """The CPU run is a strict subset of the full kernel suite: every test file (each kernel family and the
    launch-config / offline-build files) keeps tests in it, and each test left out carries the slow marker."""
    cpu, full = _collected(str(KERNELS)), _collected(str(KERNELS), env={"REPLAYSSM_TEST_FULL": "1"})
    slow = set(_collected(str(KERNELS), "-m", "slow"))
    assert set(cpu) < set(full) and slow and set(full) - set(cpu) == slow, (len(cpu), len(full), len(slow))
    files = {line.split("::")[0] for line in full}
    assert files == {f"tests/kernels/{p.name}" for p in KERNELS.glob("test_*.py")}, sorted(files)
    for f in files:
        assert any(line.startswith(f + "::") for line in cpu), f"{f} has no test left in the CPU run"


# ---- make test: pytest-xdist, the per-test time limit, exit statuses ----
def _make_test(*pytest_args, timeout=300):
    """The Makefile's `test` recipe with this interpreter, the venv and wheel-cache steps taken as done."""
    done = [".venv/.stamp-replayssm"] + [f".cache/sglang-wheels/{v}/.done" for v in ("0.5.15", "0.5.23")]
    argv = ["make", "--no-print-directory", *(a for d in done for a in ("-o", d)), "test", f"PY={sys.executable}",
            "TEST_JOBS=2", "PYTEST_ARGS=" + " ".join(pytest_args)]
    return subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_make_test_runs_xdist_workers_and_fails_on_a_failure(tests_file):
    r = _make_test("-p", "tests.conftest", str(tests_file))
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "bringing up nodes" in out, out[-2000:]  # pytest-xdist's workers
    assert re.search(r"1 failed, 2 passed", out) and "FAILED" in out and "test_b" in out, out[-2000:]
    r = _make_test("-p", "tests.conftest", str(tests_file), "-k", "test_a")
    assert r.returncode == 0 and "1 passed" in r.stdout, (r.stdout + r.stderr)[-2000:]


def test_make_test_fails_when_no_test_is_collected(tests_file):
    """pytest's exit status 5 (nothing collected, e.g. a -k filter that matches nothing) fails `make test`."""
    r = _make_test(str(tests_file), "-k", "no_such_test")
    assert r.returncode != 0 and "Error 5" in r.stderr, (r.stdout + r.stderr)[-2000:]  # make names the status


def test_a_hung_test_fails_alone(tmp_path):
    """pytest-timeout (--timeout; pyproject.toml sets the default): the test over the limit fails, the others run."""
    t = tmp_path / "test_hang.py"
    t.write_text("import time\n\n\ndef test_hangs():\n    time.sleep(60)\n\n\ndef test_after():\n    pass\n")
    r = _make_test(str(t), "--timeout", "3", timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Timeout" in out and re.search(r"1 failed, 1 passed", out), out[-2000:]


# ---- eval/gpu_kernels.sh (the GPU host's `make gpu-test`), KERNEL_BENCH=0 ----
def _gpu_kernels(out, paths, conftest=True, **env):
    """eval/gpu_kernels.sh with KERNEL_BENCH=0 (this interpreter first on PATH); its exit status and logs.
    ``conftest``: load tests/conftest.py (its per-test times hook) for test files outside tests/.
    On a CPU host its nvidia-smi / device lines fail and the script goes on, as it does for the tests."""
    e = _env(OUT=str(out), KERNEL_BENCH="0", GPU_PY=sys.executable, TEST_PATHS=paths,
             PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}", **env)
    if conftest:
        e["PYTEST_ADDOPTS"] = "-p tests.conftest"
    r = subprocess.run(["bash", "eval/gpu_kernels.sh"], cwd=ROOT, env=e, capture_output=True, text=True,
                       timeout=300)
    log = (out / "gpu-tests.log").read_text() if (out / "gpu-tests.log").exists() else ""
    return r, log


def _times(out):
    return [line.split(None, 2) for line in (out / "gpu-test-times.txt").read_text().splitlines()]


def test_gpu_kernels_script_runs_xdist_and_reports(tmp_path, tests_file):
    """One pytest -n run: the summary names the failure, every finished test has one times line (written by
    the controlling process only), the slow test runs there when asked for, and the exit status is pytest's."""
    out = tmp_path / "out"
    r, log = _gpu_kernels(out, str(tests_file), TEST_JOBS="2", REPLAYSSM_TEST_FULL="1")
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "-n 2 --dist worksteal" in log and "exit status 1" in log, log
    assert re.search(r"^FAILED .*test_b", log, re.M) and "# finished tests: 1 failed, 3 passed" in log, log
    times = _times(out)
    assert sorted(t[2].split("::")[1] for t in times) == ["test_a", "test_b", "test_c", "test_heavy"], times
    assert {t[1] for t in times} == {"passed", "failed"}
    assert "test_b" in (out / "gpu-tests-full.log").read_text()  # the whole output: the failure's traceback
    assert not (out / "kernels-h200.json").exists()  # KERNEL_BENCH=0: no benchmark

    out2 = tmp_path / "out2"
    r, log = _gpu_kernels(out2, f"{tests_file} -k test_a", TEST_JOBS="2")
    assert r.returncode == 0 and "# finished tests: 1 passed" in log, (r.stdout[-1000:], log)


def test_gpu_kernels_script_fails_on_no_tests_and_bad_jobs(tmp_path, tests_file):
    r, log = _gpu_kernels(tmp_path / "a", f"{tests_file} -k no_such_test", conftest=False, TEST_JOBS="2")
    assert r.returncode == 5 and "no test collected" in log, (r.returncode, log)
    r, _ = _gpu_kernels(tmp_path / "b", str(tests_file), conftest=False, TEST_JOBS="x")
    assert r.returncode == 2 and "TEST_JOBS must be a whole number" in r.stderr, r.stderr[-500:]


def test_gpu_kernels_script_reports_a_run_cut_by_its_time_limit(tmp_path):
    """TEST_TIMEOUT stops the whole run (SIGINT): the log says it was cut, the tests that finished are counted
    from the per-test times, and the status is a failure."""
    t = tmp_path / "test_slowly.py"
    t.write_text("import time\n\n\ndef test_quick():\n    pass\n\n\ndef test_long():\n    time.sleep(300)\n")
    out = tmp_path / "out"
    r, log = _gpu_kernels(out, str(t), TEST_JOBS="1", TEST_TIMEOUT="12")
    assert r.returncode != 0 and "cut by TEST_TIMEOUT=12 s" in log, (r.returncode, log)
    finished = [(outcome, nodeid.split("::")[1]) for _, outcome, nodeid in _times(out)]
    assert finished in ([], [("passed", "test_quick")]), finished  # test_long never finished
    assert ("# finished tests: 1 passed" in log) == bool(finished), log


def test_gpu_kernels_benchmark_stage_and_pack(tmp_path):
    """The benchmark stage's command lines (a stand-in interpreter records each ``-m eval.*`` call and writes
    its --out JSON), decode-vs-verify fed by both benchmarks' files, and PACK=1 leaving the JSONs plus one
    tarball (the device tool returns at most 8 files)."""
    calls = tmp_path / "calls.txt"
    shim = tmp_path / "py"
    shim.write_text(f"""#!{sys.executable}
import json, runpy, sys
if len(sys.argv) > 2 and sys.argv[1] == "-m" and sys.argv[2].startswith("eval."):
    with open({str(calls)!r}, "a") as f:
        f.write(" ".join(sys.argv[2:]) + "\\n")
    if "--out" in sys.argv:
        out = sys.argv[sys.argv.index("--out") + 1]
        open(out, "w").write(json.dumps({{"summary": {{}}}}))
        if out.endswith("vs-verify-h200.json"):
            open(out[:-5] + ".md", "w").write("table")
    print("ran", sys.argv[2])
    sys.exit(0)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__") if sys.argv and sys.argv[0] != "-" else exec(sys.stdin.read())
""")
    shim.chmod(0o755)
    out = tmp_path / "out"
    e = _env(OUT=str(out), GPU_PY=str(shim), TEST_JOBS="0", PACK="1",
             PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}")
    r = subprocess.run(["bash", "eval/gpu_kernels.sh"], cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    ran = calls.read_text().splitlines()
    assert [c.split()[0] for c in ran] == ["eval.bench_kernels", "eval.bench_spec", "eval.bench_spec",
                                           "eval.decode_vs_verify", "eval.bench_tree_spec"], ran
    assert "--window 1 --accept 1 --history 16" in ran[2]
    assert f"--decode {out}/kernels-h200.json --verify {out}/spec-t1-h200.json" in ran[3]
    assert f"--merge-into {out}/spec-kernels-h200.json" in ran[4]  # the tree keys join the verify summary
    left = sorted(p.name for p in out.iterdir())
    assert left == ["decode-vs-verify-h200.json", "gpu-kernels-logs.tgz", "kernels-h200.json",
                    "spec-kernels-h200.json", "spec-t1-h200.json", "spec-tree-kernels-h200.json"], left
    packed = subprocess.run(["tar", "tzf", str(out / "gpu-kernels-logs.tgz")], capture_output=True, text=True).stdout
    assert "bench.log" in packed and "decode-vs-verify-h200.md" in packed and "gpu-info.txt" in packed
