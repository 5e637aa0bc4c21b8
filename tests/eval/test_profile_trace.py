"""eval/profile_trace.py on synthetic Chrome traces, and eval.ab's profiled run against the CPU stand-in
server (tests/eval/fake_sglang_server.py answers /start_profile with a small GPU trace)."""
import gzip
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval import ab, profile_trace

REPO = Path(__file__).resolve().parents[2]


def _trace(path: Path, steps: int, kernels, gap_us: float) -> Path:
    events, ts = [], 500.0
    for _ in range(steps):
        for name, cat, dur in kernels:
            events.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur})
            ts += dur
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": ts, "dur": 999.0})  # host: not counted
        events.append({"ph": "i", "cat": "kernel", "name": "marker", "ts": ts})  # not a complete event
        ts += gap_us
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def test_groups_totals_and_busy_fraction(tmp_path):
    rnd = random.Random()
    steps = rnd.randint(2, 9)
    durs = {n: round(rnd.uniform(1, 300), 3) for n in ("_mamba2_verify_kernel", "_selective_scan_update_kernel",
                                                      "nvjet_tst_192x8_64x4_gemm", "fused_moe_kernel",
                                                      "BatchDecodeWithPagedKVCacheKernel", "rmsnorm_kernel")}
    kernels = [(n, "kernel", d) for n, d in durs.items()] + [("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 2.0)]
    gap = rnd.uniform(5, 50)
    s = profile_trace.summarize_file(_trace(tmp_path / "t.trace.json.gz", steps, kernels, gap), steps)
    per_step = sum(d for _, _, d in kernels)
    assert s["kernels"] == steps * len(kernels)
    assert s["kernel_us_per_step"] == pytest.approx(per_step)
    assert s["span_us"] == pytest.approx(steps * per_step + (steps - 1) * gap)
    assert s["busy_fraction"] == pytest.approx(steps * per_step / s["span_us"])
    g = s["by_group"]
    assert g["ssm replay (ours)"] == pytest.approx(durs["_mamba2_verify_kernel"])
    assert g["ssm stock"] == pytest.approx(durs["_selective_scan_update_kernel"])
    assert g["gemm"] == pytest.approx(durs["nvjet_tst_192x8_64x4_gemm"])
    assert g["moe"] == pytest.approx(durs["fused_moe_kernel"])
    assert g["attention"] == pytest.approx(durs["BatchDecodeWithPagedKVCacheKernel"])
    assert g["norm"] == pytest.approx(durs["rmsnorm_kernel"]) and g["memcpy / memset"] == pytest.approx(2.0)
    assert list(g.values()) == sorted(g.values(), reverse=True)
    top = s["top"][0]
    assert top["us_per_step"] == pytest.approx(max(durs.values())) and top["calls_per_step"] == 1
    with pytest.raises(ValueError):
        profile_trace.summarize([], 0)


def test_compare_groups_and_cli(tmp_path, capsys):
    a = _trace(tmp_path / "a.trace.json.gz", 4, [("_selective_scan_update_kernel", "kernel", 90.0),
                                                 ("gemm_x", "kernel", 200.0)], 10.0)
    b = _trace(tmp_path / "b.trace.json.gz", 4, [("_mamba2_replay_kernel", "kernel", 30.0),
                                                 ("gemm_x", "kernel", 200.0)], 10.0)
    sa, sb = profile_trace.summarize_file(a, 4), profile_trace.summarize_file(b, 4)
    rows = {r[0]: r[1:] for r in profile_trace.compare_groups(sa, sb)}
    assert rows["ssm stock"] == [90.0, 0.0, -90.0] and rows["ssm replay (ours)"] == [0.0, 30.0, 30.0]
    assert rows["gemm"] == [200.0, 200.0, 0.0] and rows["all kernels"] == [290.0, 230.0, -60.0]
    out = tmp_path / "cmp.json"
    assert profile_trace.main([str(a), "--steps", "4", "--vs", str(b), "--json", str(out)]) == 0
    assert "busy" in capsys.readouterr().out and json.loads(out.read_text())["b"]["kernel_us_per_step"] == 230.0
    # the newest complete trace is found; a file still being written (.tmp) is not
    (tmp_path / "c.trace.json.gz.tmp").write_text("")
    assert profile_trace.find_trace(tmp_path).name in ("a.trace.json.gz", "b.trace.json.gz")
    assert profile_trace.find_trace(tmp_path / "missing") is None


class _Driver:
    """Stands in for the bench driver: 'runs' bench_serving for a second while the profile request lands."""

    def __init__(self):
        self.argv = None

    def run(self, argv, timeout):
        self.argv = argv
        time.sleep(1.0)
        return {"ok": True, "seconds": 1.0}


@pytest.mark.parametrize("replay", [False, True])
def test_run_profile_against_the_stand_in_server(tmp_path, replay):
    port = ab.free_port()
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    if replay:
        env["SGLANG_REPLAYSSM_ENABLE"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "tests.eval.fake_sglang_server", "--model-path", "m",
                             "--port", str(port)], cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            if ab.http_text(url + "/health", timeout=1.0)[0] == 200:
                break
            time.sleep(0.1)
        drv = _Driver()
        out = ab.run_profile(url, drv, ["--x"], tmp_path / "prof", batch=8, steps=5, delay_s=0.2,
                             deadline=time.time() + 60, bench_timeout=30)
    finally:
        proc.terminate()
        proc.wait(10)
    assert drv.argv == ["--x"] and out["bench_ok"] and out["start_profile"] == "ok", out
    assert out["steps"] == 5 and out["batch"] == 8 and Path(out["trace"]).is_file()
    from tests.eval.fake_sglang_server import PREFILL_KERNEL, STEP_KERNELS

    ssm = "ssm replay (ours)" if replay else "ssm stock"
    ssm_us = next(d for n, _, d in STEP_KERNELS if n.startswith("_selective"))
    want = sum(d for _, _, d in STEP_KERNELS) - (ssm_us * 2 / 3 if replay else 0.0)
    pre_us = PREFILL_KERNEL[2]
    # whole window: the prefill step's chunked scan (group "ssm stock") spread over the 5 steps asked for
    assert out["kernel_us_per_step"] == pytest.approx(want + pre_us / 5)
    assert out["by_group"]["ssm stock"] == pytest.approx((0.0 if replay else ssm_us) + pre_us / 5)
    assert 0 < out["busy_fraction"] < 1
    # decode steps only: 4 whole steps after the first argmax, the third of the window ran the prefill
    assert out["step_split"] == {"step_end": profile_trace.STEP_END, "steps": 4, "decode": 3, "prefill": 1,
                                 "prefill_wall_us": [pytest.approx(want + pre_us + 20.0)]}
    d = out["decode_steps"]
    assert d["steps"] == 3 and d["kernel_us_per_step"] == pytest.approx(want)
    assert d["by_group"][ssm] == pytest.approx(30.0 if replay else 90.0)  # the stand-in's SSM kernel, 1/3 in replay
    assert "ssm stock" not in d["by_group"] or replay is False
    assert d["span_us_per_step"] == pytest.approx(want + 20.0)  # a step's wall: its kernels and the 20 us gap
    # no server: recorded, not raised
    bad = ab.run_profile(f"http://127.0.0.1:{ab.free_port()}", _Driver(), [], tmp_path / "none", batch=1, steps=1,
                         delay_s=0.0, deadline=time.time() + 5, bench_timeout=5)
    assert "error" in bad and bad["start_profile"] != "ok"


def test_report_sets_the_arms_profiles_side_by_side(tmp_path):
    from eval import ab_report

    res = json.loads((REPO / "tests" / "eval" / "data" / "ab_result_sample.json").read_text())
    a, b = res["summary"]["a"], res["summary"]["b"]
    assert ab_report.profile_section(res) is None  # no arm profiled: no section
    ta = _trace(tmp_path / "a.trace.json.gz", 3, [("_selective_scan_update_kernel", "kernel", 90.0)], 5.0)
    tb = _trace(tmp_path / "b.trace.json.gz", 3, [("_mamba2_verify_kernel", "kernel", 40.0)], 5.0)
    res["arms"][a]["profiles"] = [dict(profile_trace.summarize_file(ta, 3), batch=256, delay_s=3.0, trace="a"),
                                  {"batch": 1, "skipped": "deadline"}]
    res["arms"][b]["profiles"] = [{"batch": 256, "skipped": "deadline"}]
    text = ab_report.markdown(res)
    assert "GPU kernel time per forward step" in text and f"- {b}: no profile (deadline)" in text
    assert "### batch 256" in text and "### batch 1\n" in text and f"- {a}: no profile (deadline)" in text
    res["arms"][b]["profiles"] = [dict(profile_trace.summarize_file(tb, 3), batch=256, delay_s=3.0, trace="b")]
    text = ab_report.markdown(res)
    assert f"| ssm stock | 90.0 | 0.0 | -90.0 |" in text and f"| ssm replay (ours) | 0.0 | 40.0 | 40.0 |" in text
    assert f"{b} − {a}" in text and "_mamba2_verify_kernel 40.0 µs" in text


@pytest.mark.parametrize("flags,msg", [(["--profile-batch", "1,x"], "--profile-batch takes comma-separated"),
                                       (["--profile-batch", "0"], "--profile-batch takes positive"),
                                       (["--profile-batch", "8", "--profile-steps", "0"], "--profile-steps takes")])
def test_bad_profile_flags_are_refused_before_anything_starts(capsys, flags, msg):
    assert ab.main(["--dry-run", *flags]) == 2
    assert msg in capsys.readouterr().err


def test_a_trace_without_gpu_kernels_is_an_error_not_a_summary(tmp_path):
    tdir = tmp_path / "prof"
    tdir.mkdir()
    _trace(tdir / "x-TP-0.trace.json.gz", 3, [], 5.0)  # host events only (e.g. CUPTI saw nothing)
    out = ab.run_profile(f"http://127.0.0.1:{ab.free_port()}", _Driver(), [], tdir, batch=1, steps=3,
                         delay_s=0.0, deadline=time.time() + 5, bench_timeout=5)
    assert out["kernels"] == 0 and out["error"] == "no GPU kernel events in x-TP-0.trace.json.gz"


ARGMAX = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>"


@pytest.mark.parametrize("prefill_name", ["_chunk_scan_fwd_kernel", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
                                          "recompute_w_u_fwd_kernel", "_causal_conv1d_fwd_kernel",
                                          "flashinfer::PrefillWithKVCacheKernel<RaggedParams>"])
def test_steps_split_at_the_sampler_and_prefill_steps_set_apart(tmp_path, prefill_name):
    rnd = random.Random()
    n = rnd.randint(5, 9)
    pre_at = rnd.randrange(1, n - 1)  # a whole step (not the partial first one)
    dec = {"_mamba2_replay_kernel": rnd.uniform(10, 90), "gemm_x": rnd.uniform(100, 300),
           # flashinfer's tensor-core decode runs a "Prefill" kernel: not a prefill marker
           "flashinfer::BatchPrefillWithPagedKVCacheKernel": rnd.uniform(5, 20), ARGMAX: 3.0}
    gap, pre_us = rnd.uniform(5, 30), rnd.uniform(500, 900)
    events, ts = [], 0.0
    for i in range(n):
        for name, dur in ([(prefill_name, pre_us)] if i == pre_at else []) + list(dec.items()):
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur})
            ts += dur
        ts += gap
    rnd.shuffle(events)  # trace order is not time order
    split = profile_trace.split_steps(events)
    assert [k for k, _, _ in split] == ["prefill" if i == pre_at else "decode" for i in range(1, n)]
    step = sum(dec.values()) + gap
    for kind, wall, st in split:
        assert wall == pytest.approx(step + (pre_us if kind == "prefill" else 0.0))
        assert st[-1]["name"] == ARGMAX
    s = profile_trace.decode_step_summary(events)
    assert s["step_split"]["steps"] == n - 1 and s["step_split"]["prefill"] == 1
    d = s["decode_steps"]
    assert d["steps"] == n - 2 and d["kernel_us_per_step"] == pytest.approx(sum(dec.values()))
    assert d["by_group"]["ssm replay (ours)"] == pytest.approx(dec["_mamba2_replay_kernel"])
    assert d["span_us_per_step"] == pytest.approx(step) and d["busy_fraction"] == pytest.approx(sum(dec.values()) / step)
    # one sampler kernel (or none): no whole step, no decode summary
    one = [e for e in events if e["name"] != ARGMAX] + [{"ph": "X", "cat": "kernel", "name": ARGMAX, "ts": 0, "dur": 1}]
    assert profile_trace.decode_step_summary(one) == {"step_split": {
        "step_end": profile_trace.STEP_END, "steps": 0, "decode": 0, "prefill": 0, "prefill_wall_us": []}}
    assert "no whole steps" in profile_trace.step_line(profile_trace.decode_step_summary(one))


