"""Scaled random weights for ``--load-format dummy`` servers (A/B harness, test only).

SGLang's dummy loader fills every floating tensor with uniform(-1e-3, 1e-3) from one seed,
so equal-sized tensors are identical, norms are ~0, and the Mamba2 ``A`` (normally
``-exp(A_log)``, set by the checkpoint loader that dummy loading skips) is ~±1e-3.  Greedy
outputs of such a model are degenerate (one token repeated), which makes a parity run
blind.  This module draws weights a real model could have instead:

* matrices and higher-rank tensors: normal(0, gain / sqrt(fan_in)), fan_in = last dim
  (``lm_head`` with ``REPLAYSSM_EVAL_LM_HEAD_GAIN``, default 3, so greedy picks are clear);
* Mamba2 ``A``: -uniform(1, 16); GDN ``A_log``: log uniform(1, 16);
* ``dt_bias``: softplus^-1 of a log-uniform dt in [1e-3, 1e-1] (Mamba2's dt init range);
* ``D``: 1; 1-D biases (incl. router correction biases): 0;
* 1-D norm weights: 1, or 0 for Gemma-style norms that compute ``x * (1 + w)``.

Each tensor gets its own generator seeded from (``REPLAYSSM_EVAL_WEIGHT_SEED``, parameter
name), on the parameter's device: the stock and the patched server of an A/B run, and two
runs of the same server, get bit-identical weights.

Pinned greedy token (``REPLAYSSM_EVAL_PINNED_TOKEN=X``, ``eval.ab --pinned-token X``): after the draw,
:func:`pin_argmax_` makes every greedy pick of the target *and* of a separate EAGLE draft token X, whatever the
context, so the draft is accepted at every step, along a real tree path for ``--speculative-eagle-topk`` > 1
(simulated acceptance takes consecutive node ids instead).  The residual stream's dimension ``d = 0`` is held at
1: every embedding row has 1 there, and every weight that writes the residual stream (each 2-D weight with
``hidden_size`` output rows: attention / SSM / MLP output projections, some harmless extras; MoE expert down
projections; the EAGLE draft's ``fc``, whose row ``d`` copies the token embedding's dimension ``d``) has 0 in row
``d``.  The final norms keep only dimension ``d``, so the normalised state is ``e_d / rms(x)``; ``lm_head`` keeps
only column ``d``, negative but for ``X``, so the logits are ``lm_head[:, d] / rms(x)`` (an EAGLE draft has no
final norm and the target's LM head: its logits are ``lm_head[:, d] * 1``).  Token X wins every step;
the other tokens' logprobs are linear in ``1 / rms(x)``, which depends on every layer's output, SSM layers
included, so spec-vs-non-spec top-k logprobs compare what the verify computed along the accepted path.

Activation (in every SGLang process, spawned schedulers included): the harness exports
``REPLAYSSM_EVAL_RANDOM_WEIGHTS=1`` and registers :func:`register` as an entry point in
group ``sglang.srt.plugins`` (``eval/entry_points.py`` writes the dist-info).  Unset, the
plugin does nothing; it also skips the launcher process, which never loads weights
(``REPLAYSSM_EVAL_WEIGHTS_IN_MAIN=1`` installs it there too).  The variables deliberately
avoid the ``SGLANG_REPLAYSSM_`` prefix, which the package config reserves.
"""

from __future__ import annotations

import math
import os
import zlib
from typing import Any, Callable, Dict, Optional

ENABLE_ENV = "REPLAYSSM_EVAL_RANDOM_WEIGHTS"
SEED_ENV = "REPLAYSSM_EVAL_WEIGHT_SEED"
GAIN_ENV = "REPLAYSSM_EVAL_WEIGHT_GAIN"
LM_HEAD_GAIN_ENV = "REPLAYSSM_EVAL_LM_HEAD_GAIN"
PINNED_TOKEN_ENV = "REPLAYSSM_EVAL_PINNED_TOKEN"
PIN_DIM = 0  # the residual-stream dimension held at 1 under a pinned token

TARGET_MODULE = "sglang.srt.model_loader.weight_utils"
TARGET_NAME = "initialize_dummy_weights"
TARGET = f"{TARGET_MODULE}.{TARGET_NAME}"
# modules that bind the function by name (``from ..weight_utils import initialize_dummy_weights``)
IMPORTERS = ("sglang.srt.model_loader.loader",)

