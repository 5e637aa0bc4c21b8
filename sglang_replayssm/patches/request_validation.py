"""Seam: ``TokenizerManager.generate_request`` -- reject bad token ids (and unknown sampling keys) up front.

A launch check (listed by :func:`sglang_replayssm.patches.launch_check_patches`, so it is applied whenever the
package is enabled, also with ``--replayssm-replay-ring false``). No math.

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

The same hook refuses ``sampling_params`` keys that SGLang's sampling-params class does not take
(:class:`UnknownSamplingParamError`, 400): SGLang builds that class with ``**sampling_params`` and an unknown key
raises ``TypeError``, which its handlers answer with a 500 and an unhandled-exception traceback that also drops
the keep-alive connection (the soak saw other requests on it reset).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
from typing import Any, FrozenSet, Optional

from .registry import Patch

TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"

_SEQ = (list, tuple)
_SHAPE = "input_ids must be one prompt (a list of int token ids) or a batch (a list of such lists)"


class InvalidRequestError(ValueError):
    """A request refused by this check (a ``ValueError``: SGLang answers HTTP 400)."""

    status_code = 400


class InvalidTokenIdsError(InvalidRequestError):
    """A request's ``input_ids`` are not token ids of the served model (SGLang answers HTTP 400)."""


class UnknownSamplingParamError(InvalidRequestError):
    """A request's ``sampling_params`` hold a key SGLang's sampling-params class does not take (HTTP 400)."""


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


def sampling_param_names(cls) -> Optional[FrozenSet[str]]:
    """The keyword arguments ``cls(**kwargs)`` takes (a msgspec Struct's fields or ``__init__``'s named
    parameters), or None when that cannot be told (``**kwargs`` in the signature: every key is taken)."""
    fields = getattr(cls, "__struct_fields__", None)
    if fields:
        return frozenset(fields)
    try:
        params = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.name != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL)


def sampling_params_error(sampling_params, names: Optional[FrozenSet[str]]) -> Optional[str]:
    """One line naming the first unknown key of ``sampling_params`` (a dict, or a batch: a list of dicts), or
    None. Values and non-dict entries are left to SGLang's own checks (which answer 400)."""
    if not names:
        return None
    batch = isinstance(sampling_params, (list, tuple))
    for i, sp in enumerate(sampling_params if batch else [sampling_params]):
        if not isinstance(sp, dict):
            continue
        for key in sp:
            if key not in names:
                where = f"sampling_params[{i}]" if batch else "sampling_params"
                near = difflib.get_close_matches(str(key), sorted(names), n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                return f"{where} has an unknown key {key!r}{hint}: SGLang's sampling parameters do not include it"
    return None


def check_request(tokenizer_manager, obj) -> None:
    """Raise :class:`InvalidRequestError` when ``obj`` (a Generate/EmbeddingReqInput) has bad ``input_ids``
    or an unknown ``sampling_params`` key."""
    err = None
    input_ids = getattr(obj, "input_ids", None)
    if input_ids is not None:
        vocab_size = getattr(getattr(tokenizer_manager, "model_config", None), "vocab_size", None)
        err = input_ids_error(input_ids, vocab_size)
        if err is not None:
            _refuse(obj, InvalidTokenIdsError(err))
    sampling_params = getattr(obj, "sampling_params", None)
    if sampling_params:
        cls = getattr(tokenizer_manager, "sampling_params_class", None)
        if cls is None:
            try:
                from sglang.srt.sampling.sampling_params import SamplingParams as cls
            except ImportError:
                return
        err = sampling_params_error(sampling_params, sampling_param_names(cls))
        if err is not None:
            _refuse(obj, UnknownSamplingParamError(err))


def _refuse(obj, error: InvalidRequestError) -> None:
    # refused before normalize_batch_and_arguments, which sets is_single and the rids; SGLang's streaming
    # /generate still runs its deferred client-disconnect abort (create_abort_task) over them: leave it an
    # empty batch, so it neither fails on a missing attribute nor aborts a caller-chosen rid
    obj.is_single, obj.rid = False, []
    raise error


async def generate_request_around(original, self, obj, *args, **kwargs):
    """Check ``obj``'s token ids at the first step, then stream SGLang's own generator unchanged."""
    check_request(self, obj)
    async with contextlib.aclosing(original(self, obj, *args, **kwargs)) as responses:
        async for response in responses:
            yield response


PATCHES = [
    Patch(TARGET, "around", generate_request_around, params=("self", "obj"),
          description="reject requests whose input_ids are not token ids of the model, or whose sampling_params "
                      "hold an unknown key (HTTP 400)"),
]