def test_report_puts_decode_steps_first_when_both_arms_have_them(tmp_path):
    from eval import ab_report

    res = json.loads((REPO / "tests" / "eval" / "data" / "ab_result_sample.json").read_text())
    a, b = res["summary"]["a"], res["summary"]["b"]
    ta = _trace(tmp_path / "a.trace.json.gz", 4, [("_selective_scan_update_kernel", "kernel", 90.0),
                                                  (ARGMAX, "kernel", 2.0)], 8.0)
    tb = _trace(tmp_path / "b.trace.json.gz", 4, [("_mamba2_replay_kernel", "kernel", 40.0),
                                                  (ARGMAX, "kernel", 2.0)], 8.0)
    res["arms"][a]["profiles"] = [dict(profile_trace.summarize_file(ta, 4), batch=256, delay_s=3.0, trace="a")]
    res["arms"][b]["profiles"] = [dict(profile_trace.summarize_file(tb, 4), batch=256, delay_s=3.0, trace="b")]
    text = ab_report.profile_section(res)
    head = text.index("Decode steps only")
    assert head < text.index("Whole traced window") and f"{a}: 3 of 3 whole steps" in text
    decode_table = text[head:text.index("Whole traced window")]
    assert "| ssm stock | 90.0 | 0.0 | -90.0 |" in decode_table
    assert f"| {profile_trace.DECODE_WALL} | 100.0 | 50.0 | -50.0 |" in decode_table  # kernels + the 8 us gap
    assert "(3 whole decode and 0 prefill steps)" in text


