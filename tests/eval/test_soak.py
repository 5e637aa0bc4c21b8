"""CPU tests of the soak harness (eval/soak.py).

The request catalogue is checked against SGLang 0.5.17's own validators (every bad request is invalid
by SGLang's rules, every good one valid and inside the context), the summary and the Markdown against
hand-made records, and the whole harness runs for a few seconds against
``tests/eval/fake_sglang_server.py``, with the faults the record must show: bad requests answered
500 or dropped, greedy outputs that change after the chaos, a server that dies, slots that leak.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Union

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval import ab, soak  # noqa: E402

FAKE = "tests.eval.fake_sglang_server"
LIM = soak.Limits(vocab=1024, context=4096, max_new=64)
HAS_SMI = shutil.which("nvidia-smi") is not None


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def _soak(tmp_path, *plans, extra=()):
    """One soak run against stand-in servers (one per plan); (exit code, result, output path)."""
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "eval.soak", *(f"--plan={p}" for p in plans), "--patched-module", FAKE,
           "--stock-module", FAKE, "--out", str(out), "--no-progress", "--concurrency", "6",
           "--settle-timeout", "2", "--shutdown-grace", "5", "--baseline-prompts", "4", "--baseline-tokens", "16",
           "--max-new-tokens", "64", "--bad-fraction", "0.2", "--server-timeout", "60", *extra]
    r = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=180)
    assert out.is_file(), r.stdout[-3000:] + r.stderr[-3000:]
    return r, json.loads(out.read_text()), out


# --------------------------------------------------------------------------------
# what SGLang itself says of a request (0.5.17's validators; token ids must lie in [0, vocab), the launcher's rule)
# --------------------------------------------------------------------------------
def _sglang_file(rel: str):
    """One stdlib-only module of the installed SGLang, loaded from its file (no ``sglang`` package import)."""
    import importlib.util

    root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    spec = importlib.util.spec_from_file_location(f"_soak_test_{Path(rel).stem}", root / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sglang_rules():
    """SGLang 0.5.17's own input_ids validator and SamplingParams (both free of torch)."""
    fv = _sglang_file("srt/utils/field_validators.py")
    sp = _sglang_file("srt/sampling/sampling_params.py")
    return fv.validate_optional_list_i64_1d_2d, sp.SamplingParams


# CompletionRequest.prompt's annotation in SGLang 0.5.17 (srt/entrypoints/openai/protocol.py)
PROMPT_TYPE = Union[List[int], List[List[int]], str, List[str]]


def _sglang_rejects(path: str, data: bytes, lim: soak.Limits, rules) -> str:
    """Why SGLang (or the launcher's token-id check) must reject this request; "" when it is valid."""
    from pydantic import TypeAdapter, ValidationError

    validate_ids, SamplingParams = rules
    try:
        body = json.loads(data)
    except ValueError:
        return "malformed JSON"
    if not isinstance(body, dict):
        return "not an object"
    if path == "/v1/completions":
        try:
            ids = TypeAdapter(PROMPT_TYPE).validate_python(body.get("prompt"))
            sp = {"max_new_tokens": TypeAdapter(int).validate_python(body.get("max_tokens", 16)),
                  "temperature": float(body.get("temperature", 1.0)), "top_p": float(body.get("top_p", 1.0))}
        except ValidationError:
            return "CompletionRequest validation"
    else:
        ids, sp = body.get("input_ids"), dict(body.get("sampling_params") or {})
        try:
            validate_ids(ids)
        except ValueError:
            return "input_ids validator"
    if not ids:
        return "no input"
    rows = ids if isinstance(ids[0], list) else [ids]
    for row in rows:
        if not row:
            return "empty prompt"
        if any(type(t) is not int or not 0 <= t < lim.vocab for t in row):
            return "token id outside [0, vocab) or not an integer"
        if len(row) + max(0, int(sp.get("max_new_tokens") or 0)) > lim.context:
            return "longer than the context"
    try:
        SamplingParams(**sp).verify(lim.vocab)
    except (TypeError, ValueError):
        return "sampling params"
    return ""


