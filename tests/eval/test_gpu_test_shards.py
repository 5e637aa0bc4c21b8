"""The GPU host's sharded test run: REPLAYSSM_TEST_SHARD / REPLAYSSM_TEST_TIMES (tests/conftest.py) and the
shard summary of eval/gpu_kernels.sh, exercised on the CPU with a small slice of the kernel tests."""

import os
import pathlib
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SLICE = ["tests/kernels/test_decode_cursor.py", "tests/kernels/test_materialize.py"]


def _env(**extra):
    """This process's environment without the outer run's shard settings, plus ``extra``."""
    e = {k: v for k, v in os.environ.items() if k not in ("REPLAYSSM_TEST_SHARD", "REPLAYSSM_TEST_TIMES")}
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
