"""Seam: the chain target verify's causal conv1d -> ``kernels.conv_verify.conv1d_verify`` (no math here).

Applied with the replay ring (``--replayssm-conv-verify auto``, the default) or with ``--replayssm-conv-verify
true`` alone; ``false`` keeps SGLang's kernel (``eval/bench_conv.py`` times the two).  It does not need the ring: it
swaps one kernel for another with the same side effects.

How SGLang runs it (0.5.15 / 0.5.17 / 0.5.23): under EAGLE/MTP the Mamba2 mixer (``mamba.py``, target verify) and
the GDN and KDA backends call SGLang's Triton ``causal_conv1d_update(x, conv_state, weight, bias, activation,
conv_state_indices=..., intermediate_conv_window=..., intermediate_state_indices=..., retrieve_*=...)``: the outputs
of the T draft tokens, the per-draft conv windows that the commit's rollback scatter reads
(``intermediate_conv_window``; a deduplicated ``as_strided`` view on CUDA) and the last K-1 inputs written to the
conv state.  The function lives in ``sglang.kernels.ops.mamba.causal_conv1d_triton`` (0.5.17+) or
``sglang.srt.layers.attention.mamba.causal_conv1d_triton`` (0.5.15) and the callers bind it by ``from ... import``
(the Mamba2 mixer as ``causal_conv1d_update_triton``), so the AROUND hook also rewrites those bindings
(``propagate``).

Routed to the package's kernel: a call with ``intermediate_conv_window``, a [batch, dim, T] ``x``, no tree
(``retrieve_next_token`` None), no ``num_accept_tokens``, no ``cache_seqlens``, SGLang's pad slot -1 and arguments
the kernel takes (``kernels.conv_verify.argument_problem``).  Everything else (decode, prefill, trees, other users,
arguments the kernel refuses) runs SGLang's code.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Dict, List, Optional

from .registry import Patch

logger = logging.getLogger("sglang_replayssm.patches")

TARGET = "sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update"
TARGET_0515 = "sglang.srt.layers.attention.mamba.causal_conv1d_triton.causal_conv1d_update"
PARAMS = ("x", "conv_state", "weight", "bias", "activation", "cache_seqlens", "conv_state_indices",
          "num_accept_tokens", "intermediate_conv_window", "intermediate_state_indices", "retrieve_next_token",
          "retrieve_next_sibling", "retrieve_parent_token", "pad_slot_id")

_SIG: Dict[Any, inspect.Signature] = {}
_LOGGED: List[bool] = []


def _bind(original, args, kwargs) -> Dict[str, Any]:
    sig = _SIG.get(original)
    if sig is None:
        sig = _SIG[original] = inspect.signature(inspect.unwrap(original))
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def not_chain_verify(a: Dict[str, Any]) -> Optional[str]:
    """Why a bound call is not the chain target verify this seam takes (None: it is)."""
    if a.get("intermediate_conv_window") is None:
        return "no intermediate_conv_window (not a target verify)"
    for name in ("retrieve_next_token", "retrieve_next_sibling", "num_accept_tokens", "cache_seqlens"):
        if a.get(name) is not None:
            return f"{name} is set"
    if a.get("pad_slot_id") != -1:
        return f"pad_slot_id={a.get('pad_slot_id')} (the kernel skips negative slots, SGLang's pad slot is -1)"
    if a.get("validate_data"):
        return "validate_data=True"
    if a["x"].dim() != 3:
        return f"x has shape {tuple(a['x'].shape)}, not [batch, dim, T]"
    from ..kernels.conv_verify import argument_problem

    return argument_problem(a["x"], a["conv_state"], a["weight"], a["bias"], a["activation"],
                            conv_state_indices=a["conv_state_indices"],
                            intermediate_conv_window=a["intermediate_conv_window"],
                            intermediate_state_indices=a["intermediate_state_indices"])


def _kernel():
    from ..kernels.conv_verify import conv1d_verify

    return conv1d_verify


def conv_update_around(original, *args, **kwargs):
    """AROUND SGLang's Triton ``causal_conv1d_update``: chain target-verify calls to ``conv1d_verify``."""
    if kwargs.get("intermediate_conv_window") is None and len(args) <= PARAMS.index("intermediate_conv_window"):
        return original(*args, **kwargs)  # no window (decode, prefill): straight through, nothing bound
    a = _bind(original, args, kwargs)
    if not_chain_verify(a) is not None:
        return original(*args, **kwargs)
    if not _LOGGED:
        _LOGGED.append(True)
        logger.info("sglang_replayssm: target-verify conv1d on conv1d_verify (window %d, %d channels)",
                    a["x"].shape[-1], a["x"].shape[1])
    return _kernel()(a["x"], a["conv_state"], a["weight"], a["bias"], a["activation"],
                     conv_state_indices=a["conv_state_indices"],
                     intermediate_conv_window=a["intermediate_conv_window"],
                     intermediate_state_indices=a["intermediate_state_indices"])


PATCHES: List[Patch] = [
    Patch(TARGET, "around", conv_update_around, versions=">=0.5.17,<0.6", params=PARAMS, propagate=True,
          description="target-verify causal conv1d (+ rollback windows) -> conv1d_verify"),
    Patch(TARGET_0515, "around", conv_update_around, versions=">=0.5.15,<0.5.17", params=PARAMS, propagate=True,
          description="target-verify causal conv1d (+ rollback windows) -> conv1d_verify"),
]
