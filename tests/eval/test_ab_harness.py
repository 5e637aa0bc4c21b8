"""CPU tests of the A/B harness (eval/ab/, eval/ab_report.py, eval/bench_sweep.py).

No GPU, no network: command lines are checked against SGLang 0.5.17's own argument parser,
parity/metrics/bench parsing against recorded samples, and the whole harness runs end to end
against ``tests/eval/fake_sglang_server.py`` (a CPU stand-in speaking SGLang's HTTP API).
"""

from __future__ import annotations

import json
import math
import os
import random
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval import ab, ab_report, bench_sweep, models, report  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
FAKE = "tests.eval.fake_sglang_server"


def _args(*argv):
    return ab.build_parser().parse_args(list(argv))


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


# --------------------------------------------------------------------------------
# plan and command lines
# --------------------------------------------------------------------------------
def test_arm_with_its_own_kernel_config(tmp_path):
    cfg = tmp_path / "state_first.yaml"
    cfg.write_text("mamba2_output_only:\n  default: {state_first: 1}\n")
    arms = ab.parse_arms(f"stock,staged,staged@{cfg},patched:nospec@{cfg}")
    assert arms == [("stock", "stock", False, None), ("staged", "staged", False, None),
                    ("staged-state-first", "staged", False, str(cfg.resolve())),
                    ("patched-nospec-state-first", "patched", True, str(cfg.resolve()))]
    labels = [a[0] for a in ab.parse_arms(f"staged,staged,staged@{tmp_path / 'state_first.yaml'},"
                                        f"staged@{cfg}")]
    assert labels == ["staged", "staged-2", "staged-state-first", "staged-state-first-2"]
    (tmp_path / "2.yaml").write_text("{}\n")
    labels = [a[0] for a in ab.parse_arms(f"staged,staged,staged@{tmp_path / '2.yaml'}")]
    assert labels == ["staged", "staged-2", "staged-2-2"] and len(set(labels)) == 3  # never two arms with one label
    with pytest.raises(ValueError, match="applies to patched and staged arms only"):
        ab.parse_arms(f"stock@{cfg}")
    with pytest.raises(ValueError, match="not found"):
        ab.parse_arms(f"staged@{tmp_path / 'missing.yaml'}")
    args = _args("--arms", f"stock,staged,staged@{cfg}")
    ph = ab.plan_phases(args)
    assert [p.kernel_config for p in ph] == [None, None, str(cfg.resolve())]
    model = ab.ModelSpec("m", "/m", "/m", True, {}, "tiny", "", "")
    base = {"SGLANG_REPLAYSSM_KERNEL_CONFIG": "/inherited.yaml"}
    envs = [ab.server_env(base, args, p, model, []) for p in ph]
    assert "SGLANG_REPLAYSSM_KERNEL_CONFIG" not in envs[0]  # stock: the plugin stays inert
    assert envs[1]["SGLANG_REPLAYSSM_KERNEL_CONFIG"] == "/inherited.yaml"
    assert envs[2]["SGLANG_REPLAYSSM_KERNEL_CONFIG"] == str(cfg.resolve())


def test_arms_and_phases():
    assert ab.parse_arms("stock,stock,patched") == [("stock", "stock", False, None), ("stock-2", "stock", False, None),
                                                   ("patched", "patched", False, None)]
    assert ab.parse_arms("stock,staged,stock:nospec") == [("stock", "stock", False, None),
                                                         ("staged", "staged", False, None),
                                                         ("stock-nospec", "stock", True, None)]
    for bad in ("stock,fork", "stock:fast", "staged@"):
        with pytest.raises(ValueError, match="unknown arm"):
            ab.parse_arms(bad)
    # the non-speculative baseline arm of a spec run: no spec flags, no simulation, bench only
    ph = ab.plan_phases(_args("--arms", "stock,staged,stock:nospec", "--spec", "nextn", "--sim-acc-len", "3"))
    assert [(p.label, p.spec, p.sim_acc_len, p.bench, p.parity, p.role) for p in ph] == [
        ("stock", True, 3.0, True, True, "arm"), ("staged", True, 3.0, True, True, "arm"),
        ("stock-nospec", False, None, True, False, "arm"),
        ("stock-spec-parity", True, None, False, True, "spec-parity"),
        ("staged-spec-parity", True, None, False, True, "spec-parity"),
        ("stock-nospec-reference", False, None, False, True, "reference")]
    assert ab.parse_batches("32,1,128,32") == [1, 32, 128]

    with pytest.raises(ValueError):
        ab.parse_batches("1,x")
    ph = ab.plan_phases(_args("--arms", "stock,patched"))
    assert [(p.label, p.bench, p.parity, p.role) for p in ph] == [("stock", True, True, "arm"),
                                                                   ("patched", True, True, "arm")]
    # spec with simulated acceptance: speed arms without parity, then spec-parity servers + a non-spec reference
    ph = ab.plan_phases(_args("--arms", "stock,patched", "--spec", "nextn", "--sim-acc-len", "2.5"))
    assert [(p.label, p.spec, p.sim_acc_len, p.bench, p.parity) for p in ph] == [
        ("stock", True, 2.5, True, False), ("patched", True, 2.5, True, False),
        ("stock-spec-parity", True, None, False, True), ("patched-spec-parity", True, None, False, True),
        ("stock-nospec-reference", "stock" == "x", None, False, True)]
    # spec without simulation: the arms do their own parity; only the reference is extra
    ph = ab.plan_phases(_args("--arms", "stock,patched", "--spec", "nextn"))
    assert [p.role for p in ph] == ["arm", "arm", "reference"] and ph[0].parity
    # a whole simulated accept length with match-expected accepts the same drafts on every server:
    # the speed arms compare their outputs too
    ph = ab.plan_phases(_args("--arms", "stock,staged", "--spec", "nextn", "--sim-acc-len", "3"))
    assert [(p.label, p.parity) for p in ph][:2] == [("stock", True), ("staged", True)]
    ph = ab.plan_phases(_args("--arms", "stock,staged", "--spec", "nextn", "--sim-acc-len", "3",
                              "--sim-acc-method", "multinomial"))
    assert [(p.label, p.parity) for p in ph][:2] == [("stock", False), ("staged", False)]


def test_arm_launchers():
    args = ab.build_parser().parse_args(["--patched-arg", "--replayssm-buffer-len 8"])
    assert ab.arm_launch(args, "stock") == (ab.STOCK_MODULE, [])
    # staged: the launcher as users run it (the replay path is its default); patched: seams off
    assert ab.arm_launch(args, "staged") == (ab.PATCHED_MODULE, ["--replayssm-buffer-len", "8"])
    assert ab.arm_launch(args, "patched") == (ab.PATCHED_MODULE,
                                               ["--replayssm-buffer-len", "8", "--replayssm-replay-ring", "false"])
    assert ab.arm_launch(args, "upstream") == (ab.STOCK_MODULE, ["--enable-linear-replayssm"])


