"""eval/e2e_summary.py on a recorded H200 result (tests/eval/data/ab_result_sample.json) and variants of it."""
import copy
import gzip
import json
from pathlib import Path

import pytest

from eval import ab_report, e2e_summary, report

DATA = Path(__file__).parent / "data"


def _variant(res, *, model=None, b_kind=None, stem=None, scale=None):
    r = copy.deepcopy(res)
    if model:
        r["model"]["name"] = model
        r["model"].pop("size", None)
    b = r["summary"]["b"]
    if b_kind:
        r["arms"][b]["phase"]["kind"] = b_kind
    if scale:
        for e in r["arms"][b]["bench"]:
            if e.get("result"):
                e["result"]["output_throughput"] *= scale
    return r


def _tok_s(res, label, bs):
    return next(e["result"]["output_throughput"] for e in res["arms"][label]["bench"] if e["batch"] == bs)


def test_summaries_from_recorded_and_variant_results(tmp_path):
    res = json.loads((DATA / "ab_result_sample.json").read_text())
    a, b = res["summary"]["a"], res["summary"]["b"]
    assert res["arms"][b]["phase"]["kind"] == "staged" and res["model"]["name"] == "nemotron-h-8b"
    runs = tmp_path / "runs"
    report.write_json(runs / "n" / "ab-nemotron-h-8b-stock-vs-staged.json", res)
    report.write_json(runs / "n" / "ab-nemotron-h-8b-stock-vs-stock.json", _variant(res, b_kind="stock"))
    g = "qwen3-next-80b-a3b-e64"
    report.write_json(runs / "g" / f"ab-{g}-stock-vs-staged.json", _variant(res, model=g))
    up = report.write_json(runs / "g" / f"ab-{g}-stock-vs-upstream.json", _variant(res, model=g, b_kind="upstream",
                                                                                  scale=0.5))
    with gzip.open(str(up) + ".gz", "wt") as f:  # large raw results are committed gzipped
        f.write(up.read_text())
    up.unlink()
    out = tmp_path / "out"
    assert e2e_summary.main([str(runs), "--out-dir", str(out)]) == 0
    dec = json.loads((out / "e2e-decode-h200.json").read_text())["summary"]
    want = _tok_s(res, b, 256) / _tok_s(res, a, 256)
    assert abs(dec["nemotron_h_speedup_bs256"] - want) < 1e-9 and abs(dec["gdn_speedup_bs256"] - want) < 1e-9
    assert abs(dec["nemotron_h_speedup_bs1"] - _tok_s(res, b, 1) / _tok_s(res, a, 1)) < 1e-9
    assert abs(dec["gdn_vs_upstream_bs256"] - 2.0) < 1e-9 and abs(dec["upstream_speedup_bs256"] - want / 2) < 1e-9
    assert [n["model"] for n in dec["noise_floor_stock_vs_stock"]] == ["nemotron-h-8b"]
    # the noise floor names its run's workload (a floor at one workload says little about another)
    assert dec["noise_floor_stock_vs_stock"][0]["workload"]["input_len"] == res["bench"]["input_len"]
    assert "nemotron-h-8b (" in (out / "e2e-decode-h200.md").read_text()
    assert dec["met"]["gdn_vs_upstream_bs256"] is True
    par = json.loads((out / "parity-decode-h200.json").read_text())
    s = res["summary"]["parity"]
    assert par["summary"]["runs"] == 2 and par["summary"]["token_mismatches"] == 2 * s["mismatches"]
    assert par["summary"]["tokens_compared"] == 2 * s["tokens_compared"]
    assert par["summary"]["max_abs_logprob_diff"] == s["max_abs_dlogprob"]
    assert set(par["summary"]["references"]) == {"stock vs stock", "upstream vs stock"}
    assert par["summary"]["target_met"] is (s["mismatches"] == 0 and s["max_abs_dlogprob"] <= 0.05)
    spec = json.loads((out / "e2e-spec-h200.json").read_text())
    assert spec["runs"] == [] and spec["summary"]["greedy_mismatches"] is None
    md = (out / "e2e-decode-h200.md").read_text()
    assert "| nemotron_h_speedup_bs256 |" in md and "stock vs stock geomean" in md
    assert (out / "e2e-decode-h200.png").exists() == report.have_matplotlib()


