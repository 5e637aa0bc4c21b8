"""eval.decode_vs_verify: case matching, the ratio, the verdict rule and its refusals (fake benchmark JSONs)."""

import json

import pytest

from eval import decode_vs_verify as dvv


def _result(times, spec=None, L=16):
    cases = [{"family": f, "geometry": g, "state_dtype": d, "batch": b, "t_ours_us": t, "t_stock_us": 2 * t}
             for (f, g, d, b), t in times.items()]
    out = {"git_commit": "abc", "gpu": "fake", "L": L, "cases": cases}
    if spec is not None:
        out["spec"] = spec
    return out


T1 = {"T": 1, "accept": 1, "length": 16}


def test_within_tolerance_says_serve_as_verify():
    d = _result({("gdn", "g", "fp32", 1): 10.0, ("gdn", "g", "fp32", 256): 100.0})
    v = _result({("gdn", "g", "fp32", 1): 10.2, ("gdn", "g", "fp32", 256): 99.0}, T1)
    res = dvv.compare(d, v)
    s = res["summary"]
    assert s["cases"] == 2 and s["all_within_tolerance"]
    assert s["max_verify_over_decode"] == pytest.approx(1.02)
    assert s["min_verify_over_decode"] == pytest.approx(0.99)
    assert "T = 1 verify" in s["verdict"]


def test_one_slow_case_keeps_both_and_names_it():
    d = _result({("mamba2", "m", "bf16", 32): 10.0, ("mamba2", "m", "fp32", 32): 10.0, ("gdn", "g", "fp32", 32): 5.0})
    v = _result({("mamba2", "m", "bf16", 32): 11.0, ("mamba2", "m", "fp32", 32): 10.1, ("gdn", "g", "fp32", 32): 5.0},
                T1)
    s = dvv.compare(d, v)["summary"]
    assert not s["all_within_tolerance"] and "keep both" in s["verdict"]
    assert s["max_at"] == {"family": "mamba2", "geometry": "m", "state_dtype": "bf16", "batch": 32}
    assert s["by_family"]["gdn"]["max_verify_over_decode"] == pytest.approx(1.0)


def test_unmatched_and_filtered_cases_are_left_out():
    d = _result({("gdn", "g", "fp32", 1): 10.0, ("gdn", "g", "fp32", 8): 10.0, ("gdn", "g", "bf16", 1): 10.0})
    v = _result({("gdn", "g", "fp32", 1): 10.0, ("gdn", "g", "fp32", 8): 50.0}, T1)
    res = dvv.compare(d, v, batches=[1, 32, 256])
    assert [(r["state_dtype"], r["batch"]) for r in res["rows"]] == [("fp32", 1)]


@pytest.mark.parametrize("spec, match", [({"T": 4, "accept": 3, "length": 5}, "not a T = 1"),
                                         ({"T": 1, "accept": 1, "length": 8}, "flush cycles differ")])
def test_refuses_wrong_verify_run(spec, match):
    d = _result({("gdn", "g", "fp32", 1): 10.0})
    v = _result({("gdn", "g", "fp32", 1): 10.0}, spec)
    with pytest.raises(ValueError, match=match):
        dvv.compare(d, v)


def test_no_common_case_is_an_error():
    with pytest.raises(ValueError, match="no case"):
        dvv.compare(_result({("gdn", "g", "fp32", 1): 1.0}), _result({("gdn", "g", "fp32", 2): 1.0}, T1))


def test_cli_writes_json_and_markdown(tmp_path):
    dp, vp, out = tmp_path / "d.json", tmp_path / "v.json", tmp_path / "dvv.json"
    dp.write_text(json.dumps(_result({("gdn", "g", "fp32", 256): 100.0})))
    vp.write_text(json.dumps(_result({("gdn", "g", "fp32", 256): 104.0}, T1)))
    assert dvv.main(["--decode", str(dp), "--verify", str(vp), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["git_commit"] == "abc" and res["rows"][0]["verify_over_decode"] == pytest.approx(1.04)
    md = out.with_suffix(".md").read_text()
    assert "| gdn" in md and "1.040" in md and "keep both" in md
    assert "one GPU run" in md


def test_cli_names_both_commits_of_two_runs(tmp_path):
    dp, vp, out = tmp_path / "d.json", tmp_path / "v.json", tmp_path / "dvv.json"
    dp.write_text(json.dumps(_result({("gdn", "g", "fp32", 256): 100.0})))
    v = _result({("gdn", "g", "fp32", 256): 104.0}, T1)
    v["git_commit"] = "def"
    vp.write_text(json.dumps(v))
    assert dvv.main(["--decode", str(dp), "--verify", str(vp), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["git_commit"] == ["abc", "def"] and (res["decode_commit"], res["verify_commit"]) == ("abc", "def")
    md = out.with_suffix(".md").read_text()
    assert "commit abc, def" in md and "decode at abc, verify at def: two runs" in md