def _model(tmp_path, name, spec=False):
    return ab.prepare_model(_args("--model", name), tmp_path, spec)


@pytest.mark.parametrize("name", models.names())
def test_server_flags_parse_with_sglangs_parser(tmp_path, sglang_parser, name):
    spec = name not in ("tiny-falcon-h1", "tiny-granitemoehybrid")
    for use_spec in ([False, True] if spec else [False]):
        args = _args("--model", name, "--batch", "1,32", "--spec", "nextn" if use_spec else "none",
                     "--server-arg", "--max-total-tokens 65536")
        m = ab.prepare_model(args, tmp_path, use_spec)
        flags = ab.common_server_flags(args, m, use_spec)
        cmd = ab.launch_cmd("python", ab.STOCK_MODULE, flags, "127.0.0.1", 31000)
        ns = sglang_parser.parse_args(cmd[3:])
        assert ns.model_path == m.path and ns.load_format == "dummy" and ns.skip_tokenizer_init is False
        assert ns.attention_backend == models.get(name).attention_backend
        assert ns.disable_radix_cache and ns.enable_metrics and ns.port == 31000
        assert ns.cuda_graph_max_bs_decode == 32 and ns.max_total_tokens == 65536
        assert ns.mem_fraction_static == (0.25 if name.startswith("tiny") else 0.85)
        if use_spec:
            assert ns.speculative_algorithm == "NEXTN" and ns.speculative_num_steps == 3
            assert ns.speculative_eagle_topk == 1 and ns.speculative_num_draft_tokens == 4
            cfg = json.loads((Path(m.path) / "config.json").read_text())
            assert cfg["num_nextn_predict_layers"] == 1


def test_stock_and_patched_commands_differ_only_in_launcher_and_port(tmp_path):
    args = _args("--arms", "stock,patched", "--patched-arg", "--replayssm-buffer-len 8")
    m = _model(tmp_path, "tiny-nemotron-h")
    flags = ab.common_server_flags(args, m, False)
    st = ab.launch_cmd("python3", ab.STOCK_MODULE, flags, "127.0.0.1", 1)
    pa = ab.launch_cmd("python3", ab.PATCHED_MODULE, flags, "127.0.0.1", 2, ["--replayssm-buffer-len", "8"])
    assert st[2] == "sglang.launch_server" and pa[2] == "sglang_replayssm.launch_server"
    assert st[3:-2] == pa[3:-4] and pa[-2:] == ["--replayssm-buffer-len", "8"]


def test_server_env(tmp_path, monkeypatch):
    base = {"PATH": "/bin", "PYTHONPATH": "/bundle", "SGLANG_REPLAYSSM_BUFFER_LEN": "8",
            "SGLANG_SIMULATE_ACC_LEN": "9"}
    args = _args("--spec", "nextn", "--sim-acc-len", "2.5", "--weight-seed", "7")
    m = _model(tmp_path, "tiny-nemotron-h", True)
    stock, patched = ab.plan_phases(args)[:2][0], ab.Phase("patched", "patched", True, 2.5, True, False)
    env = ab.server_env(base, args, stock, m, ["/ep", "/repo"])
    assert env["PYTHONPATH"] == os.pathsep.join(["/ep", "/repo", "/bundle"])
    assert "SGLANG_REPLAYSSM_BUFFER_LEN" not in env  # stock stays plain SGLang
    assert env["REPLAYSSM_EVAL_RANDOM_WEIGHTS"] == "1" and env["REPLAYSSM_EVAL_WEIGHT_SEED"] == "7"
    assert env["SGLANG_SIMULATE_ACC_LEN"] == "2.5" and env["SGLANG_SIMULATE_ACC_METHOD"] == "match-expected"
    assert env["SGLANG_FLASHINFER_USE_TENSOR_CORE"] == "true"
    envp = ab.server_env(base, args, patched, m, ["/ep"])
    assert envp["SGLANG_REPLAYSSM_BUFFER_LEN"] == "8"
    ref = ab.server_env(base, args, ab.Phase("ref", "stock", False, None, False, True), m, [])
    assert "SGLANG_SIMULATE_ACC_LEN" not in ref
    assert not any(k.startswith("SGLANG_REPLAYSSM_") for k in ab.env_delta(env, base))


def test_test_retract_env_and_retraction_count(tmp_path):
    """--test-retract N turns on SGLang's retraction test hook on every server (stock and ours alike), and
    the servers' logs are scanned for the requests actually retracted."""
    m = _model(tmp_path, "tiny-nemotron-h")
    args = _args("--test-retract", "5")
    for phase in ab.plan_phases(args):
        env = ab.server_env({"PATH": "/bin"}, args, phase, m, [])
        assert env["SGLANG_TEST_RETRACT"] == "1" and env["SGLANG_TEST_RETRACT_INTERVAL"] == "5", phase.label
    off = ab.server_env({"PATH": "/bin"}, _args(), ab.plan_phases(_args())[0], m, [])
    assert "SGLANG_TEST_RETRACT" not in off and "SGLANG_TEST_RETRACT_INTERVAL" not in off
    n = random.randint(2, 9)
    log = "\n".join(["[t] Testing retraction. #retracted_reqs: 0, #new_tokens_gained: 0",
                      f"[t] Testing retraction. #retracted_reqs: {n}, #new_tokens_gained: 40",
                      "[t] server_args=ServerArgs(retraction_policy='length')",
                      "[t] KV cache pool is full. Retract requests. #retracted_reqs: 1, #aborted_retracted_reqs: 0"])
    assert ab.count_retractions(log) == n + 1
    assert ab.count_retractions("no retraction here") == 0
    rec = ab.recorded_env({"PATH": "/bin", "SGLANG_TEST_RETRACT": "1", "SGLANG_REPLAYSSM_KERNEL_CONFIG": "/k.yaml",
                           "SGLANG_SIMULATE_ACC_LEN": "3"})
    assert rec == {"SGLANG_REPLAYSSM_KERNEL_CONFIG": "/k.yaml", "SGLANG_TEST_RETRACT": "1"}


def test_bench_serving_argv(tmp_path):
    args = _args("--batch", "1,64", "--rounds", "3", "--input-len", "100", "--output-len", "50")
    m = _model(tmp_path, "tiny-qwen3-next")
    argv = ab.bench_serving_argv("http://h:1", m, 64, args, "/o.jsonl")
    d = dict(zip(argv[::2], argv[1::2]))
    assert "--tokenize-prompt" in argv and "--disable-tqdm" in argv
    i = argv.index("--tokenize-prompt")
    argv2 = argv[:i] + argv[i + 1:]
    j = argv2.index("--disable-tqdm")
    d = dict(zip(argv2[:j][::2], argv2[:j][1::2]))
    assert d["--dataset-name"] == "random-ids" and d["--max-concurrency"] == "64" and d["--num-prompts"] == "192"
    assert d["--tokenizer"] == m.tokenizer and d["--random-input-len"] == "100"
    assert ab.bench_serving_argv("http://h:1", m, 1, args, "/o")[argv.index("--num-prompts") + 1] == "4"