@pytest.mark.parametrize("name,group", [("_mamba2_replay_kernel", "ssm replay (ours)"),
                                        ("_gdn_history_scores_kernel", "ssm replay (ours)"),
                                        ("_spec_commit_kernel", "ssm replay (ours)"),
                                        ("_decode_cursor_kernel", "ssm replay (ours)"),
                                        ("fused_gdn_gating_kernel", "other"),  # SGLang's, not ours
                                        ("fused_qkv_split_gdn_prefill_kernel", "other"),
                                        ("fused_recurrent_linear_replayssm_decode_kernel", "ssm stock"),
                                        ("chunk_gated_delta_rule_fwd_kkt_solve_kernel", "ssm stock")])
def test_kernel_groups_tell_ours_from_sglangs(name, group):
    assert profile_trace.group_of(name) == group


def test_rereduce_redoes_a_results_profiles_from_its_traces(tmp_path):
    logs = tmp_path / "logs-ab-x"
    (logs / "profile-stock-b8").mkdir(parents=True)
    _trace(logs / "profile-stock-b8" / "1-TP-0.trace.json.gz", 4,
           [("_selective_scan_update_kernel", "kernel", 70.0), (ARGMAX, "kernel", 2.0)], 6.0)
    res = {"arms": {"stock": {"profiles": [{"batch": 8, "steps": 4, "delay_s": 1.0, "bench_ok": True,
                                            "start_profile": "ok", "trace": "profile-stock-b8/1-TP-0.trace.json.gz",
                                            "by_group": {"stale": 1.0}}]},
                    "staged": {"profiles": [{"batch": 8, "skipped": "deadline"}]}}}
    path = tmp_path / "ab-x.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(res, f)
    assert profile_trace.main(["--rereduce", str(path), str(logs)]) == 0
    with gzip.open(path, "rt") as f:
        p, q = (a["profiles"][0] for a in json.load(f)["arms"].values())
    assert "stale" not in p["by_group"] and p["by_group"]["ssm stock"] == pytest.approx(70.0)
    assert p["decode_steps"]["steps"] == 3 and p["batch"] == 8 and p["trace"].startswith("profile-stock-b8/")
    assert q == {"batch": 8, "skipped": "deadline"}
    assert profile_trace.main(["--rereduce", str(path), str(tmp_path / "nowhere")]) == 1  # nothing redone
    # a speculative server's steps are not split (several sampler kernels per step)
    res["arms"]["stock"]["phase"] = {"spec": True}
    assert profile_trace.rereduce(res, logs) == 1
    p = res["arms"]["stock"]["profiles"][0]
    assert "decode_steps" not in p and p["step_split"] == {"skipped": profile_trace.SPEC_UNSPLIT}
    assert "speculative" in profile_trace.step_line(p) and p["by_group"]["ssm stock"] == pytest.approx(70.0)
    # a trace without kernels keeps its error
    _trace(logs / "profile-stock-b8" / "1-TP-0.trace.json.gz", 2, [], 5.0)
    res["arms"]["stock"]["phase"] = {"spec": False}
    assert profile_trace.rereduce(res, logs) == 1
    assert res["arms"]["stock"]["profiles"][0]["error"] == "no GPU kernel events in 1-TP-0.trace.json.gz"
