"""Launch checks of speculative decoding (patches/server_args.py ``spec_reasons`` / ``draft_model_problem``, the
launcher's ``draft_model_problem``): EAGLE with a separate draft model, tree shapes against the spec ring, and
malformed draft configs, on SGLang 0.5.17's real ServerArgs (built on CPU)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_replayssm import launch_server, models
from sglang_replayssm.config import ReplaySSMConfig
from sglang_replayssm.patches import apply, server_args as sa, unapply_all
from sglang_replayssm.patches.server_args import (UnsupportedConfigError, draft_model_problem, tree_max_nodes,
                                                  unsupported_reasons)

from ._sglang_cpu import clean_env, cpu_server_argv
from .test_launcher import run


def _target(tmp_path, name="tiny-nemotron-h"):
    return models.materialize(name, root=tmp_path)


def _draft(tmp_path, target_dir, dirname="draft", **over):
    """A one-layer EAGLE-1 draft (SGLang's LlamaForCausalLMEagle) sized to the target in ``target_dir``."""
    t = json.loads((Path(target_dir) / "config.json").read_text())
    cfg = {"architectures": ["LlamaForCausalLMEagle"], "model_type": "llama", "torch_dtype": "bfloat16",
           "vocab_size": t["vocab_size"], "hidden_size": t["hidden_size"], "intermediate_size": 512,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": t["max_position_embeddings"],
           "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
    cfg.update(over)
    d = Path(tmp_path) / dirname
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def _eagle_argv(target, draft, topk=1, steps=3, ndraft=4):
    return ["--model-path", target, "--load-format", "dummy", "--skip-tokenizer-init", "--device", "cpu",
            "--disable-radix-cache", "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", draft,
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(ndraft)]


@pytest.fixture
def checked(monkeypatch):
    """``prepare_server_args`` + the patched ``check_server_args`` with ReplaySSM enabled (ring length 16)."""
    from sglang.srt.server_args import prepare_server_args

    from sglang_replayssm.config import reset_for_tests

    for k in ("SGLANG_REPLAYSSM_BUFFER_LEN", "SGLANG_REPLAYSSM_SPEC", "SGLANG_REPLAYSSM_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SGLANG_REPLAYSSM_ENABLE", "1")
    reset_for_tests()
    unapply_all()
    apply(sa.PATCHES)

    def make(argv):
        args = prepare_server_args(argv)
        if hasattr(args, "resolve_once"):  # 0.5.23: the engine resolves the record before check_server_args
            args.resolve_once()
        args.check_server_args()
        return args

    yield make
    unapply_all()
    reset_for_tests()


# --------------------------------------------------------------------------------
# chain EAGLE with a separate draft model: accepted
# --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny-nemotron-h", "tiny-qwen3-next"])
def test_chain_eagle_with_a_separate_draft_is_accepted(tmp_path, checked, name):
    target = _target(tmp_path, name)
    draft = _draft(tmp_path, target)
    args = checked(_eagle_argv(target, draft))  # would raise UnsupportedConfigError
    assert args.speculative_algorithm == "EAGLE" and args.speculative_draft_model_path == draft
    assert args.speculative_eagle_topk == 1 and args.speculative_num_draft_tokens == 4


def test_mismatched_draft_fails_in_check_server_args_naming_the_file(tmp_path, checked):
    target = _target(tmp_path)
    draft = _draft(tmp_path, target, hidden_size=512)
    with pytest.raises(UnsupportedConfigError) as e:
        checked(_eagle_argv(target, draft))
    assert f"{draft}/config.json: hidden_size 512 differs from the target's hidden_size 256" in str(e.value)
    assert "--speculative-draft-model-path" in str(e.value)


# --------------------------------------------------------------------------------
# trees
# --------------------------------------------------------------------------------
def test_tree_refusal_switch(tmp_path, checked, monkeypatch):
    """Trees are accepted (the seams are wired); the switch that would refuse them names the flag to change."""
    target = _target(tmp_path)
    draft = _draft(tmp_path, target)
    assert sa.TREE_VERIFY_WIRED is True
    args = checked(_eagle_argv(target, draft, topk=4, ndraft=8))
    assert args.speculative_eagle_topk == 4
    monkeypatch.setattr(sa, "TREE_VERIFY_WIRED", False)
    with pytest.raises(UnsupportedConfigError, match="--speculative-eagle-topk 4: tree verify is not supported"):
        checked(_eagle_argv(target, draft, topk=4, ndraft=8))


def test_tree_shapes(tmp_path, checked, monkeypatch):
    """topk 4 / 8 nodes and topk 8 / 16 nodes fit the default ring (16); a tree with
    more nodes than --replayssm-buffer-len, or more than its steps x topk can hold, is refused naming the flag."""
    monkeypatch.setattr(sa, "TREE_VERIFY_WIRED", True)
    target = _target(tmp_path)
    draft = _draft(tmp_path, target)
    for topk, ndraft in ((4, 8), (8, 16)):
        args = checked(_eagle_argv(target, draft, topk=topk, ndraft=ndraft))
        assert (args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (topk, ndraft)
    fields = getattr(type(args), "__struct_fields__", None)  # 0.5.23: a msgspec Struct, no __dict__
    base = {f: getattr(args, f) for f in fields} if fields else dict(vars(args))
    tree = SimpleNamespace(**{**base, "speculative_eagle_topk": 8, "speculative_num_draft_tokens": 16,
                              "max_speculative_num_draft_tokens": None})
    reasons = unsupported_reasons(tree, ReplaySSMConfig(enable=True, buffer_len=8))
    assert len(reasons) == 1, reasons
    assert reasons[0].startswith("--replayssm-buffer-len 8 is smaller than --speculative-num-draft-tokens 16")
    assert "tree nodes" in reasons[0] and "raise --replayssm-buffer-len to 16 or more" in reasons[0]
    assert unsupported_reasons(tree, ReplaySSMConfig(enable=True, buffer_len=16)) == []
    wide = SimpleNamespace(**{**vars(tree), "speculative_num_steps": 2, "speculative_eagle_topk": 2,
                              "speculative_num_draft_tokens": 8})
    assert tree_max_nodes(2, 2) == 7
    reasons = unsupported_reasons(wide, ReplaySSMConfig(enable=True, buffer_len=16))
    assert reasons == ["--speculative-num-draft-tokens 8: a tree of --speculative-num-steps 2 x "
                       "--speculative-eagle-topk 2 has at most 7 nodes; lower --speculative-num-draft-tokens or raise "
                       "--speculative-num-steps / --speculative-eagle-topk"]


def test_tree_max_nodes_is_sglangs_candidate_count():
    """SGLang picks T - 1 draft nodes among topk + (steps - 1) * topk**2 scored candidates (eagle_utils)."""
    import torch
    from sglang.srt.speculative.eagle_utils import organize_draft_results

    steps, topk, bs = 3, 2, 1
    scores = [torch.rand(bs, 1, topk)] + [torch.rand(bs, topk, topk) for _ in range(steps - 1)]
    tokens = [torch.zeros(bs, topk, dtype=torch.long)] + [torch.zeros(bs, topk * topk, dtype=torch.long)] * (steps - 1)
    parents = [torch.zeros(bs, topk + 1, dtype=torch.long)] + [torch.zeros(bs, topk, dtype=torch.long)] * (steps - 1)
    n = tree_max_nodes(steps, topk)
    organize_draft_results(scores, tokens, parents, n)  # the largest tree: every candidate
    with pytest.raises(RuntimeError):
        organize_draft_results(scores, tokens, parents, n + 1)


# --------------------------------------------------------------------------------
# malformed draft configs: one line naming the file
# --------------------------------------------------------------------------------
def test_draft_config_problems(tmp_path):
    target = _target(tmp_path)
    ok = _draft(tmp_path, target, "ok")
    assert draft_model_problem(target, ok, "EAGLE") is None
    assert draft_model_problem(target, target, "EAGLE") is None  # MTP layers of the target itself
    assert draft_model_problem(target, "org/some-hub-draft", "EAGLE") is None  # not on disk: SGLang downloads it
    assert draft_model_problem(target, None, "EAGLE") is None

    missing = tmp_path / "nowhere"
    assert draft_model_problem(target, str(missing), "EAGLE") == \
        f"draft model directory {missing} does not exist (--speculative-draft-model-path)"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert draft_model_problem(target, str(empty), "EAGLE") == \
        f"{empty}/config.json is missing (--speculative-draft-model-path)"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"hidden_size": 256,\n "vocab_size": }')
    p = draft_model_problem(target, str(broken), "EAGLE")
    assert p.startswith(f"{broken}/config.json is not valid JSON (line 2 column") and p.endswith(
        "(--speculative-draft-model-path)")
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "config.json").write_text("[1, 2]")
    assert "holds a JSON list, not an object" in draft_model_problem(target, str(listed), "EAGLE")

    vocab = _draft(tmp_path, target, "vocab", vocab_size=2048)
    p = draft_model_problem(target, vocab, "NEXTN")
    assert p.startswith(f"{vocab}/config.json: vocab_size 2048 differs from the target's vocab_size 1024 "
                        f"({target}/config.json)")
    hidden = _draft(tmp_path, target, "hidden", hidden_size=128)
    assert "hidden_size 128 differs from the target's hidden_size 256" in draft_model_problem(target, hidden, "EAGLE")
    # a standalone draft is a whole model: its own hidden size, the same vocab
    assert draft_model_problem(target, hidden, "STANDALONE") is None
    assert "vocab_size 2048" in draft_model_problem(target, vocab, "STANDALONE")
    # EAGLE-3 drafts name the target width they read separately from their own width
    e3 = _draft(tmp_path, target, "eagle3", architectures=["LlamaForCausalLMEagle3"], hidden_size=512,
                target_hidden_size=256)
    assert draft_model_problem(target, e3, "EAGLE3") is None
    e3bad = _draft(tmp_path, target, "eagle3bad", hidden_size=256, target_hidden_size=4096)
    assert "target_hidden_size 4096 differs" in draft_model_problem(target, e3bad, "EAGLE3")
    nohidden = tmp_path / "nohidden"
    nohidden.mkdir()
    (nohidden / "config.json").write_text(json.dumps({"vocab_size": 1024}))
    assert draft_model_problem(target, str(nohidden), "EAGLE") == \
        f"{nohidden}/config.json has no hidden_size (--speculative-draft-model-path)"
    for p in (draft_model_problem(target, str(x), "EAGLE") for x in (missing, empty, broken, vocab, hidden)):
        assert "\n" not in p


def test_launcher_refuses_a_malformed_draft_before_sglang(tmp_path):
    target_args = cpu_server_argv(tmp_path)
    target = target_args[target_args.index("--model-path") + 1]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    argv = [*target_args, "--speculative-algorithm", "EAGLE", "--speculative-draft-model", str(broken)]
    assert launch_server.draft_model_problem(argv).startswith(f"{broken}/config.json is not valid JSON")
    assert launch_server.draft_model_problem([*target_args]) is None  # no speculation: nothing to check
    ok = _draft(tmp_path, target)
    assert launch_server.draft_model_problem([*target_args, "--speculative-algorithm", "EAGLE",
                                              "--speculative-draft-model-path", ok]) is None
    r = run(["-m", "sglang_replayssm.launch_server", *argv], env=clean_env())
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m sglang_replayssm.launch_server: error: ")
    assert f"{broken}/config.json is not valid JSON" in lines[0] and "--speculative-draft-model-path" in lines[0]
    # --replayssm-disable launches stock SGLang: its own checks, not ours
    assert launch_server.launch_problem(ReplaySSMConfig(enable=False), [*argv, "--device", "cpu"]) is None
