"""Built-in hybrid model geometries for the A/B harness (config.json only, dummy weights).

Tiny models start in seconds and exercise the whole server path; real geometries have the
layer shapes of released checkpoints, so decode speed is representative.  Nothing is
downloaded: :func:`materialize` writes ``config.json`` and a synthetic word-level tokenizer
(one token per id, ``w<id>``) into a fresh directory, served with ``--load-format dummy``
(and, in the harness, scaled random weights from ``eval/weights.py``).

Why a tokenizer: with ``--skip-tokenizer-init`` SGLang's ``/generate`` stream carries only
``output_ids``, and ``sglang.bench_serving`` timestamps only chunks that carry ``text``, so
TTFT / ITL / TPOT would come out empty.  With this tokenizer the benchmark still sends token
ids (``--dataset-name random-ids --tokenize-prompt``) and the server's detokenizer emits one
word per token.

Every geometry names its source.  ``python -m eval.models`` lists them.
"""

from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from sglang_replayssm import models as pkg_models

NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"

# Nemotron-H's MTP head is one attention + one MoE layer ("*E"); the MoE keys size it.
_NEMOTRON_TINY_MTP = {
    "num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*E",
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "moe_intermediate_size": 128, "moe_shared_expert_intermediate_size": 128,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
}
_NEMOTRON_8B_MTP = dict(_NEMOTRON_TINY_MTP, n_routed_experts=8, moe_intermediate_size=2048,
                        moe_shared_expert_intermediate_size=2048)


@dataclass(frozen=True)
class Geometry:
    name: str
    family: str                      # "mamba2" or "gdn"
    size: str                        # "tiny" or "real"
    config: Dict
    attention_backend: str
    source: str
    notes: str = ""
    spec_keys: Dict = field(default_factory=dict)     # merged into config.json for NEXTN/EAGLE
    spec_server_flags: Tuple[str, ...] = ()
    server_flags: Tuple[str, ...] = ()
    env: Dict[str, str] = field(default_factory=dict)
    h200: str = "not run"            # what has run on the H200 with this geometry
    min_tp: int = 1                  # fewest GPUs (SGLang --tp-size) the geometry fits on, H200-sized
    min_tp_reason: str = ""          # why, for eval.ab's message when --tp is lower

    def config_json(self, spec: bool = False, **overrides) -> Dict:
        cfg = copy.deepcopy(self.config)
        if spec:
            cfg.update(copy.deepcopy(self.spec_keys))
        cfg.update(overrides)
        return cfg


def _tiny_qwen35() -> Dict:
    cfg = pkg_models.config("tiny-qwen3-next")
    for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
              "shared_expert_intermediate_size", "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers"):
        cfg.pop(k, None)
    cfg.update(architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text")
    return _with_qwen35_rope(cfg)


def _with_qwen35_rope(cfg: Dict) -> Dict:
    """``cfg`` with RoPE also as ``rope_parameters``, as Qwen3.5 configs carry it (SGLang 0.5.17's
    Qwen3_5TextConfig turns a missing one into ``{}``, and its attention layer then fails on ``rope_theta``)."""
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_theta"],
                              "partial_rotary_factor": cfg["partial_rotary_factor"]}
    return cfg


# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json with 64 of its 512 routed experts (qwen3-next-80b-a3b-e64);
# qwen3-next-80b-a3b restores the 512
_QWEN3_NEXT_80B_E64: Dict = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "torch_dtype": "bfloat16",
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 48,
    "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "partial_rotary_factor": 0.25, "rope_theta": 10000000, "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "attn_output_gate": True,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "num_experts": 64, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1, "norm_topk_prob": True,
    "mlp_only_layers": [], "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
}

_FLASHINFER_ENV = {"SGLANG_FLASHINFER_USE_TENSOR_CORE": "true"}

