"""CPU tests of ``eval.ab --spec eagle``: the built-in dummy-weight EAGLE drafts (eval/models.py) and the
speculative flags every arm gets (eval/ab/plan.py ``spec_shape``, eval/ab/servers.py).

SGLang 0.5.17 itself checks the drafts: its ``ModelConfig`` parses each as a draft model, its model registry
resolves the architecture, and (in a subprocess with SGLang's own single-rank gloo parallel state) the draft
model class is built on the meta device, takes the target's embedding and LM head through
``set_embed_and_head`` (what the EAGLE worker does) and maps [token embedding, target hidden state] through its
``fc`` to the target's hidden size.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from _sglang_cpu_worker import init_cpu_rank, run_worker  # noqa: E402
from eval import ab, models  # noqa: E402

DRAFTED = models.eagle_draft_names()


def _args(*argv):
    return ab.build_parser().parse_args(list(argv))


# --------------------------------------------------------------------------------
# the drafts
# --------------------------------------------------------------------------------
def test_the_issue_geometries_ship_a_draft():
    assert {"nemotron-h-8b", "qwen3-next-80b-a3b", "qwen3-next-80b-a3b-e64"} <= set(DRAFTED)
    with pytest.raises(ValueError, match="no built-in EAGLE draft"):
        models.eagle_draft_config("tiny-falcon-h1")


@pytest.mark.parametrize("name", DRAFTED)
def test_draft_config_follows_its_target(name):
    t, d = models.get(name).config, models.eagle_draft_config(name)
    assert d["architectures"] == [models.EAGLE_DRAFT_ARCH] and d["model_type"] == "llama"
    # what the draft consumes (the target's hidden states) and shares (embedding, LM head, token ids)
    assert d["hidden_size"] == t["hidden_size"] and d["vocab_size"] == t["vocab_size"]
    assert d["max_position_embeddings"] == t["max_position_embeddings"] and d["num_hidden_layers"] == 1
    assert d["eos_token_id"] == t["eos_token_id"]
    assert d["num_attention_heads"] % d["num_key_value_heads"] == 0


def test_materialized_draft_dir(tmp_path):
    d = Path(models.materialize_eagle_draft("tiny-nemotron-h", root=tmp_path))
    cfg = json.loads((d / "config.json").read_text())
    assert cfg == models.eagle_draft_config("tiny-nemotron-h")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    assert tok.vocab_size == cfg["vocab_size"] and tok.decode([7, 8]) == "w7 w8"


@pytest.mark.parametrize("name", DRAFTED)
def test_sglang_parses_the_draft_and_resolves_its_architecture(tmp_path, name):
    mc_mod = pytest.importorskip("sglang.srt.configs.model_config")
    from sglang.srt.models.registry import ModelRegistry

    d = models.materialize_eagle_draft(name, root=tmp_path, tokenizer=False)
    mc = mc_mod.ModelConfig(model_path=d, is_draft_model=True, context_length=4096, speculative_algorithm="EAGLE")
    t = models.get(name).config
    assert mc.hf_config.architectures == [models.EAGLE_DRAFT_ARCH]  # no draft remapping for this architecture
    assert (mc.hidden_size, mc.vocab_size, mc.num_hidden_layers) == (t["hidden_size"], t["vocab_size"], 1)
    cls, arch = ModelRegistry.resolve_model_cls(mc.hf_config.architectures)
    assert arch == models.EAGLE_DRAFT_ARCH and cls.__module__ == "sglang.srt.models.llama_eagle"


def worker(out_path: str) -> None:
    """Per drafted geometry: SGLang's server args of a chain EAGLE launch with the draft, both model configs,
    and the draft model built on meta from SGLang's own class, fed target-shaped tensors."""
    init_cpu_rank()
    import tempfile

    import torch
    from sglang.srt import runtime_context
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.server_args import prepare_server_args

    facts = {}
    for name in DRAFTED:
        root = tempfile.mkdtemp()
        target = models.materialize(name, root=root, tokenizer=False)
        draft = models.materialize_eagle_draft(name, root=root, tokenizer=False)
        args = prepare_server_args(["--model-path", target, "--load-format", "dummy", "--skip-tokenizer-init",
                                    "--device", "cpu", "--disable-radix-cache", "--context-length", "4096",
                                    "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", draft,
                                    "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                    "--speculative-num-draft-tokens", "4"])
        runtime_context.publish(args, role="test")
        tc = ModelConfig.from_server_args(args)
        dc = ModelConfig.from_server_args(args, model_path=draft, is_draft_model=True)
        cls, _ = ModelRegistry.resolve_model_cls(dc.hf_config.architectures)
        with torch.device("meta"):
            m = cls(dc.hf_config)
            embed = torch.empty(tc.vocab_size, tc.hidden_size)  # the target's get_embed_and_head() shapes
            head = torch.empty(tc.vocab_size, tc.hidden_size)
            m.set_embed_and_head(embed, head)
            ids = torch.zeros(5, dtype=torch.long)
            fused = m.model.fc(torch.cat([m.model.embed_tokens(ids), torch.empty(5, tc.hidden_size)], dim=-1))
        facts[name] = {"algorithm": args.speculative_algorithm, "draft_path": args.speculative_draft_model_path,
                       "target": [tc.hidden_size, tc.vocab_size], "draft_arch": dc.hf_config.architectures[0],
                       "fc": list(m.model.fc.weight.shape), "embed": list(m.model.embed_tokens.weight.shape),
                       "lm_head": list(m.lm_head.weight.shape), "fused": list(fused.shape),
                       "embed_is_target": m.model.embed_tokens.weight is embed,
                       "head_is_target": m.lm_head.weight is head}
        runtime_context.get_context()._server_args = None
    Path(out_path).write_text(json.dumps(facts))


def test_draft_model_class_takes_the_targets_tensors(tmp_path):
    pytest.importorskip("sglang.srt.models.llama_eagle")
    facts = run_worker(__file__, tmp_path / "facts.json")
    assert set(facts) == set(DRAFTED)
    for name, f in facts.items():
        H, V = f["target"]
        assert (H, V) == (models.get(name).config["hidden_size"], models.get(name).config["vocab_size"])
        assert f["algorithm"] == "EAGLE" and f["draft_arch"] == models.EAGLE_DRAFT_ARCH and f["draft_path"]
        assert f["fc"] == [H, 2 * H] and f["embed"] == [V, H] and f["lm_head"] == [V, H], (name, f)
        assert f["fused"] == [5, H] and f["embed_is_target"] and f["head_is_target"]


# --------------------------------------------------------------------------------
# the harness: flags of every arm
# --------------------------------------------------------------------------------
def _flags(tmp_path, *argv):
    args = _args(*argv)
    ab.cli.check_spec(args)
    m = ab.prepare_model(args, tmp_path, True)
    return m, ab.common_server_flags(args, m, True)


@pytest.mark.parametrize("name", DRAFTED)
def test_eagle_chain_flags_parse_with_sglangs_parser(tmp_path, sglang_parser, name):
    m, flags = _flags(tmp_path, "--model", name, "--spec", "eagle", "--batch", "8")
    ns = sglang_parser.parse_args(ab.launch_cmd("python", ab.STOCK_MODULE, flags, "127.0.0.1", 31000)[3:])
    assert ns.speculative_algorithm == "EAGLE" and ns.speculative_num_steps == 3
    assert ns.speculative_eagle_topk == 1 and ns.speculative_num_draft_tokens == 4
    assert ns.speculative_draft_model_path == m.draft
    assert json.loads((Path(m.draft) / "config.json").read_text()) == models.eagle_draft_config(name)
    target = json.loads((Path(m.path) / "config.json").read_text())
    assert "num_nextn_predict_layers" not in target  # a separate draft: no MTP keys in the target
    assert "--moe-runner-backend" not in flags  # that flag serves the built-in MTP draft only


@pytest.mark.parametrize("topk,ndraft", [(4, 8), (8, 16)])
def test_eagle_tree_flags(tmp_path, sglang_parser, topk, ndraft):
    m, flags = _flags(tmp_path, "--model", "nemotron-h-8b", "--spec", "eagle", "--spec-topk", str(topk),
                      "--spec-draft-tokens", str(ndraft))
    ns = sglang_parser.parse_args(ab.launch_cmd("python", ab.STOCK_MODULE, flags, "127.0.0.1", 1)[3:])
    assert (ns.speculative_eagle_topk, ns.speculative_num_draft_tokens, ns.speculative_num_steps) == (topk, ndraft, 3)
    assert ns.speculative_draft_model_path == m.draft


@pytest.mark.parametrize("argv,mode", [
    (("--spec", "eagle", "--spec-topk", "4", "--spec-draft-tokens", "8"), "fixed"),  # SGLang refuses real tokens
    (("--spec", "eagle"), "real-draft-token"),
    (("--spec", "nextn"), "real-draft-token"),
    (("--spec", "eagle", "--spec-topk", "4", "--spec-draft-tokens", "8", "--sim-acc-token-mode",
      "real-draft-token"), "real-draft-token"),  # a mode given wins
])
def test_simulated_acceptance_token_mode(capsys, argv, mode):
    assert ab.main(["--model", "tiny-nemotron-h", *argv, "--sim-acc-len", "3", "--batch", "4", "--no-parity",
                    "--dry-run"]) == 0
    envs = [ln for ln in capsys.readouterr().out.splitlines() if "SGLANG_SIMULATE_ACC_LEN=3.0" in ln]
    assert envs and all(f"SGLANG_SIMULATE_ACC_TOKEN_MODE={mode} " in ln + " " for ln in envs), envs


def test_a_simulated_tree_runs_no_same_simulation_parity(capsys):
    """Under simulated tree acceptance (fixed token mode: one output id; stock and the ring commit different nodes)
    stock-vs-ours parity means nothing: no arm runs it; a simulated chain keeps it."""
    assert ab.main(["--model", "tiny-nemotron-h", "--spec", "eagle", "--spec-topk", "4", "--spec-draft-tokens", "8",
                    "--sim-acc-len", "3", "--batch", "4", "--no-spec-parity", "--dry-run"]) == 0
    heads = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("# ")]
    assert heads and all("parity=False" in ln for ln in heads), heads
    assert ab.main(["--model", "tiny-nemotron-h", "--spec", "eagle", "--sim-acc-len", "3", "--batch", "4",
                    "--no-spec-parity", "--dry-run"]) == 0
    heads = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("# ")]
    assert heads and all("parity=True" in ln for ln in heads), heads