# printed once per model by every scheduler; the harness greps server logs for it
LOG_MARKER = "replayssm-eval: scaled random weights"
PIN_MARKER = "replayssm-eval: greedy pick pinned to token"

A_RANGE = (1.0, 16.0)
DT_RANGE = (1e-3, 1e-1)


def enabled(env: Optional[Dict[str, str]] = None) -> bool:
    v = (os.environ if env is None else env).get(ENABLE_ENV, "")
    return v.strip().lower() in ("1", "true", "yes", "on")


def _float_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        raise SystemExit(f"replayssm-eval: {name}={os.environ[name]!r} is not a number") from None


def settings() -> Dict[str, float]:
    return {
        "seed": int(_float_env(SEED_ENV, 0)),
        "gain": _float_env(GAIN_ENV, 1.0),
        "lm_head_gain": _float_env(LM_HEAD_GAIN_ENV, 3.0),
    }


def pinned_token(env: Optional[Dict[str, str]] = None) -> Optional[int]:
    """``REPLAYSSM_EVAL_PINNED_TOKEN`` as a token id, None when unset; a bad value stops the process."""
    v = (os.environ if env is None else env).get(PINNED_TOKEN_ENV, "").strip()
    if not v:
        return None
    try:
        tok = int(v)
    except ValueError:
        tok = -1
    if tok < 0:
        raise SystemExit(f"replayssm-eval: {PINNED_TOKEN_ENV}={v!r} is not a token id (an integer >= 0)")
    return tok


def _hidden_size(model: Any) -> int:
    """The residual stream's width: the token embedding's columns (``embed_tokens`` / ``embeddings``)."""
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 2)
        if p.dim() == 2 and len(leaf) >= 2 and leaf[-2] in ("embed_tokens", "embeddings") and leaf[-1] == "weight":
            return int(p.shape[1])
    cfg = getattr(model, "config", None)
    H = getattr(cfg, "hidden_size", None)
    if not H:
        raise ValueError("pin_argmax_: the model has no token embedding and no config.hidden_size")
    return int(H)


def _final_norm(name: str) -> bool:
    """A final norm's weight: a norm module directly under the model body (``model.norm``, ``model.norm_f``,
    ``model.final_layernorm``), not one inside a layer."""
    parts = name.split(".")
    return len(parts) == 3 and parts[0] == "model" and parts[2] == "weight" and "norm" in parts[1]