def test_bench_serving_accepts_the_arguments(tmp_path):
    serving = pytest.importorskip("sglang.benchmark.serving", exc_type=ImportError)
    seen = {}
    orig = serving.run_benchmark
    try:
        serving.run_benchmark = lambda a: seen.setdefault("args", a)
        m = _model(tmp_path, "tiny-qwen3-next")
        argv = ab.bench_serving_argv("http://h:1", m, 8, _args(), str(tmp_path / "o.jsonl"))
        old = sys.argv
        sys.argv = ["x"] + argv
        try:
            serving.cli_main()
        finally:
            sys.argv = old
    finally:
        serving.run_benchmark = orig
    a = seen["args"]
    assert a.dataset_name == "random-ids" and a.tokenize_prompt and a.max_concurrency == 8


def test_dry_run_prints_every_server(capsys):
    assert ab.main(["--model", "tiny-qwen3-next", "--arms", "stock,stock,patched", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("-m sglang.launch_server") == 2 and out.count("-m sglang_replayssm.launch_server") == 1
    assert out.count("python -m sglang.bench_serving") == 3 * 4


# --------------------------------------------------------------------------------
# parity
# --------------------------------------------------------------------------------
def _run(tokens, lp=-0.1, top=None):
    return {"tokens": tokens, "logprobs": [lp] * len(tokens),
            "top": top if top is not None else [{t: lp, 999: lp - 1.0} for t in tokens]}


def test_parity_exact_and_histogram():
    a = [_run([5, 6, 7, 8]), _run([1, 2, 3])]
    r = ab.compare_parity(a, [dict(x) for x in a], 0.05, None)
    assert r["exact"] and r["mismatches"] == 0 and r["identical_prompts"] == 2 and r["tokens_compared"] == 7
    assert r["dlogprob_hist"]["counts"][0] == 7 and r["max_abs_dlogprob"] == 0.0


def test_parity_mismatch_near_tie_and_deltas():
    ref = [_run([5, 6, 7, 8]), _run([1, 2, 3, 4]), _run([9, 9])]
    o0 = _run([5, 6, 70, 8])  # real mismatch at 2: ref's gap between 7 and 70 is large
    tie_top_a = [{1: -0.1}, {2: -0.1}, {3: -0.50, 30: -0.51}, {4: -0.1}]
    tie_top_b = [{1: -0.1}, {2: -0.1}, {30: -0.50, 3: -0.52}, {4: -0.1}]
    ref[1] = {"tokens": [1, 2, 3, 4], "logprobs": [-0.1, -0.1, -0.5, -0.1], "top": tie_top_a}
    o1 = {"tokens": [1, 2, 30, 4], "logprobs": [-0.1, -0.1000004, -0.5, -0.1], "top": tie_top_b}
    o2 = _run([9, 9], lp=-0.1 + 2e-3)
    r = ab.compare_parity(ref, [o0, o1, o2], 0.05, None)
    assert r["mismatches"] == 1 and r["mismatch_details"][0]["pos"] == 2 and r["mismatch_details"][0]["kind"] == "mismatch"
    assert len(r["near_ties"]) == 1 and r["near_ties"][0]["prompt"] == 1 and r["near_ties"][0]["b_token"] == 30
    assert r["first_divergence"] == [2, 2, None] and not r["exact"]
    assert r["tokens_compared"] == 2 + 2 + 2
    assert math.isclose(r["max_abs_dlogprob"], 2e-3, rel_tol=1e-6)
    labels, counts = r["dlogprob_hist"]["labels"], r["dlogprob_hist"]["counts"]
    assert counts[labels.index("≤1e-2")] == 2 and counts[labels.index("≤1e-6")] == 1
    # a length difference is a mismatch too
    r2 = ab.compare_parity([_run([1, 2, 3])], [_run([1, 2])], 0.05, 3)
    assert r2["mismatches"] == 1 and r2["mismatch_details"][0]["kind"] == "length"


def test_parse_recorded_generate_output():
    item = json.loads((DATA / "generate_sample.json").read_text())
    out = ab.parse_generate_output(item)
    n = len(item["meta_info"]["output_token_logprobs"])
    assert len(out["tokens"]) == len(out["logprobs"]) == len(out["top"]) == n
    assert out["tokens"] == [t[1] for t in item["meta_info"]["output_token_logprobs"]]
    assert out["tokens"][:n] == item["output_ids"][:n]
    assert all(out["tokens"][i] in out["top"][i] for i in range(n))
    slim = ab.slim_outputs([out])[0]
    assert set(slim) == {"tokens", "logprobs"}


def test_parse_metrics_and_server_info():
    text = ('# HELP sglang:num_running_reqs x\nsglang:num_running_reqs{model_name="a",dp="0"} 3.0\n'
            'sglang:num_running_reqs{model_name="a",dp="1"} 2.0\nsglang:spec_accept_length{m="a"} 2.75\n'
            'sglang:other 1\nnot a metric\n')
    assert ab.parse_metrics(text) == {"num_running_reqs": 5.0, "spec_accept_length": 2.75}
    info = {"version": "0.5.17", "max_total_num_tokens": 1000, "internal_states": [
        {"effective_max_running_requests_per_dp": 48, "avg_spec_accept_length": 2.5,
         "memory_usage": {"token_capacity": 1000, "weight": 1.5}}]}
    f = ab.server_facts(info)
    assert f["max_running_requests"] == 48 and f["avg_spec_accept_length"] == 2.5 and f["token_capacity"] == 1000
    assert ab.server_facts(None) == {}


def test_trim_recorded_bench_serving_line():
    line = (DATA / "bench_serving_sample.jsonl").read_text().strip().splitlines()[-1]
    res = ab.trim_bench(json.loads(line))
    for k in ("output_throughput", "median_tpot_ms", "p99_itl_ms", "median_ttft_ms", "completed"):
        assert report.is_number(res[k]), k
    assert "server_info" not in res


# --------------------------------------------------------------------------------
# reports from a recorded result
# --------------------------------------------------------------------------------
def test_report_from_recorded_result(tmp_path):
    res = json.loads((DATA / "ab_result_sample.json").read_text())
    for k in ("git_commit", "sglang_version", "gpu", "flags", "summary", "arms"):
        assert k in res
    md = ab_report.markdown(res)
    assert "## Speed (sglang.bench_serving)" in md and "## Parity" in md and "```" in md
    assert "spreads an event's gap" not in md  # streamed token by token
    chunked = dict(res, bench=dict(res.get("bench") or {}, stream_interval=8))
    assert "stream interval 8 (each streamed event carries that many tokens; bench_serving spreads an event's gap" in \
        ab_report.markdown(chunked)
    a, b = res["summary"]["a"], res["summary"]["b"]
    for bs in (e["batch"] for e in res["arms"][a]["bench"] if e.get("result")):
        assert f"\n| {bs} |" in md
    paths = ab_report.write_all(res, tmp_path, "ab-sample")
    names = {p.name for p in paths}
    assert {"ab-sample.json", "ab-sample.md"} <= names
    assert ("ab-sample.png" in names) == report.have_matplotlib()
    assert "ab-sample.json" in ab_report.render(tmp_path / "ab-sample.json")
    # a gzipped result is rendered beside itself and left as it is
    import gzip

    gz = tmp_path / "gz" / "ab-z.json.gz"
    gz.parent.mkdir()
    gz.write_bytes(gzip.compress((tmp_path / "ab-sample.json").read_bytes()))
    before = gz.read_bytes()
    ab_report.render(gz)
    assert (gz.parent / "ab-z.md").read_text() == md and gz.read_bytes() == before
    assert not list(gz.parent.glob("*.json"))
    panels = ab_report.panels(res)
    assert panels[0]["hline"] == 1.0 and panels[-1]["kind"] == "bar"


# --------------------------------------------------------------------------------
# bench_serving driver
# --------------------------------------------------------------------------------
def test_bench_sweep_protocol_and_jobs(capsys):
    assert bench_sweep.parse_event('@@BENCH_SWEEP {"event": "ready"}\n') == {"event": "ready"}
    assert bench_sweep.parse_event("Mean TPOT (ms): 1.0") is None
    calls = []

    def cli_main():
        calls.append(list(sys.argv))
        if "--boom" in sys.argv:
            raise RuntimeError("boom")
        if "--exit" in sys.argv:
            sys.exit(1)

    assert bench_sweep.run_job(cli_main, ["--a", "1"])["ok"]
    assert calls[-1] == ["sglang.bench_serving", "--a", "1"]
    r = bench_sweep.run_job(cli_main, ["--boom"])
    assert not r["ok"] and "boom" in r["error"]
    assert not bench_sweep.run_job(cli_main, ["--exit"])["ok"]
    assert (bench_sweep.SHIM_DIR / "datasets" / "__init__.py").is_file()


# --------------------------------------------------------------------------------
# end to end against the CPU stand-in server
# --------------------------------------------------------------------------------
def _run_ab(tmp_path, *extra, timeout=240):
    cmd = [sys.executable, "-m", "eval.ab", "--model", "tiny-nemotron-h", "--stock-module", FAKE,
           "--patched-module", FAKE, "--no-bench", "--parity-tokens", "64", "--parity-prompts", "4",
           "--out-dir", str(tmp_path), "--no-progress", "--shutdown-grace", "5", *extra]
    return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("concurrent", [False, True])
def test_end_to_end_with_stand_in_servers(tmp_path, concurrent):
    r = _run_ab(tmp_path, "--arms", "stock,stock,patched",
                "--patched-arg", "--fake-flip-at 10 --fake-gap 0.5", *(["--concurrent-start"] if concurrent else []))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ss = json.loads((tmp_path / "ab-tiny-nemotron-h-stock-vs-stock.json").read_text())
    sp = json.loads((tmp_path / "ab-tiny-nemotron-h-stock-vs-patched.json").read_text())
    for res in (ss, sp):
        assert res["schema"] == ab.SCHEMA and res["git_commit"] and "gpu" in res and "flags" in res
        assert res["flags"]["harness"]["concurrent_start"] == concurrent
        assert res["summary"]["random_weights_confirmed"] is True
        assert (tmp_path / f"ab-tiny-nemotron-h-{res['comparison']}.md").is_file()
        for arm in res["arms"].values():
            assert arm["status"] == "ok" and arm["shutdown"]["stopped"]
            assert len(arm["parity"]["outputs"]) == 4 and len(arm["parity"]["outputs"][0]["tokens"]) == 64
            assert "top" not in arm["parity"]["outputs"][0]
    assert ss["summary"]["parity"]["exact"] is True
    par = sp["summary"]["parity"]
    assert not par["exact"] and par["mismatches"] == 1 and par["first_divergence"][0] == 10
    assert "sglang_replayssm.launch_server" not in sp["arms"]["patched"]["command"]  # stand-in launcher
    assert not list(tmp_path.glob("*partial.json"))
    if concurrent:  # each server but the last held back the next until its memory pools were allocated
        assert "memory pools allocated after" in r.stderr + r.stdout
        assert "pools_ready_after_s" in ss["arms"]["stock"] and "pools_ready_after_s" not in sp["arms"]["patched"]


def test_two_arms_of_one_kind_write_two_results(tmp_path):
    """stock,patched,patched: the second comparison is named by its arm's label, not written over the first."""
    r = _run_ab(tmp_path, "--arms", "stock,patched,patched", "--patched-arg", "--fake-flip-at 10 --fake-gap 0.5")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    first = json.loads((tmp_path / "ab-tiny-nemotron-h-stock-vs-patched.json").read_text())
    second = json.loads((tmp_path / "ab-tiny-nemotron-h-stock-vs-patched-2.json").read_text())
    assert first["summary"]["b"] == "patched" and second["summary"]["b"] == "patched-2"
    assert set(first["arms"]) == {"stock", "patched"} and set(second["arms"]) == {"stock", "patched-2"}


def test_seams_state_from_the_server_log():
    line = "[t replayssm pid=7] INFO sglang_replayssm active (pid 7): L=16, ssm_types=gdn, spec=True, replay_ring={}, x"
    old = line.replace("replay_ring=", "staged=")  # servers before the setting's rename
    assert ab.seams_state(old.format("False")) is False and ab.seams_state(old.format("True")) is True
    assert ab.seams_state(line.format("True") + "\n" + line.format("True")) is True
    assert ab.seams_state(line.format("False")) is False
    assert ab.seams_state(line.format("True") + "\n" + line.format("False")) == "mixed"
    assert ab.seams_state("plain SGLang log") is None


def test_conv_verify_state_from_the_server_log():
    """Whether the conv1d verify kernel served: the plugin's line says conv_verify=; servers from before it do not."""
    line = ("[t replayssm pid=7] INFO sglang_replayssm active (pid 7): L=16, ssm_types=mamba2, spec=True, "
            "replay_ring=True, conv_verify={}, kernel config x, 9 patch(es) verified")
    assert ab.conv_verify_state(line.format("True") + "\n" + line.format("True")) is True
    assert ab.conv_verify_state(line.format("False")) is False
    assert ab.conv_verify_state(line.format("True") + "\n" + line.format("False")) == "mixed"
    old = "sglang_replayssm active (pid 7): L=16, ssm_types=gdn, spec=True, replay_ring=True, kernel config x"
    assert ab.conv_verify_state(old) is None and ab.conv_verify_state("plain SGLang log") is None


def test_staged_arm_drops_an_inherited_seams_switch(tmp_path):
    base = {"PATH": "/bin", "SGLANG_REPLAYSSM_REPLAY_RING": "0", "SGLANG_REPLAYSSM_STAGED": "0",
            "SGLANG_REPLAYSSM_BUFFER_LEN": "8"}
    args = _args()
    m = _model(tmp_path, "tiny-nemotron-h")
    staged = ab.server_env(base, args, ab.Phase("staged", "staged", False, None, True, False), m, [])
    patched = ab.server_env(base, args, ab.Phase("patched", "patched", False, None, True, False), m, [])
    assert "SGLANG_REPLAYSSM_REPLAY_RING" not in staged and "SGLANG_REPLAYSSM_STAGED" not in staged
    assert staged["SGLANG_REPLAYSSM_BUFFER_LEN"] == "8"
    assert patched["SGLANG_REPLAYSSM_REPLAY_RING"] == "0"  # its own --replayssm-replay-ring false decides anyway


def test_an_arm_whose_server_ran_the_wrong_seams_is_an_error(tmp_path):
    """The server's own log line decides: a staged arm that served with the seams off (an inherited YAML,
    say) is recorded as an error, not compared as if it were the replay path."""
    r = _run_ab(tmp_path, "--arms", "stock,staged,patched", "--patched-arg=--fake-replayssm")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "ab-tiny-nemotron-h-stock-vs-staged.json").read_text())
    assert res["arms"]["staged"]["status"] == "ok" and res["arms"]["staged"]["replayssm_seams"] is True
    assert res["arms"]["staged"]["replayssm_conv_verify"] is True and res["arms"]["stock"]["replayssm_conv_verify"] is None
    res = json.loads((tmp_path / "ab-tiny-nemotron-h-stock-vs-patched.json").read_text())
    assert res["arms"]["patched"]["status"] == "ok" and res["arms"]["patched"]["replayssm_seams"] is False
    assert res["arms"]["patched"]["replayssm_conv_verify"] is False
    bad = tmp_path / "bad"
    r = _run_ab(bad, "--arms", "stock,staged", "--patched-arg=--fake-replayssm --fake-seams off")
    assert r.returncode == 1
    res = json.loads((bad / "ab-tiny-nemotron-h-stock-vs-staged.json").read_text())
    arm = res["arms"]["staged"]
    assert arm["status"] == "error" and "needs the replay-ring seams on" in arm["error"]