def test_nextn_keeps_the_targets_mtp_and_an_explicit_draft_wins(tmp_path):
    m, flags = _flags(tmp_path, "--model", "tiny-nemotron-h", "--spec", "nextn")
    assert m.draft is None and "--speculative-draft-model-path" not in flags and "--moe-runner-backend" in flags
    assert json.loads((Path(m.path) / "config.json").read_text())["num_nextn_predict_layers"] == 1
    mine = tmp_path / "mine"
    m, flags = _flags(tmp_path, "--model", "tiny-qwen3.5", "--spec", "eagle", "--spec-draft-model", str(mine))
    assert flags[flags.index("--speculative-draft-model-path") + 1] == str(mine) == m.draft


@pytest.mark.parametrize("argv,needle", [
    (("--spec", "eagle", "--spec-topk", "4"), "needs --spec-draft-tokens"),
    (("--spec", "eagle", "--spec-topk", "2", "--spec-draft-tokens", "12"), "2 <= N <= 11"),
    (("--spec", "eagle", "--spec-draft-tokens", "6"), "a chain (--spec-topk 1) verifies --spec-steps + 1 = 4"),
    (("--spec-topk", "2",), "add --spec"),
    (("--spec", "eagle", "--spec-topk", "0"), "positive integers"),
    (("--spec", "eagle", "--model", "tiny-falcon-h1"), "has no built-in EAGLE draft"),
])
def test_bad_spec_shapes_name_the_flag(capsys, argv, needle):
    assert ab.main(["--dry-run", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_dry_run_passes_the_draft_to_every_arm(capsys):
    assert ab.main(["--model", "tiny-qwen3-next", "--spec", "eagle", "--arms", "stock,patched,staged",
                    "--batch", "4", "--no-parity", "--dry-run"]) == 0
    servers = [ln for ln in capsys.readouterr().out.splitlines() if "launch_server" in ln]
    assert len(servers) == 3
    drafts = {ln.split("--speculative-draft-model-path ")[1].split()[0] for ln in servers}
    assert len(drafts) == 1 and "eagle-draft" in drafts.pop()
    assert all("--speculative-algorithm EAGLE" in ln and "--speculative-eagle-topk 1" in ln for ln in servers)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
