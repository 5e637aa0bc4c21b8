"""eval.ab under prefix caching (issue 19): ``--radix-cache {off,on,no_buffer,extra_buffer}`` as server flags,
``--workload shared-prefix`` (SGLang's generated-shared-prefix dataset, the server's cache hit rate from its
Prefill batch lines, TTFT), parity on prompts that share prefixes (hits vs cold), and eval/gpu_prefix.sh's dry
run; end to end against tests/eval/fake_sglang_server.py with SGLang's own bench_serving."""

from __future__ import annotations

import argparse
import json
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

from eval import ab, ab_report  # noqa: E402
from eval.ab import parity, prefix_cache, presets, workloads  # noqa: E402

FAKE = "tests.eval.fake_sglang_server"


def _env(home=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))}
    env["PYTHONPATH"] = str(REPO)
    if home is not None:  # bench_serving caches its generated dataset under ~/.cache/sglang/benchmark
        env["HOME"] = str(home)
    return env


def _args(*argv):
    p = ab.build_parser()
    args = p.parse_args(list(argv))
    args.workload_set = presets.apply_workload(args, p, list(argv))
    return args


def _model(tmp_path, name="tiny-nemotron-h"):
    return ab.prepare_model(_args("--model", name), tmp_path, False)


# --------------------------------------------------------------------------------
# --radix-cache as server flags
# --------------------------------------------------------------------------------
def test_radix_modes_give_sglang_flags_every_arm_shares(tmp_path, sglang_parser):
    m = _model(tmp_path)
    seen = {}
    for mode in ("off", "on", "no_buffer", "extra_buffer", "default"):
        flags = ab.common_server_flags(_args("--radix-cache", mode), m, False)
        ns = sglang_parser.parse_args(ab.launch_cmd("python", ab.STOCK_MODULE, flags, "127.0.0.1", 1)[3:])
        seen[mode] = (ns.disable_radix_cache, ns.mamba_radix_cache_strategy, ns.disable_overlap_schedule)
        assert not any(f.startswith("--replayssm") for f in flags), mode  # SGLang's own flags only
    assert seen["off"][0] is True and seen["off"][2] is False
    assert seen["on"] == seen["no_buffer"] == (False, "no_buffer", True)  # SGLang 0.5.17: no overlap with no_buffer
    assert seen["extra_buffer"] == (False, "extra_buffer", False)  # its default: the overlap scheduler stays on
    # default: no radix flag at all, SGLang's own defaults (what a user who gives none gets)
    assert seen["default"] == (False, sglang_parser.get_default("mamba_radix_cache_strategy"), False)
    assert ab.common_server_flags(_args("--radix-cache", "default"), m, False) == \
        [f for f in ab.common_server_flags(_args("--radix-cache", "off"), m, False) if f != "--disable-radix-cache"]
    with pytest.raises(SystemExit):
        ab.build_parser().parse_args(["--radix-cache", "lazy"])


def test_extra_buffer_opts_in_our_launcher_only():
    args = _args("--radix-cache", "extra_buffer", "--patched-arg", "--replayssm-buffer-len 8")
    assert ab.arm_launch(args, "stock") == (ab.STOCK_MODULE, [])
    assert ab.arm_launch(args, "upstream") == (ab.STOCK_MODULE, ["--enable-linear-replayssm"])
    assert ab.arm_launch(args, "staged") == (ab.PATCHED_MODULE, ["--replayssm-buffer-len", "8",
                                                                 "--replayssm-extra-buffer", "true"])
    assert ab.arm_launch(args, "patched")[1] == ["--replayssm-buffer-len", "8", "--replayssm-extra-buffer", "true",
                                                 "--replayssm-replay-ring", "false"]
    for mode in ("off", "on", "no_buffer"):
        assert "--replayssm-extra-buffer" not in ab.arm_launch(_args("--radix-cache", mode), "staged")[1]
    # our launcher's own flag parser reads the staged arm's launcher flags as extra_buffer on (also its default)
    from sglang_replayssm import config

    lp = argparse.ArgumentParser()
    config.add_flags(lp)
    ns, rest = lp.parse_known_args(ab.arm_launch(args, "staged")[1])
    assert rest == [] and config.from_flags(ns, environ={}).extra_buffer is True
    assert config.from_flags(lp.parse_known_args(ab.arm_launch(_args(), "staged")[1])[0], environ={}).extra_buffer \
        is True


