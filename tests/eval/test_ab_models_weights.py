"""CPU tests of the A/B harness's model geometries, synthetic tokenizer, random-weights hook
and plugin entry points (eval/models.py, eval/weights.py, eval/entry_points.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval import entry_points, models, weights  # noqa: E402


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))}
    env.update(extra)
    return env


# --------------------------------------------------------------------------------
# geometries
# --------------------------------------------------------------------------------
def test_every_size_class_and_family_is_present():
    tiny = set(models.names("tiny"))
    real = set(models.names("real"))
    assert {"tiny-nemotron-h", "tiny-qwen3-next", "tiny-qwen3.5", "tiny-falcon-h1", "tiny-granitemoehybrid"} <= tiny
    assert {"nemotron-h-8b", "qwen3-next-80b-a3b-e64", "qwen3.5-4b-like"} <= real
    for name in models.names():
        g = models.get(name)
        assert g.source and g.family in ("mamba2", "gdn") and g.attention_backend in ("flashinfer", "triton")
    with pytest.raises(ValueError, match="unknown model"):
        models.get("no-such-model")


def test_tiny_package_configs_are_reused_not_copied():
    from sglang_replayssm import models as pkg

    assert models.get("tiny-nemotron-h").config == pkg.config("tiny-nemotron-h")
    assert models.get("tiny-qwen3-next").config == pkg.config("tiny-qwen3-next")
    q35 = models.get("tiny-qwen3.5").config
    assert q35["model_type"] == "qwen3_5_text" and "num_experts" not in q35


def test_real_geometry_shapes():
    n8 = models.get("nemotron-h-8b").config
    assert models.layer_counts(n8) == {"mamba2": 24, "attention": 4, "mlp": 24, "moe": 0}
    # Mamba2 in_proj width of the released checkpoint: 2*d_inner + 2*groups*state + heads
    d_inner = n8["mamba_num_heads"] * n8["mamba_head_dim"]
    assert 2 * d_inner + 2 * n8["n_groups"] * n8["ssm_state_size"] + n8["mamba_num_heads"] == 18560
    assert n8["n_groups"] == n8["mamba_n_groups"]  # pool and mixer shapes must agree
    qn = models.get("qwen3-next-80b-a3b-e64").config
    assert models.layer_counts(qn) == {"gdn": 36, "attention": 12}
    assert qn["num_experts"] < 512 and "REDUCED" in models.get("qwen3-next-80b-a3b-e64").source
    q35 = models.get("qwen3.5-4b-like").config
    assert models.layer_counts(q35) == {"gdn": 24, "attention": 8}
    assert "CONSTRUCTED" in models.get("qwen3.5-4b-like").source
    # fp32 state bytes: 24 layers x 128 heads x 64 x 128 x 4 B
    assert models.ssm_state_bytes_per_seq(n8) == 24 * 128 * 64 * 128 * 4


@pytest.mark.parametrize("name", models.names())
def test_configs_load_in_sglangs_config_classes(name):
    cfgs = pytest.importorskip("sglang.srt.configs")
    cls = {"nemotron_h": "NemotronHConfig", "qwen3_next": "Qwen3NextConfig", "falcon_h1": "FalconH1Config",
           "granitemoehybrid": "GraniteMoeHybridConfig"}
    g = models.get(name)
    for spec in (False, True):
        cfg = g.config_json(spec=spec)
        mt = cfg["model_type"]
        if mt == "qwen3_5_text":
            from sglang.srt.configs.qwen3_5 import Qwen3_5TextConfig as C
        else:
            C = getattr(cfgs, cls[mt])
        kw = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")}
        c = C(**kw)
        if mt == "nemotron_h":
            assert len(c.layers_block_type) == len(cfg["hybrid_override_pattern"])
        if mt in ("qwen3_next", "qwen3_5_text"):
            assert c.layers_block_type.count("attention") == models.layer_counts(cfg)["attention"]
            # the attention layers read RoPE through SGLang's helper (Qwen3.5 reads rope_parameters,
            # which its config class sets to {} when the JSON has none: a KeyError at model init)
            from sglang.srt.utils.hf_transformers.common import get_rope_config

            theta, _ = get_rope_config(c)
            assert theta == 10000000


def test_materialize_writes_config_and_a_loadable_tokenizer(tmp_path):
    d = Path(models.materialize("tiny-nemotron-h", root=tmp_path, spec=True))
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["mtp_hybrid_override_pattern"] == "*E"
    assert (d / "tokenizer.json").is_file() and (d / "tokenizer_config.json").is_file()
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    assert tok.vocab_size == cfg["vocab_size"] == 1024
    ids = [5, 900, 3, 1023]
    assert tok.decode(ids) == "w5 w900 w3 w1023"
    assert tok.encode("w5 w900", add_special_tokens=False) == [5, 900]
    assert tok.eos_token_id == 2
    # every id decodes to a non-empty word: streamed chunks always carry text
    assert all(tok.decode([i]) for i in range(0, 1024, 97))


# --------------------------------------------------------------------------------
# random weights
# --------------------------------------------------------------------------------
class GemmaRMSNorm(torch.nn.Module):  # name-alike of SGLang's (1 + w) norm
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n))
        self.register_buffer("gemma_weight", torch.ones(n), persistent=False)


class RMSNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n))


class Mixer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.A = torch.nn.Parameter(torch.empty(8))
        self.D = torch.nn.Parameter(torch.empty(8))
        self.dt_bias = torch.nn.Parameter(torch.empty(8))
        self.in_proj = torch.nn.Linear(64, 256, bias=False)
        self.conv1d = torch.nn.Linear(4, 96)
        self.norm = RMSNorm(64)


class Gdn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.A_log = torch.nn.Parameter(torch.empty(8))
        self.dt_bias = torch.nn.Parameter(torch.empty(8))


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(1000, 64)
        self.mixer = Mixer()
        self.gdn = Gdn()
        self.input_layernorm = GemmaRMSNorm(64)
        self.experts_w13 = torch.nn.Parameter(torch.empty(4, 128, 64))
        self.router_bias = torch.nn.Parameter(torch.empty(4))
        self.lm_head = torch.nn.Linear(64, 1000, bias=False)


def _draw(dtype=torch.bfloat16, seed=0):
    torch.manual_seed(123)
    m = Toy().to(dtype)
    counts = weights.randomize_(m, {"seed": seed, "gain": 1.0, "lm_head_gain": 3.0})
    return m, counts


def test_random_weight_rules():
    m, counts = _draw()
    A = m.mixer.A.float()
    assert (A <= -1).all() and (A >= -16).all() and A.unique().numel() > 1
    a_log = m.gdn.A_log.float().exp()
    assert (a_log >= 0.99).all() and (a_log <= 16.1).all()
    for dtb in (m.mixer.dt_bias, m.gdn.dt_bias):
        dt = torch.nn.functional.softplus(dtb.float())
        assert (dt > 0.9e-3).all() and (dt < 0.11).all()
    assert torch.equal(m.mixer.D, torch.ones_like(m.mixer.D))
    assert torch.equal(m.mixer.norm.weight, torch.ones_like(m.mixer.norm.weight))
    assert torch.equal(m.input_layernorm.weight, torch.zeros_like(m.input_layernorm.weight))  # x * (1 + w)
    assert torch.equal(m.input_layernorm.gemma_weight, torch.ones(64))
    assert torch.equal(m.mixer.conv1d.bias, torch.zeros_like(m.mixer.conv1d.bias))
    assert torch.equal(m.router_bias, torch.zeros_like(m.router_bias))
    std = m.mixer.in_proj.weight.float().std().item()
    assert abs(std - 1 / 8) < 0.02  # 1/sqrt(fan_in=64)
    assert abs(m.experts_w13.float().std().item() - 1 / 8) < 0.02  # fan_in = last dim of 3-D weights
    assert abs(m.lm_head.weight.float().std().item() - 3 / 8) < 0.03
    assert counts["mamba_A"] == 1 and counts["A_log"] == 1 and counts["dt_bias"] == 2 and counts["lm_head"] == 1


def test_random_weights_are_seeded_per_name_and_distinct_per_tensor():
    m1, _ = _draw()
    m2, _ = _draw()
    for (n, p1), (_, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        assert torch.equal(p1, p2), n
    m3, _ = _draw(seed=1)
    assert not torch.equal(m1.mixer.in_proj.weight, m3.mixer.in_proj.weight)
    # equal shapes, different names -> different values (stock dummy init makes them equal)
    assert not torch.equal(m1.mixer.dt_bias, m1.gdn.dt_bias)


def test_low_precision_tensors_are_left_to_the_stock_initializer():
    m = Toy()
    m.fp8 = torch.nn.Parameter(torch.zeros(4, 4).to(torch.float8_e4m3fn), requires_grad=False)
    counts = weights.randomize_(m, {"seed": 0, "gain": 1.0, "lm_head_gain": 3.0})
    assert torch.equal(m.fp8.float(), torch.zeros(4, 4))
    assert sum(counts.values()) == sum(1 for p in m.parameters() if p.dtype != torch.float8_e4m3fn)


def test_install_wraps_the_initializer_and_its_by_name_import(monkeypatch, capsys):
    calls = []

    def initialize_dummy_weights(model, low=-1e-3, high=1e-3, seed=1234):
        calls.append(model)
        for p in model.parameters():
            p.data.uniform_(low, high)

    wu = types.ModuleType(weights.TARGET_MODULE)
    wu.initialize_dummy_weights = initialize_dummy_weights
    loader = types.ModuleType("sglang.srt.model_loader.loader")
    loader.initialize_dummy_weights = initialize_dummy_weights
    monkeypatch.setitem(sys.modules, weights.TARGET_MODULE, wu)
    monkeypatch.setitem(sys.modules, "sglang.srt.model_loader.loader", loader)
    monkeypatch.setenv(weights.ENABLE_ENV, "1")
    w = weights.install()
    assert wu.initialize_dummy_weights is w and loader.initialize_dummy_weights is w
    assert w.__wrapped__ is initialize_dummy_weights
    assert weights.install() is w  # idempotent
    m = Toy()
    loader.initialize_dummy_weights(m)
    assert calls == [m]  # the stock initializer ran first (fp8 tensors, buffers)
    assert torch.equal(m.mixer.D, torch.ones(8))
    assert weights.LOG_MARKER in capsys.readouterr().out
    monkeypatch.setenv(weights.ENABLE_ENV, "0")  # the wrapper follows the variable
    m2 = Toy()
    loader.initialize_dummy_weights(m2)
    assert m2.mixer.D.abs().max() <= 1e-3


def test_register_is_inert_without_the_variable(monkeypatch):
    monkeypatch.delenv(weights.ENABLE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, weights.TARGET_MODULE, None)  # importing it would fail
    weights.register()  # no import attempted


def test_bad_setting_fails_loudly(monkeypatch):
    monkeypatch.setenv(weights.SEED_ENV, "abc")
    with pytest.raises(SystemExit, match=weights.SEED_ENV):
        weights.settings()


# --------------------------------------------------------------------------------
# entry points without pip
# --------------------------------------------------------------------------------
def test_entry_point_dist_infos(tmp_path):
    d = entry_points.install(tmp_path / "ep", package=True, eval_weights=True)
    assert entry_points.registered("sglang_replayssm.plugin", path=[str(d)])
    assert entry_points.registered("eval.weights", path=[str(d)])
    code = ("import json; from importlib.metadata import entry_points as e; "
            "eps = e(group='sglang.srt.plugins'); print(json.dumps(sorted((x.name, x.value) for x in eps))); "
            "[x.load() for x in eps]; "
            "from sglang_replayssm.launch_server import entry_point_registered as r; print(r())")
    env = _env(PYTHONPATH=os.pathsep.join([str(d), str(REPO)]))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    eps = json.loads(lines[0])
    assert ["replayssm", "sglang_replayssm.plugin:register"] in eps
    assert ["replayssm_eval_weights", "eval.weights:register"] in eps
    assert ["replayssm_eval_sync_debug", "eval.sync_debug:register"] in eps  # loaded above: inert without its variable
    assert lines[-1] == "True"
    # auto mode: the package entry point is written only when nothing registers it yet
    d2 = entry_points.install(tmp_path / "ep2", package=None, eval_weights=False)
    want = not entry_points.registered("sglang_replayssm.plugin")
    assert entry_points.registered("sglang_replayssm.plugin", path=[str(d2)]) == want
    assert entry_points.main(["--dest", str(tmp_path / "ep3"), "--package", "no"]) == 0
    assert not entry_points.registered("sglang_replayssm.plugin", path=[str(tmp_path / "ep3")])
