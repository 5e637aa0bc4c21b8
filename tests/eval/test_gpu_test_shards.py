"""Sharded test runs: REPLAYSSM_TEST_SHARD / REPLAYSSM_TEST_SHARD_ORDER / REPLAYSSM_TEST_TIMES (tests/conftest.py),
the GPU host's shard summary (eval/gpu_kernels.sh) and `make test`'s side-by-side CPU shards (tests/run_shards.sh),
exercised on the CPU with a small slice of the kernel tests."""

import os
import pathlib
import re
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SLICE = ["tests/kernels/test_decode_cursor.py", "tests/kernels/test_materialize.py"]


def _env(**extra):
    """This process's environment without the outer run's shard settings, plus ``extra``."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("REPLAYSSM_TEST_SHARD", "REPLAYSSM_TEST_SHARD_ORDER", "REPLAYSSM_TEST_TIMES")}
    e.update(extra)
    return e


def _pytest(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=_env(**(env or {})), capture_output=True, text=True, timeout=timeout)


def _gpu_kernels_tests_only(out, jobs: int, timeout_s: int, path: str):
    """eval/gpu_kernels.sh with KERNEL_BENCH=0 on one test file (this interpreter first on PATH); the total line
    of its gpu-tests.log and the log."""
    env = _env(OUT=str(out), KERNEL_BENCH="0", TEST_JOBS=str(jobs), TEST_TIMEOUT=str(timeout_s), TEST_PATHS=path,
               PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    r = subprocess.run(["bash", "eval/gpu_kernels.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    log = (out / "gpu-tests.log").read_text()
    total = [line for line in log.splitlines() if line.startswith("# all shards:")]
    assert total, log
    return total[0], log


def _collected(env=None):
    r = _pytest("--collect-only", "-q", *SLICE, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return [line for line in r.stdout.splitlines() if "::" in line]


def test_shards_partition_the_collection_in_order():
    full = _collected()
    assert len(full) > 6
    parts = [_collected({"REPLAYSSM_TEST_SHARD": f"{i}/4"}) for i in range(4)]
    assert all(parts), [len(p) for p in parts]
    assert sum(parts, []) == full  # contiguous blocks, each test exactly once
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_stride_shards_take_every_nth_test():
    """REPLAYSSM_TEST_SHARD_ORDER=stride: shard i keeps tests i, i + n, i + 2n, ... of the collection."""
    full = _collected()
    parts = [_collected({"REPLAYSSM_TEST_SHARD": f"{i}/3", "REPLAYSSM_TEST_SHARD_ORDER": "stride"}) for i in range(3)]
    assert parts == [full[i::3] for i in range(3)], [len(p) for p in parts]


def test_bad_shard_order_is_a_usage_error():
    r = _pytest("--collect-only", "-q", *SLICE,
                env={"REPLAYSSM_TEST_SHARD": "0/2", "REPLAYSSM_TEST_SHARD_ORDER": "random"})
    assert r.returncode == 4, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert "REPLAYSSM_TEST_SHARD_ORDER must be blocks or stride" in r.stdout + r.stderr


def _run_shards(jobs, *args):
    env = _env(PY=sys.executable, TEST_JOBS=str(jobs))
    return subprocess.run(["bash", "tests/run_shards.sh", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_run_shards_runs_every_test_once_across_its_processes():
    """tests/run_shards.sh (`make test`): both shards' pytest summaries, together every test of the slice."""
    path = SLICE[0]
    n = len([line for line in _collected() if line.startswith(path)])
    r = _run_shards(2, path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    passed = [int(m) for m in re.findall(r"(\d+) passed", r.stdout)]
    skipped = [int(m) for m in re.findall(r"(\d+) skipped", r.stdout)]
    assert len(passed) == 2 and sum(passed) + sum(skipped) == n, r.stdout[-2000:]
    assert "== shard 1/2" in r.stdout and "exit statuses 0 0: passed" in r.stdout, r.stdout[-1000:]


def test_run_shards_fails_when_a_shard_fails(tmp_path):
    """A failing test in either shard fails the run; a shard that a -k filter leaves empty (exit 5) does not."""
    t = tmp_path / "test_one_fails.py"
    t.write_text("def test_a():\n    pass\n\n\ndef test_b():\n    assert 1 == 2\n\n\ndef test_c():\n    pass\n")
    own = ("-p", "tests.conftest", str(t))  # the sharding hook, for a test file outside tests/
    r = _run_shards(2, *own)  # shard 0: test_a, test_c; shard 1: test_b
    assert r.returncode == 1, r.stdout[-2000:]
    assert r.stdout.count("1 failed") == 1 and "exit statuses 0 1: FAILED" in r.stdout, r.stdout[-1000:]
    r = _run_shards(2, *own, "-k", "test_a")  # shard 1 keeps nothing (exit 5)
    assert r.returncode == 0 and "exit statuses 0 5: passed" in r.stdout, r.stdout[-2000:]
    r = _run_shards(2, *own, "-k", "no_such_test")  # nothing anywhere
    assert r.returncode == 5, r.stdout[-2000:]
    r = subprocess.run(["bash", "tests/run_shards.sh"], cwd=ROOT, env=_env(TEST_JOBS="x"), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "TEST_JOBS must be a positive whole number" in r.stderr


@pytest.mark.parametrize("spec", ["4/4", "-1/3", "a/b", "3"])
def test_bad_shard_is_a_usage_error(spec):
    r = _pytest("--collect-only", "-q", *SLICE, env={"REPLAYSSM_TEST_SHARD": spec})
    assert r.returncode == 4, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert "REPLAYSSM_TEST_SHARD must be i/n" in r.stdout + r.stderr


def test_gpu_kernels_script_sums_its_shards(tmp_path):
    """eval/gpu_kernels.sh with KERNEL_BENCH=0 on a slice: per-shard lines, the total, per-test times; no bench.
    (On a CPU host its nvidia-smi / device lines fail and the script goes on, as it does for the tests.)"""
    out = tmp_path / "out"
    total, log = _gpu_kernels_tests_only(out, 3, 240, SLICE[0])
    n = len([line for line in _collected() if line.startswith(SLICE[0])])
    assert sum(f"# shard {i}/3:" in log for i in range(3)) == 3, log
    passed = int(total.split("# all shards:")[1].split(" passed")[0].strip().split()[-1])
    skipped = [w for w in total.split(",") if "skipped" in w]
    assert passed + sum(int(w.split()[0]) for w in skipped) == n, (total, n)
    assert "deselected" not in total and "cut by" not in total
    times = (out / "gpu-test-times.txt").read_text().splitlines()
    assert len(times) == passed and all(t.split()[1] == "passed" for t in times), times
    with tarfile.open(out / "gpu-shard-logs.tgz") as tar:  # every shard's full output comes back in one file
        logs = {m.name.lstrip("./"): tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert {f"shard-{i}.log" for i in range(3)} <= set(logs), sorted(logs)
    assert all("passed" in logs[f"shard-{i}.log"] for i in range(3)), logs
    assert not (out / "kernels-h200.json").exists()


def test_gpu_kernels_script_counts_a_cut_shard(tmp_path):
    """A shard stopped by TEST_TIMEOUT (SIGINT) is reported as cut, with the tests it finished counted from its
    per-test times; `make gpu-test`'s check then fails on the log."""
    out = tmp_path / "out"
    total, log = _gpu_kernels_tests_only(out, 1, 3, SLICE[1])
    assert "(1 shards cut by TEST_TIMEOUT)" in total, log
    finished = len((out / "gpu-test-times.txt").read_text().splitlines())
    n = len([line for line in _collected() if line.startswith(SLICE[1])])
    assert finished < n, (finished, n)  # the slice takes far longer than 3 s in the interpreter
    assert (f"{finished} passed" in total) if finished else ("no test finished" in total), total