def test_extra_buffer_with_speculation_runs(capsys):
    """Our launcher serves extra_buffer under speculation too: the A/B takes the combination, and the
    shared-prefix workload's extra_buffer default yields to a given --radix-cache under --spec."""
    assert ab.main(["--radix-cache", "extra_buffer", "--spec", "nextn", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--mamba-radix-cache-strategy extra_buffer" in out and "--speculative-algorithm NEXTN" in out
    assert ab.main(["--workload", "shared-prefix", "--spec", "nextn", "--radix-cache", "no_buffer", "--no-parity",
                    "--dry-run"]) == 0


# --------------------------------------------------------------------------------
# the shared-prefix workload
# --------------------------------------------------------------------------------
def test_shared_prefix_preset_and_its_overrides():
    args = _args("--workload", "shared-prefix")
    assert (args.arms, args.radix_cache, args.batch, args.output_len) == ("stock,staged", "default", "16,64", 256)
    assert (args.gsp_groups, args.gsp_prompts_per_group, args.gsp_system_len, args.gsp_question_len) == (16, 16,
                                                                                                        2048, 128)
    given = _args("--workload", "shared-prefix", "--radix-cache", "off", "--arms", "stock,staged,staged",
                  "--model", "tiny-qwen3-next")
    assert (given.radix_cache, given.arms) == ("off", "stock,staged,staged")
    # a GDN model gets no upstream arm here: SGLang's own replay serves no_buffer only
    assert _args("--workload", "shared-prefix", "--model", "tiny-qwen3-next").arms == "stock,staged"
    # flags that add up (--server-arg, --patched-arg) count as given, and next to a preset they still parse
    assert presets.given_flags(ab.build_parser(), ["--server-arg", "--a 1", "--patched-arg=--b", "--seed", "3"]) == {
        "server_arg", "patched_arg", "seed"}
    assert _args("--workload", "shared-prefix", "--server-arg=--x").server_arg == ["--x"]


@pytest.mark.parametrize("argv, flag", [
    (["--gsp-groups", "0"], "--gsp-groups"),
    (["--clients", "2", "--batch", "4"], "--clients 1"),
    (["--gsp-system-len", "4000"], "--context-length 4096"),
    (["--parity-prompts", "6", "--parity-groups", "4"], "--parity-groups 4"),
    (["--parity-prompts", "4", "--parity-groups", "4"], "at least two prompts per group"),
    (["--parity-tokens", "3000"], "lower --parity-tokens"),
])
def test_shared_prefix_bad_flags_are_named(capsys, argv, flag):
    assert ab.main(["--workload", "shared-prefix", *argv, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err


def test_shared_prefix_bench_argv_is_what_sglangs_bench_serving_accepts(tmp_path):
    serving = pytest.importorskip("sglang.benchmark.serving", exc_type=ImportError)
    from sglang.benchmark.datasets.generated_shared_prefix import GeneratedSharedPrefixDataset

    args = _args("--workload", "shared-prefix", "--gsp-groups", "3", "--gsp-prompts-per-group", "5",
                 "--gsp-system-len", "300", "--gsp-question-len", "20", "--output-len", "40", "--seed", "7")
    m = _model(tmp_path)
    argv = ab.bench_serving_argv("http://h:1", m, 64, args, str(tmp_path / "o.jsonl"))
    seen = {}
    orig, old = serving.run_benchmark, sys.argv
    try:
        serving.run_benchmark = lambda a: seen.setdefault("args", a)
        sys.argv = ["x"] + argv
        serving.cli_main()
    finally:
        serving.run_benchmark, sys.argv = orig, old
    a = seen["args"]
    assert a.dataset_name == "generated-shared-prefix" and not a.tokenize_prompt and a.flush_cache
    assert (a.gsp_num_groups, a.gsp_prompts_per_group, a.gsp_system_prompt_len, a.gsp_question_len,
            a.gsp_output_len, a.gsp_range_ratio) == (3, 5, 300, 20, 40, 1.0)
    assert a.max_concurrency == 64 and a.seed == 7 and a.num_prompts == 15
    ds = GeneratedSharedPrefixDataset.from_args(a)  # the dataset takes these arguments as they are
    assert (ds.num_groups, ds.prompts_per_group, ds.output_len) == (3, 5, 40)
    # the random-ids workload is unchanged
    plain = ab.bench_serving_argv("http://h:1", m, 8, _args(), "/o")
    assert "--tokenize-prompt" in plain and "--flush-cache" not in plain and "random-ids" in plain


def test_stale_generated_dataset_of_this_run_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    d = tmp_path / ".cache" / "sglang" / "benchmark"
    d.mkdir(parents=True)
    args = _args("--workload", "shared-prefix", "--gsp-groups", "3", "--seed", "5")
    mine = d / "gen_shared_prefix_5_3_16_2048_128_256_PreTrainedTokenizerFast.pkl"
    other = d / "gen_shared_prefix_5_4_16_2048_128_256_PreTrainedTokenizerFast.pkl"  # another run's groups
    for f in (mine, other):
        f.write_bytes(b"x")
    assert workloads.clear_gsp_cache(args, None) == [str(mine)]
    assert not mine.exists() and other.exists()


# --------------------------------------------------------------------------------
# the server's hit rate from its log
# --------------------------------------------------------------------------------
def test_hit_rate_from_sglangs_prefill_lines():
    rng = random.Random(3)
    rows = [(rng.randint(1, 8), rng.randint(0, 5000), rng.randint(0, 5000)) for _ in range(6)]
    text = "\n".join(
        f"[2026-01-01 00:00:0{i} TP0] Prefill batch{' [%d]' % (10 + i) if i % 2 else ''}, #new-seq: {s}, "
        f"#new-token: {n}, #cached-token: {c}, token usage: 0.01, #running-req: 3, #queue-req: 0, "
        f"#pending-token: 0, cuda graph: False, input throughput (token/s): 12.5"
        for i, (s, n, c) in enumerate(rows))
    text += "\n[t] Decode batch, #running-req: 4, #token: 10, gen throughput (token/s): 9.0"
    r = prefix_cache.hit_rate(text)
    new, cached = sum(x[1] for x in rows), sum(x[2] for x in rows)
    assert (r["prefill_lines"], r["new_seqs"], r["new_tokens"], r["cached_tokens"]) == (
        6, sum(x[0] for x in rows), new, cached)
    assert r["hit_rate"] == pytest.approx(cached / (new + cached))
    assert prefix_cache.hit_rate("no prefill here")["hit_rate"] is None


def test_the_prefill_line_format_is_sglangs():
    """The pattern matches the f-string SGLang 0.5.17's scheduler logs (metrics_reporter.report_prefill_stats)."""
    mr = pytest.importorskip("sglang.srt.managers.scheduler_components.metrics_reporter")
    src = Path(mr.__file__).read_text()
    for piece in ('f"Prefill batch{iter_msg}, "', 'f"#new-seq: {prefill_stats.num_new_seqs}, "',
                  'f"#new-token: {prefill_stats.log_input_tokens}, "',
                  'f"#cached-token: {prefill_stats.log_hit_tokens}, "'):
        assert piece in src


# --------------------------------------------------------------------------------
# parity with prefix hits
# --------------------------------------------------------------------------------
def test_shared_prefix_parity_prompts():
    prompts = parity.shared_prefix_prompts(4, 3, 1024, 0, 200, 30)
    assert len(prompts) == 12 and prompts == parity.shared_prefix_prompts(4, 3, 1024, 0, 200, 30)
    for g in range(4):
        group = prompts[3 * g: 3 * g + 3]
        plen = 200 - 37 * g
        assert all(p[:plen] == group[0][:plen] for p in group)  # one prefix per group
        assert len({tuple(p[plen:]) for p in group}) == 3  # its own question each
        assert all(3 <= t < 1024 for p in group for t in p)
    assert len({tuple(prompts[3 * g][:50]) for g in range(4)}) == 4  # groups do not share a prefix


def test_end_to_end_shared_prefix_with_stand_in_servers(tmp_path):
    """stock vs staged on the fake server: SGLang's bench_serving sends the generated-shared-prefix dataset, each
    server logs its prefix hits, the result carries hit rates (from the logs), TTFT ratios and parity of hits,
    also against the same requests on a flushed cache."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "eval.ab", "--model", "tiny-nemotron-h", "--stock-module", FAKE,
           "--patched-module", FAKE, "--workload", "shared-prefix", "--batch", "4", "--gsp-groups", "3",
           "--gsp-prompts-per-group", "4", "--gsp-system-len", "96", "--gsp-question-len", "8", "--output-len", "8",
           "--parity-prompts", "6", "--parity-groups", "3", "--parity-tokens", "16",
           "--server-arg=--fake-prefill-log", "--out-dir", str(out), "--no-progress", "--shutdown-grace", "5"]
    r = subprocess.run(cmd, cwd=REPO, env=_env(home=tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "ab-tiny-nemotron-h-stock-vs-staged.json").read_text())
    assert res["bench"]["radix_cache"] == "default" and res["bench"]["gsp"]["groups"] == 3
    assert res["bench"]["dataset"].startswith("generated-shared-prefix")
    assert "--replayssm-extra-buffer" not in res["arms"]["staged"]["command"]  # the launcher's defaults
    assert "radix" not in res["arms"]["staged"]["command"] and "radix" not in res["arms"]["stock"]["command"]
    assert "--replayssm" not in res["arms"]["stock"]["command"]
    for label in ("stock", "staged"):
        arm = res["arms"][label]
        (entry,) = arm["bench"]
        assert entry["result"]["completed"] == 12
        pc = entry["prefix_cache"]
        # warm-up (cold) + 12 prompts after the flush: 3 groups' first prompts miss, 9 others hit the system prompt
        assert pc["new_seqs"] == 13 and pc["prefill_lines"] == 13
        assert 0.5 < pc["hit_rate"] < 1.0
        assert pc["cached_tokens"] >= 9 * 90
        # prefill runs throughout this workload: the client-path flag is not judged, the reason recorded
        assert entry["rates"]["client_path_bound"] is None and entry["rates"]["client_path_not_judged"]
        par = arm["parity"]
        assert par["flushes_ok"] and par["hit_prompts"] == [1, 3, 5] and len(par["cold_outputs"]) == 3
        assert len(par["outputs"]) == 6 and all(len(o["tokens"]) == 16 for o in par["outputs"])
    s = res["summary"]
    row = s["by_batch"]["4"]
    assert row["cache_hit_rate"]["stock"] == pytest.approx(res["arms"]["stock"]["bench"][0]["prefix_cache"]["hit_rate"])
    assert row["hit_rate_ratio"] == pytest.approx(1.0)  # the stand-in caches alike under both launchers
    assert row["ttft_p50_ratio"] > 0 and row["ttft_p99_ratio"] > 0
    assert s["parity"]["exact"] is True
    assert s["prefix_parity"]["stock"]["exact"] and s["prefix_parity"]["staged"]["exact"]
    assert "prefix cache hit rate batch 4" in s["verdict"] and "staged hit vs cold exact" in s["verdict"]
    md = (out / "ab-tiny-nemotron-h-stock-vs-staged.md").read_text()
    assert "## Prefix caching" in md and "prefix-hit requests vs the same requests on a flushed cache" in md
    # the server logs confirm the hits happened during parity too (after each flush, the later members hit)
    log = Path(res["arms"]["staged"]["log"]).read_text()
    assert "#cached-token: 0" in log and any(x[2] > 0 for x in prefix_cache.prefill_lines(log))
    (out / "ab-tiny-nemotron-h-stock-vs-staged.md").unlink()  # --render re-draws it from the JSON alone
    ab_report.render(str(out / "ab-tiny-nemotron-h-stock-vs-staged.json"))
    assert "## Prefix caching" in (out / "ab-tiny-nemotron-h-stock-vs-staged.md").read_text()


def test_radix_off_baseline_logs_no_hits(tmp_path):
    """--radix-cache off: the no-caching run of the same workload (its own run: one set of SGLang flags per run)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "eval.ab", "--model", "tiny-nemotron-h", "--stock-module", FAKE,
           "--patched-module", FAKE, "--workload", "shared-prefix", "--radix-cache", "off", "--arms", "stock",
           "--batch", "2", "--gsp-groups", "2", "--gsp-prompts-per-group", "2", "--gsp-system-len", "40",
           "--gsp-question-len", "4", "--output-len", "4", "--no-parity", "--server-arg=--fake-prefill-log",
           "--out-dir", str(out), "--no-progress", "--shutdown-grace", "5"]
    r = subprocess.run(cmd, cwd=REPO, env=_env(home=tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(next(out.glob("ab-tiny-nemotron-h*.json")).read_text())
    arm = next(iter(res["arms"].values()))
    assert "--disable-radix-cache" in arm["command"]
    assert arm["bench"][0]["prefix_cache"]["hit_rate"] == 0.0


# --------------------------------------------------------------------------------
# the GPU script
# --------------------------------------------------------------------------------
def test_gpu_prefix_script_dry_run(tmp_path):
    """eval/gpu_prefix.sh --dry-run: both runs' eval.ab flags parse and plan (so the GPU call cannot fail on a
    typo), every arm on its own defaults: no radix flag, no overlap or extra_buffer setting (SGLang's extra_buffer
    strategy with the overlap scheduler is what they resolve to)."""
    env = _env(home=tmp_path)
    env.update(OUT=str(tmp_path / "out"), PYTHON=sys.executable)
    r = subprocess.run(["bash", str(REPO / "eval" / "gpu_prefix.sh"), "--dry-run"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    heads = [x for x in r.stdout.splitlines() if x.startswith("== ")]
    assert [h.split()[1] for h in heads] == ["tiny-nemotron-h:", "tiny-qwen3-next:"]
    servers = [shlex.split(x.strip()) for x in r.stdout.splitlines() if " -m sglang" in x and "bench_serving" not in x]
    assert len(servers) == 4
    for cmd in servers:
        assert "--mamba-radix-cache-strategy" not in cmd and "--replayssm-extra-buffer" not in cmd
        assert "--disable-overlap-schedule" not in cmd and "--disable-radix-cache" not in cmd
        assert "--cuda-graph-backend-decode" not in cmd  # CUDA graphs on
    bench = [x for x in r.stdout.splitlines() if "sglang.bench_serving" in x]
    assert len(bench) == 4 and all("generated-shared-prefix" in x for x in bench)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing written
    text = (REPO / "eval" / "gpu_prefix.sh").read_text()
    assert "bash eval/jit_cache.sh restore" in text and "SGLANG_BUNDLE_HTTP=1" in text
    assert 'bash eval/jit_cache.sh save "$OUT"' in text


def test_gpu_prefix_script_under_speculation_starts_no_reference_and_sizes_its_deadline(tmp_path):
    """--spec nextn: each model's two arms only (no non-speculative reference server: --no-spec-parity); the
    deadline is 220 s with carried JIT caches, 330 s without, PREFIX_DEADLINE_S wins."""
    env = _env(home=tmp_path)
    env.update(OUT=str(tmp_path / "out"), PYTHON=sys.executable, PREFIX_MODELS="tiny-nemotron-h")
    r = subprocess.run(["bash", str(REPO / "eval" / "gpu_prefix.sh"), "--dry-run", "--spec", "nextn"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    servers = [x for x in r.stdout.splitlines() if " -m sglang" in x and "bench_serving" not in x]
    assert len(servers) == 2 and all("--speculative-algorithm" in x for x in servers)
    cached = any((REPO / ".sglang-bundle" / "jitcache").glob("*.txz"))
    head = next(x for x in r.stdout.splitlines() if x.startswith("== "))
    assert f"--deadline-s {220 if cached else 330} " in head and "--no-spec-parity" in head
    env["PREFIX_DEADLINE_S"] = "99"
    r = subprocess.run(["bash", str(REPO / "eval" / "gpu_prefix.sh"), "--dry-run"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "--deadline-s 99 " in r.stdout


def test_gpu_prefix_script_starts_real_size_servers_one_after_another(tmp_path):
    """--concurrent-start only for tiny models: a real-size model's first server takes its default
    --mem-fraction-static of the GPU, and the next one, started beside it, ran out of memory loading its weights
    (the Qwen3-Next geometry on the H200, eval/results/e2e-h200/prefix-qwen3-next-80b-a3b-e64-concurrent-oom)."""
    env = _env(home=tmp_path)
    env.update(OUT=str(tmp_path / "out"), PYTHON=sys.executable, PREFIX_MODELS="tiny-qwen3-next nemotron-h-8b")
    r = subprocess.run(["bash", str(REPO / "eval" / "gpu_prefix.sh"), "--dry-run"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    heads = {x.split()[1].rstrip(":"): x for x in r.stdout.splitlines() if x.startswith("== ")}
    assert "--concurrent-start" in heads["tiny-qwen3-next"] and "--concurrent-start" not in heads["nemotron-h-8b"]


def test_upstream_arm_on_default_radix_gets_no_buffer_without_overlap(tmp_path):
    """--radix-cache default with an upstream arm: upstream's replay ring serves prefix caching only as no_buffer
    without the overlap scheduler (SGLang refuses --enable-linear-replayssm with extra_buffer), so that arm alone
    gets those flags; stock and ours keep their defaults."""
    env = _env(home=tmp_path)
    r = subprocess.run([sys.executable, "-m", "eval.ab", "--model", "tiny-qwen3-next", "--workload", "shared-prefix",
                        "--arms", "stock,staged,upstream", "--dry-run"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    servers = [shlex.split(x.strip()) for x in r.stdout.splitlines() if " -m sglang" in x and "bench_serving" not in x]
    assert len(servers) == 3
    up = [c for c in servers if "--enable-linear-replayssm" in c]
    assert len(up) == 1
    assert up[0][up[0].index("--mamba-radix-cache-strategy") + 1] == "no_buffer"
    assert "--disable-overlap-schedule" in up[0]
    for cmd in servers:
        if cmd is not up[0]:
            assert "--mamba-radix-cache-strategy" not in cmd and "--disable-overlap-schedule" not in cmd