def test_a_launch_config_variant_is_named_by_its_label(tmp_path):
    """stock,patched@FILE,patched: the variant's comparison carries its file stem, the plain arm's the kinds."""
    cfg = tmp_path / "sf.yaml"
    cfg.write_text("{}\n")
    out = tmp_path / "out"
    r = _run_ab(out, "--arms", f"stock,patched@{cfg},patched", "--patched-arg", "--fake-gap 0.5")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    variant = json.loads((out / "ab-tiny-nemotron-h-stock-vs-patched-sf.json").read_text())
    plain = json.loads((out / "ab-tiny-nemotron-h-stock-vs-patched.json").read_text())
    assert variant["summary"]["b"] == "patched-sf" and plain["summary"]["b"] == "patched"


def test_end_to_end_failure_is_recorded_and_servers_are_stopped(tmp_path):
    r = _run_ab(tmp_path, "--arms", "stock,patched", "--patched-arg=--fake-crash", "--server-timeout", "30")
    assert r.returncode == 1
    res = json.loads((tmp_path / "ab-tiny-nemotron-h-stock-vs-patched.json").read_text())
    assert res["arms"]["stock"]["status"] == "ok"
    assert res["arms"]["patched"]["status"] == "error" and "exited" in res["arms"]["patched"]["error"]
    assert "crashing" in Path(res["arms"]["patched"]["log"]).read_text()
    assert res["summary"]["parity"].get("skipped")