def test_every_bad_request_is_invalid_by_sglangs_rules(sglang_rules):
    rng = random.Random(0)
    reasons = {}
    for kind in soak.BAD_KINDS:
        for _ in range(3):
            path, data = soak.bad_request(kind, rng, LIM)
            why = _sglang_rejects(path, data, LIM, sglang_rules)
            assert why, f"{kind}: {data[:200]!r} would be accepted"
            reasons[kind] = why
    # the catalogue covers what the soak promises
    assert reasons["generate_negative_id"] == reasons["generate_id_ge_vocab"] == \
        "token id outside [0, vocab) or not an integer"
    assert reasons["generate_bool_id"] == "token id outside [0, vocab) or not an integer"  # SGLang's validator lets bools in
    assert reasons["generate_malformed_json"] == reasons["completions_malformed_json"] == "malformed JSON"
    assert reasons["generate_too_long"] == reasons["completions_too_long"] == "longer than the context"
    assert reasons["generate_unknown_sampling_key"] == "sampling params"
    assert {k.split("_")[0] for k in soak.BAD_KINDS} == {"generate", "completions"}
    with pytest.raises(KeyError):
        soak.bad_request("generate_fine", rng, LIM)


def test_good_requests_are_valid_and_fill_the_context(sglang_rules):
    rng = random.Random(1)
    longest = 0
    for kind in soak.GOOD_KINDS:
        for _ in range(80):
            q = soak.good_request(kind, rng, LIM, model_name="m")
            why = _sglang_rejects(q["path"], json.dumps(q["payload"]).encode(), LIM, sglang_rules)
            assert not why, f"{kind}: {why}"
            ids = q["payload"].get("input_ids") or q["payload"].get("prompt")
            rows = ids if isinstance(ids[0], list) else [ids]
            new = q["payload"].get("max_tokens") or q["payload"]["sampling_params"]["max_new_tokens"]
            assert all(len(r) + new <= LIM.context - LIM.margin for r in rows) and 1 <= new <= LIM.max_new
            longest = max(longest, *map(len, rows))
            assert q["stream"] == kind.endswith(("stream", "stream_cut", "stream_abort"))
            assert (q["cut_after"] is not None) == (kind == "generate_stream_cut") or kind == "completions_stream"
            assert (q["abort_after"] is not None) == (kind == "generate_stream_abort")
            assert (q["abort_delay"] is not None) == (kind == "generate_abort")
    assert longest > LIM.context // 2  # prompts reach far into the context
    for kind in soak.LENIENT_KINDS:
        path, data = soak.lenient_request(kind, rng, LIM)
        assert not _sglang_rejects(path, data, LIM, sglang_rules) and b"frobnicate" in data
    with pytest.raises(ValueError, match="unknown request kind"):
        soak.good_request("generate_fast", rng, LIM)


def test_plans_labels_and_flags_match_the_ab_harness():
    p = soak.parse_plan("nemotron-h-8b:nextn:1.5 --fake-die-after 3", 2.0)
    assert (p.model, p.spec, p.minutes, p.extra, p.label) == ("nemotron-h-8b", "nextn", 1.5, ["--fake-die-after", "3"],
                                                              "nemotron-h-8b-nextn")
    assert soak.parse_plan("tiny-qwen3-next", 0.5) == soak.Plan("tiny-qwen3-next", "none", 0.5)
    for bad, msg in (("m:warp", "spec 'warp'"), ("m:none:x", "minutes must be a number"),
                     ("m:none:0", "positive"), ("a:b:c:d", "MODEL")):
        with pytest.raises(ValueError, match=msg):
            soak.parse_plan(bad, 1.0)
    args = soak.build_parser().parse_args(["--model", "tiny-nemotron-h", "--model", "tiny-qwen3-next",
                                           "--spec", "none,nextn"])
    assert [label for _, label in soak.build_plans(args)] == [
        "tiny-nemotron-h", "tiny-nemotron-h-nextn", "tiny-qwen3-next", "tiny-qwen3-next-nextn"]
    args = soak.build_parser().parse_args(["--plan", "tiny-nemotron-h", "--plan", "tiny-nemotron-h:none:1"])
    assert [label for _, label in soak.build_plans(args)] == ["tiny-nemotron-h-1", "tiny-nemotron-h-2"]
    with pytest.raises(ValueError, match="--spec"):
        soak.build_plans(soak.build_parser().parse_args(["--spec", "none,fast"]))
    with pytest.raises(ValueError, match="loopback"):
        soak.check_args(soak.build_parser().parse_args(["--host", "0.0.0.0"]))
    # the server flags are eval.ab's for the same model and spec
    for spec in ("none", "nextn"):
        ns = soak.ab_namespace(soak.build_parser().parse_args([]), soak.Plan("tiny-nemotron-h", spec))
        ref = ab.build_parser().parse_args(["--model", "tiny-nemotron-h", "--spec", spec])
        model = ab.ModelSpec("tiny-nemotron-h", "/m", "/m", True, {}, "tiny", attention_backend="flashinfer")
        assert ab.common_server_flags(ns, model, spec != "none") == ab.common_server_flags(ref, model, spec != "none")
        assert ab.arm_launch(ns, "staged") == (ab.PATCHED_MODULE, [])