_GEOMETRIES: List[Geometry] = [
    Geometry(
        name="tiny-nemotron-h", family="mamba2", size="tiny",
        config=pkg_models.config("tiny-nemotron-h"), attention_backend="flashinfer",
        source="sglang_replayssm/models/tiny-nemotron-h.json: "
               "NemotronH schema at toy size, pattern M*M- (2 Mamba2, 1 attention, 1 MLP)",
        spec_keys=_NEMOTRON_TINY_MTP, spec_server_flags=("--moe-runner-backend", "triton"),
        env=_FLASHINFER_ENV, h200="harness: decode + NEXTN parity (stock/staged)",
    ),
    Geometry(
        name="tiny-qwen3-next", family="gdn", size="tiny",
        config=pkg_models.config("tiny-qwen3-next"), attention_backend="triton",
        source="sglang_replayssm/models/tiny-qwen3-next.json (sglang-seams.md §9.3): Qwen3-Next schema "
               "at toy size, 3 GDN + 1 attention layer, 8 experts top-2",
        spec_keys={"num_nextn_predict_layers": 1},
        h200="harness: decode + NEXTN parity (stock/patched/staged)",
    ),
    Geometry(
        name="tiny-qwen3.5", family="gdn", size="tiny",
        config=_tiny_qwen35(), attention_backend="triton",
        source="sglang-seams.md §9.4: Qwen3_5ForCausalLM (model_type qwen3_5_text, dense MLP), the "
               "tiny Qwen3-Next geometry without the MoE keys",
        spec_keys={"num_nextn_predict_layers": 1},
        notes="not in SGLang's mamba radix-cache archs: the harness always passes --disable-radix-cache",
        h200="harness: decode + NEXTN parity (stock/staged/patched), e2e-h200/tiny-qwen3.5",
    ),
    Geometry(
        name="tiny-falcon-h1", family="mamba2", size="tiny",
        config={
            "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "torch_dtype": "bfloat16",
            "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_act": "silu",
            "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "rope_theta": 100000.0,
            "mamba_d_ssm": 512, "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_n_groups": 1,
            "mamba_d_state": 128, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
            "mamba_conv_bias": True, "mamba_proj_bias": False, "mamba_rms_norm": False,
            "mamba_norm_before_gate": False, "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        },
        attention_backend="flashinfer",
        source="SGLang 0.5.17 srt/configs/falcon_h1.py schema at toy size: every layer runs attention and "
               "a Mamba2 mixer in parallel (8 heads x 64, state 128)",
        env=_FLASHINFER_ENV,
        notes="no NEXTN draft for Falcon-H1",
        h200="harness: decode parity (stock/staged/patched), e2e-h200/tiny-falcon-granite",
    ),
    Geometry(
        name="tiny-granitemoehybrid", family="mamba2", size="tiny",
        config={
            "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
            "torch_dtype": "bfloat16", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 4, "layer_types": ["mamba", "mamba", "mamba", "attention"],
            "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu", "rms_norm_eps": 1e-5,
            "max_position_embeddings": 4096, "position_embedding_type": "nope",
            "mamba_d_state": 128, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_d_head": 64,
            "mamba_n_heads": 8, "mamba_n_groups": 1, "mamba_chunk_size": 256, "mamba_conv_bias": True,
            "mamba_proj_bias": False, "num_local_experts": 0, "num_experts_per_tok": 0,
            "shared_intermediate_size": 512, "tie_word_embeddings": True,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        },
        attention_backend="flashinfer",
        source="SGLang 0.5.17 srt/configs/granitemoehybrid.py schema at toy size (Granite-4.0-H layout: "
               "Mamba2 layers with an attention layer every 4th, dense shared MLP, no routed experts)",
        env=_FLASHINFER_ENV,
        h200="harness: decode parity (stock/staged/patched), e2e-h200/tiny-falcon-granite",
    ),
    Geometry(
        name="nemotron-h-8b", family="mamba2", size="real",
        config={
            "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "torch_dtype": "bfloat16",
            "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 21504,
            "hybrid_override_pattern": NEMOTRON_H_8B_PATTERN, "num_attention_heads": 32, "head_dim": 128,
            "num_key_value_heads": 8, "mlp_hidden_act": "relu2", "layer_norm_epsilon": 1e-5,
            "max_position_embeddings": 8192, "mamba_num_heads": 128, "mamba_head_dim": 64,
            "ssm_state_size": 128, "mamba_n_groups": 8, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
            "use_conv_bias": True, "use_bias": False, "mamba_hidden_act": "silu", "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        },
        attention_backend="flashinfer",
        source="nvidia/Nemotron-H-8B-Base-8K config.json: 52 layers (24 Mamba2 of 128 heads x 64, state 128, "
               "8 groups; 4 attention, 32 q / 8 kv heads x 128; 24 relu2 MLP 21504), hidden 4096, vocab 131072. "
               "The same numbers are the defaults of SGLang 0.5.17's NemotronHConfig. Full size (8.1B, ~16 GB bf16)",
        spec_keys=_NEMOTRON_8B_MTP, spec_server_flags=("--moe-runner-backend", "triton"), env=_FLASHINFER_ENV,
        notes="the checkpoint has no MTP head: under NEXTN the draft (*E: attention + 8-expert MoE) is synthetic",
        h200="harness: decode A/B bs 1-256 (stock/stock/staged)",
    ),
    Geometry(
        name="qwen3-next-80b-a3b-e64", family="gdn", size="real",
        config=copy.deepcopy(_QWEN3_NEXT_80B_E64),
        attention_backend="triton",
        source="Qwen/Qwen3-Next-80B-A3B-Instruct config.json: all 48 layers with their shapes (36 GDN: 16 K / "
               "32 V heads x 128, conv 4; 12 gated attention: 16 q / 2 kv heads x 256; hidden 2048), MoE "
               "top-10 of 512-wide experts + shared expert. REDUCED: 64 routed experts instead of 512 "
               "(~12B parameters, ~24 GB bf16, fits one H200); per-token compute and SSM state per layer "
               "are unchanged",
        spec_keys={"num_nextn_predict_layers": 1},
        notes="fewer experts than the released model: expert-weight memory and MoE routing spread differ",
        h200="harness: decode A/B bs 1-256 (stock/staged/upstream)",
    ),
    Geometry(
        name="qwen3-next-80b-a3b", family="gdn", size="real",
        config={**copy.deepcopy(_QWEN3_NEXT_80B_E64), "num_experts": 512},
        attention_backend="triton",
        source="Qwen/Qwen3-Next-80B-A3B-Instruct config.json at full size: the qwen3-next-80b-a3b-e64 shapes (48 "
               "layers, 36 GDN: 16 K / 32 V heads x 128; 12 gated attention; hidden 2048; MoE top-10 of 512-wide "
               "experts + shared expert) with all 512 routed experts: ~80B parameters, ~160 GB bf16",
        spec_keys={"num_nextn_predict_layers": 1},
        notes="needs two H200s: python -m eval.ab --model qwen3-next-80b-a3b --tp 2 (per rank 8 K / 16 V GDN heads)",
        min_tp=2, min_tp_reason="~160 GB of bf16 weights, one H200 holds 141 GB",
    ),
    Geometry(
        name="qwen3.5-4b-like", family="gdn", size="real",
        config=_with_qwen35_rope({
            "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "torch_dtype": "bfloat16",
            "vocab_size": 248320, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 32,
            "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
            "partial_rotary_factor": 0.25, "rope_theta": 10000000, "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "attn_output_gate": True,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32, "tie_word_embeddings": True,
            "bos_token_id": 1, "eos_token_id": 2,
        }),
        attention_backend="triton",
        source="CONSTRUCTED, not a released config: the Qwen3.5 text schema (qwen3_5_text, dense gated MLP, "
               "vocab 248320 as in the public Qwen3_5TextConfig defaults) at ~4.3B parameters: 32 layers "
               "(24 GDN with Qwen3-Next's head layout 16 K / 32 V x 128, 8 gated attention 16 q / 4 kv x 256), "
               "hidden 2560, MLP 9728, tied embeddings",
        spec_keys={"num_nextn_predict_layers": 1},
        notes="a stand-in for a Qwen3.5-4B-class dense GDN model; replace with the released config when at hand",
        h200="harness: decode A/B bs 1/256 (stock/staged/upstream), e2e-h200/decode-qwen3.5-4b-like*",
    ),
]

GEOMETRIES: Dict[str, Geometry] = {g.name: g for g in _GEOMETRIES}
DEFAULT_TINY = "tiny-nemotron-h"


def names(size: Optional[str] = None) -> List[str]:
    return [g.name for g in _GEOMETRIES if size is None or g.size == size]


def get(name: str) -> Geometry:
    if name not in GEOMETRIES:
        raise ValueError(f"unknown model {name!r}; built-in: {', '.join(names())} (or a model directory)")
    return GEOMETRIES[name]


# ---------------------------------------------------------------------------------
# synthetic tokenizer
# ---------------------------------------------------------------------------------
def token_str(i: int) -> str:
    return f"w{i}"


def tokenizer_files(vocab_size: int, bos: int = 1, eos: int = 2, pad: int = 0) -> Dict[str, Dict]:
    """``tokenizer.json`` (HF tokenizers, WordLevel, whitespace split, no decoder: ids decode
    to ``"w<i>"`` words joined by spaces) and ``tokenizer_config.json``."""
    vocab = {token_str(i): i for i in range(vocab_size)}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": token_str(pad)},
    }
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token_str(bos), "eos_token": token_str(eos),
        "pad_token": token_str(pad), "unk_token": token_str(pad),
        "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False,
    }
    return {"tokenizer.json": tok, "tokenizer_config.json": tok_cfg}


