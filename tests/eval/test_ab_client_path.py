"""eval.ab's end-to-end truth (issue 24): SGLang's decode rate beside the client's per arm and batch with the
client-path-bound flag, the standard decode workload preset, bench_serving from several client processes, and
--stream-interval on every server; end to end against tests/eval/fake_sglang_server.py with SGLang's own
bench_serving."""

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

from eval import ab, ab_report  # noqa: E402
from eval.ab import multiclient, presets  # noqa: E402

FAKE = "tests.eval.fake_sglang_server"


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def _dry(*argv):
    r = subprocess.run([sys.executable, "-m", "eval.ab", "--dry-run", *argv], cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=300)
    return r


def _bench_lines(out: str):
    return [shlex.split(x.strip())[3:] for x in out.splitlines() if x.strip().startswith("python -m sglang.bench_serving")]


def _val(argv, flag):
    return argv[argv.index(flag) + 1]


# --------------------------------------------------------------------------------
# the standard decode workload
# --------------------------------------------------------------------------------
def test_standard_decode_preset_command_lines():
    r = _dry("--model", "tiny-nemotron-h", "--workload", "standard-decode")
    assert r.returncode == 0, r.stderr[-2000:]
    heads = [x.split()[1] for x in r.stdout.splitlines() if x.startswith("# ")]
    assert heads == ["stock", "staged", "stock-2"]  # Mamba2: no upstream arm; stock twice: the noise floor
    bench = _bench_lines(r.stdout)
    assert len(bench) == 6
    for argv in bench:
        assert _val(argv, "--random-input-len") == "1024" and _val(argv, "--random-output-len") == "1024"
        assert _val(argv, "--dataset-name") == "random-ids" and _val(argv, "--random-range-ratio") == "1.0"
    # two waves at each batch: prompts = 2 x concurrency
    assert sorted({(_val(a, "--max-concurrency"), _val(a, "--num-prompts")) for a in bench}) == [("1", "2"),
                                                                                               ("256", "512")]
    assert "--workload standard-decode: --input-len=1024 --output-len=1024 --rounds=2 --batch=1,256" in r.stdout
    servers = [x for x in r.stdout.splitlines() if "launch_server" in x]
    assert len(servers) == 3 and all(" --stream-interval 8 " in x + " " for x in servers)  # past the main-process cap
    g = _dry("--model", "tiny-qwen3-next", "--workload", "standard-decode")
    assert [x.split()[1] for x in g.stdout.splitlines() if x.startswith("# ")] == ["stock", "staged", "upstream",
                                                                                  "stock-2"]
    assert "--enable-linear-replayssm" in g.stdout


def test_flags_given_on_the_command_line_win_over_the_preset():
    argv = ["--workload", "standard-decode", "--arms", "stock,staged", "--batch", "256", "--output-len", "512"]
    args = ab.build_parser().parse_args(argv)
    done = presets.apply_workload(args, ab.build_parser(), argv)
    assert (args.arms, args.batch, args.output_len, args.input_len, args.rounds) == ("stock,staged", "256", 512,
                                                                                     1024, 2)
    assert done == ["--input-len=1024", "--rounds=2", "--min-prompts=1", "--stream-interval=8"]
    plain = ab.build_parser().parse_args([])
    assert presets.apply_workload(plain, ab.build_parser(), []) == [] and plain.input_len == 128
    assert presets.given_flags(ab.build_parser(), ["--rounds", "2", "--tag=x"]) == {"rounds", "tag"}
    assert presets.is_gdn("tiny-qwen3-next") and not presets.is_gdn("nemotron-h-8b")


def test_stream_interval_and_clients_flags():
    r = _dry("--model", "tiny-nemotron-h", "--batch", "4,8", "--stream-interval", "8", "--clients", "4")
    assert r.returncode == 0, r.stderr[-2000:]
    servers = [x for x in r.stdout.splitlines() if "-m sglang" in x and "launch_server" in x]
    assert len(servers) == 2 and all("--stream-interval 8" in x for x in servers)  # identical on every arm
    r = _dry("--model", "tiny-nemotron-h", "--batch", "1,8", "--clients", "2")
    assert r.returncode == 2 and "--clients 2: every client needs at least one concurrent request" in r.stderr
    r = _dry("--model", "tiny-nemotron-h", "--stream-interval", "-1")
    assert r.returncode == 2 and "--stream-interval" in r.stderr


# --------------------------------------------------------------------------------
# several client processes
# --------------------------------------------------------------------------------
def test_split_and_client_command_lines():
    assert multiclient.split(256, 512, 3) == [(86, 172), (85, 170), (85, 170)]
    assert multiclient.split(5, 7, 2) == [(3, 5), (2, 2)]
    assert sum(p for _, p in multiclient.split(256, 513, 4)) == 513
    with pytest.raises(ValueError, match="--clients 0"):
        multiclient.split(8, 16, 0)
    argv = ["--backend", "sglang", "--num-prompts", "16", "--max-concurrency", "8", "--seed", "3", "--output-file",
            "/x/b.jsonl"]
    a0, a1 = multiclient.client_argvs(argv, 2)
    assert (_val(a0, "--max-concurrency"), _val(a0, "--num-prompts"), _val(a0, "--seed")) == ("4", "8", "3")
    assert (_val(a1, "--max-concurrency"), _val(a1, "--num-prompts"), _val(a1, "--seed")) == ("4", "8", "4")
    assert _val(a1, "--output-file") == "/x/b.jsonl.client1" and a1[-1] == "--output-details"