def _server(label, requests=2000, bad=200, not4xx=0, crashed=False, same=True, used=(0.0, 0.0), mem=(1000.0, 1100.0)):
    rec = {"label": label, "status": "crashed" if crashed else "ok", "crashed": crashed,
           "chaos": {"requests": requests, "bad": bad, "bad_not_4xx": not4xx, "good_failed": 1},
           "idle_before": {"metrics": {"mamba_used_tokens": used[0]}, "gpu_mem_mib": mem[0]},
           "baseline_before": {"outputs": [[1, 2, 3], [4, 5]]}, "health_after": not crashed, "alive_after": not crashed}
    if not crashed:
        rec["idle_after"] = {"metrics": {"mamba_used_tokens": used[1]}, "gpu_mem_mib": mem[1]}
        rec["baseline_after"] = {"outputs": [[1, 2, 3], [4, 5] if same else [4, 6]]}
    return soak.finish_record(rec)


def test_summary_from_records():
    servers = [_server("a"), _server("b", requests=2500, bad=150, not4xx=2, used=(0.0, 3.0), mem=(1000.0, 1400.0))]
    s = soak.summarize(servers)
    assert set(soak.SUMMARY_KEYS) <= set(s)
    assert (s["requests"], s["bad_requests_sent"], s["bad_requests_not_4xx"]) == (2000, 150, 2)
    assert (s["server_crashes"], s["baseline_identical"], s["leaked_mamba_slots"], s["gpu_mem_growth_mib"]) == \
        (0, 1, 3, 400.0)
    assert s["requests_total"] == 4500 and s["requests_per_server"] == {"a": 2000, "b": 2500}
    assert servers[1]["baseline"]["identical"] is True
    drift = _server("c", same=False)
    assert drift["baseline"] == {"identical": False, "prompts": 2, "differing_prompts": [1], "first_divergence": {1: 1}}
    dead = _server("d", requests=40, crashed=True)
    s = soak.summarize([servers[0], drift, dead])
    assert (s["server_crashes"], s["baseline_identical"], s["requests"]) == (1, 0, 40)
    assert s["crashed_servers"] == ["d"] and s["leak_unmeasured"] == ["d"] and s["healthy_after"]["d"] is False
    assert s["leaked_mamba_slots"] is None  # a server without its idle reading: unknown, never a silent 0
    assert dead["baseline"]["identical"] is False and "no baseline" in dead["baseline"]["why"]
    skipped = soak.finish_record({"label": "e", "status": "skipped", "crashed": False})
    s = soak.summarize([servers[0], skipped])
    assert s["requests"] == 0 and s["servers_not_ran"] == ["e"] and s["baseline_identical"] == 0
    assert s["complete"] == 0 and s["leaked_mamba_slots"] is None
    assert soak.summarize(servers)["complete"] == 1
    md = soak.render_markdown({"summary": soak.summarize(servers), "servers": servers, "gpu": {"name": "H200"},
                               "git_commit": "abc"})
    assert "| requests" in md and "## a (ok)" in md and "## b (ok)" in md and "`abc`" in md
    for k in soak.SUMMARY_KEYS:
        assert f"| {k}" in md