def write_tokenizer(directory, vocab_size: int, bos: int = 1, eos: int = 2, pad: int = 0) -> None:
    d = Path(directory)
    for fname, obj in tokenizer_files(vocab_size, bos, eos, pad).items():
        (d / fname).write_text(json.dumps(obj))


def _first_id(v, default: int) -> int:
    if isinstance(v, list):
        v = v[0] if v else None
    return v if isinstance(v, int) and v >= 0 else default


def materialize(name: str, root=None, spec: bool = False, tokenizer: bool = True, **overrides) -> str:
    """Write ``config.json`` (+ the synthetic tokenizer) for a built-in geometry; return the dir."""
    g = get(name)
    cfg = g.config_json(spec=spec, **overrides)
    d = Path(tempfile.mkdtemp(prefix=f"replayssm-ab-{name}{'-spec' if spec else ''}-", dir=root))
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    if tokenizer:
        V = int(cfg["vocab_size"])
        write_tokenizer(d, V, bos=min(_first_id(cfg.get("bos_token_id"), 1), V - 1),
                        eos=min(_first_id(cfg.get("eos_token_id"), 2), V - 1),
                        pad=min(_first_id(cfg.get("pad_token_id"), 0), V - 1))
    return str(d)


# ---------------------------------------------------------------------------------
# EAGLE drafts (a separate draft model, ``--spec eagle``)
# ---------------------------------------------------------------------------------
# SGLang 0.5.17 serves a separate EAGLE draft beside a hybrid target as EAGLE-1: the draft is
# ``LlamaForCausalLMEagle`` (srt/models/llama_eagle.py, one Llama decoder layer behind
# ``fc: Linear(2*hidden -> hidden)`` over [token embedding, target hidden state]), and the EAGLE worker
# (speculative/eagle_worker_v2.py ``init_lm_head``) replaces the draft's embedding and LM head with the
# target's ``get_embed_and_head()``.  So the draft's hidden size and vocab must equal the target's.
# EAGLE-3 does not fit both families: its draft reads the target's auxiliary hidden states, which
# NemotronHForCausalLM does not capture (no ``set_eagle3_layers_to_capture`` in 0.5.17; Qwen3-Next has it),
# so one draft architecture serves both and the A/B stays comparable across families.
# Decoder-layer shapes: a Llama-3-8B EAGLE head for the 4096-wide Nemotron-H-8B (32 q / 8 kv heads x 128,
# MLP 14336, as yuhuili/EAGLE-LLaMA3-Instruct-8B), a Qwen3-1.7B-sized layer for the 2048-wide Qwen3-Next
# (16 q / 8 kv heads x 128, MLP 6144), the tiny geometries' own attention shape for the tiny targets.
EAGLE_DRAFT_ARCH = "LlamaForCausalLMEagle"
_EAGLE_LAYER_LLAMA3_8B = {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                          "intermediate_size": 14336, "rope_theta": 500000.0}
_EAGLE_LAYER_QWEN3_NEXT = {"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                           "intermediate_size": 6144, "rope_theta": 10000000.0}
_EAGLE_LAYER_TINY = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                     "intermediate_size": 512, "rope_theta": 10000.0}
EAGLE_DRAFT_LAYERS: Dict[str, Dict] = {
    "nemotron-h-8b": _EAGLE_LAYER_LLAMA3_8B,
    "qwen3-next-80b-a3b": _EAGLE_LAYER_QWEN3_NEXT,
    "qwen3-next-80b-a3b-e64": _EAGLE_LAYER_QWEN3_NEXT,
    "tiny-nemotron-h": _EAGLE_LAYER_TINY,
    "tiny-qwen3-next": _EAGLE_LAYER_TINY,
}


