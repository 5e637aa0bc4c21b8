"""eval/pick_verify_config.py on the recorded H200 verify benchmark (eval/results/spec-kernels-h200.json)
and variants of it: the fastest correct variant per family goes into the launch-config YAML."""
import copy
import json
from pathlib import Path

import pytest
import yaml

from eval import pick_verify_config as pvc

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "eval" / "results" / "spec-kernels-h200.json"


def _recorded():
    """The recorded run, its launch configs less the parameters removed since it ran (the run is from an earlier
    commit; a pick is written at the commit that timed it)."""
    from sglang_replayssm.kernels import common, gdn_verify, mamba2_verify  # noqa: F401 (their registrations)

    doc = json.loads(H200.read_text())
    for family, key in pvc.FAMILY_KEY.items():
        cfg = doc["ours"][family]["config"]
        known = common.family_defaults(key)
        doc["ours"][family]["config"] = {k: v for k, v in cfg.items() if k in known}
    return doc


def _variant(doc, family, factor, config=None, passed=True):
    d = copy.deepcopy(doc)
    for c in d["cases"]:
        if c["family"] == family:
            c["t_ours_us"] *= factor
    for c in d["correctness"]:
        if c["family"] == family:
            c["passed"] = passed
    if config:
        d["ours"][family]["config"] = dict(d["ours"][family]["config"], **config)
    return d


def test_score_is_the_geomean_of_batch_1_32_and_256():
    doc = json.loads(H200.read_text())
    for fam in ("mamba2", "gdn"):
        t = {c["batch"]: c["t_ours_us"] for c in doc["cases"] if c["family"] == fam and c["state_dtype"] == "fp32"}
        assert pvc.score(doc, fam) == pytest.approx((t[1] * t[32] * t[256]) ** (1 / 3))
    no32 = copy.deepcopy(doc)
    no32["cases"] = [c for c in no32["cases"] if c["batch"] != 32]
    assert pvc.score(no32, "mamba2") is None  # a run that did not time every pick batch is not scored
    failed = _variant(doc, "gdn", 1.0, passed=False)
    assert pvc.score(failed, "gdn") is None and pvc.score(failed, "mamba2") is not None


def test_pick_fastest_correct_variant_and_write_yaml(tmp_path):
    doc = _recorded()
    docs = [doc,
            _variant(doc, "mamba2", 0.4, {"reduce": "token", "num_warps": 1}),
            _variant(_variant(doc, "gdn", 0.3, {"scores": "pre"}, passed=False), "mamba2", 0.5)]
    picked = pvc.pick(docs, ["packaged", "w1-token", "broken-gdn"])
    assert picked["mamba2"]["variant"] == "w1-token" and picked["mamba2"]["config"]["reduce"] == "token"
    assert picked["gdn"]["variant"] in ("packaged", "w1-token")  # the faster gdn run failed its check
    assert picked["gdn"]["all"]["broken-gdn"] is None
    base = ROOT / "sglang_replayssm" / "kernels" / "configs" / "h200.yaml"
    out = tmp_path / "picked.yaml"
    pvc.write_yaml(picked, base, out)
    y = yaml.safe_load(out.read_text())
    original = yaml.safe_load(base.read_text())
    assert y["mamba2_verify"]["default"] == picked["mamba2"]["config"]
    assert y["gdn_verify"]["default"] == picked["gdn"]["config"]
    for family in original:  # the rest of the packaged file is kept as it is
        if family not in ("mamba2_verify", "gdn_verify"):
            assert y[family] == original[family]
    assert "variant w1-token" in out.read_text()
    # and the picked file is a valid launch-config file for the verify wrappers
    from sglang_replayssm.kernels import common
    from sglang_replayssm.kernels.mamba2_verify import MAMBA2_VERIFY_DEFAULT_LAUNCH

    cfg = common.launch_config("mamba2_verify", "H128_P64_N128_G8_R20_T4", MAMBA2_VERIFY_DEFAULT_LAUNCH, path=str(out))
    assert cfg["reduce"] == "token" and cfg["num_warps"] == 1


def test_main_writes_nothing_without_a_correct_run(tmp_path, capsys):
    doc = _variant(_variant(json.loads(H200.read_text()), "gdn", 1.0, passed=False), "mamba2", 1.0, passed=False)
    p = tmp_path / "spec-x.json"
    p.write_text(json.dumps(doc))
    assert pvc.main([str(p), "--out", str(tmp_path / "o.yaml")]) == 1
    assert not (tmp_path / "o.yaml").exists()
    ok = tmp_path / "spec-packaged.json"
    ok.write_text(H200.read_text())
    assert pvc.main([str(ok), str(p), "--out", str(tmp_path / "o.yaml")]) == 0
    assert "packaged" in capsys.readouterr().out and (tmp_path / "o.yaml").exists()


def test_main_reads_gzipped_records_and_names_them_by_variant(tmp_path, capsys):
    """gpu_spec_variants.sh packs its records gzip-compressed (spec-<variant>.json.gz): the pick reads them and
    names the variant without either suffix."""
    import gzip

    slow = tmp_path / "spec-slow.json.gz"
    with gzip.open(slow, "wt") as f:
        json.dump(_variant(_recorded(), "mamba2", 1.5), f)
    fast = tmp_path / "spec-fast.json.gz"
    with gzip.open(fast, "wt") as f:
        json.dump(_variant(_recorded(), "mamba2", 0.5, config={"BLOCK_M": 16}), f)
    assert pvc.main([str(slow), str(fast), "--out", str(tmp_path / "o.yaml")]) == 0
    out = capsys.readouterr().out
    assert "mamba2_verify: fast (" in out
    head = (tmp_path / "o.yaml").read_text()
    assert "variant fast (" in head and "slow " in head and ".json" not in head.split("\n", 1)[1]
    assert yaml.safe_load(head)["mamba2_verify"]["default"]["BLOCK_M"] == 16