def pin_argmax_(model: Any, token: int, dim: int = PIN_DIM) -> Dict[str, int]:
    """Make greedy decoding of ``model`` pick ``token`` at every step (see the module docstring); in place, after
    :func:`randomize_`.  Returns counts of what was set, by kind; raises when the model has no final norm or
    ``token`` is outside the vocabulary."""
    import torch

    H = _hidden_size(model)
    head_w = getattr(getattr(model, "lm_head", None), "weight", None)
    embed_w = getattr(getattr(getattr(model, "model", None), "embed_tokens", None), "weight", None)
    if head_w is not None and head_w is embed_w:
        raise ValueError("pin_argmax_: the LM head is the token embedding (tie_word_embeddings): cannot pin")
    counts: Dict[str, int] = {}
    seen = set()

    def count(kind: str) -> None:
        counts[kind] = counts.get(kind, 0) + 1

    with torch.no_grad():
        for mod_name, module in model.named_modules():
            for leaf, p in module.named_parameters(recurse=False):
                if id(p) in seen or not torch.is_floating_point(p):
                    continue
                seen.add(id(p))
                name = f"{mod_name}.{leaf}" if mod_name else leaf
                gemma = "Gemma" in type(module).__name__
                if p.dim() == 2 and mod_name.rsplit(".", 1)[-1] in ("embed_tokens", "embeddings"):
                    p[:, dim] = 1.0
                    count("embedding")
                elif p.dim() == 2 and "lm_head" in name:
                    if token >= p.shape[0]:
                        raise ValueError(f"pin_argmax_: token {token} is outside the vocabulary ({p.shape[0]})")
                    gen = torch.Generator(device=p.device)
                    gen.manual_seed(_param_seed(token, name))
                    col = torch.empty(p.shape[0], dtype=torch.float32, device=p.device).uniform_(0.5, 1.5,
                                                                                                 generator=gen)
                    col.neg_()[token] = 1.0
                    p.zero_()  # only dimension d reaches the logits: also for an EAGLE draft, which has no final norm
                    p[:, dim] = col.to(p.dtype)
                    count("lm_head")
                elif p.dim() == 1 and _final_norm(name) and p.shape[0] == H:
                    keep = torch.zeros_like(p)
                    keep[dim] = 1.0
                    p.copy_(keep - 1.0 if gemma else keep)  # Gemma norms scale by (1 + w)
                    gw = getattr(module, "gemma_weight", None)
                    if gemma and gw is not None and hasattr(gw, "copy_") and gw.shape == p.shape:
                        gw.copy_(keep.to(gw.dtype))
                    count("final_norm")
                elif p.dim() == 2 and leaf == "weight" and mod_name.rsplit(".", 1)[-1] == "fc" \
                        and p.shape[0] == H and p.shape[1] >= H:
                    p[dim, :] = 0.0  # EAGLE's fc(cat(embedding, target hidden)): dimension d copies the embedding's
                    p[dim, dim] = 1.0
                    count("eagle_fc")
                elif p.dim() == 2 and p.shape[0] == H:
                    p[dim, :] = 0.0  # writes the residual stream (or a harmless extra): nothing into dimension d
                    count("residual_writer")
                elif p.dim() == 3 and (leaf.startswith("w2") or (p.shape[1] == H and p.shape[2] != H)):
                    if p.shape[1] != H:
                        raise ValueError(f"pin_argmax_: expert weight {name} {tuple(p.shape)} is not [experts, "
                                         f"hidden={H}, intermediate]")
                    p[:, dim, :] = 0.0  # MoE experts' down projections (SGLang's w2) [experts, hidden, intermediate]
                    count("expert_writer")
                elif p.dim() == 1 and p.shape[0] == H and leaf == "bias":
                    p[dim] = 0.0
                    count("residual_bias")
    # an EAGLE draft (its fc) ends without a norm: lm_head's one nonzero column reads dimension d, which is 1
    if not counts.get("lm_head") or not (counts.get("final_norm") or counts.get("eagle_fc")):
        raise ValueError(f"pin_argmax_: no lm_head, or neither a final norm nor an EAGLE fc (set: {counts})")
    return counts


def _param_seed(seed: int, name: str) -> int:
    return (zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1)) & 0x7FFFFFFF