def test_no_results_is_an_error(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        e2e_summary.main([str(tmp_path)])
    assert "no eval.ab result JSON" in capsys.readouterr().err


def test_spec_speed_and_capacity_from_one_run(tmp_path):
    """A spec run with arms stock, staged, stock:nospec spreads over two result files."""
    res = json.loads((DATA / "ab_result_sample.json").read_text())
    a, b = res["summary"]["a"], res["summary"]["b"]
    res["flags"]["harness"].update(spec="nextn", sim_acc_len=3.0)
    for arm in res["arms"].values():
        arm["phase"]["spec"] = True
    res["summary"]["max_running_requests"] = {a: 100, b: 350}
    nospec = _variant(res, b_kind="stock", scale=0.5)
    nospec["arms"]["stock-nospec"] = nospec["arms"].pop(b)
    nospec["arms"]["stock-nospec"]["phase"]["spec"] = False
    nospec["summary"].update(b="stock-nospec", max_running_requests={a: 100, "stock-nospec": 120})
    runs = tmp_path / "runs"
    report.write_json(runs / "ab-nemotron-h-8b-nextn-stock-vs-staged.json", res)
    report.write_json(runs / "ab-nemotron-h-8b-nextn-stock-vs-stock-nospec.json", nospec)
    out = tmp_path / "out"
    assert e2e_summary.main([str(runs), "--out-dir", str(out)]) == 0
    doc = json.loads((out / "e2e-spec-h200.json").read_text())
    s = doc["summary"]
    want = _tok_s(res, b, 256) / _tok_s(res, a, 256)
    assert abs(s["spec_vs_stock_spec_bs256"] - want) < 1e-9
    assert abs(s["spec_vs_stock_nonspec_bs256"] - _tok_s(res, b, 256) / (0.5 * _tok_s(res, b, 256))) < 1e-9
    assert s["capacity_ratio"] == 3.5 and "not_measured" not in s
    assert [r["arms"] for r in doc["runs"]] == ["staged vs stock"]
    assert sorted(r["batch"] for r in doc["speed"]) == [1, 32, 128, 256]
    # the spec run is not a decode run
    assert json.loads((out / "e2e-decode-h200.json").read_text())["by_batch"] == []
    assert "| 256 |" in (out / "e2e-spec-h200.md").read_text()


def test_summaries_name_the_code_that_produced_them(tmp_path):
    res = json.loads((DATA / "ab_result_sample.json").read_text())
    other = copy.deepcopy(res)
    other["git_commit"] = "0000000"
    other["started"] = "later"
    report.write_json(tmp_path / "runs" / "a" / "ab-nemotron-h-8b-stock-vs-staged.json", res)
    report.write_json(tmp_path / "runs" / "b" / "ab-nemotron-h-8b-stock-vs-staged.json", other)
    out = tmp_path / "out"
    assert e2e_summary.main([str(tmp_path / "runs"), "--out-dir", str(out)]) == 0
    for name in ("parity-decode-h200", "e2e-decode-h200"):
        doc = json.loads((out / f"{name}.json").read_text())
        assert doc["git_commit"] == ", ".join(sorted({res["git_commit"], "0000000"}))
        assert doc["sglang_version"] == res["sglang_version"] and doc["gpu"] == res["gpu"]["name"]
        assert {x["git_commit"] for x in doc["sources"]} == {res["git_commit"], "0000000"}
        assert f"git commit of the runs**: {doc['git_commit']}" in (out / f"{name}.md").read_text()
    spec = json.loads((out / "e2e-spec-h200.json").read_text())
    assert spec["git_commit"] is None and spec["sources"] == []  # no speculative run among the inputs


def test_spec_nonspec_baseline_borrowed_from_the_nearest_run():
    """The recorded Nemotron-H-8B NEXTN runs (eval/results/e2e-h200/spec-nemotron-h-8b*): the ac035cc run with
    stock and staged has no stock:nospec arm, so its non-spec baseline is the one of the run nearest in
    time (run 2), flagged as borrowed; ratios are recomputed from the arms' own throughputs.  The `stream`
    run's stock:nospec arm was skipped (deadline): a skipped arm is no baseline, so it borrows the one of
    `stream-nospec` (staged against stock:nospec only, minutes later).  Each target reads the latest run
    that measured it, the non-spec ratio only from a run with its own baseline: `std-16b1851` (the standard
    workload, 2026-12-04, repeating `std` of 2026-12-03), whose SGLang decode-rate ratio the summary reports beside
    it; a borrowed baseline gives none. The profiled run of our server alone (`prof-a040a5c`) compares nothing."""
    root = Path(__file__).parents[2] / "eval" / "results" / "e2e-h200"
    dirs = sorted(root.glob("spec-nemotron-h-8b*"))
    results = e2e_summary.load_results(dirs)
    rows = [r for r in e2e_summary.spec_speed(results) if r["model"] == "nemotron-h-8b"]
    runs = e2e_summary.arms_by_run(results)
    measured = lambda a: any((b or {}).get("output_throughput") for b in a["bench"].values())  # noqa: E731
    nospec = {st: next(a for a in arms.values() if a["kind"] == "stock" and not a["spec"] and measured(a))
              for (m, st), arms in runs.items()
              if any(a["kind"] == "stock" and not a["spec"] and measured(a) for a in arms.values())}
    assert len(nospec) == 7  # run 1, run 2, the picked-config run, stream-nospec, streamchunk, std, std-16b1851
    skipped = [a for arms in runs.values() for a in arms.values() if a["kind"] == "stock" and not a["spec"]
               and not measured(a)]
    assert len(skipped) == 1 and "spec-nemotron-h-8b-stream/" in skipped[0]["file"]
    by = {name: [r for r in rows if f"/{name}/" in r["file"]]
          for name in ("spec-nemotron-h-8b", "spec-nemotron-h-8b-picked", "spec-nemotron-h-8b-stream",
                       "spec-nemotron-h-8b-stream-nospec", "spec-nemotron-h-8b-streamchunk",
                       "spec-nemotron-h-8b-std", "spec-nemotron-h-8b-std-16b1851")}
    assert sum(map(len, by.values())) == len(rows)
    assert {r["batch"] for r in by["spec-nemotron-h-8b"]} == {1, 32, 128, 256}
    run2 = next(a for a in nospec.values() if "run2" in a["file"])
    for r in by["spec-nemotron-h-8b"]:
        assert r["nonspec_same_run"] is False and "run2-workspace" in r["stock_nonspec_file"]
        assert r["stock_nonspec_tok_s"] == run2["bench"][r["batch"]]["output_throughput"]
        assert r["latest"] is False and r["latest_for"] == []
    for r in by["spec-nemotron-h-8b-picked"]:  # its own baseline, superseded by the later runs
        assert r["nonspec_same_run"] is True and "spec-nemotron-h-8b-picked/" in r["stock_nonspec_file"]
        assert r["latest_for"] == []
    for r in by["spec-nemotron-h-8b-stream"]:
        assert r["nonspec_same_run"] is False
        assert r["stock_nonspec_file"] is None or "stream-nospec/" in r["stock_nonspec_file"]
        assert r["latest_for"] == ["spec_vs_stock_spec", "capacity_ratio"]
    for name in ("spec-nemotron-h-8b-stream-nospec", "spec-nemotron-h-8b-streamchunk", "spec-nemotron-h-8b-std",
                 "spec-nemotron-h-8b-std-16b1851"):
        for r in by[name]:  # no stock spec arm: the non-spec ratio only; the latest (std-16b1851) is read
            assert r["stock_spec_tok_s"] is None and r["spec_vs_stock_spec"] is None and r["capacity_ratio"] is None
            assert r["nonspec_same_run"] is True
            assert r["latest_for"] == (["spec_vs_stock_nonspec"] if name.endswith("-16b1851") else [])
    for r in by["spec-nemotron-h-8b-std"] + by["spec-nemotron-h-8b-std-16b1851"]:  # SGLang's decode rates beside
        assert r["staged_decode_tok_s"] and r["stock_nonspec_decode_tok_s"]
        assert r["spec_vs_stock_nonspec_decode"] == report.ratio(r["staged_decode_tok_s"],
                                                                 r["stock_nonspec_decode_tok_s"])
    for r in rows:
        assert r["spec_vs_stock_nonspec"] == report.ratio(r["staged_tok_s"], r["stock_nonspec_tok_s"])
        if not r["nonspec_same_run"]:  # a borrowed baseline's decode rate is not compared
            assert r["stock_nonspec_decode_tok_s"] is None and r["spec_vs_stock_nonspec_decode"] is None
        assert r["capacity_ratio"] == report.ratio(r["max_running_staged"], r["max_running_stock"])
    doc = e2e_summary.spec_summary(results)
    at256 = {name: next(r for r in rs if r["batch"] == 256) for name, rs in by.items()}
    assert doc["summary"]["spec_vs_stock_spec_bs256"] == at256["spec-nemotron-h-8b-stream"]["spec_vs_stock_spec"]
    latest = at256["spec-nemotron-h-8b-std-16b1851"]
    assert doc["summary"]["spec_vs_stock_nonspec_bs256"] == latest["spec_vs_stock_nonspec"]
    assert doc["summary"]["capacity_ratio"] == at256["spec-nemotron-h-8b-stream"]["capacity_ratio"]
    assert doc["summary"]["bs256_by_model"]["spec_vs_stock_nonspec"] == {
        "nemotron-h-8b": latest["spec_vs_stock_nonspec"]}
    assert doc["summary"]["bs256_by_model"]["spec_vs_stock_nonspec_decode"] == {
        "nemotron-h-8b": latest["spec_vs_stock_nonspec_decode"]}


def test_decode_targets_read_the_latest_run_and_its_profiled_decode_steps(tmp_path):
    res = json.loads((DATA / "ab_result_sample.json").read_text())
    a, b = res["summary"]["a"], res["summary"]["b"]
    runs = tmp_path / "runs"
    report.write_json(runs / "old" / "ab-nemotron-h-8b-stock-vs-staged.json", res)
    new = _variant(res, scale=1.25)
    new["started"] = "2099-01-01T00:00:00Z"  # later than the recorded run
    new["arms"][a]["profiles"] = [{"batch": 256, "decode_steps": {"span_us_per_step": 27000.0}}]
    new["arms"][b]["profiles"] = [{"batch": 256, "decode_steps": {"span_us_per_step": 18000.0}},
                                  {"batch": 1, "skipped": "deadline"}]
    new["arms"][b]["bench"] = [e for e in new["arms"][b]["bench"] if e["batch"] != 1]  # bs1 only in the old run
    report.write_json(runs / "new" / "ab-nemotron-h-8b-stock-vs-staged.json", new)
    dec = e2e_summary.decode_speed(e2e_summary.load_results([runs]))["summary"]
    assert abs(dec["nemotron_h_speedup_bs256"] - 1.25 * _tok_s(res, b, 256) / _tok_s(res, a, 256)) < 1e-9
    assert Path(dec["sources"]["nemotron_h_speedup_bs256"]).parent.name == "new"
    assert abs(dec["nemotron_h_speedup_bs1"] - _tok_s(res, b, 1) / _tok_s(res, a, 1)) < 1e-9
    assert Path(dec["sources"]["nemotron_h_speedup_bs1"]).parent.name == "old"
    assert abs(dec["nemotron_h_decode_step_speedup_bs256"] - 1.5) < 1e-9
    assert dec["nemotron_h_decode_step_speedup_bs1"] is None
    # still later runs that the targets must not read: a launch-config variant arm, a bf16 state, another model
    variant = _variant(res, scale=3.0)
    variant["started"] = "2099-02-01T00:00:00Z"
    variant["arms"][b]["phase"]["kernel_config"] = "/x/sf.yaml"
    bf16 = _variant(res, scale=4.0)
    bf16["started"] = "2099-03-01T00:00:00Z"
    bf16["flags"]["harness"]["server_arg"] = ["--mamba-ssm-dtype bfloat16"]
    other = _variant(res, model="my-mamba2-model", scale=5.0)  # a real Mamba2 model that is not the headline one
    other["model"].update(size="real", family="mamba2")
    other["started"] = "2099-04-01T00:00:00Z"
    for name, r in (("variant", variant), ("bf16", bf16), ("other", other)):
        report.write_json(runs / name / "ab-nemotron-h-8b-stock-vs-staged.json", r)
    doc = e2e_summary.decode_speed(e2e_summary.load_results([runs]))
    assert Path(doc["summary"]["sources"]["nemotron_h_speedup_bs256"]).parent.name == "new"
    assert {r["arm"] for r in doc["by_batch"]} == {"staged", "staged@sf.yaml"}  # the variant is listed apart
    assert {r["model"] for r in doc["by_batch"]} == {"nemotron-h-8b", "my-mamba2-model"}
    assert {r["ssm_state"] for r in doc["by_batch"]} == {"default", "bf16"}


def test_a_run_on_another_workload_is_listed_apart_from_the_targets(tmp_path):
    """A later run with one wave of 1024-token outputs (eval.ab --rounds 1 --output-len 1024) is not read by the
    targets, which stay on the standard workload's latest run; its ratio is reported as another workload's."""
    res = json.loads((DATA / "ab_result_sample.json").read_text())
    a, b = res["summary"]["a"], res["summary"]["b"]
    runs = tmp_path / "runs"
    report.write_json(runs / "std" / "ab-nemotron-h-8b-stock-vs-staged.json", res)
    wave = _variant(res, scale=1.5)
    wave["started"] = "2099-01-01T00:00:00Z"
    wave["flags"]["harness"].update(output_len=1024, rounds=1)
    report.write_json(runs / "wave" / "ab-nemotron-h-8b-stock-vs-staged.json", wave)
    out = tmp_path / "out"
    assert e2e_summary.main([str(runs), "--out-dir", str(out)]) == 0
    dec = json.loads((out / "e2e-decode-h200.json").read_text())["summary"]
    base = _tok_s(res, b, 256) / _tok_s(res, a, 256)
    assert abs(dec["nemotron_h_speedup_bs256"] - base) < 1e-9
    assert Path(dec["sources"]["nemotron_h_speedup_bs256"]).parent.name == "std"
    assert abs(dec["nemotron_h_other_workload_speedup_bs256"] - 1.5 * base) < 1e-9
    assert Path(dec["sources"]["nemotron_h_other_workload_speedup_bs256"]).parent.name == "wave"
    assert dec["gdn_other_workload_speedup_bs256"] is None
    md = (out / "e2e-decode-h200.md").read_text()
    assert "| nemotron_h_other_workload_speedup_bs256 | " in md and "output_len 1024, rounds 1" in md
    assert "| 128/1024 x1 |" in md and "| 128/256 x2 |" in md  # the by-batch rows name their workload


def test_parity_target_is_judged_on_fp32_state_runs(tmp_path):
    res = json.loads((DATA / "ab_result_sample.json").read_text())
    s = res["summary"]["parity"]
    runs = tmp_path / "runs"
    report.write_json(runs / "f" / "ab-nemotron-h-8b-stock-vs-staged.json", res)
    bf = copy.deepcopy(res)
    bf["flags"]["harness"]["server_arg"] = ["--mamba-ssm-dtype bfloat16"]
    bf["summary"]["parity"].update(mismatches=s["mismatches"] + 3, max_abs_dlogprob=9.0)
    report.write_json(runs / "b" / "ab-nemotron-h-8b-stock-vs-staged.json", bf)
    par = e2e_summary.parity_summary(e2e_summary.load_results([runs]))["summary"]
    assert par["max_abs_logprob_diff"] == 9.0 and par["fp32_state"]["max_abs_logprob_diff"] == s["max_abs_dlogprob"]
    assert set(par["by_state"]) == {"bf16", "default"} and par["by_state"]["bf16"]["runs"] == 1
    assert par["target_met"] is (s["mismatches"] == 0 and s["max_abs_dlogprob"] <= 0.05)
    for args, want in ((["--mamba-ssm-dtype=float16"], "fp16"), (["--x 1", "--mamba-ssm-dtype float32"], "fp32"),
                       ([], "default"), (["--mamba-ssm-dtype"], "default")):
        assert e2e_summary._ssm_state({"server_arg": args}) == want


def _decode_log(path, lines):
    """A server log with SGLang scheduler lines: (running requests, gen throughput) per decode line, None for a
    prefill line."""
    text = "".join(f"[2026-11-30 16:12:{i:02d}] Prefill batch, #new-seq: 8, #new-token: 1024, #running-req: 248\n"
                   if line is None else
                   f"[2026-11-30 16:12:{i:02d}] Decode batch, #running-req: {line[0]}, #full token: 4096, full token "
                   f"usage: 0.01, mamba num: {line[0]}, cuda graph: True, gen throughput (token/s): {line[1]:.2f}, "
                   f"#queue-req: 0\n"
                   for i, line in enumerate(lines))
    text += "[2026-11-30 16:12:59] Prefill batch, #new-seq: 64, #new-token: 8192, #running-req: 256\n"
    with gzip.open(path, "wt") as f:
        f.write(text)


def test_steady_decode_speedup_from_the_server_logs(tmp_path):
    """Beside bench_serving's ratio: SGLang's own gen throughput at exactly the batch's running requests
    (median over its Decode batch lines), read from the server logs next to the result; the log's first line and
    a line whose window held a prefill (both low) and lines at other batch sizes do not move the median; a batch
    logged only in such lines still gets their rate."""
    res = json.loads((DATA / "ab_result_sample.json").read_text())
    a, b = res["summary"]["a"], res["summary"]["b"]
    g = "qwen3-next-80b-a3b-e64"
    run = tmp_path / "runs" / "g"
    report.write_json(run / f"ab-{g}-stock-vs-staged.json", _variant(res, model=g))
    report.write_json(run / f"ab-{g}-stock-vs-upstream.json", _variant(res, model=g, b_kind="upstream"))
    ours_label = res["summary"]["b"]
    _decode_log(run / f"server-{a}.log.gz", [(256, 900.0), (256, 9000.0), (256, 9400.0), None, (256, 5000.0),
                                                (256, 9100.0), (256, 9200.0), (128, 1.0), None, (64, 7.0)])
    _decode_log(run / f"server-{ours_label}.log.gz", [(256, 1000.0), (256, 15000.0), (256, 16000.0), None,
                                                      (256, 8000.0), (256, 15200.0), (256, 15500.0), (1, 200.0)])
    # the upstream result reuses the staged label in this sample, so its log is the same file: vs upstream 1.0
    dec = e2e_summary.decode_speed(e2e_summary.load_results([tmp_path / "runs"]))
    s = dec["summary"]
    assert abs(s["gdn_steady_decode_speedup_bs256"] - 15350.0 / 9150.0) < 1e-9  # medians of the four clean lines
    assert abs(s["gdn_steady_vs_upstream_bs256"] - 1.0) < 1e-9
    assert s["nemotron_h_steady_decode_speedup_bs256"] is None  # no Mamba2 run here
    row = next(r for r in dec["by_batch"] if r["batch"] == 1 and r["arm"] == "staged")
    assert row["stock_steady_tok_s"] is None and row["steady_decode_speedup"] is None  # stock logged no batch 1
    rates = e2e_summary.steady_decode_rates(run / f"server-{a}.log.gz")
    assert abs(rates.get(128) - 1.0) < 1e-9
    assert abs(rates.get(64) - 7.0) < 1e-9  # its one line held a prefill: read anyway
    assert rates.get(32) is None
    out = tmp_path / "out"
    e2e_summary.write_decode(dec, out)
    assert "| gdn_steady_decode_speedup_bs256 | 1.678 |" in (out / "e2e-decode-h200.md").read_text()


def test_plots_are_written_with_a_palette(tmp_path):
    """report.plot_panels stores palette PNGs (about a third of an RGBA file; results travel to the GPU host
    under a size limit) that still show the plot: more than one colour, the figure's size."""
    import pytest

    if not report.have_matplotlib():
        pytest.skip("matplotlib is not installed")
    from PIL import Image

    path = tmp_path / "p.png"
    assert report.plot_panels(path, [{"title": "t", "xlabel": "x", "ylabel": "y", "series": [
        {"label": "a", "x": [1, 2, 4], "y": [1.0, 2.0, 1.5]}, {"label": "b", "x": [1, 2, 4], "y": [0.5, 1.0, 3.0]}]}])
    with Image.open(path) as im:
        assert im.mode == "P" and im.size[0] > 200 and im.size[1] > 200
        assert 2 < len(im.getcolors(maxcolors=report.PNG_COLORS + 1)) <= report.PNG_COLORS


def test_greedy_mismatches_read_each_models_latest_spec_run():
    """The recorded tiny NEXTN runs: `tiny-spec` (f415586) and `tiny-launcher-default` (9a77592) compared the
    same models' greedy spec output with non-spec output.  greedy_mismatches sums each model's latest run only;
    the earlier run is listed as history and counted in nothing."""
    root = Path(__file__).parents[2] / "eval" / "results" / "e2e-h200"
    results = e2e_summary.load_results([root / "tiny-spec", root / "tiny-launcher-default"])
    doc = e2e_summary.spec_summary(results)
    runs = [r for r in doc["runs"] if r["spec_vs_nonspec"]]
    assert sorted(r["model"] for r in runs) == ["tiny-nemotron-h", "tiny-nemotron-h", "tiny-qwen3-next",
                                                "tiny-qwen3-next"]
    counted = [r for r in runs if r["greedy_target_run"]]
    assert sorted(r["model"] for r in counted) == ["tiny-nemotron-h", "tiny-qwen3-next"]
    assert all("tiny-launcher-default" in r["file"] for r in counted)

    def total(rs, side):
        return sum(r["spec_vs_nonspec"][r["arms"].split(" vs ")[side]]["token_mismatches"] for r in rs)

    s = doc["summary"]
    assert s["greedy_mismatches"] == total(counted, 0) and s["stock_greedy_mismatches"] == total(counted, 1)
    assert total(runs, 0) > s["greedy_mismatches"]  # the repeat is not counted twice

    # a later run whose second arm ran with the seams off (kind patched) is not the replay server's: it
    # replaces nothing; a later EAGLE run of one model is the EAGLE summary's (e2e-tree-h200), not this one's
    f, res = next((f, r) for f, r in results if "tiny-launcher-default" in str(f) and
                  r["flags"]["harness"]["spec"] == "nextn" and r["flags"]["harness"]["model"] == "tiny-nemotron-h")
    off = copy.deepcopy(res)
    off["started"] = "2099-01-01T00:00:00Z"
    off["arms"][off["summary"]["b"]]["phase"]["kind"] = "patched"
    assert e2e_summary.spec_summary(results + [(f, off)])["summary"]["greedy_mismatches"] == s["greedy_mismatches"]
    eagle = copy.deepcopy(res)
    eagle["started"] = "2099-01-01T00:00:00Z"
    eagle["flags"]["harness"]["spec"] = "eagle"
    again = e2e_summary.spec_summary(results + [(f, eagle)])["summary"]
    b = res["summary"]["b"]
    assert again["greedy_mismatches"] == s["greedy_mismatches"]
    assert e2e_summary.spec_summary(results + [(f, eagle)], eagle=True)["summary"]["greedy_mismatches"] == \
        e2e_summary.spec_summary([(f, res)])["summary"]["greedy_mismatches"]
    assert b in res["summary"]["spec_vs_nonspec"]


def _io1024(res, started, rates=None):
    """A standard-decode-workload run (eval.ab --workload standard-decode) with the decode rates eval.ab records
    per arm and batch: rates = {label: {batch: (decode tok/s, client-path bound)}}."""
    r = copy.deepcopy(res)
    r["started"] = started
    r["flags"]["harness"].update(input_len=1024, output_len=1024, rounds=2, workload="standard-decode",
                                 stream_interval=8)
    r.setdefault("bench", {})["stream_interval"] = 8
    for label, by in (rates or {}).items():
        for e in r["arms"][label]["bench"]:
            if e["batch"] in by:
                dec, bound = by[e["batch"]]
                # the client's median token gap: 20% short of the decode rate where the run is to be flagged
                e["result"]["median_itl_ms"] = e["batch"] * 1000.0 / (dec * (0.8 if bound else 1.0))
                e["rates"] = {"client_tok_s": e["result"]["output_throughput"], "decode_tok_s": dec,
                              "client_path_bound": bound}
    return r


def test_a_standard_decode_run_at_another_stream_interval_is_not_standard():
    """The standard decode workload streams at interval 8: the same in/out/waves at SGLang's default of 1 is
    another workload (its client rate would measure the tokenizer manager, docs/streaming.md)."""
    res = json.loads((DATA / "ab_result_sample.json").read_text())
    std = _io1024(res, "2099-01-01T00:00:00Z")
    assert e2e_summary._setup(std)["workload"] == e2e_summary.IO1024_WORKLOAD
    at1 = copy.deepcopy(std)
    at1["bench"]["stream_interval"] = 1
    assert e2e_summary._setup(at1)["workload"] != e2e_summary.IO1024_WORKLOAD
    old = copy.deepcopy(res)
    old.pop("bench", None)  # a result from before eval.ab recorded the interval: SGLang's default
    assert e2e_summary._setup(old)["workload"]["stream_interval"] == 1


def test_standard_decode_workload_keys_and_client_path_bound_runs(tmp_path):
    """The issue-24 keys read only runs of the standard decode workload (1024/1024, two waves); the decode-rate
    speedup is SGLang's own full-batch rate, ours over stock; client_path_bound_runs counts the flagged runs among
    those the summary keys read (an older flagged run that no key reads does not count)."""
    res = json.loads((DATA / "ab_result_sample.json").read_text())
    a, b = res["summary"]["a"], res["summary"]["b"]
    runs = tmp_path / "runs"
    report.write_json(runs / "std" / "ab-nemotron-h-8b-stock-vs-staged.json", res)  # the old standard workload
    old = _io1024(res, "2099-01-01T00:00:00Z", {a: {256: (9000.0, True)}, b: {256: (12000.0, True)}})
    report.write_json(runs / "old" / "ab-nemotron-h-8b-stock-vs-staged.json", old)
    new = _io1024(_variant(res, scale=1.2), "2099-02-01T00:00:00Z",
                  {a: {256: (9300.0, False), 1: (220.0, False)}, b: {256: (15300.0, True), 1: (215.0, False)}})
    report.write_json(runs / "new" / "ab-nemotron-h-8b-stock-vs-staged.json", new)
    g = "qwen3-next-80b-a3b-e64"
    gs = _io1024(_variant(res, model=g), "2099-02-01T01:00:00Z")
    gu = _io1024(_variant(res, model=g, b_kind="upstream", scale=0.8), "2099-02-01T01:00:00Z")
    report.write_json(runs / "g" / f"ab-{g}-stock-vs-staged.json", gs)
    report.write_json(runs / "g" / f"ab-{g}-stock-vs-upstream.json", gu)
    out = tmp_path / "out"
    assert e2e_summary.main([str(runs), "--out-dir", str(out)]) == 0
    dec = json.loads((out / "e2e-decode-h200.json").read_text())["summary"]
    base = _tok_s(res, b, 256) / _tok_s(res, a, 256)
    assert abs(dec["nemotron_h_speedup_bs256"] - base) < 1e-9  # the old keys stay on the old standard workload
    assert Path(dec["sources"]["nemotron_h_speedup_bs256"]).parent.name == "std"
    assert abs(dec["nemotron_h_speedup_bs256_io1024"] - 1.2 * base) < 1e-9
    assert abs(dec["nemotron_h_decode_rate_speedup_bs256_io1024"] - 15300.0 / 9300.0) < 1e-9
    assert abs(dec["nemotron_h_speedup_bs1_io1024"] - 1.2 * _tok_s(res, b, 1) / _tok_s(res, a, 1)) < 1e-9
    assert Path(dec["sources"]["nemotron_h_speedup_bs256_io1024"]).parent.name == "new"
    assert abs(dec["gdn_vs_upstream_bs256_io1024"] - 1.25) < 1e-9
    # the io1024 runs have their own keys: they are no "other workload"
    assert dec["nemotron_h_other_workload_speedup_bs256"] is None
    # the new run's batch-256 row is flagged (ours); the old flagged run is read by no key
    assert dec["client_path_bound_runs"] == 1 and "new/" in dec["client_path_bound_list"][0]
    assert dec["met"]["client_path_bound_runs"] is False and dec["targets"]["client_path_bound_runs"] == 0
    assert dec["met"]["nemotron_h_decode_rate_speedup_bs256_io1024"] is True  # 1.645 >= 1.6
    md = (out / "e2e-decode-h200.md").read_text()
    assert "| nemotron_h_decode_rate_speedup_bs256_io1024 | 1.645 | 1.60 | yes | new |" in md
    assert "| client_path_bound_runs | 1 | 0 | no |" in md and "| 1024/1024 x2, stream interval 8 |" in md


def test_arm_decode_rate_prefers_the_recorded_rates_and_falls_back_to_the_log():
    rec = {"decode_tok_s": 15000.0, "client_path_bound": False}
    # the recorded rate, the flag judged again by today's rule: the client's 256 / median ITL against it
    assert e2e_summary.arm_decode_rate(rec, {"median_itl_ms": 17.0}, 1.0, 256) == (15000.0, False)
    assert e2e_summary.arm_decode_rate(rec, {"median_itl_ms": 99.0}, 1.0, 256) == (15000.0, True)
    # a run recorded under the TPOT rule (the 8B 1024/1024 x2 run: TPOT 21.33 ms holds the second wave's
    # prefills, the median ITL 17.05 ms does not): flagged then, not now
    old = {"decode_tok_s": 15068.6, "client_path_bound": True, "full_batch": 256}
    assert e2e_summary.arm_decode_rate(old, {"median_tpot_ms": 21.33, "median_itl_ms": 17.05}, None, 256) == \
        (15068.6, False)
    assert e2e_summary.arm_decode_rate(old, None, None, 256) == (15068.6, True)  # no bench result: as recorded
    assert e2e_summary.arm_decode_rate(dict(old, client_path_not_judged="prefill"), {"median_itl_ms": 99.0},
                                       None, 256) == (15068.6, None)
    # an older run: the log's rate at exactly the batch against the client's batch / TPOT (256 / 35.4 ms = 7232)
    rate, bound = e2e_summary.arm_decode_rate(None, {"median_tpot_ms": 35.4}, 15300.0, 256)
    assert rate == 15300.0 and bound is True
    assert e2e_summary.arm_decode_rate(None, {"median_tpot_ms": 16.5}, 15300.0, 256) == (15300.0, False)
    assert e2e_summary.arm_decode_rate(None, {"median_tpot_ms": 16.5}, None, 256) == (None, None)


PREFIX_RUN = Path(__file__).resolve().parents[2] / "eval" / "results" / "e2e-h200" / "prefix-tiny-nemotron-h" / \
    "ab-tiny-nemotron-h-stock-vs-staged.json.gz"


def _prefix_variant(res, *, model, radix="default", batch=None, ttft_scale=1.0, status="ok", upstream_ttft=None):
    r = copy.deepcopy(res)
    r["model"]["name"] = model
    r["model"].pop("size", None)
    r["bench"]["radix_cache"] = radix
    r["started"] = "2026-12-03T00:00:00Z"
    staged = r["arms"]["staged"]
    staged["status"] = status
    for e in staged["bench"] + r["arms"]["stock"]["bench"]:
        e["batch"] = batch or e["batch"]
    for e in staged["bench"]:
        e["result"]["median_ttft_ms"] *= ttft_scale
    if upstream_ttft is not None:
        up = copy.deepcopy(r["arms"]["stock"])
        up["phase"]["kind"] = "upstream"
        for e in up["bench"]:
            e["result"]["median_ttft_ms"] = upstream_ttft
        r["arms"]["upstream"] = up
    return r


def test_prefix_summary_reads_each_target_from_its_models_latest_run(tmp_path):
    """e2e-prefix-h200: the committed tiny shared-prefix run gives the parity key (ours and stock's |Δlogprob|);
    variants of it as the two target geometries give the hit-rate, TTFT, decode-rate and defaults-launch keys, each
    from the latest run of the model it names; a failed default launch makes defaults_launch_ok 0."""
    res = report.read_json(PREFIX_RUN)
    st, sg = res["arms"]["stock"]["bench"][0], res["arms"]["staged"]["bench"][0]
    runs = tmp_path / "runs"
    report.write_json(runs / "t" / "ab-tiny-nemotron-h-stock-vs-staged.json", res)
    n8 = _prefix_variant(res, model="nemotron-h-8b", batch=256, ttft_scale=1.5)
    report.write_json(runs / "n" / "ab-nemotron-h-8b-stock-vs-staged.json", n8)
    g = "qwen3-next-80b-a3b-e64"
    report.write_json(runs / "g" / f"ab-{g}-stock-vs-staged.json",
                      _prefix_variant(res, model=g, upstream_ttft=4 * sg["result"]["median_ttft_ms"]))
    out = tmp_path / "out"
    assert e2e_summary.main([str(runs), "--out-dir", str(out)]) == 0
    doc = json.loads((out / "e2e-prefix-h200.json").read_text())
    s = doc["summary"]
    hit = sg["prefix_cache"]["hit_rate"] / st["prefix_cache"]["hit_rate"]
    assert abs(s["prefix_hit_rate_vs_stock"] - hit) < 1e-9
    ttft = sg["result"]["median_ttft_ms"] / st["result"]["median_ttft_ms"]
    assert abs(s["ttft_p50_vs_stock"] - 1.5 * ttft) < 1e-9
    assert abs(s["ttft_p50_vs_upstream"] - 0.25) < 1e-9
    assert abs(s["decode_rate_speedup_prefix_bs256"] - sg["rates"]["decode_tok_s"] / st["rates"]["decode_tok_s"]) < 1e-9
    pp = res["summary"]["prefix_parity"]
    assert s["prefix_parity_max_abs_logprob_diff"] == pp["staged"]["max_abs_dlogprob"]
    assert s["prefix_parity_max_abs_logprob_diff_stock"] == pp["stock"]["max_abs_dlogprob"]
    assert s["defaults_launch_ok"] == 1
    assert sorted((r["model"], r["arm"]) for r in doc["runs"]) == [
        ("nemotron-h-8b", "staged"), (g, "staged"), (g, "upstream"), ("tiny-nemotron-h", "staged")]
    md = (out / "e2e-prefix-h200.md").read_text()
    assert "| ttft_p50_vs_upstream |" in md and "| t (5029b6f) |" in md
    assert (out / "e2e-prefix-h200.png").exists() == report.have_matplotlib()
    # a later run of the 8B whose launch on the defaults failed; an extra_buffer-flag run says nothing about defaults
    failed = _prefix_variant(res, model="nemotron-h-8b", batch=256, status="failed: exit 1")
    failed["started"] = "2026-12-04T00:00:00Z"
    report.write_json(runs / "n2" / "ab-nemotron-h-8b-stock-vs-staged.json", failed)
    s = e2e_summary.prefix_summary(e2e_summary.load_results([runs]))["summary"]
    assert s["defaults_launch_ok"] == 0 and s["defaults_launch_by_model"]["nemotron-h-8b"] == 0
    s = e2e_summary.prefix_summary(e2e_summary.load_results([runs / "t"]))["summary"]
    assert s["defaults_launch_ok"] is None and s["prefix_hit_rate_vs_stock"] is None


def test_prefix_rows_join_the_upstream_arm_from_its_own_file_and_read_capped_rates_from_the_logs(tmp_path):
    """eval.ab writes stock-vs-staged and stock-vs-upstream of one run to two files: our TTFT is compared with the
    upstream arm of the same run (model, start time). A run at a concurrency above the servers' max running
    requests, recorded with no decode rate, gets it from each arm's server log (lines from 90% of its cap up). The
    parity key reads the latest tiny run that measured parity (a later spec run cut short measured none)."""
    res = report.read_json(PREFIX_RUN)
    g = "qwen3-next-80b-a3b-e64"
    runs = tmp_path / "runs"
    base = _prefix_variant(res, model=g, batch=256)
    for arm, cap in (("stock", 102), ("staged", 95)):
        base["arms"][arm]["facts"]["max_running_requests"] = cap
        for e in base["arms"][arm]["bench"]:
            e["rates"]["decode_tok_s"] = None
    report.write_json(runs / "g" / f"ab-{g}-stock-vs-staged.json", base)
    ups = copy.deepcopy(base)
    up = ups["arms"].pop("staged")
    up["phase"]["kind"] = "upstream"
    for e in up["bench"]:
        e["result"]["median_ttft_ms"] = 4 * base["arms"]["staged"]["bench"][0]["result"]["median_ttft_ms"]
    ups["arms"]["upstream"] = up
    report.write_json(runs / "g" / f"ab-{g}-stock-vs-upstream.json", ups)
    line = ("[2026-12-02 16:48:40] Decode batch, #running-req: {n}, #full token: 1, full token usage: 0.01, mamba "
            "num: 1, mamba usage: 0.5, cuda graph: True, gen throughput (token/s): {x}, #queue-req: 3\n")
    logs = runs / "g" / f"logs-ab-{g}"
    logs.mkdir()
    (logs / "server-stock.log").write_text(line.format(n=64, x=9999) + line.format(n=101, x=7000)
                                           + line.format(n=102, x=7600) + line.format(n=102, x=7400))
    with gzip.open(logs / "server-staged.log.gz", "wt") as f:
        f.write(line.format(n=95, x=10400) + line.format(n=80, x=5000))
    tiny_cut = copy.deepcopy(res)
    tiny_cut["started"] = "2026-12-05T00:00:00Z"
    tiny_cut["summary"]["prefix_parity"] = {}
    for e in tiny_cut["arms"]["staged"]["bench"]:
        e["rates"]["decode_tok_s"] = None
    report.write_json(runs / "t" / "ab-tiny-nemotron-h-stock-vs-staged.json", res)
    report.write_json(runs / "t2" / "ab-tiny-nemotron-h-nextn-stock-vs-staged.json", tiny_cut)
    doc = e2e_summary.prefix_summary(e2e_summary.load_results([runs]))
    ours = [r for r in doc["runs"] if r["model"] == g and r["arm"] == "staged"]
    assert len(ours) == 1 and ours[0]["ttft_p50_vs_upstream"] == pytest.approx(0.25)
    assert ours[0]["decode_rate"] == 10400 and ours[0]["stock_decode_rate"] == 7400  # median of 7000/7600/7400
    assert doc["summary"]["ttft_p50_vs_upstream"] == pytest.approx(0.25)
    pp = res["summary"]["prefix_parity"]
    assert doc["summary"]["prefix_parity_max_abs_logprob_diff"] == pp["staged"]["max_abs_dlogprob"]
    # a shared-prefix run is no decode or speculative speed figure (prefill in every step)
    results = e2e_summary.load_results([runs])
    assert e2e_summary.decode_speed(results)["by_batch"] == [] and e2e_summary.spec_speed(results) == []
    # below its cap a run that recorded no rate stays without one (the log could hold other runs' lines)
    assert e2e_summary.capped_decode_rate(runs / "g" / f"ab-{g}-stock-vs-staged.json",
                                          dict(base["arms"]["stock"], label="stock"), 64) is None


def test_eagle_summary_keys_from_tree_and_chain_runs(tmp_path):
    """e2e-tree-h200: an EAGLE tree run (topk 4, 8 draft tokens) and an EAGLE chain run of Nemotron-H-8B give the
    batch-64 speed keys and the tree's capacity ratio; the tiny recorded greedy comparison, relabelled as an EAGLE
    tree, gives the greedy excess (ours minus stock's); none of them reaches the NEXTN summary."""
    res = json.loads((DATA / "ab_result_sample.json").read_text())
    a, b = res["summary"]["a"], res["summary"]["b"]
    for arm in res["arms"].values():
        arm["phase"]["spec"] = True
        for e in arm["bench"]:
            e["batch"] = 64 if e["batch"] == 32 else e["batch"]
    res["summary"]["max_running_requests"] = {a: 64, b: 320}
    tree = copy.deepcopy(res)
    tree["flags"]["harness"].update(spec="eagle", spec_topk=4, spec_draft_tokens=8, sim_acc_len=3.0)
    chain = _variant(res, scale=0.8)
    chain["flags"]["harness"].update(spec="eagle", spec_topk=1, sim_acc_len=3.0)
    chain["started"] = "2099-01-01T00:00:00Z"    # another run (runs are told apart by model and start)
    runs = tmp_path / "runs"
    report.write_json(runs / "t" / "ab-nemotron-h-8b-eagle-tree.json", tree)
    report.write_json(runs / "c" / "ab-nemotron-h-8b-eagle-chain.json", chain)
    root = Path(__file__).parents[2] / "eval" / "results" / "e2e-h200"
    f, tiny = next((f, r) for f, r in e2e_summary.load_results([root / "tiny-launcher-default"])
                   if r["flags"]["harness"]["spec"] == "nextn" and r["flags"]["harness"]["model"] == "tiny-nemotron-h")
    tiny = copy.deepcopy(tiny)
    tiny["flags"]["harness"].update(spec="eagle", spec_topk=4, spec_draft_tokens=8)
    report.write_json(runs / "g" / "ab-tiny-nemotron-h-eagle-tree.json", tiny)
    out = tmp_path / "out"
    assert e2e_summary.main([str(runs), "--out-dir", str(out)]) == 0
    s = json.loads((out / "e2e-tree-h200.json").read_text())["summary"]
    want = _tok_s(res, b, 64) / _tok_s(res, a, 64)
    assert abs(s["tree_vs_stock_tree_bs64"] - want) < 1e-9 and abs(s["eagle_chain_vs_stock_bs64"] - 0.8 * want) < 1e-9
    assert s["tree_capacity_ratio"] == 5.0
    svn = tiny["summary"]["spec_vs_nonspec"]
    tb = tiny["summary"]["b"]
    ours, stock = svn[tb]["mismatches"], svn[tiny["summary"]["a"]]["mismatches"]
    assert s["tree_greedy_excess_mismatches"] == ours - stock
    md = (out / "e2e-tree-h200.md").read_text()
    assert "| tree_vs_stock_tree_bs64 |" in md
    assert "| nemotron-h-8b | 4 | 8 | 64 | 3.0 |" in md  # each speed row says whether its acceptance was simulated
    nextn = json.loads((out / "e2e-spec-h200.json").read_text())
    assert nextn["speed"] == [] and nextn["runs"] == []
    assert (out / "e2e-tree-h200.png").stat().st_size > 0


def test_eagle_rows_carry_each_arms_decode_rate_and_its_batch():
    """The committed 8B tree run: each speed row has SGLang's decode rate of both arms as recorded, with the batch it
    was read at (stock at its running cap of 48 under a concurrency of 64), and the md names that batch."""
    root = Path(__file__).resolve().parents[2] / "eval" / "results" / "e2e-h200"
    results = e2e_summary.load_results([root / "eagle-nemotron-h-8b-tree"])
    (row,) = e2e_summary.spec_speed(results, eagle=True)
    (res,) = [r for _, r in results]
    rec = {lab: next(e["rates"] for e in arm["bench"] if e["batch"] == 64) for lab, arm in res["arms"].items()}
    assert row["staged_decode_tok_s"] == rec["staged"]["decode_tok_s"] and row["stock_decode_full_batch"] == 48
    assert row["stock_decode_tok_s"] == rec["stock"]["decode_tok_s"]
    assert row["staged_client_path_bound"] is rec["staged"]["client_path_bound"]
    md = (Path(__file__).resolve().parents[2] / "eval" / "results" / "e2e-tree-h200.md").read_text()
    assert f"{report.fmt(rec['stock']['decode_tok_s'], 0)} (at 48)" in md


def test_shared_prefix_runs_are_no_speculative_run_or_non_speculative_baseline():
    """The committed tree EAGLE run borrows its non-speculative baseline from the nearest plain run of the tiny
    model (tiny-decode), never from a shared-prefix run, though prefix-tiny-nemotron-h is nearer in time; the NEXTN
    shared-prefix run is summarised in e2e-prefix only, not among the speculative runs."""
    root = Path(__file__).resolve().parents[2] / "eval" / "results" / "e2e-h200"
    dirs = [root / d for d in ("tiny-decode", "prefix-tiny-nemotron-h", "prefix-tiny-qwen3-next-nextn",
                               "tree-tiny-nemotron-h-eagle")]
    results = e2e_summary.load_results(dirs)
    runs = e2e_summary.arms_by_run(results)
    assert runs and not any("/prefix-" in a["file"] for arms in runs.values() for a in arms.values())
    (tree,) = [r for r in e2e_summary.spec_speed(results, eagle=True) if r["batch"] == 1]
    assert "/tiny-decode/" in tree["stock_nonspec_file"] and tree["stock_nonspec_tok_s"]
    assert not any("/prefix-" in r["file"] for r in e2e_summary.spec_summary(results)["runs"])
    assert any("/prefix-tiny-qwen3-next-nextn/" in r["file"] for r in e2e_summary.prefix_runs(results))


def test_a_single_arm_run_is_no_speculative_comparison():
    """The committed profiled run of our NEXTN server alone (spec-nemotron-h-8b-prof-a040a5c, one arm) compares
    nothing: it is not among the speculative runs and no target reads it; the standard-workload run beside it
    still gives the Nemotron-H-8B ratios."""
    root = Path(__file__).resolve().parents[2] / "eval" / "results" / "e2e-h200"
    results = e2e_summary.load_results([root / "spec-nemotron-h-8b-prof-a040a5c", root / "spec-nemotron-h-8b-std-16b1851"])
    ((_, alone),) = [(f, r) for f, r in results if "-prof-" in str(f)]
    assert alone["summary"]["b"] is None and len(alone["arms"]) == 1
    runs = e2e_summary.spec_summary(results)["runs"]
    assert [Path(r["file"]).parent.name for r in runs] == ["spec-nemotron-h-8b-std-16b1851"]
    assert runs[0]["arms"] == "staged vs stock"
    rows = [r for r in e2e_summary.spec_speed(results) if r["batch"] == 256]
    assert rows and all("-prof-" not in r["file"] for r in rows)
    assert any(r["spec_vs_stock_nonspec"] and abs(r["spec_vs_stock_nonspec"] - 1.329) < 1e-3 for r in rows)


def test_capped_rates_are_read_only_where_the_log_can_tell_the_run(tmp_path):
    """capped_decode_rate: a result recorded with the cap (``full_batch`` in its rates) keeps what it recorded; an
    arm with two batches above its cap gets none (their lines cannot be told apart); the log is the run's own
    (``logs-<result name up to the arms>``), not another model's beside it. A plain-decode row of two servers
    read at different full batches has no decode-rate ratio."""
    res = report.read_json(PREFIX_RUN)
    arm = dict(copy.deepcopy(res["arms"]["stock"]), label="stock")
    arm["facts"]["max_running_requests"] = 100
    (entry,) = arm["bench"]
    entry["batch"] = 256
    entry["rates"].pop("full_batch", None)
    run = tmp_path / "run"
    line = ("[2026-12-02 16:48:40] Decode batch, #running-req: {n}, #full token: 1, full token usage: 0.01, mamba "
            "num: 1, mamba usage: 0.5, cuda graph: True, gen throughput (token/s): {x}, #queue-req: 3\n")
    for d, x in (("logs-ab-tiny-nemotron-h", 5000), ("logs-ab-tiny-nemotron-h-nextn", 9000)):
        (run / d).mkdir(parents=True)
        (run / d / "server-stock.log").write_text(line.format(n=100, x=x))
    f = run / "ab-tiny-nemotron-h-stock-vs-staged.json"
    assert e2e_summary.capped_decode_rate(f, arm, 256) == 5000
    assert e2e_summary.capped_decode_rate(run / "ab-tiny-nemotron-h-nextn-stock-vs-staged.json", arm, 256) == 9000
    assert e2e_summary.capped_decode_rate(run / "ab-other-model-stock-vs-staged.json", arm, 256) is None
    recorded = copy.deepcopy(arm)
    recorded["bench"][0]["rates"]["full_batch"] = 100
    assert e2e_summary.capped_decode_rate(f, recorded, 256) is None
    two = copy.deepcopy(arm)
    two["bench"].append(dict(copy.deepcopy(entry), batch=128))
    assert e2e_summary.capped_decode_rate(f, two, 256) is None
    for cap in (0, True, None):
        arm["facts"]["max_running_requests"] = cap
        assert e2e_summary.capped_decode_rate(f, arm, 256) is None


def test_decode_rows_compare_decode_rates_only_at_one_full_batch(tmp_path):
    res = report.read_json(PREFIX_RUN)
    r = copy.deepcopy(res)
    r["bench"]["workload"] = "none"
    r["model"]["name"] = "nemotron-h-8b"
    r["model"].pop("size", None)
    for lab, fb in (("stock", 64), ("staged", 60)):
        for e in r["arms"][lab]["bench"]:
            e["rates"]["full_batch"] = fb
    report.write_json(tmp_path / "ab-nemotron-h-8b-stock-vs-staged.json", r)
    (row,) = e2e_summary.decode_speed(e2e_summary.load_results([tmp_path]))["by_batch"]
    assert row["full_batch"] == {"stock": 64, "arm": 60} and row["decode_rate_speedup"] is None
    assert row["stock_decode_tok_s"] and row["arm_decode_tok_s"]
    for e in r["arms"]["staged"]["bench"]:
        e["rates"]["full_batch"] = 64
    report.write_json(tmp_path / "ab-nemotron-h-8b-stock-vs-staged.json", r)
    (row,) = e2e_summary.decode_speed(e2e_summary.load_results([tmp_path]))["by_batch"]
    assert row["decode_rate_speedup"] == report.ratio(row["arm_decode_tok_s"], row["stock_decode_tok_s"])


def test_prefix_markdown_names_spec_caps_and_runs_that_measured_nothing(tmp_path):
    root = Path(__file__).resolve().parents[2] / "eval" / "results" / "e2e-h200"
    doc = e2e_summary.prefix_summary(e2e_summary.load_results(
        [root / d for d in ("prefix-nemotron-h-8b", "prefix-tiny-nemotron-h-nextn-cut")]))
    e2e_summary.write_prefix(doc, tmp_path)
    md = (tmp_path / "e2e-prefix-h200.md").read_text()
    assert "| spec | batch | max running (arm / stock) |" in md
    assert "| nemotron-h-8b | staged | default | none | 256 | 95 / 102 | ok |" in md
    assert "| tiny-nemotron-h | staged | default | nextn | 64 | 64 / — | ok, nothing measured |" in md


def test_speed_table_names_the_batch_a_capped_decode_rate_was_read_at():
    """eval.ab's speed table: a decode rate read at a server's running cap says so; a run whose client-path flag
    is not judged (shared-prefix) says that instead of a blank."""
    res = report.read_json(PREFIX_RUN)
    r = copy.deepcopy(res)
    for lab, fb in (("stock", 64), ("staged", 60)):
        for e in r["arms"][lab]["bench"]:
            e["rates"].update(full_batch=fb, client_path_bound=None, client_path_not_judged="prefill")
    table = ab_report.speed_table(r)
    rate = r["arms"]["staged"]["bench"][0]["rates"]["decode_tok_s"]
    assert f"{report.fmt(rate, 0)} (at 60)" in table and "(at 64)" not in table
    assert "stock: not judged, staged: not judged" in table


def test_the_conv1d_kernel_state_comes_from_the_record_or_the_committed_server_log(tmp_path):
    """The replay arm's conv_verify: its record when it says, else the plugin's line in the server log beside the
    result (gzipped as committed), else None (runs from before the setting)."""
    line = ("[t replayssm pid=7] INFO sglang_replayssm active (pid 7): L=16, ssm_types=mamba2, spec=True, "
            "replay_ring=True, conv_verify={}, kernel config x, 9 patch(es) verified\n")
    f = tmp_path / "ab-x.json"
    assert e2e_summary._conv_verify({"replayssm_conv_verify": False}, f, "staged") is False
    assert e2e_summary._conv_verify({}, f, "staged") is None
    with gzip.open(tmp_path / "server-staged.log.gz", "wt") as fh:
        fh.write(line.format("True") * 2)
    assert e2e_summary._conv_verify({}, f, "staged") is True
    assert e2e_summary._conv_verify({"replayssm_conv_verify": None}, f, "staged") is True
    (tmp_path / "server-patched.log").write_text(line.format("False"))
    assert e2e_summary._conv_verify({}, f, "patched") is False
    (tmp_path / "server-old.log").write_text("sglang_replayssm active (pid 7): L=16, replay_ring=True, kernel config x")
    assert e2e_summary._conv_verify({}, f, "old") is None
