"""CPU tests of the streaming-cap diagnosis (eval/streaming_cap.py, eval/gpu_streaming_cap.sh): the plan, the
process roles and CPU summary, and the whole script end to end against tests/eval/fake_sglang_server.py with
SGLang's own bench_serving (so the one GPU call it is written for cannot fail on a typo)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval import streaming_cap as sc  # noqa: E402

FAKE = "tests.eval.fake_sglang_server"


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def _args(*argv):
    args, rest = sc.build_parser().parse_known_args(list(argv))
    return args, rest


def test_variants_and_the_plan():
    assert sc.parse_variant("staged:--incremental-streaming-output") == (
        "staged+incremental-streaming-output", "staged", ["--incremental-streaming-output"])
    assert sc.parse_variant("tw2=staged:--tokenizer-worker-num 2") == ("tw2", "staged", ["--tokenizer-worker-num", "2"])
    for bad in ("fast:--x", "staged", "staged:", "x=fork:--y"):
        with pytest.raises(ValueError, match="KIND:FLAGS"):
            sc.parse_variant(bad)
    args, _ = _args("--arms", "stock,staged", "--intervals", "1,8", "--extra-intervals", "2,8,4",
                    "--variant", "inc=staged:--incremental-streaming-output", "--variant-intervals", "1")
    plan = sc.plan_servers(args)
    assert [(p.label, p.kind, p.flags, p.intervals, p.extra_intervals, p.via) for p in plan] == [
        ("stock", "stock", [], [1, 8], [2, 4], "request"), ("staged", "staged", [], [1, 8], [2, 4], "request"),
        ("inc", "staged", ["--incremental-streaming-output"], [1], [], "request")]
    args.interval_mode = "server"
    plan = sc.plan_servers(args)
    assert [p.label for p in plan] == ["stock-si1", "stock-si8", "stock-si2", "stock-si4", "staged-si1", "staged-si8",
                                       "staged-si2", "staged-si4", "inc-si1"]
    assert plan[1].flags == ["--stream-interval", "8"] and plan[1].intervals == [8]
    assert plan[2].intervals == [] and plan[2].extra_intervals == [2]  # a server run only while time allows
    assert plan[-1].flags == ["--incremental-streaming-output", "--stream-interval", "1"]
    for argv, msg in ((["--arms", "stock,fork"], "unknown arm"), (["--intervals", "1,x"], "comma-separated"),
                      (["--intervals", "0"], "positive"), (["--arms", "", "--variant", "staged:--a", "--variant",
                                                            "staged:--a"], "share the label")):
        with pytest.raises(ValueError, match=msg):
            sc.plan_servers(_args(*argv)[0])


def test_per_request_interval_and_the_dry_run(capsys):
    rc = sc.main(["--dry-run", "--stock-module", FAKE, "--patched-module", FAKE, "--batch", "64",
                  "--output-len", "300", "--intervals", "4", "--extra-intervals", "", "--arms", "stock",
                  "--server-arg=--fake-decode-log"])
    assert rc == 0
    out = capsys.readouterr().out
    bench = [shlex.split(x.strip())[3:] for x in out.splitlines() if "sglang.bench_serving" in x]
    assert len(bench) == 1
    argv = bench[0]
    body = json.loads(argv[argv.index("--extra-request-body") + 1])
    assert body == {"sampling_params": {"temperature": 0.0, "max_new_tokens": 300, "ignore_eos": True,
                                        "stream_interval": 4}}
    assert argv[argv.index("--max-concurrency") + 1] == "64" and argv[argv.index("--num-prompts") + 1] == "64"
    assert argv[argv.index("--warmup-requests") + 1] == "0"
    server = [x for x in out.splitlines() if FAKE in x][0]
    assert "--fake-decode-log" in server and "--stream-interval" not in server
    # by server: the SGLang flag, no per-request field
    assert sc.main(["--dry-run", "--stock-module", FAKE, "--arms", "stock", "--intervals", "8", "--extra-intervals",
                    "", "--interval-mode", "server"]) == 0
    out = capsys.readouterr().out
    assert "--stream-interval 8" in out and "--extra-request-body" not in out
    assert sc.main(["--dry-run", "--arms", "stock", "--no-such-flag"]) != 0  # eval.ab's parser rejects it


def test_roles_and_summary():
    assert sc.role_of(["python", "-m", "sglang.launch_server"], 10, 10, 99) == "main"
    assert sc.role_of(["python", "-m", "eval.bench_sweep", "--serve"], 99, 10, 99) == "client"
    assert sc.role_of(["sglang::scheduler_TP0"], 11, 10, 99) == "scheduler"
    assert sc.role_of(["sglang::detokenizer"], 12, 10, 99) == "detokenizer"
    assert sc.role_of(["sglang::tokenizer_worker:13"], 13, 10, 99) == "tokenizer_worker"
    assert sc.role_of(["python", "-c", "from multiprocessing.resource_tracker import main"], 14, 10, 99) == "other"
    info = {10: {"pid": 10, "role": "main"}, 11: {"pid": 11, "role": "scheduler"},
            12: {"pid": 12, "role": "detokenizer"}, 13: {"pid": 13, "role": "tokenizer_worker"},
            14: {"pid": 14, "role": "tokenizer_worker"}, 99: {"pid": 99, "role": "client"}}
    samples = [{"t": i * 0.5, "host_pct": 20.0,
                "cpu": {"10": 99.0 + i, "11": 100.0, "12": 30.0, "13": 10.0, "14": 50.0 + i, "99": 60.0},
                "top_thread": {"10": 97.0, "11": 100.0, "12": 29.0, "13": 9.0, "14": 40.0, "99": 55.0}}
               for i in range(3)]
    s = sc.summarize(samples, info)
    assert list(s["roles"]) == ["main", "detokenizer", "tokenizer_worker", "scheduler", "client"]
    assert s["roles"]["main"]["cpu_pct"] == {"mean": 100.0, "p50": 100.0, "max": 101.0}
    assert s["roles"]["tokenizer_worker"]["processes"] == 2 and s["roles"]["tokenizer_worker"]["cpu_pct"]["max"] == 52.0
    # the scheduler busy-waits: never "the hottest"; saturated = busiest thread at 90% of a core or more
    assert s["hottest"] == "main" and s["saturated"] == ["main", "scheduler"]
    assert s["series"][0]["main:10"] == 99.0 and s["host_pct"]["p50"] == 20.0


def test_cpu_sampler_sees_a_busy_child(tmp_path):
    """The sampler on a real process tree: a child spinning a core is measured near 100% and titled by its
    command line."""
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<20: pass",
                             "sglang::detokenizer"])
    try:
        s = sc.CpuSampler(os.getpid(), None, period=0.3).start()
        import time

        time.sleep(1.6)
        out = s.stop()
    finally:
        busy.kill()
        busy.wait()
    det = out["roles"]["detokenizer"]
    assert out["samples"] >= 3 and det["processes"] == 1
    assert det["cpu_pct"]["max"] > 40.0  # a shared 2-core host: well above idle, whatever the neighbours do
    assert out["processes"][str(busy.pid)]["role"] == "detokenizer"


def test_end_to_end_against_the_stand_in_server(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "eval.streaming_cap", "--stock-module", FAKE, "--patched-module", FAKE,
           "--server-arg", "--fake-decode-log --fake-children", "--arms", "stock", "--intervals", "1,8",
           "--extra-intervals", "2", "--variant", "inc=staged:--incremental-streaming-output",
           "--variant-intervals", "8", "--batch", "4", "--input-len", "16", "--output-len", "400",
           "--sample-period", "0.2", "--out-dir", str(out), "--log-dir", str(tmp_path / "logs"),
           "--shutdown-grace", "5"]
    r = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "streaming-cap-tiny-nemotron-h.json").read_text())
    assert res["schema"] == sc.SCHEMA and res["setup"]["batch"] == 4 and res["setup"]["output_len"] == 400
    assert [(s["label"], s["status"]) for s in res["servers"]] == [("stock", "ok"), ("inc", "ok")]
    assert res["servers"][1]["flags"] == ["--incremental-streaming-output"]
    assert "--incremental-streaming-output" in res["servers"][1]["command"]
    assert [(e["server"], e["interval"]) for e in res["runs"]] == [("stock", 1), ("stock", 8), ("stock", 2),
                                                                   ("inc", 8)]
    for e in res["runs"]:
        assert e["ok"] and e["result"]["completed"] == 4 and e["result"]["total_output_tokens"] == 1600
        assert e["rates"]["client_tok_s"] == e["result"]["output_throughput"]
        assert e["rates"]["client_full_batch_tok_s"] == pytest.approx(4000.0 / e["result"]["median_itl_ms"])
        assert e["rates"]["decode_lines_all"] >= 1  # the stand-in's scheduler lines inside the run's window
        roles = e["cpu"]["roles"]
        assert {"main", "scheduler", "detokenizer", "client"} <= set(roles), roles
        assert e["cpu"]["samples"] >= 1 and e["cpu"]["hottest"] in ("main", "detokenizer", "client")
    md = (out / "streaming-cap-tiny-nemotron-h.md").read_text()
    assert "| inc | 8 (request) |" in md and "client-path bound" in md
    assert (tmp_path / "logs" / "server-inc.log").is_file()


def test_a_server_that_does_not_fit_the_deadline_is_recorded(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "eval.streaming_cap", "--stock-module", FAKE, "--arms", "stock,stock",
           "--intervals", "1", "--extra-intervals", "", "--batch", "2", "--input-len", "8", "--output-len", "20",
           "--deadline-s", "1", "--min-server-s", "30", "--out-dir", str(out)]
    r = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "streaming-cap-tiny-nemotron-h.json").read_text())
    assert [(s["label"], s["status"]) for s in res["servers"]] == [("stock", "skipped"), ("stock-2", "skipped")]
    assert res["runs"] == []


def test_the_gpu_wrapper_runs_the_script_with_its_plan(tmp_path):
    """eval/gpu_streaming_cap.sh as the device call runs it, with --dry-run appended: every flag it passes is
    accepted, and its plan is the five servers in order."""
    env = dict(_env(), PYTHON=sys.executable, OUT=str(tmp_path / "out"))
    r = subprocess.run(["bash", "eval/gpu_streaming_cap.sh", "--dry-run"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    heads = [x for x in r.stdout.splitlines() if x.startswith("# ")]
    assert [h.split()[1] for h in heads] == ["stock", "staged", "staged+incremental", "stock+incremental",
                                             "staged+tokenizer-workers-2"]
    assert "intervals [1, 8] + if time [2, 4]" in heads[0] and "intervals [1, 8] + if time []" in heads[2]
    assert r.stdout.count("--max-concurrency 256") == 14 and "--random-output-len 512" in r.stdout
    assert "--tokenizer-worker-num 2" in r.stdout and (tmp_path / "out" / "streaming-cap-logs.tgz").is_file()


def test_variant_and_interval_flags_parse_with_sglangs_parser(tmp_path):
    """The SGLang flags the device call gives its servers (variants; --stream-interval by server) are SGLang
    0.5.17's own."""
    import argparse

    sa = pytest.importorskip("sglang.srt.server_args")
    parser = argparse.ArgumentParser()
    sa.ServerArgs.add_cli_args(parser)
    args, rest = _args("--arms", "stock", "--intervals", "8", "--extra-intervals", "", "--interval-mode", "server",
                       "--variant", "staged:--incremental-streaming-output",
                       "--variant", "tw=staged:--tokenizer-worker-num 2 --detokenizer-worker-num 2",
                       "--variant-intervals", "8")
    ab_args = sc.ab_args_from(args, rest)
    model = sc.prepare_model(ab_args, tmp_path, False)
    flags = sc.common_server_flags(ab_args, model, False)
    seen = []
    for sp in sc.plan_servers(args):
        ns = parser.parse_args([*flags, *sp.flags, "--port", "31000"])
        assert ns.stream_interval == 8 and ns.cuda_graph_max_bs_decode == 256
        seen.append((ns.incremental_streaming_output, ns.tokenizer_worker_num, ns.detokenizer_worker_num))
    assert seen == [(False, 1, 1), (True, 1, 1), (False, 2, 2)]