def test_deadline_skips_servers(tmp_path):
    r = _run_ab(tmp_path, "--arms", "stock,patched", "--deadline-s", "1", "--min-phase-s", "30")
    assert r.returncode == 1
    res = json.loads((tmp_path / "ab-tiny-nemotron-h-stock-vs-patched.json").read_text())
    assert {a["status"] for a in res["arms"].values()} == {"skipped"}


def test_solo_parity_and_engine_noise_floor():
    """--parity-solo: stock batched vs stock solo is the noise floor; solo vs solo compares the arms."""
    args = ab.build_parser().parse_args(["--parity-solo", "--parity-tokens", "3"])
    base = [_run([1, 2, 3]), _run([4, 5, 6])]
    flipped = [_run([1, 2, 3]), _run([4, 50, 6])]

    def arm(label, kind, batched, solo):
        return {"label": label, "phase": {"role": "arm", "kind": kind}, "status": "ok", "bench": {},
                "parity": {"outputs": batched}, "parity_solo": {"outputs": solo}}

    a, b = arm("stock", "stock", base, flipped), arm("staged", "staged", base, flipped)
    out = ab.compare(a, b, [a, b], args)
    assert out["parity"]["exact"] and out["parity_solo"]["exact"]
    nf = out["parity_noise_floor"]
    assert nf["mismatches"] == 1 and nf["first_divergence"] == [None, 1] and nf["what"] == "stock batched vs solo"
    assert "noise floor: 1 mismatching prompt(s)" in out["verdict"] and "solo parity exact" in out["verdict"]
    slim = ab.slim_phase(a)
    assert set(slim["parity_solo"]["outputs"][0]) == {"tokens", "logprobs"}


def test_radix_cache_flag(tmp_path):
    m = _model(tmp_path, "tiny-nemotron-h")
    assert "--disable-radix-cache" in ab.common_server_flags(_args(), m, False)
    on = ab.common_server_flags(_args("--radix-cache", "on"), m, False)
    assert "--disable-radix-cache" not in on
    assert on[on.index("--mamba-radix-cache-strategy") + 1] == "no_buffer" and "--disable-overlap-schedule" in on


def test_radix_flags_pass_sglangs_own_checks(tmp_path, sglang_parser):
    """SGLang 0.5.17 asserts no_buffer runs without the overlap scheduler (found on the H200)."""
    sa = pytest.importorskip("sglang.srt.server_args")
    m = _model(tmp_path, "tiny-nemotron-h")
    flags = ab.common_server_flags(_args("--radix-cache", "on"), m, False)
    ns = sglang_parser.parse_args(ab.launch_cmd("python", ab.STOCK_MODULE, flags, "127.0.0.1", 31000)[3:])
    assert ns.disable_overlap_schedule and not ns.disable_radix_cache
    assert ns.mamba_radix_cache_strategy == "no_buffer"
    assert hasattr(sa.ServerArgs, "_validate_mamba_no_buffer")


