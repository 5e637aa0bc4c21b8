"""Seam: ``TokenizerManager.generate_request`` -- reject bad token ids before they reach the scheduler.

A launch check (listed by :func:`sglang_replayssm.patches.all_patches`, so it is applied whenever the
package is enabled, also with ``--replayssm-staged false``). No math.

Why: SGLang 0.5.15-0.5.23 do not range-check caller-supplied ``input_ids`` before the model runs
(0.5.15/0.5.17 define ``_validate_input_ids_in_vocab`` but call it nowhere). An id < 0 or >= vocab size
reaches the embedding gather on the GPU, trips a device-side assert and kills the scheduler together
with every other user's requests.

Where: every entry point that serves a prompt calls ``TokenizerManager.generate_request(obj, request)``
in the HTTP server / tokenizer-manager process (``/generate``, ``/encode``, OpenAI completions / chat /
embeddings, Ollama, gRPC bridge, ``Engine.generate``), before ``normalize_batch_and_arguments``, before
any tokenization, and before anything is sent to the scheduler. An AROUND hook checks the caller's
``obj.input_ids`` (one prompt or a batch, as the caller gave them) and raises
:class:`InvalidTokenIdsError` (a ``ValueError``) at the generator's first step -- where SGLang raises its
own request errors -- so the HTTP handlers turn it into a 400 and no part of a bad batch is dispatched.
Ids that SGLang itself produces (tokenizer, multimodal processor) are not checked here.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

from .registry import Patch

TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"

_SEQ = (list, tuple)
_SHAPE = "input_ids must be one prompt (a list of int token ids) or a batch (a list of such lists)"


class InvalidTokenIdsError(ValueError):
    """A request's ``input_ids`` are not token ids of the served model (SGLang answers HTTP 400)."""

    status_code = 400


def _show(x: Any) -> str:
    r = repr(x)
    if len(r) > 40:
        r = r[:37] + "..."
    return r if x is None or type(x) is int else f"{r} ({type(x).__name__})"


def _range(vocab_size: Optional[int]) -> str:
    return f"[0, {vocab_size}) (the model's vocab size)" if vocab_size else ">= 0"


def _prompt_error(ids, vocab_size: Optional[int], where: str, in_batch: bool) -> Optional[str]:
    """The first problem in one prompt's ids, or None. Fast path: all plain ints, then min/max."""
    if len(ids) == 0:
        return f"{where} is an empty prompt: give at least one token id"
    if set(map(type, ids)) == {int}:
        if min(ids) >= 0 and (not vocab_size or max(ids) < vocab_size):
            return None
    for j, x in enumerate(ids):
        at = f"{where}[{j}]"
        if isinstance(x, _SEQ):
            if in_batch:
                return f"{at} is a list: input_ids nests at most two levels (a batch of prompts, each a list of ints)"
            return f"{at} is a list but {where}[0] is not: {_SHAPE}"
        if type(x) is bool or not isinstance(x, int):
            return f"{at} = {_show(x)} is not a token id: token ids must be ints in {_range(vocab_size)}"
        if x < 0 or (vocab_size and x >= vocab_size):
            return f"{at} = {x} is out of range: token ids must be in {_range(vocab_size)}"
    return None


def input_ids_error(input_ids, vocab_size: Optional[int], name: str = "input_ids") -> Optional[str]:
    """One line naming the first bad token id of ``input_ids`` and its position, or None if all are valid.

    ``input_ids`` is one prompt (a list of ints) or a batch (a list of non-empty lists of ints); each id
    must be a plain ``int`` (``bool`` and numpy integers are refused) in ``[0, vocab_size)``. A falsy
    ``vocab_size`` (unknown) checks only the types, the shape and ``id >= 0``. ``None`` is valid (no ids).
    """
    if input_ids is None:
        return None
    if not isinstance(input_ids, _SEQ):
        return f"{name} = {_show(input_ids)} is not a list: {_SHAPE}"
    if len(input_ids) == 0:
        return f"{name} is empty: give at least one token id"
    if not isinstance(input_ids[0], _SEQ):
        return _prompt_error(input_ids, vocab_size, name, in_batch=False)
    for i, prompt in enumerate(input_ids):
        if not isinstance(prompt, _SEQ):
            return f"{name}[{i}] = {_show(prompt)} is not a list but {name}[0] is: {_SHAPE}"
        err = _prompt_error(prompt, vocab_size, f"{name}[{i}]", in_batch=True)
        if err is not None:
            return err
    return None


def check_request(tokenizer_manager, obj) -> None:
    """Raise :class:`InvalidTokenIdsError` when ``obj.input_ids`` (a Generate/EmbeddingReqInput) is bad."""
    input_ids = getattr(obj, "input_ids", None)
    if input_ids is None:
        return
    vocab_size = getattr(getattr(tokenizer_manager, "model_config", None), "vocab_size", None)
    err = input_ids_error(input_ids, vocab_size)
    if err is not None:
        # refused before normalize_batch_and_arguments, which sets is_single and the rids; SGLang's streaming
        # /generate still runs its deferred client-disconnect abort (create_abort_task) over them: leave it an
        # empty batch, so it neither fails on a missing attribute nor aborts a caller-chosen rid
        obj.is_single, obj.rid = False, []
        raise InvalidTokenIdsError(err)


async def generate_request_around(original, self, obj, *args, **kwargs):
    """Check ``obj``'s token ids at the first step, then stream SGLang's own generator unchanged."""
    check_request(self, obj)
    async with contextlib.aclosing(original(self, obj, *args, **kwargs)) as responses:
        async for response in responses:
            yield response


PATCHES = [
    Patch(TARGET, "around", generate_request_around, params=("self", "obj"),
          description="reject requests whose input_ids are not token ids of the model (HTTP 400)"),
]
