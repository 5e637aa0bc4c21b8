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
    ssm = "ssm replay (ours)" if replay else "ssm stock"
    assert out["by_group"][ssm] == pytest.approx(30.0 if replay else 90.0)  # the stand-in's SSM kernel, 1/3 in replay
    from tests.eval.fake_sglang_server import STEP_KERNELS

    ssm_us = next(d for n, _, d in STEP_KERNELS if n.startswith("_selective"))
    want = sum(d for _, _, d in STEP_KERNELS) - (ssm_us * 2 / 3 if replay else 0.0)
    assert out["kernel_us_per_step"] == pytest.approx(want)
    assert 0 < out["busy_fraction"] < 1
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