def classify(name: str, param: Any, owner_cls: str) -> str:
    """The rule for one parameter (see the module docstring): a short label."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "A":
        return "mamba_A"
    if leaf == "A_log":
        return "A_log"
    if leaf == "dt_bias":
        return "dt_bias"
    if leaf == "D":
        return "ones"
    if param.dim() >= 2:
        return "lm_head" if "lm_head" in name else "matrix"
    if leaf.endswith("bias"):
        return "zeros"
    if param.dim() == 1 and leaf == "weight":
        return "zeros" if "Gemma" in owner_cls else "ones"
    return "keep"


def fill_(name: str, param: Any, rule: str, cfg: Dict[str, float]) -> None:
    """Overwrite ``param`` in place according to ``rule`` (deterministic per name)."""
    import torch

    if rule == "keep":
        return
    with torch.no_grad():
        if rule == "ones":
            param.data.fill_(1.0)
            return
        if rule == "zeros":
            param.data.zero_()
            return
        gen = torch.Generator(device=param.device)
        gen.manual_seed(_param_seed(int(cfg["seed"]), name))
        buf = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        if rule in ("matrix", "lm_head"):
            gain = cfg["lm_head_gain"] if rule == "lm_head" else cfg["gain"]
            buf.normal_(0.0, gain / math.sqrt(max(1, param.shape[-1])), generator=gen)
        elif rule == "mamba_A":
            buf.uniform_(*A_RANGE, generator=gen).neg_()
        elif rule == "A_log":
            buf.uniform_(*A_RANGE, generator=gen).log_()
        elif rule == "dt_bias":
            lo, hi = math.log(DT_RANGE[0]), math.log(DT_RANGE[1])
            dt = buf.uniform_(lo, hi, generator=gen).exp_()
            buf = dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt)
        else:  # pragma: no cover - classify() returns only the labels above
            raise ValueError(rule)
        param.data.copy_(buf.to(param.dtype))


def randomize_(model: Any, cfg: Optional[Dict[str, float]] = None) -> Dict[str, int]:
    """Apply the rules to every floating parameter of >= 16 bits; returns counts per rule."""
    import torch

    cfg = settings() if cfg is None else cfg
    counts: Dict[str, int] = {}
    seen = set()
    for mod_name, module in model.named_modules():
        for leaf, p in module.named_parameters(recurse=False):
            if id(p) in seen or not torch.is_floating_point(p) or torch.finfo(p.dtype).bits < 16:
                continue
            seen.add(id(p))
            name = f"{mod_name}.{leaf}" if mod_name else leaf
            rule = classify(name, p, type(module).__name__)
            fill_(name, p, rule, cfg)
            counts[rule] = counts.get(rule, 0) + 1
        # Gemma-style norms keep a precomputed (1 + w) buffer the weight loader refreshes
        gw = getattr(module, "gemma_weight", None)
        w = getattr(module, "weight", None)
        if gw is not None and w is not None and hasattr(gw, "copy_") and gw.shape == w.shape:
            with torch.no_grad():
                gw.copy_(w.detach().to(gw.dtype) + 1.0)
    return counts


def around_initialize_dummy_weights(original: Callable, model: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook: stock dummy init first (fp8 tensors, buffers), then the scaled draw."""
    result = original(model, *args, **kwargs)
    if enabled():
        cfg = settings()
        counts = randomize_(model, cfg)
        msg = (f"{LOG_MARKER} (seed={cfg['seed']}, gain={cfg['gain']}, lm_head_gain={cfg['lm_head_gain']}): "
               + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        print(msg, flush=True)  # scheduler stdout -> the server log the harness greps
        token = pinned_token()
        if token is not None:
            pins = pin_argmax_(model, token)
            print(f"{PIN_MARKER} {token} (residual dimension {PIN_DIM}): "
                  + ", ".join(f"{k}={v}" for k, v in sorted(pins.items())), flush=True)
    return result


def _rebind(original: Callable, wrapped: Callable) -> int:
    """Point every by-name binding of the original in loaded SGLang modules at the wrapper."""
    import sys

    n = 0
    for name, mod in list(sys.modules.items()):
        if not (name == "sglang" or name.startswith("sglang.")):
            continue
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for attr, value in list(d.items()):
            if value is original:
                try:
                    setattr(mod, attr, wrapped)
                    n += 1
                except (AttributeError, TypeError):
                    pass
    return n


def install() -> Callable:
    """AROUND-wrap the dummy initializer in this process (idempotent); returns the wrapper.

    Sets the wrapper on ``weight_utils`` and on every module that already bound the function
    by name (``loader.py`` does); a module imported later binds the wrapper.  Checked here:
    SGLang logs and swallows plugin errors, and a silent miss would leave degenerate weights.
    """
    import functools
    import importlib

    wu = importlib.import_module(TARGET_MODULE)
    current = getattr(wu, TARGET_NAME)
    if getattr(current, "_replayssm_eval", False):
        return current

    @functools.wraps(current)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return around_initialize_dummy_weights(current, *args, **kwargs)

    wrapped.__wrapped__ = current  # type: ignore[attr-defined]
    wrapped._replayssm_eval = True  # type: ignore[attr-defined]
    setattr(wu, TARGET_NAME, wrapped)
    _rebind(current, wrapped)
    import sys

    for mod_name in IMPORTERS:
        mod = sys.modules.get(mod_name)
        if mod is not None and getattr(mod, TARGET_NAME, None) is not wrapped:
            raise RuntimeError(f"replayssm-eval: {mod_name}.{TARGET_NAME} still unwrapped")
    if getattr(wu, TARGET_NAME) is not wrapped:
        raise RuntimeError(f"replayssm-eval: could not wrap {TARGET}")
    return wrapped


def register() -> None:
    """Entry point (group ``sglang.srt.plugins``): inert unless REPLAYSSM_EVAL_RANDOM_WEIGHTS=1."""
    if not enabled():
        return
    settings()  # fail early on bad numbers
    pinned_token()
    import multiprocessing

    if multiprocessing.parent_process() is None and not os.environ.get("REPLAYSSM_EVAL_WEIGHTS_IN_MAIN"):
        return  # the launcher never loads weights; the spawned schedulers do
    try:
        install()
    except Exception as e:
        # SGLang would log and continue with degenerate weights; a parity run must not
        raise SystemExit(f"replayssm-eval: cannot install the random-weights hook: {e}") from None