def test_save_jitcache_keeps_what_a_cache_hit_loads(tmp_path, monkeypatch):
    """Triton's cache tarball keeps each kernel's metadata .json, .cubin and launcher .so and drops its text IRs;
    FlashInfer / tvm-ffi are kept whole (ninja rebuilds a missing object file)."""
    import tarfile

    root = tmp_path / "cache"
    names = {"triton/H1/k.json": "{}", "triton/H1/__grp__k.json": "{}", "triton/H1/k.cubin": "bin",
             "triton/H2/launcher.so": "so", "flashinfer/op/a.cuda.o": "o", "flashinfer/op/a.ptx": "ptx-kept",
             "tvm-ffi/m/m.so": "so"}
    names.update({f"triton/H1/k{ext}": "ir" for ext in ab.TRITON_IR_SUFFIXES})
    for rel, text in names.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    monkeypatch.setenv("SGLANG_CACHE_ROOT", str(root))
    out = ab.save_jitcache(tmp_path / "out")
    assert out["root"] == str(root) and "error" not in out
    got = set()
    for fname in ("jit-triton.txz", "jit-other.txz"):
        with tarfile.open(tmp_path / "out" / fname) as tf:
            got |= {m.name for m in tf.getmembers() if m.isfile()}
    dropped = {f"triton/H1/k{ext}" for ext in ab.TRITON_IR_SUFFIXES}
    assert got == set(names) - dropped
    monkeypatch.setenv("SGLANG_CACHE_ROOT", str(tmp_path / "missing"))
    assert ab.save_jitcache(tmp_path / "out2")["error"] == "no cache root"


