"""eval/gpu_ab.sh under a device call's wall limit (CALL_S): eval.ab is stopped before the limit, a run stopped
before it wrote its results is finished from its partial record, the JIT caches are saved after the first server.
A stand-in interpreter (PYTHON=) records how the script calls eval.ab and plays a run that outlasts its time."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

STUB = r"""#!/usr/bin/env bash
# stand-in for python: records every call; "-m eval.ab ..." writes a partial record into --out-dir and then
# runs for SLEEP_S seconds (a run that outlasts its time); "-m eval.ab --finish FILE" removes FILE
echo "$*" >> "$CALLS"
[ "$1" = "-c" ] && exit 0
if [ "$1 $2 $3" = "-m eval.ab --finish" ]; then rm -f "$4"; echo "finished $4"; exit 0; fi
out=""; prev=""
for a in "$@"; do [ "$prev" = "--out-dir" ] && out="$a"; prev="$a"; done
echo '{}' > "$out/ab-stand-in-partial.json"
trap 'echo "stopped"; exit 130' INT
sleep "$SLEEP_S" & wait
"""


def _run(tmp_path: Path, *args: str, **env_extra: str) -> tuple:
    stub = tmp_path / "python-stub"
    stub.write_text(STUB)
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.txt"
    calls.touch()
    env = {k: v for k, v in os.environ.items() if k not in ("CALL_S", "TAIL_S", "PACK")}
    env.update({"PYTHON": str(stub), "CALLS": str(calls), "OUT": str(tmp_path / "out"), "JIT": "0", "SLEEP_S": "30",
                **env_extra})
    r = subprocess.run(["bash", "eval/gpu_ab.sh", *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
    return r, calls.read_text().splitlines()


def test_a_run_that_outlasts_the_call_is_stopped_and_finished(tmp_path):
    r, calls = _run(tmp_path, "--model", "tiny-nemotron-h", CALL_S="14", TAIL_S="2")
    ab = [c for c in calls if c.startswith("-m eval.ab") and "--finish" not in c]
    assert len(ab) == 1, calls
    # stopped 12 s in (14 - 2), so its deadline is a quarter of that (3 s) earlier: 9 s
    assert "--deadline-s 9 " in ab[0] + " " and "--save-jitcache" not in ab[0]
    fin = [c for c in calls if "--finish" in c]
    assert len(fin) == 1 and fin[0].endswith("ab-stand-in-partial.json"), calls
    assert "stopped" in r.stdout and "finished" in r.stdout and "its results were written from" in r.stdout
    assert r.returncode == 1  # the servers it finished: a partial run, not a timed-out call (124)
    assert not list((tmp_path / "out").glob("*-partial.json"))
    # a copy stays for a later call's --resume
    assert [f.name for f in (tmp_path / "out").glob("*-partial-kept.json")] == ["ab-stand-in-partial-kept.json"]


def test_a_run_given_its_own_out_dir_is_finished_there(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    r, calls = _run(tmp_path, "--model", "tiny-nemotron-h", "--out-dir", str(own), CALL_S="012", TAIL_S="2")
    fin = [c for c in calls if "--finish" in c]
    assert fin == [f"-m eval.ab --finish {own}/ab-stand-in-partial.json"], calls  # CALL_S 012: twelve, not octal


def test_a_given_deadline_wins_and_jit_saves_after_the_first_server(tmp_path):
    r, calls = _run(tmp_path, "--model", "tiny-nemotron-h", "--deadline-s", "5", CALL_S="14", TAIL_S="2",
                    JIT="1", SLEEP_S="0", SGLANG_CACHE_ROOT=str(tmp_path / "no-cache"), HOME=str(tmp_path / "home"))
    (ab,) = [c for c in calls if c.startswith("-m eval.ab") and "--finish" not in c]
    assert ab.count("--deadline-s") == 1 and "--deadline-s 5" in ab
    assert f"--save-jitcache {tmp_path / 'out'}" in ab


def test_call_s_must_leave_eval_ab_time(tmp_path):
    for call_s, tail_s, why in (("abc", "2", "whole number"), ("10", "5", "too little"), ("60", "x", "TAIL_S")):
        r, calls = _run(tmp_path, "--model", "tiny-nemotron-h", CALL_S=call_s, TAIL_S=tail_s)
        assert r.returncode == 2 and why in r.stderr
        assert not [c for c in calls if c.startswith("-m eval.ab")]


def test_without_call_s_nothing_changes(tmp_path):
    r, calls = _run(tmp_path, "--model", "tiny-nemotron-h", SLEEP_S="0")
    (ab,) = [c for c in calls if c.startswith("-m eval.ab") and "--finish" not in c]
    assert "--deadline-s" not in ab and "--save-jitcache" not in ab
    # a run that left its partial record (stopped by something else) is still finished
    assert [c for c in calls if "--finish" in c]