def test_merge_of_per_request_records():
    """Two clients: the union window, totals summed, percentiles over every successful request; TPOT is
    (latency - TTFT) / (tokens - 1) with latency = TTFT + the inter-token gaps, as bench_serving has it."""
    c0 = {"completed": 2, "total_input_tokens": 20, "total_output_tokens": 8, "duration": 2.0,
          "ttfts": [0.1, 0.2], "itls": [[0.1, 0.1, 0.1], [0.3, 0.3, 0.3]], "output_lens": [4, 4], "errors": ["", ""]}
    c1 = {"completed": 1, "total_input_tokens": 10, "total_output_tokens": 4, "duration": 1.0,
          "ttfts": [0.4, 9.9], "itls": [[0.2, 0.2, 0.2], []], "output_lens": [4, 0], "errors": ["", "boom"]}
    m = multiclient.merge([c0, c1], [(100.0, 102.0), (100.5, 103.0)], batch=3)
    assert m["duration"] == pytest.approx(3.0) and m["clients"] == 2 and m["max_concurrency"] == 3
    assert m["completed"] == 3 and m["total_output_tokens"] == 12
    assert m["output_throughput"] == pytest.approx(4.0) and m["request_throughput"] == pytest.approx(1.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0) and m["mean_ttft_ms"] == pytest.approx(700.0 / 3)
    assert m["median_tpot_ms"] == pytest.approx(200.0) and m["p99_tpot_ms"] == pytest.approx(298.0)
    assert m["median_itl_ms"] == pytest.approx(200.0)
    assert m["median_e2e_latency_ms"] == pytest.approx(1000.0)  # 0.4 + 3 x 0.2 s
    assert m["concurrency"] == pytest.approx((0.4 + 1.1 + 1.0) / 3.0)


# --------------------------------------------------------------------------------
# end to end: the rates, the flag, the merged clients
# --------------------------------------------------------------------------------
def test_end_to_end_decode_rate_beside_client_rate_with_two_clients(tmp_path):
    cmd = [sys.executable, "-m", "eval.ab", "--model", "tiny-nemotron-h", "--stock-module", FAKE,
           "--patched-module", FAKE, "--arms", "stock,staged", "--batch", "2,4", "--input-len", "16",
           "--output-len", "300", "--no-parity", "--server-arg=--fake-decode-log", "--clients", "2",
           "--stream-interval", "2", "--out-dir", str(tmp_path), "--no-progress", "--shutdown-grace", "5"]
    r = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "ab-tiny-nemotron-h-stock-vs-staged.json").read_text())
    assert res["bench"]["stream_interval"] == 2 and res["bench"]["clients"] == 2
    assert "--stream-interval 2" in res["arms"]["stock"]["command"]
    for label in ("stock", "staged"):
        for e in res["arms"][label]["bench"]:
            b = e["batch"]
            x = e["result"]
            # two bench_serving processes merged: every prompt of the run, each client's share recorded
            assert e["ok"] and x["clients"] == 2 and x["completed"] == 2 * b and x["total_output_tokens"] == 600 * b
            assert sorted(c["max_concurrency"] for c in x["per_client"]) == [b // 2, b - b // 2]
            q = e["rates"]
            assert q["client_tok_s"] == x["output_throughput"]
            assert q["client_full_batch_tok_s"] == pytest.approx(b * 1000.0 / x["median_itl_ms"])
            assert q["decode_lines_all"] >= 1  # the stand-in's scheduler lines in this run's window of the log
            if q["decode_tok_s"] is not None:
                assert q["client_path_bound"] is (abs(q["client_to_decode"] - 1) > 0.10)
    by = res["summary"]["by_batch"]
    for bs, row in by.items():
        qa, qb = (ab_report.rates_rows(res["arms"][k])[int(bs)] for k in ("stock", "staged"))
        if qa["decode_tok_s"] and qb["decode_tok_s"]:
            assert row["decode_rate_ratio"] == pytest.approx(qb["decode_tok_s"] / qa["decode_tok_s"])
        assert row["client_path_bound"] == {"stock": qa["client_path_bound"], "staged": qb["client_path_bound"]}
    flagged = sum(bool(f) for row in by.values() for f in row["client_path_bound"].values())
    assert res["summary"]["client_path_bound_runs"] == flagged
    assert ("client-path bound" in res["summary"]["verdict"]) is (flagged > 0)
    md = (tmp_path / "ab-tiny-nemotron-h-stock-vs-staged.md").read_text()
    assert "| stock decode tok/s | staged decode tok/s | decode staged/stock | client-path bound |" in md
    assert "stream interval 2, clients 2" in md