def test_finish_writes_the_results_of_a_stopped_run(tmp_path, monkeypatch):
    """A run stopped after its servers but before its results (the GPU call's time ran out) leaves its partial
    record, parity outputs included; ``--finish`` writes from it the results the run would have written."""
    import signal as _signal

    from eval.ab import cli

    for k in [k for k in os.environ if k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.chdir(REPO)

    def stopped(*a, **k):
        raise KeyboardInterrupt("stopped before the results")

    handlers = {s: _signal.getsignal(s) for s in (_signal.SIGTERM, _signal.SIGINT)}
    try:
        with monkeypatch.context() as m:
            m.setattr(cli, "write_results", stopped)
            with pytest.raises(KeyboardInterrupt):
                cli.main(["--model", "tiny-nemotron-h", "--stock-module", FAKE, "--patched-module", FAKE,
                          "--no-bench", "--parity-tokens", "64", "--parity-prompts", "4", "--arms", "stock,patched",
                          "--patched-arg", "--fake-flip-at 10 --fake-gap 0.5", "--parity-solo",
                          "--out-dir", str(tmp_path), "--no-progress", "--shutdown-grace", "5"])
    finally:
        for s, h in handlers.items():
            _signal.signal(s, h)
    (partial,) = tmp_path.glob("*-partial.json")
    assert not list(tmp_path.glob("ab-*-stock-vs-patched.json"))
    rec = json.loads(partial.read_text())
    assert [len(p["parity"]["outputs"]) for p in rec["phases"]] == [4, 4]  # parity outputs kept in the partial
    assert cli.main(["--finish", str(partial)]) == 0
    res = json.loads((tmp_path / "ab-tiny-nemotron-h-stock-vs-patched.json").read_text())
    par = res["summary"]["parity"]
    assert par["mismatches"] == 1 and par["first_divergence"][0] == 10
    assert res["summary"]["parity_solo"]["tokens_total"] == 4 * 64
    assert res["finished_from_partial"] == str(partial) and not partial.exists()
    assert (tmp_path / "ab-tiny-nemotron-h-stock-vs-patched.md").is_file()
    # a run of a model directory is named by the directory's name, as the run names it
    rec["flags"]["harness"]["model"] = str(tmp_path / "models" / "tiny-nemotron-h")
    again = tmp_path / "again" / partial.name
    again.parent.mkdir()
    again.write_text(json.dumps(rec))
    assert cli.main(["--finish", str(again)]) == 0
    assert (again.parent / "ab-tiny-nemotron-h-stock-vs-patched.json").is_file()
    # what is no partial record is refused, by name
    bad = tmp_path / "other.json"
    bad.write_text("{}")
    assert cli.main(["--finish", str(bad)]) == 2
    assert cli.main(["--finish", str(tmp_path / "missing-partial.json")]) == 2


def test_resume_runs_the_servers_a_stopped_run_had_not_finished(tmp_path, monkeypatch):
    """A run stopped after its first server (the GPU call's limit) is gone on with by ``--resume`` in a later call:
    the finished server is kept, the others run, and the results compare them as one run (the record lists both
    calls); flags other than run control are refused beside it, as is a record from another commit."""
    import signal as _signal

    from eval.ab import cli, workloads

    for k in [k for k in os.environ if k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("GIT_COMMIT", "a" * 40)
    monkeypatch.chdir(REPO)
    real = workloads.run_phase
    seen = []

    def stop_at_second(ph, *a, **k):
        seen.append(ph.label)
        if len(seen) == 2:
            raise KeyboardInterrupt("the call's limit")
        return real(ph, *a, **k)

    flags = ["--model", "tiny-nemotron-h", "--stock-module", FAKE, "--patched-module", FAKE, "--no-bench",
             "--parity-tokens", "32", "--parity-prompts", "3", "--arms", "stock,patched",
             "--patched-arg", "--fake-flip-at 7 --fake-gap 0.5", "--no-progress", "--shutdown-grace", "5"]
    handlers = {s: _signal.getsignal(s) for s in (_signal.SIGTERM, _signal.SIGINT)}
    try:
        with monkeypatch.context() as m:
            m.setattr(workloads, "run_phase", stop_at_second)
            with pytest.raises(KeyboardInterrupt):
                cli.main(flags + ["--out-dir", str(tmp_path / "call1")])
    finally:
        for s, h in handlers.items():
            _signal.signal(s, h)
    (partial,) = (tmp_path / "call1").glob("*-partial.json")
    rec = json.loads(partial.read_text())
    assert [p["label"] for p in rec["phases"]] == ["stock"]
    # the record's flags only: a flag of the run's own beside --resume is refused, by name
    assert cli.main(["--resume", str(partial), "--arms", "stock,upstream", "--out-dir", str(tmp_path / "no")]) == 2
    assert not (tmp_path / "no").exists()
    # another commit's record is refused
    monkeypatch.setenv("GIT_COMMIT", "b" * 40)
    assert cli.main(["--resume", str(partial), "--out-dir", str(tmp_path / "call2")]) == 2
    monkeypatch.setenv("GIT_COMMIT", "a" * 40)
    # a server recorded as failed runs again, after the kept one
    rec["phases"].append({"label": "patched", "phase": {"role": "arm", "kind": "patched"}, "status": "failed"})
    partial.write_text(json.dumps(rec))
    assert cli.main(["--resume", str(partial), "--out-dir", str(tmp_path / "call2"), "--no-progress"]) == 0
    res = json.loads((tmp_path / "call2" / "ab-tiny-nemotron-h-stock-vs-patched.json").read_text())
    assert [c["servers"] for c in res["calls"]] == [["stock"], ["patched"]]
    assert res["started"] == rec["started"] and {a["status"] for a in res["arms"].values()} == {"ok"}
    par = res["summary"]["parity"]
    assert par["mismatches"] == 1 and par["first_divergence"][0] == 7  # the kept server's outputs compared
    assert "stopped and resumed" in (tmp_path / "call2" / "ab-tiny-nemotron-h-stock-vs-patched.md").read_text()
    assert not list((tmp_path / "call2").glob("*-partial.json"))
    # a run whose deadline skipped a server keeps a record to go on with
    assert cli.main(flags + ["--out-dir", str(tmp_path / "call3"), "--deadline-s", "1", "--min-phase-s", "60"]) == 1
    (kept,) = (tmp_path / "call3").glob("*-partial-kept.json")
    assert [p["status"] for p in json.loads(kept.read_text())["phases"]] == ["skipped", "skipped"]
    # a finished run's record is not resumed
    done = tmp_path / "done.json"
    done.write_text(json.dumps(dict(rec, finished="2026-12-03T00:00:00Z")))
    assert cli.main(["--resume", str(done), "--out-dir", str(tmp_path / "no")]) == 2


def test_resume_refusals_cut_servers_old_records_and_order(tmp_path, monkeypatch, capsys):
    """``--resume`` refuses a run flag given at its default value and names a store_false flag as given; a bad
    record is refused with rc 2, not a traceback; a server the deadline cut short runs again, and a run whose last
    server was cut keeps a record; a record lacking flags of a later harness resumes; ``--finish`` of a resumed
    run's partial (kept servers first) compares against the plan's first arm."""
    from dataclasses import asdict

    from eval.ab import cli, workloads

    for k in [k for k in os.environ if k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("GIT_COMMIT", "a" * 40)
    monkeypatch.chdir(REPO)
    flags = ["--model", "tiny-nemotron-h", "--stock-module", FAKE, "--patched-module", FAKE, "--no-bench",
             "--parity-tokens", "32", "--parity-prompts", "3", "--arms", "stock,patched", "--no-progress"]
    skip = ["--deadline-s", "1", "--min-phase-s", "60"]  # every server skipped: no server starts
    assert cli.main(flags + ["--out-dir", str(tmp_path / "c1")] + skip) == 1
    (kept,) = (tmp_path / "c1").glob("*-partial-kept.json")
    rec = json.loads(kept.read_text())
    capsys.readouterr()
    # a run flag at its default value, and a store_false flag by its own name
    assert cli.main(["--resume", str(kept), "--arms", "stock,staged", "--out-dir", str(tmp_path / "no")]) == 2
    assert cli.main(["--resume", str(kept), "--no-spec-parity", "--out-dir", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert "drop --arms" in err and "drop --no-spec-parity" in err
    # other parity prompts: refused, rc 2
    kept.write_text(json.dumps(dict(rec, parity_setup=dict(rec["parity_setup"], prompt_lens=[1]))))
    assert cli.main(["--resume", str(kept), "--out-dir", str(tmp_path / "no")] + skip) == 2
    # an ok server whose parity the deadline skipped runs again; a harness without later flags resumes
    old = dict(rec, flags=dict(rec["flags"], harness={k: v for k, v in rec["flags"]["harness"].items()
                                                      if k not in ("workload_set", "stream_interval", "clients")}))
    old["phases"][0] = dict(old["phases"][0], status="ok", parity={"skipped": "deadline"})
    kept.write_text(json.dumps(old))
    assert cli.main(["--resume", str(kept), "--out-dir", str(tmp_path / "c2")] + skip) == 1
    (kept2,) = (tmp_path / "c2").glob("*-partial-kept.json")
    rec2 = json.loads(kept2.read_text())
    assert [p["status"] for p in rec2["phases"]] == ["skipped", "skipped"]
    assert [c["servers"] for c in rec2["calls"]] == [[], ["stock", "patched"]]

    def fake(ph, *a, **k):  # every server ok; the last one's parity cut by the deadline
        return {"label": ph.label, "phase": asdict(ph), "status": "ok",
                "parity": {"skipped": "deadline"} if ph.label == "patched" else {"skipped": "stand-in"}}

    monkeypatch.setattr(workloads, "run_phase", fake)
    assert cli.main(flags + ["--out-dir", str(tmp_path / "c3")]) == 0
    (kept3,) = (tmp_path / "c3").glob("*-partial-kept.json")
    # a resumed run's partial (the baseline ran again after the kept arm), finished: stock is the baseline
    rec3 = json.loads(kept3.read_text())
    part = tmp_path / "c4" / "ab-tiny-nemotron-h-partial.json"
    part.parent.mkdir()
    part.write_text(json.dumps(dict(rec3, phases=rec3["phases"][::-1], calls=[{"servers": ["patched"]}])))
    assert cli.main(["--finish", str(part)]) == 0
    assert [f.name for f in (tmp_path / "c4").glob("ab-*.json")] == ["ab-tiny-nemotron-h-stock-vs-patched.json"]


def _resumable(tmp_path, monkeypatch, capsys):
    """A partial record to resume, written under SGLang 0.5.17 (as the harness's interpreter reports it),
    SGLANG_REPLAYSSM_BUFFER_LEN=16 and one visible GPU; every server is skipped by the deadline, so none starts.
    Returns the record's file, the record, and the flags that skip every server of a resumed call too (no progress
    bar: stderr holds only the harness's own lines)."""
    from eval.ab import cli, results

    for k in [k for k in os.environ if k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("GIT_COMMIT", "a" * 40)
    monkeypatch.setenv("SGLANG_REPLAYSSM_BUFFER_LEN", "16")
    monkeypatch.chdir(REPO)
    real = results.dist_version
    monkeypatch.setattr(results, "dist_version", lambda name: "0.5.17" if name == "sglang" else real(name))
    monkeypatch.setattr(results, "visible_gpus", lambda: 1)
    skip = ["--deadline-s", "1", "--min-phase-s", "60", "--no-progress"]
    assert cli.main(["--model", "tiny-nemotron-h", "--stock-module", FAKE, "--patched-module", FAKE, "--no-bench",
                     "--parity-tokens", "32", "--parity-prompts", "3", "--arms", "stock,patched",
                     "--out-dir", str(tmp_path / "c1")] + skip) == 1
    (kept,) = (tmp_path / "c1").glob("*-partial-kept.json")
    capsys.readouterr()
    return kept, json.loads(kept.read_text()), skip


def _refused(cli, kept, tmp_path, skip, capsys) -> str:
    """The one error line of a refused ``--resume`` (rc 2, nothing written)."""
    assert cli.main(["--resume", str(kept), "--out-dir", str(tmp_path / "no")] + skip) == 2
    assert not (tmp_path / "no").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m eval.ab: error: ")
    assert err[0].endswith("start a fresh run instead")
    return err[0]


def test_run_record_stores_the_sglang_version_replayssm_env_and_visible_gpus(tmp_path, monkeypatch, capsys):
    """The record holds what ``--resume`` checks: SGLang's version, the SGLANG_REPLAYSSM_* variables and the visible
    GPU count (torch's count where CUDA is available, else 0)."""
    import torch

    from eval.ab import results

    kept, rec, _ = _resumable(tmp_path, monkeypatch, capsys)
    assert rec["sglang_version"] == "0.5.17" and rec["visible_gpus"] == 1
    assert {k: v for k, v in rec["env_inherited"].items() if k.startswith("SGLANG_REPLAYSSM_")} == {
        "SGLANG_REPLAYSSM_BUFFER_LEN": "16"}
    monkeypatch.undo()
    assert results.visible_gpus() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_resume_accepts_a_matching_environment(tmp_path, monkeypatch, capsys):
    """Same SGLang, same SGLANG_REPLAYSSM_* variables, same visible GPU count: resumed, with no warning."""
    from eval.ab import cli

    kept, rec, skip = _resumable(tmp_path, monkeypatch, capsys)
    assert cli.main(["--resume", str(kept), "--out-dir", str(tmp_path / "c2")] + skip) == 1  # every server skipped
    captured = capsys.readouterr()
    assert "warning" not in captured.err and "error" not in captured.err
    assert "resuming the run started" in captured.out
    (kept2,) = (tmp_path / "c2").glob("*-partial-kept.json")
    rec2 = json.loads(kept2.read_text())
    assert rec2["started"] == rec["started"] and [c["servers"] for c in rec2["calls"]] == [[], ["stock", "patched"]]


def test_resume_refuses_another_sglang_version(tmp_path, monkeypatch, capsys):
    from eval.ab import cli, results

    kept, _, skip = _resumable(tmp_path, monkeypatch, capsys)
    monkeypatch.setattr(results, "dist_version", lambda name: "0.5.18")
    err = _refused(cli, kept, tmp_path, skip, capsys)
    assert "the run started with SGLang 0.5.17, this interpreter has SGLang 0.5.18" in err


def test_resume_refuses_other_sglang_replayssm_variables(tmp_path, monkeypatch, capsys):
    """Another value, a variable more, a variable less: each refused, naming the variables that differ, the record's
    values and this environment's; a recorded variable of another prefix is not compared."""
    from eval.ab import cli

    kept, rec, skip = _resumable(tmp_path, monkeypatch, capsys)
    monkeypatch.setenv("SGLANG_REPLAYSSM_BUFFER_LEN", "32")
    err = _refused(cli, kept, tmp_path, skip, capsys)
    assert ("the run started with SGLANG_REPLAYSSM_BUFFER_LEN=16, this environment has SGLANG_REPLAYSSM_BUFFER_LEN=32:"
            " its SGLANG_REPLAYSSM_* settings differ") in err
    monkeypatch.setenv("SGLANG_REPLAYSSM_BUFFER_LEN", "16")
    monkeypatch.setenv("SGLANG_REPLAYSSM_LOG_LEVEL", "debug")
    err = _refused(cli, kept, tmp_path, skip, capsys)
    assert ("the run started with SGLANG_REPLAYSSM_LOG_LEVEL unset, this environment has "
            "SGLANG_REPLAYSSM_LOG_LEVEL=debug:") in err and "BUFFER_LEN" not in err
    monkeypatch.delenv("SGLANG_REPLAYSSM_LOG_LEVEL")
    monkeypatch.delenv("SGLANG_REPLAYSSM_BUFFER_LEN")
    err = _refused(cli, kept, tmp_path, skip, capsys)
    assert ("the run started with SGLANG_REPLAYSSM_BUFFER_LEN=16, this environment has "
            "SGLANG_REPLAYSSM_BUFFER_LEN unset:") in err
    # the record's SGLANG_TEST_* settings are recorded, not compared by --resume
    monkeypatch.setenv("SGLANG_REPLAYSSM_BUFFER_LEN", "16")
    kept.write_text(json.dumps(dict(rec, env_inherited=dict(rec["env_inherited"], SGLANG_TEST_RETRACT="1"))))
    assert cli.main(["--resume", str(kept), "--out-dir", str(tmp_path / "c2")] + skip) == 1


def test_resume_refuses_another_visible_gpu_count(tmp_path, monkeypatch, capsys):
    from eval.ab import cli, results

    kept, _, skip = _resumable(tmp_path, monkeypatch, capsys)
    monkeypatch.setattr(results, "visible_gpus", lambda: 2)
    err = _refused(cli, kept, tmp_path, skip, capsys)
    assert "the run started with 1 visible GPU(s), this host has 2: its arms would not compare" in err


def test_resume_warns_on_an_older_record_without_the_environment(tmp_path, monkeypatch, capsys):
    """A record from before the SGLang version, the SGLANG_REPLAYSSM_* variables or the visible GPU count were
    recorded resumes, each unchecked item named in a warning; so does one whose SGLang version or GPU count was
    unknown (None), or where this call cannot tell them."""
    from eval.ab import cli, results

    kept, rec, skip = _resumable(tmp_path, monkeypatch, capsys)
    old = {k: v for k, v in rec.items() if k not in ("sglang_version", "env_inherited", "visible_gpus")}
    kept.write_text(json.dumps(old))
    monkeypatch.setattr(results, "visible_gpus", lambda: 2)  # would be refused against a record that holds 1
    assert cli.main(["--resume", str(kept), "--out-dir", str(tmp_path / "c2")] + skip) == 1
    err = capsys.readouterr().err.splitlines()
    assert "error" not in "\n".join(err)
    assert err == [
        "python -m eval.ab: warning: --resume: the SGLang version not checked (the record's: not recorded (an older "
        "record), now: 0.5.17)",
        "python -m eval.ab: warning: --resume: the SGLANG_REPLAYSSM_* settings not checked (the record's: not "
        "recorded (an older record), now: SGLANG_REPLAYSSM_BUFFER_LEN=16)",
        "python -m eval.ab: warning: --resume: the visible GPU count not checked (the record's: not recorded (an "
        "older record), now: 2)"]
    assert len(list((tmp_path / "c2").glob("*-partial-kept.json"))) == 1
    # a record whose SGLang version was unknown (no SGLang in the harness's interpreter), a call without torch
    kept.write_text(json.dumps(dict(rec, sglang_version=None)))
    monkeypatch.setattr(results, "visible_gpus", lambda: None)
    assert cli.main(["--resume", str(kept), "--out-dir", str(tmp_path / "c3")] + skip) == 1
    err = capsys.readouterr().err
    assert "the SGLang version not checked (the record's: unknown, now: 0.5.17)" in err
    assert "the visible GPU count not checked (the record's: 1, now: unknown)" in err
    assert "SGLANG_REPLAYSSM_* settings not checked" not in err and "error" not in err
