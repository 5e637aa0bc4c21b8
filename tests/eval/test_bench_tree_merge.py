"""eval.bench_tree_spec --merge-into / --from: the tree keys land in the chain verify benchmark's summary, and a
failed, foreign or empty tree run is refused (fake JSONs, nothing runs)."""

import json

import pytest

from eval import bench_tree_spec as bts

TREE = {"git_commit": "848245cabc", "gpu": "NVIDIA H200", "T": 8, "topk": 4, "accept": 3, "checks_passed": True,
        "summary": {"mamba2_tree_verify_speedup_bs64_fp32": 2.47, "gdn_tree_verify_speedup_bs64_fp32": 1.48}}
SPEC = {"git_commit": "848245c", "gpu": "NVIDIA H200", "summary": {"mamba2_verify_speedup_bs256_fp32": 4.0}}


def _files(tmp_path, tree, spec):
    t, s = tmp_path / "tree.json", tmp_path / "spec.json"
    t.write_text(json.dumps(tree))
    s.write_text(json.dumps(spec))
    return t, s


def test_from_merges_the_tree_keys_and_keeps_the_chain_keys(tmp_path):
    t, s = _files(tmp_path, TREE, SPEC)
    assert bts.main(["--from", str(t), "--merge-into", str(s)]) == 0
    summary = json.loads(s.read_text())["summary"]
    assert summary["mamba2_tree_verify_speedup_bs64_fp32"] == 2.47
    assert summary["gdn_tree_verify_speedup_bs64_fp32"] == 1.48
    assert summary["mamba2_verify_speedup_bs256_fp32"] == 4.0
    assert summary["tree_source"] == {"file": str(t), "git_commit": "848245cabc", "T": 8, "topk": 4, "accept": 3}


@pytest.mark.parametrize("change, match", [({"checks_passed": False}, "did not pass"),
                                           ({"git_commit": "1234567"}, "git_commit"),
                                           ({"gpu": "NVIDIA A100"}, "gpu"),
                                           ({"summary": {"other": 1.0}}, "no tree summary keys")])
def test_refuses_a_run_it_must_not_merge(tmp_path, change, match):
    t, s = _files(tmp_path, {**TREE, **change}, SPEC)
    before = s.read_text()
    with pytest.raises(ValueError, match=match):
        bts.merge_into(json.loads(t.read_text()), str(t), str(s))
    assert s.read_text() == before


def test_from_without_merge_into_is_a_usage_error(tmp_path, capsys):
    t, _ = _files(tmp_path, TREE, SPEC)
    with pytest.raises(SystemExit) as e:
        bts.main(["--from", str(t)])
    assert e.value.code == 2 and "--from needs --merge-into" in capsys.readouterr().err