def test_merge_runs_of_one_commit(tmp_path):
    """Runs of one commit, SGLang and GPU merge into one record whose summary covers every server; runs of
    different commits or GPUs are refused in one line."""
    def run(started, *servers, commit="abc"):
        return {"schema": soak.SCHEMA, "git_commit": commit, "sglang_version": "0.5.17", "gpu": {"name": "H200"},
                "started": started, "finished": started, "wall_s": 100.0, "plan": [{"label": s["label"]}
                                                                                   for s in servers],
                "servers": list(servers), "summary": soak.summarize(list(servers))}
    a = run("t0", _server("a", requests=2100), _server("b", requests=2500))
    b = run("t1", _server("c", requests=2200, bad=120, used=(0.0, 1.0)))
    for i, r in enumerate((a, b)):
        (tmp_path / f"r{i}.json").write_text(json.dumps(r))
    out = tmp_path / "merged.json"
    r = subprocess.run([sys.executable, "-m", "eval.soak", "--merge", str(tmp_path / "r0.json"),
                        str(tmp_path / "r1.json"), "--out", str(out)], cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    m = json.loads(out.read_text())
    assert [s["label"] for s in m["servers"]] == ["a", "b", "c"] and m["servers"][2]["run_started"] == "t1"
    s = m["summary"]
    assert (s["requests"], s["bad_requests_sent"], s["leaked_mamba_slots"], s["servers"], s["complete"]) == \
        (2100, 120, 1, 3, 1)
    assert s["requests_total"] == 6800 and m["wall_s"] == 200.0 and len(m["merged_from"]) == 2
    assert "Merged from 2 runs" in out.with_suffix(".md").read_text()
    with pytest.raises(ValueError, match="differ in git_commit"):
        soak.merge_runs([a, run("t2", _server("d"), commit="def")])
    # a server skipped at one run's deadline yields to the run that ran it; one that ran twice keeps both records
    skipped = soak.finish_record({"label": "c", "status": "skipped", "crashed": False})
    m = soak.merge_runs([run("t0", _server("a", requests=2100), skipped), b, run("t2", _server("a", requests=900))])
    assert [s["label"] for s in m["servers"]] == ["a", "c", "a (run 3)"] and m["servers"][2]["server"] == "a"
    assert m["merged_from"][0]["skipped_here_ran_elsewhere"] == ["c"] and m["summary"]["complete"] == 1
    assert m["summary"]["requests"] == 900 and m["summary"]["requests_per_server"]["a (run 3)"] == 900
    only_skipped = soak.merge_runs([run("t0", skipped), run("t1", dict(skipped))])
    assert [s["label"] for s in only_skipped["servers"]] == ["c"] and only_skipped["summary"]["complete"] == 0
    r = subprocess.run([sys.executable, "-m", "eval.soak", "--merge", str(tmp_path / "missing.json"), "--out",
                        str(out)], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "error" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_memory_growth_is_counted_after_the_first_round():
    """The first chaos round's growth (the caching allocator meeting new shapes) is reported apart; the summary's
    figure is the growth from the idle reading after round 1 to the one after the last round."""
    rec = {"label": "r", "status": "ok", "crashed": False, "chaos": {"requests": 10, "bad": 1},
           "idle_before": {"metrics": {"mamba_used_tokens": 0.0}, "gpu_mem_mib": 1000.0},
           "rounds": [{"round": 1, "idle": {"gpu_mem_mib": 1596.0}}, {"round": 2, "idle": {"gpu_mem_mib": 1600.0}},
                      {"round": 3, "idle": {"gpu_mem_mib": 1610.0}}],
           "idle_after": {"metrics": {"mamba_used_tokens": 0.0}, "gpu_mem_mib": 1610.0},
           "baseline_before": {"outputs": [[1]]}, "baseline_after": {"outputs": [[1]]}}
    n = soak.finish_record(rec)["numbers"]
    assert (n["gpu_mem_growth_mib"], n["gpu_mem_round1_growth_mib"], n["gpu_mem_growth_total_mib"]) == \
        (14.0, 596.0, 610.0)
    assert soak.summarize([rec])["gpu_mem_growth_mib"] == 14.0
    # one round: the growth is from before the chaos, as before rounds existed
    one = dict(rec, rounds=[{"round": 1, "idle": {"gpu_mem_mib": 1610.0}}])
    n = soak.finish_record(one)["numbers"]
    assert (n["gpu_mem_growth_mib"], n["gpu_mem_round1_growth_mib"]) == (610.0, 610.0)
    md = soak.render_markdown({"summary": soak.summarize([rec]), "servers": [rec]})
    assert "growth 14 after the first round (that round: 596; in all: 610)" in md


def test_log_uniform_lengths_stay_in_bounds():
    rng = random.Random(3)
    xs = [soak.log_uniform_int(rng, 1, 100) for _ in range(3000)]
    assert min(xs) == 1 and max(xs) == 100 and sorted(xs)[len(xs) // 2] < 30  # mostly short
    assert soak.log_uniform_int(rng, 5, 2) == 5


# --------------------------------------------------------------------------------
# end to end against the stand-in server
# --------------------------------------------------------------------------------
def test_soak_of_a_healthy_server(tmp_path):
    r, res, out = _soak(tmp_path, "tiny-nemotron-h:none:0.03")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert res["schema"] == soak.SCHEMA and res["git_commit"] and set(soak.SUMMARY_KEYS) <= set(res["summary"])
    srv, = res["servers"]
    c = srv["chaos"]
    assert srv["status"] == "ok" and srv["shutdown"]["stopped"] and srv["alive_after"] and srv["health_after"]
    # the counts add up: by category, by kind, and the per-request records on disk
    assert c["requests"] == c["good"] + c["bad"] + c["lenient"] == c["started"] > 50
    # two rounds (the default), an idle reading after each; the last is the idle reading after the chaos
    assert [x["round"] for x in srv["rounds"]] == [1, 2] and all(x["requests"] > 10 for x in srv["rounds"])
    assert sum(x["requests"] for x in srv["rounds"]) == c["requests"]
    assert srv["rounds"][-1]["idle"] == srv["idle_after"] and srv["rounds"][0]["idle"]["settled"]
    assert sum(sum(v.values()) for v in c["by_kind"].values()) == c["requests"]
    assert sum(sum(v.values()) for v in c["by_category"].values()) == c["requests"]
    lines = (Path(out.parent / "logs-soak" / "requests-tiny-nemotron-h.jsonl")).read_text().splitlines()
    assert len(lines) == c["requests"]
    assert c["bad"] > 5 and c["bad_not_4xx"] == 0 and c["good_failed"] == 0 and c["failures"] == 0
    assert all(set(v) == {"4xx"} for k, v in c["by_kind"].items() if k in soak.BAD_KINDS)
    assert c["streams_cut"] > 0 and sum(c["aborts"].values()) > 0 and c["aborts"].keys() == {"200"}
    assert set(soak.GOOD_KINDS) <= set(c["by_kind"])
    s = res["summary"]
    assert (s["requests"], s["bad_requests_sent"], s["bad_requests_not_4xx"]) == (c["requests"], c["bad"], 0)
    assert (s["server_crashes"], s["baseline_identical"], s["leaked_mamba_slots"]) == (0, 1, 0)
    assert srv["numbers"]["mamba_available_before"] == srv["numbers"]["mamba_available_after"] == 256
    if not HAS_SMI:
        assert s["gpu_mem_growth_mib"] is None
    assert srv["warmup"]["outcomes"] == {"ok": 6} and len(srv["baseline_before"]["outputs"]) == 4
    assert srv["log_checks"]["random_weights_confirmed"] is True
    md = out.with_suffix(".md").read_text()
    assert "## tiny-nemotron-h (ok)" in md and "| bad_requests_not_4xx | 0" in md.replace("  ", " ").replace("  ", " ")
    out.with_suffix(".md").unlink()
    rr = subprocess.run([sys.executable, "-m", "eval.soak", "--render", str(out)], cwd=REPO, env=_env(),
                        capture_output=True, text=True, timeout=60)
    assert rr.returncode == 0 and out.with_suffix(".md").read_text() == md


def test_bad_requests_answered_500_or_dropped_are_counted(tmp_path):
    r, res, _ = _soak(tmp_path, "tiny-nemotron-h:none:0.02 --fake-bad-status 500",
                      "tiny-nemotron-h:nextn:0.02 --fake-bad-drop")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    five, drop = res["servers"]
    assert (five["label"], drop["label"]) == ("tiny-nemotron-h", "tiny-nemotron-h-nextn")
    assert "--fake-bad-status 500" in five["command"] and "--speculative-algorithm NEXTN" in drop["command"]
    for srv, outcome in ((five, "5xx"), (drop, "conn_error")):
        c = srv["chaos"]
        assert c["bad"] > 0 and c["bad_not_4xx"] == c["bad"] == c["by_category"]["bad"][outcome]
        assert all(set(v) == {outcome} for k, v in c["by_kind"].items() if k in soak.BAD_KINDS)
        assert c["good_failed"] == 0 and srv["status"] == "ok"
        assert {e["cat"] for e in c["failure_examples"]} == {"bad"}
    s = res["summary"]
    assert s["bad_requests_not_4xx"] == five["chaos"]["bad"] + drop["chaos"]["bad"]
    assert s["bad_requests_sent"] == min(five["chaos"]["bad"], drop["chaos"]["bad"])
    assert s["server_crashes"] == 0 and s["baseline_identical"] == 1


def test_dying_or_hung_servers_are_crashes_and_a_drifting_one_is_not_identical(tmp_path):
    # warm-up (6), baseline (4) and the idle probe come first: the servers die, drift or hang inside the chaos
    r, res, _ = _soak(tmp_path, "tiny-nemotron-h:none:0.2 --fake-die-after 60",
                      "tiny-nemotron-h:nextn:0.02 --fake-drift-after 30",
                      "tiny-qwen3-next:none:0.2 --fake-hang-after 40", extra=("--hang-s", "1.5"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    dead, drift, hung = res["servers"]
    assert dead["status"] == "crashed" and dead["crashed"] and dead["crash"]["rc"] == 17
    assert dead["crash"]["kind"] == "died"
    assert "dying on generate request 60" in dead["crash"]["log_tail"]
    assert dead["crash"]["requests_near_death"] and not dead["alive_after"]
    assert dead["chaos"]["seconds"] < 10  # the chaos stopped at the death, not at its 12 s
    assert dead["numbers"]["baseline_identical"] is False and "baseline_after" not in dead
    assert drift["status"] == "ok" and drift["chaos"]["requests"] > 0  # the run moved on
    assert drift["baseline"]["identical"] is False and drift["baseline"]["differing_prompts"] == [0, 1, 2, 3]
    assert hung["status"] == "crashed" and hung["crash"]["rc"] is None and hung["crash"]["kind"].startswith("hung")
    assert hung["chaos"]["seconds"] < 10 and hung["chaos"]["cancelled_at_drain"] > 0
    assert hung["shutdown"]["stopped"] and "baseline_after" not in hung
    # where it hung: its processes got SIGABRT and faulthandler printed their stacks into the log
    assert hung["crash"]["stacks_dumped_pids"] and "Fatal Python error: Aborted" in hung["crash"]["log_tail"]
    assert "File " in hung["crash"]["log_tail"].split("Fatal Python error: Aborted", 1)[1]
    assert "gpu_utilization_pct" in hung["crash"] and "stacks_dumped_pids" not in dead["crash"]
    cpu = hung["crash"]["process_cpu"]
    assert cpu and all({"pid", "name", "status", "cpu_pct"} <= set(x) for x in cpu)
    assert set(hung["crash"]["stacks_dumped_pids"]) == {x["pid"] for x in cpu}
    s = res["summary"]
    assert (s["server_crashes"], s["baseline_identical"]) == (2, 0)
    assert s["crashed_servers"] == ["tiny-nemotron-h", "tiny-qwen3-next"]
    assert s["requests"] == min(x["chaos"]["requests"] for x in (dead, drift, hung))


def test_leaked_slots_and_skipped_servers(tmp_path):
    r, res, _ = _soak(tmp_path, "tiny-nemotron-h:none:0.02 --fake-leak-aborts")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    srv, = res["servers"]
    n = srv["numbers"]
    assert srv["idle_after"]["settled"] is False  # waited its --settle-timeout for the slots to come back
    assert n["leaked_mamba_slots"] == n["mamba_used_after"] - n["mamba_used_before"] > 0
    assert res["summary"]["leaked_mamba_slots"] == n["leaked_mamba_slots"]
    r, res, _ = _soak(tmp_path / "skip", "tiny-nemotron-h", extra=("--deadline-s", "1", "--min-server-s", "30"))
    assert r.returncode == 0 and res["servers"][0]["status"] == "skipped"
    assert res["summary"]["requests"] == 0 and res["summary"]["servers_not_ran"] == ["tiny-nemotron-h"]


def test_a_jit_compile_is_not_a_hang(tmp_path):
    """A server whose scheduler stalls while a compiler runs under it (a first-use JIT compile: FlashInfer's
    nvcc) is waited for, and the wait is recorded; the same stall without a compiler is a hang."""
    from eval import soak

    r, res, _ = _soak(tmp_path, "tiny-nemotron-h:none:0.15 --fake-hang-after 40 --fake-compile-s 4",
                      extra=("--hang-s", "1.5"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (srv,) = res["servers"]
    assert srv["status"] == "ok" and not srv["crashed"], srv.get("crash")
    assert srv["chaos"]["jit_compile_wait_s"] >= 1.5
    assert srv["chaos"]["requests"] > 40 and srv["numbers"]["baseline_identical"] is True
    assert not soak.jit_compiling(os.getpid())