def eagle_draft_names() -> List[str]:
    """Built-in geometries that ship a dummy-weight EAGLE draft (``--spec eagle`` without ``--spec-draft-model``)."""
    return [n for n in names() if n in EAGLE_DRAFT_LAYERS]


def eagle_draft_config(name: str) -> Dict:
    """``config.json`` of the EAGLE-1 draft of built-in geometry ``name``: one ``LlamaForCausalLMEagle`` layer
    whose hidden size, vocab, context and special tokens are the target's (what the draft consumes and shares)."""
    g = get(name)
    if name not in EAGLE_DRAFT_LAYERS:
        raise ValueError(f"model {name!r} has no built-in EAGLE draft (built-in: {', '.join(eagle_draft_names())}); "
                         "pass --spec-draft-model DIR")
    t = g.config
    eps = t.get("rms_norm_eps", t.get("layer_norm_epsilon", 1e-5))
    cfg = {"architectures": [EAGLE_DRAFT_ARCH], "model_type": "llama", "torch_dtype": t.get("torch_dtype", "bfloat16"),
           "vocab_size": t["vocab_size"], "hidden_size": t["hidden_size"], "num_hidden_layers": 1,
           "hidden_act": "silu", "rms_norm_eps": eps, "max_position_embeddings": t["max_position_embeddings"],
           "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}
    cfg.update(EAGLE_DRAFT_LAYERS[name])
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if k in t:
            cfg[k] = t[k]
    return cfg


def materialize_eagle_draft(name: str, root=None, tokenizer: bool = True) -> str:
    """Write the EAGLE draft of built-in geometry ``name`` (``config.json`` + the target's synthetic tokenizer)
    into a fresh directory, served with ``--load-format dummy``; return the dir."""
    cfg = eagle_draft_config(name)
    d = Path(tempfile.mkdtemp(prefix=f"replayssm-ab-{name}-eagle-draft-", dir=root))
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    if tokenizer:
        V = int(cfg["vocab_size"])
        write_tokenizer(d, V, bos=min(_first_id(cfg.get("bos_token_id"), 1), V - 1),
                        eos=min(_first_id(cfg.get("eos_token_id"), 2), V - 1),
                        pad=min(_first_id(cfg.get("pad_token_id"), 0), V - 1))
    return str(d)


# ---------------------------------------------------------------------------------
# sizes (for the docs and the report)
# ---------------------------------------------------------------------------------
def layer_counts(cfg: Dict) -> Dict[str, int]:
    mt = cfg.get("model_type")
    if mt == "nemotron_h":
        p = cfg.get("hybrid_override_pattern", "")
        return {"mamba2": p.count("M"), "attention": p.count("*"), "mlp": p.count("-"), "moe": p.count("E")}
    if mt in ("qwen3_next", "qwen3_5_text"):
        n, k = cfg["num_hidden_layers"], cfg["full_attention_interval"]
        att = sum(1 for i in range(n) if (i + 1) % k == 0)
        return {"gdn": n - att, "attention": att}
    if mt == "falcon_h1":
        return {"mamba2+attention (parallel)": cfg["num_hidden_layers"]}
    if mt == "granitemoehybrid":
        lt = cfg["layer_types"]
        return {"mamba2": lt.count("mamba"), "attention": lt.count("attention")}
    return {}


def ssm_state_bytes_per_seq(cfg: Dict, state_bytes: int = 4) -> int:
    """Recurrent-state bytes per sequence (fp32 state by default), summed over SSM layers."""
    mt = cfg.get("model_type")
    lc = layer_counts(cfg)
    if mt == "nemotron_h":
        return lc["mamba2"] * cfg["mamba_num_heads"] * cfg["mamba_head_dim"] * cfg["ssm_state_size"] * state_bytes
    if mt in ("qwen3_next", "qwen3_5_text"):
        per = cfg["linear_num_value_heads"] * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"]
        return lc["gdn"] * per * state_bytes
    if mt == "falcon_h1":
        n = cfg["num_hidden_layers"]
        return n * cfg["mamba_n_heads"] * cfg["mamba_d_head"] * cfg["mamba_d_state"] * state_bytes
    if mt == "granitemoehybrid":
        return lc["mamba2"] * cfg["mamba_n_heads"] * cfg["mamba_d_head"] * cfg["mamba_d_state"] * state_bytes
    return 0


def describe() -> str:
    from eval import report

    rows = []
    for g in _GEOMETRIES:
        lc = ", ".join(f"{v} {k}" for k, v in layer_counts(g.config).items())
        rows.append([g.name, g.size, g.family, g.config["architectures"][0], lc,
                     f"{ssm_state_bytes_per_seq(g.config) / 2**20:.1f}", g.attention_backend, str(g.min_tp), g.h200])
    return report.markdown_table(
        ["model", "size", "ssm", "architecture", "layers", "state MiB/seq (fp32)", "attention", "min --tp", "H200"],
        rows, align=["l", "l", "l", "l", "l", "r", "l", "r", "l"])


def main() -> int:
    print(describe())
    print()
    for g in _GEOMETRIES:
        print(f"{g.name}: {g.source}" + (f" [{g.notes}]" if g.notes else ""))
    print()
    print(f"EAGLE drafts (--spec eagle; {EAGLE_DRAFT_ARCH}, dummy weights, the target's embedding and LM head):")
    for name in eagle_draft_names():
        c = eagle_draft_config(name)
        print(f"  {name}: {c['num_hidden_layers']} layer, hidden {c['hidden_size']}, {c['num_attention_heads']} q / "
              f"{c['num_key_value_heads']} kv heads x {c['head_dim']}, MLP {c['intermediate_size']}, "
              f"vocab {c['vocab_size']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
