"""``eval.ab --pinned-token``: weights that make every greedy pick one token (eval/weights.py ``pin_argmax_``), so
an EAGLE draft is accepted along real tree paths and spec-vs-non-spec logprobs check the verify along them.

Checked on CPU: a pure-torch pre-norm model and an EAGLE-style draft (forward passes, random contexts), SGLang
0.5.17's own tiny NemotronH and its Llama EAGLE draft built on the CPU in a subprocess (the pieces that decide
the argmax: final norm and LM head, residual stream and LM head), the harness flag, and the tree summary, which
lists such runs apart from the greedy-mismatch key.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from _sglang_cpu_worker import init_cpu_rank, run_worker  # noqa: E402
from eval import ab, e2e_summary, models, report, weights  # noqa: E402

DATA = Path(__file__).parent / "data"
H, V, TOKEN = 32, 50, 7


class RMSNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(torch.nn.Module):
    """A pre-norm block: a mixer (in_proj -> tanh -> out_proj) and an MLP (up -> relu^2 -> down), each added to
    the residual stream."""

    def __init__(self):
        super().__init__()
        self.norm, self.norm2 = RMSNorm(H), RMSNorm(H)
        self.in_proj, self.out_proj = torch.nn.Linear(H, 3 * H, bias=False), torch.nn.Linear(3 * H, H, bias=False)
        self.up_proj, self.down_proj = torch.nn.Linear(H, 2 * H, bias=False), torch.nn.Linear(2 * H, H)

    def forward(self, x):
        x = x + self.out_proj(torch.tanh(self.in_proj(self.norm(x))))
        return x + self.down_proj(torch.relu(self.up_proj(self.norm2(x))) ** 2)


class Body(torch.nn.Module):
    def __init__(self, layers, final_norm=True, fc=False):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(V, H)
        self.layers = torch.nn.ModuleList(Block() for _ in range(layers))
        self.norm = RMSNorm(H) if final_norm else None
        self.fc = torch.nn.Linear(2 * H, H) if fc else None


class Toy(torch.nn.Module):
    """A target (final norm) or, with ``draft``, an EAGLE-style draft: fc(cat(embedding, hidden)), one block,
    no final norm."""

    def __init__(self, draft=False):
        super().__init__()
        self.model = Body(1 if draft else 3, final_norm=not draft, fc=draft)
        self.lm_head = torch.nn.Linear(H, V, bias=False)

    def forward(self, ids, hidden=None):
        x = self.model.embed_tokens(ids)
        if self.model.fc is not None:
            x = self.model.fc(torch.cat([x, hidden], -1))
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x) if self.model.norm is not None else x)


def _pinned(draft=False, seed=0):
    torch.manual_seed(seed)
    m = Toy(draft)
    weights.randomize_(m, {"seed": seed, "gain": 1.0, "lm_head_gain": 3.0})
    return m, weights.pin_argmax_(m, TOKEN)


@torch.no_grad()
def test_every_greedy_pick_is_the_pinned_token_and_logprobs_still_follow_the_context():
    target, counts = _pinned()
    assert counts == {"embedding": 1, "residual_writer": 6, "residual_bias": 3, "final_norm": 1, "lm_head": 1}
    draft, dcounts = _pinned(draft=True, seed=1)
    assert dcounts["eagle_fc"] == 1 and "final_norm" not in dcounts
    draft.lm_head.weight.copy_(target.lm_head.weight)  # SGLang hands the draft the target's head (and embedding)
    draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    ids = torch.randint(0, V, (64, 5))
    logits = target(ids)
    assert (logits.argmax(-1) == TOKEN).all()
    assert (draft(ids, torch.randn(64, 5, H) * 4).argmax(-1) == TOKEN).all()
    # the logprobs are not constant: they depend on the context through 1/rms of the residual stream
    lp = torch.log_softmax(logits, -1)
    assert float(lp[..., 0].std()) > 1e-3
    # without the pin the same weights pick many tokens
    plain = Toy()
    torch.manual_seed(0)
    weights.randomize_(plain, {"seed": 0, "gain": 1.0, "lm_head_gain": 3.0})
    assert len(set(plain(ids).argmax(-1).flatten().tolist())) > 3


def test_pin_refuses_what_it_cannot_pin():
    m = Toy()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        weights.pin_argmax_(m, V)
    m.lm_head.weight = m.model.embed_tokens.weight  # tied embeddings
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        weights.pin_argmax_(m, TOKEN)
    bare = Toy()
    bare.model.norm = None  # neither a final norm nor an EAGLE fc
    with pytest.raises(ValueError, match="neither a final norm nor an EAGLE fc"):
        weights.pin_argmax_(bare, TOKEN)
    assert weights.pinned_token({}) is None and weights.pinned_token({weights.PINNED_TOKEN_ENV: " 12 "}) == 12
    for bad in ("x", "-1"):
        with pytest.raises(SystemExit, match=weights.PINNED_TOKEN_ENV):
            weights.pinned_token({weights.PINNED_TOKEN_ENV: bad})


def worker(out_path: str) -> None:
    """SGLang's tiny NemotronH and its Llama EAGLE draft, built on the CPU, drawn and pinned; the argmax of
    norm_f -> lm_head (target) and of the residual stream -> the target's lm_head (draft) on random states whose
    dimension 0 is 1, as the pin keeps it."""
    init_cpu_rank()
    import tempfile

    from sglang.srt import runtime_context
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers import dp_attention
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.server_args import prepare_server_args

    root = tempfile.mkdtemp()
    target = models.materialize("tiny-nemotron-h", root=root, tokenizer=False)
    draft = models.materialize_eagle_draft("tiny-nemotron-h", root=root, tokenizer=False)
    args = prepare_server_args(["--model-path", target, "--load-format", "dummy", "--skip-tokenizer-init",
                                "--device", "cpu", "--disable-radix-cache", "--context-length", "4096",
                                "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", draft,
                                "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                                "--speculative-num-draft-tokens", "8"])
    runtime_context.publish(args, role="test")
    dp_attention.initialize_dp_attention(args, ModelConfig.from_server_args(args))
    built, facts = {}, {}
    for role, path, is_draft in (("target", target, False), ("draft", draft, True)):
        mc = ModelConfig.from_server_args(args, model_path=path, is_draft_model=is_draft)
        cls, _ = ModelRegistry.resolve_model_cls(mc.hf_config.architectures)
        with torch.device("cpu"):
            m = cls(config=mc.hf_config)
        weights.randomize_(m, {"seed": 0, "gain": 1.0, "lm_head_gain": 3.0})
        facts[role] = {"class": cls.__name__, "counts": weights.pin_argmax_(m, 100)}
        built[role] = m
    t = built["target"]
    Hs = weights._hidden_size(t)
    with torch.no_grad():
        x = torch.randn(16, Hs) * 3
        x[:, weights.PIN_DIM] = 1.0
        h = t.model.norm_f(x.clone())
        h = h[0] if isinstance(h, tuple) else h
        facts["target_argmax"] = sorted(set((h @ t.lm_head.weight.T).argmax(-1).tolist()))
        facts["draft_argmax"] = sorted(set((x @ t.lm_head.weight.T).argmax(-1).tolist()))
        facts["writers_row0_zero"] = all(float(p[weights.PIN_DIM].abs().max()) == 0.0
                                         for m in built.values() for n, p in m.named_parameters()
                                         if p.dim() == 2 and p.shape[0] == Hs and not n.endswith(("fc.weight",
                                                                                                  "lm_head.weight")))
    Path(out_path).write_text(json.dumps(facts))


def test_sglangs_tiny_nemotron_h_and_its_eagle_draft_pick_the_pinned_token(tmp_path):
    pytest.importorskip("sglang.srt.models.llama_eagle")
    f = run_worker(__file__, tmp_path / "facts.json")
    assert f["target"]["class"] == "NemotronHForCausalLM" and f["draft"]["class"] == models.EAGLE_DRAFT_ARCH
    # Mamba2 out_proj x2, attention o_proj, MLP down_proj; the draft's o_proj and down_proj
    assert f["target"]["counts"]["residual_writer"] == 4 and f["target"]["counts"]["final_norm"] == 1
    assert f["draft"]["counts"]["residual_writer"] == 2 and f["draft"]["counts"]["eagle_fc"] == 1
    assert f["target_argmax"] == [100] and f["draft_argmax"] == [100] and f["writers_row0_zero"]


def test_harness_flag_reaches_every_server_and_is_checked(capsys):
    assert ab.main(["--model", "tiny-nemotron-h", "--spec", "eagle", "--spec-topk", "4", "--spec-draft-tokens", "8",
                    "--pinned-token", "100", "--batch", "4", "--dry-run"]) == 0
    envs = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("env:")]
    assert len(envs) >= 3 and all(f"{weights.PINNED_TOKEN_ENV}=100" in ln for ln in envs)
    assert ab.main(["--model", "tiny-nemotron-h", "--batch", "4", "--dry-run"]) == 0
    assert weights.PINNED_TOKEN_ENV not in capsys.readouterr().out
    assert ab.main(["--pinned-token", "3", "--no-random-weights", "--dry-run"]) == 2
    assert "--pinned-token" in capsys.readouterr().err


def test_tree_summary_lists_pinned_runs_apart_from_the_greedy_key(tmp_path):
    """A pinned-token EAGLE tree run (later than the committed greedy run) is listed under the tree paths with ours
    minus stock's top-k |dlogprob|; the greedy-mismatch key still reads the unpinned run."""
    root = REPO / "eval" / "results" / "e2e-h200"
    base = e2e_summary.eagle_summary(e2e_summary.load_results([root / "tree-tiny-nemotron-h-eagle"]))["summary"]
    (f, res), = [(f, r) for f, r in e2e_summary.load_results([root / "tree-tiny-nemotron-h-eagle"])]
    pinned = copy.deepcopy(res)
    pinned["started"] = "2099-01-01T00:00:00Z"
    pinned["flags"]["harness"]["pinned_token"] = 100
    svn = pinned["summary"]["spec_vs_nonspec"]
    a, b = pinned["summary"]["a"], pinned["summary"]["b"]
    svn[b].update(mismatches=0, max_abs_dlogprob_topk=0.004)
    svn[a].update(mismatches=0, max_abs_dlogprob_topk=0.003)
    report.write_json(tmp_path / "p" / "ab-tiny-nemotron-h-eagle-pinned.json", pinned)
    results = e2e_summary.load_results([root / "tree-tiny-nemotron-h-eagle", tmp_path / "p"])
    doc = e2e_summary.eagle_summary(results)
    s = doc["summary"]
    assert s["tree_greedy_excess_mismatches"] == base["tree_greedy_excess_mismatches"]
    (p,) = doc["pinned_paths"]
    assert p["pinned_token"] == 100 and p["ours_token_mismatches"] == 0
    assert abs(p["topk_dlogprob_excess"] - 0.001) < 1e-12 and s["tree_path_topk_dlogprob_excess"] == \
        p["topk_dlogprob_excess"]
    e2e_summary.write_eagle(doc, tmp_path)
    assert "| tiny-nemotron-h | 4 | 8 |" in (tmp_path / "e2e-tree-h200.md").read_text().split("## Tree paths")[1]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
