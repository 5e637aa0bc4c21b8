"""The request-validation launch check (``patches/request_validation.py``) on real SGLang 0.5.17, on CPU.

Three levels: the pure validator on every bad kind and on good prompts; SGLang's real
``TokenizerManager.generate_request`` patched through the registry (a bad request raises before SGLang's
own body starts, a good one runs it with the ids untouched); and SGLang's real FastAPI ``app``
(``/generate`` and OpenAI ``/v1/completions``) over a tokenizer manager built with ``object.__new__``,
showing the HTTP status and body a client gets.
"""

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest

from sglang_replayssm.patches import launch_check_patches, replay_ring_patches
from sglang_replayssm.patches import request_validation as rv
from sglang_replayssm.patches.registry import apply, is_patched, unapply_all, verify

V = 100  # vocab size of the stand-in model


class ReachedSGLang(ValueError):
    """Raised by the stand-in at the first line of SGLang's own ``generate_request``."""


# (input_ids, the message must contain) -- every kind of bad request, each naming the id and its position
BAD = [
    ([-1, 3], "input_ids[0] = -1 is out of range"),
    ([3, V], f"input_ids[1] = {V} is out of range"),
    ([3, 2 ** 70], f"input_ids[1] = {2 ** 70} is out of range"),
    ([5, -1, V], "input_ids[1] = -1"),  # the first bad id is named
    ([[1, 2], [3, -7]], "input_ids[1][1] = -7 is out of range"),
    ([[1, 2], [3, V + 5]], f"input_ids[1][1] = {V + 5} is out of range"),
    ([1, 2.0], "input_ids[1] = 2.0 (float) is not a token id"),
    ([2.0, 1], "input_ids[0] = 2.0 (float) is not a token id"),
    ([1, "3"], "input_ids[1] = '3' (str) is not a token id"),
    (["3"], "input_ids[0] = '3' (str) is not a token id"),
    ([True, 3], "input_ids[0] = True (bool) is not a token id"),
    ([[1], [2, False]], "input_ids[1][1] = False (bool) is not a token id"),
    ([1, None], "input_ids[1] = None is not a token id"),
    ([1, np.int64(2)], "(int64) is not a token id"),  # numpy ints are refused: pass .tolist()
    ([[1, 2], 3], "input_ids[1] = 3 is not a list but input_ids[0] is"),
    ([3, [1, 2]], "input_ids[1] is a list but input_ids[0] is not"),
    ([[[1]]], "input_ids[0][0] is a list: input_ids nests at most two levels"),
    ([[1], [2, [3]]], "input_ids[1][1] is a list: input_ids nests at most two levels"),
    ([], "input_ids is empty"),
    ([[1], []], "input_ids[1] is an empty prompt"),
    (7, "input_ids = 7 is not a list"),
    ("1 2 3", "input_ids = '1 2 3' (str) is not a list"),
    (np.array([1, 2]), "(ndarray) is not a list"),
]

GOOD = [[0], [V - 1], [0, 1, V - 1], (4, 5), [[0], [V - 1, 3]], ([1], (2, 3))]


@pytest.mark.parametrize("ids,expect", BAD, ids=[repr(b[0])[:30] for b in BAD])
def test_validator_names_each_bad_kind_and_its_position(ids, expect):
    err = rv.input_ids_error(ids, V)
    assert err is not None and expect in err, err
    assert "\n" not in err


@pytest.mark.parametrize("ids", GOOD, ids=repr)
def test_validator_accepts_valid_prompts(ids):
    assert rv.input_ids_error(ids, V) is None


def test_validator_range_and_unknown_vocab():
    err = rv.input_ids_error([-1], V)
    assert f"[0, {V})" in err and "vocab size" in err
    assert rv.input_ids_error(None, V) is None
    # vocab size unknown: types, shape and id >= 0 are still checked
    assert rv.input_ids_error([10 ** 9], None) is None
    assert "input_ids[0] = -1" in rv.input_ids_error([-1], None)
    assert "(float)" in rv.input_ids_error([1.0], None)


def test_validator_long_prompt():
    ids = list(range(V)) * 1311  # 131100 ids
    assert rv.input_ids_error(ids, V) is None
    ids[-1] = V
    assert rv.input_ids_error(ids, V).startswith(f"input_ids[{len(ids) - 1}] = {V} is out of range")
    ids[-1] = 1.5
    assert rv.input_ids_error([ids[:3], ids], V).startswith(f"input_ids[1][{len(ids) - 1}] = 1.5 (float)")


# ---- the patched SGLang method -------------------------------------------------------------------

@pytest.fixture
def patched():
    unapply_all()
    apply(rv.PATCHES)
    verify(rv.PATCHES)
    yield
    unapply_all()


def _tokenizer_manager(vocab_size=V):
    """A real TokenizerManager without __init__: the model's vocab size, and a first line that reports."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    tm = object.__new__(TokenizerManager)
    tm.model_config = SimpleNamespace(vocab_size=vocab_size)
    tm.started = []

    def auto_create_handle_loop():  # the first statement of SGLang's generate_request
        tm.started.append(True)
        raise ReachedSGLang("reached SGLang's generate_request")

    tm.auto_create_handle_loop = auto_create_handle_loop
    return tm


def _first(tm, obj):
    async def go():
        return await tm.generate_request(obj, None).__anext__()

    return asyncio.run(go())


def test_is_a_launch_check_on_the_real_method(patched):
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    assert rv.TARGET in {p.target for p in launch_check_patches()}
    assert rv.TARGET not in {p.target for p in replay_ring_patches()}
    assert is_patched(TokenizerManager.__dict__["generate_request"], rv.TARGET)
    original = TokenizerManager.__dict__["generate_request"].__wrapped__
    unapply_all()
    assert TokenizerManager.__dict__["generate_request"] is original


LIST_BAD = [b for b in BAD if isinstance(b[0], list)]


@pytest.mark.parametrize("ids,expect", LIST_BAD, ids=[repr(b[0])[:30] for b in LIST_BAD])
def test_bad_generate_request_never_starts_sglang(patched, ids, expect):
    from sglang.srt.managers.io_struct import GenerateReqInput

    tm = _tokenizer_manager()
    obj = GenerateReqInput(input_ids=ids, sampling_params={"max_new_tokens": 4})
    with pytest.raises(rv.InvalidTokenIdsError) as e:
        _first(tm, obj)
    assert isinstance(e.value, ValueError) and expect in str(e.value)
    assert tm.started == [], "SGLang's generate_request ran for a bad request"
    assert not hasattr(obj, "batch_size")  # not even normalised: nothing was queued


def test_refused_stream_leaves_sglang_nothing_to_abort(patched, monkeypatch):
    """Streaming /generate runs SGLang's deferred abort over the request's rids after the error event: it must
    neither fail (normalize never ran) nor abort another request that has the refused one's rid."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    tm = _tokenizer_manager()
    aborted = []
    tm.abort_request = lambda rid="", abort_all=False: aborted.append(rid)
    obj = GenerateReqInput(input_ids=[-1], rid="client-rid", stream=True)
    with pytest.raises(rv.InvalidTokenIdsError):
        _first(tm, obj)

    async def no_wait(_):
        return None

    monkeypatch.setattr(asyncio, "sleep", no_wait)
    asyncio.run(tm.create_abort_task(obj)())  # SGLang's own background task, as the HTTP handler runs it
    assert aborted == []


def test_bad_embedding_request_is_refused(patched):
    from sglang.srt.managers.io_struct import EmbeddingReqInput

    tm = _tokenizer_manager()
    with pytest.raises(rv.InvalidTokenIdsError, match=r"input_ids\[0\]\[1\] = 100 is out of range"):
        _first(tm, EmbeddingReqInput(input_ids=[[1, V]]))
    assert tm.started == []


@pytest.mark.parametrize("kwargs", [dict(input_ids=[0, V - 1]), dict(input_ids=[[0], [5, V - 1]]),
                                    dict(text="hello"), dict(text="hi", input_ids=[1, 2])])
def test_good_request_runs_sglang_with_the_ids_untouched(patched, kwargs):
    from sglang.srt.managers.io_struct import GenerateReqInput

    tm = _tokenizer_manager()
    obj = GenerateReqInput(**kwargs)
    ids = obj.input_ids
    before = None if ids is None else [list(x) if isinstance(x, list) else x for x in ids]
    with pytest.raises(ReachedSGLang):
        _first(tm, obj)
    assert tm.started == [True]
    assert obj.input_ids is ids
    if ids is not None:
        assert [list(x) if isinstance(x, list) else x for x in ids] == before


def test_stream_is_passed_through_and_closed(patched):
    """A good request's responses come from SGLang's generator unchanged; closing ours closes it."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    closed = []

    async def fake_generate(self, obj, request=None):
        try:
            for i in range(3):
                yield {"i": i, "ids": obj.input_ids}
        finally:
            closed.append(True)

    tm = _tokenizer_manager()

    async def run():
        gen = rv.generate_request_around(fake_generate, tm, GenerateReqInput(input_ids=[1, 2]), None)
        first = await gen.__anext__()
        await gen.aclose()
        full = [r async for r in rv.generate_request_around(fake_generate, tm, GenerateReqInput(input_ids=[3]))]
        return first, full

    first, full = asyncio.run(run())
    assert first == {"i": 0, "ids": [1, 2]} and closed[0] is True
    assert full == [{"i": i, "ids": [3]} for i in range(3)] and closed == [True, True]


# ---- HTTP: SGLang's own FastAPI app ----------------------------------------------------------------

@pytest.fixture
def client(patched, monkeypatch, tmp_path):
    from fastapi.testclient import TestClient
    from sglang.srt import runtime_context
    from sglang.srt.entrypoints import http_server
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion

    if hasattr(runtime_context, "process_model_config"):  # 0.5.23: the OpenAI layer reads the published config
        from sglang.srt.server_args import prepare_server_args

        from sglang_replayssm import models

        ctx = runtime_context.get_context()
        monkeypatch.setattr(ctx, "_config_bags", ctx._config_bags)  # restored after the test
        monkeypatch.setattr(ctx, "_server_args", getattr(ctx, "_server_args", None))
        path = models.materialize("tiny-qwen3-next", root=tmp_path)
        args = prepare_server_args(["--model-path", path, "--load-format", "dummy", "--skip-tokenizer-init",
                                    "--device", "cpu", "--disable-radix-cache"])
        runtime_context.publish(args, role="test")

    tm = _tokenizer_manager()
    tm.server_args = SimpleNamespace(tokenizer_metrics_allowed_custom_labels=None,
                                     stream_response_default_include_usage=False)
    tm.request_logger = SimpleNamespace(log_requests=False, log_requests_level=0)
    old_state = http_server.get_global_state()
    old_serving = getattr(http_server.app.state, "openai_serving_completion", None)
    http_server.set_global_state(SimpleNamespace(tokenizer_manager=tm, template_manager=None))
    http_server.app.state.openai_serving_completion = OpenAIServingCompletion(
        tm, SimpleNamespace(completion_template_name=None))
    try:
        yield TestClient(http_server.app, raise_server_exceptions=False), tm
    finally:
        http_server.set_global_state(old_state)
        http_server.app.state.openai_serving_completion = old_serving


def test_http_generate_answers_400_naming_the_id(client):
    c, tm = client
    r = c.post("/generate", json={"input_ids": [-1, 3]})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": rv.input_ids_error([-1, 3], V)}}
    assert "input_ids[0] = -1" in r.json()["error"]["message"]
    r = c.post("/generate", json={"input_ids": [[1, 2], [3, V]]})  # batch
    assert r.status_code == 400 and f"input_ids[1][1] = {V}" in r.json()["error"]["message"]
    r = c.post("/generate", json={"input_ids": [True, 3]})  # SGLang's field validator lets bools through
    assert r.status_code == 400
    err = r.json().get("error")
    if isinstance(err, dict):  # the validator's answer
        assert "input_ids[0] = True (bool)" in err["message"]
    else:  # 0.5.23's request parser refuses booleans itself ({"error": "invalid type: boolean ..."})
        assert "boolean" in str(err)
    r = c.post("/generate", json={"input_ids": [[1], []]})
    assert r.status_code == 400 and "input_ids[1] is an empty prompt" in r.json()["error"]["message"]
    assert tm.started == []
    # kinds SGLang's own request model refuses first (a float, a string, None, wrong nesting): 400 as well
    for ids in ([1, 2.5], [1, "3"], [1, None], [[1], 3], [3, [1]], [[[1]]]):
        r = c.post("/generate", json={"input_ids": ids})
        assert r.status_code == 400 and r.json()["object"] == "error", (ids, r.text)
    assert tm.started == []
    r = c.post("/generate", json={"input_ids": [0, V - 1]})  # a good request goes on to SGLang
    assert r.status_code == 400 and r.json()["error"]["message"] == "reached SGLang's generate_request"
    assert tm.started == [True]


def test_http_generate_stream_reports_in_the_stream(client):
    c, tm = client
    r = c.post("/generate", json={"input_ids": [3, -2], "stream": True})
    assert r.status_code == 200  # SGLang's /generate streams its request errors as an event
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    err = json.loads(events[0])["error"]
    assert err["code"] == 400 and "input_ids[1] = -2 is out of range" in err["message"]
    assert tm.started == []


@pytest.mark.parametrize("stream", [False, True])
def test_http_openai_completions_answer_400(client, stream):
    c, tm = client
    for prompt, expect in (([-1, 3], "input_ids[0] = -1"), ([[1, 2], [3, V]], f"input_ids[1][1] = {V}")):
        r = c.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 4, "stream": stream})
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["object"] == "error" and body["code"] == 400 and expect in body["message"], body
    assert tm.started == []
    r = c.post("/v1/completions", json={"model": "m", "prompt": [0, V - 1], "max_tokens": 4, "stream": stream})
    assert r.json()["message"] == "reached SGLang's generate_request" and tm.started == [True]


# ---- unknown sampling_params keys ----------------------------------------------------------------

def _names():
    from sglang.srt.sampling.sampling_params import SamplingParams

    return rv.sampling_param_names(SamplingParams)


def test_sampling_param_names_are_sglangs_own():
    from sglang.srt.sampling.sampling_params import SamplingParams

    names = _names()
    assert {"max_new_tokens", "temperature", "top_p", "ignore_eos", "stop"} <= names
    assert "frobnicate" not in names
    # the names are exactly what SamplingParams(**kwargs) takes: each alone constructs, an extra key raises
    for key in ("max_new_tokens", "top_k", "n"):
        SamplingParams(**{key: 1})
    with pytest.raises(TypeError):
        SamplingParams(frobnicate=1)


def test_sampling_params_error_names_the_key_and_position():
    names = _names()
    assert rv.sampling_params_error({"max_new_tokens": 4, "temperature": 0.0}, names) is None
    assert rv.sampling_params_error(None, names) is None
    err = rv.sampling_params_error({"max_new_tokens": 4, "frobnicate": [1]}, names)
    assert err.startswith("sampling_params has an unknown key 'frobnicate'") and "\n" not in err
    err = rv.sampling_params_error({"temprature": 0.5}, names)
    assert "unknown key 'temprature' (did you mean 'temperature'?)" in err
    err = rv.sampling_params_error([{"top_p": 0.9}, {"top_q": 0.9}], names)
    assert err.startswith("sampling_params[1] has an unknown key 'top_q'")
    assert rv.sampling_params_error([{"top_p": 0.9}, "not a dict"], names) is None  # left to SGLang
    assert rv.sampling_params_error({"anything": 1}, None) is None  # names unknown: no check


def test_sampling_param_names_of_plain_classes():
    class Named:
        def __init__(self, a=1, *args, b=2):
            pass

    class Open:
        def __init__(self, a=1, **kwargs):
            pass

    assert rv.sampling_param_names(Named) == {"a", "b"}
    assert rv.sampling_param_names(Open) is None


def test_openai_chat_sampling_params_pass_the_check():
    """SGLang's OpenAI layer builds sampling_params itself: every key it builds must pass."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                temperature=0.5, top_p=0.9, top_k=5, min_p=0.1, stop=["x"], seed=3,
                                logit_bias={"1": 0.5}, response_format={"type": "json_object"})
    try:
        built = req.to_sampling_params(stop=["x"], model_generation_config={})
    except TypeError as e:  # another release's signature
        pytest.skip(f"ChatCompletionRequest.to_sampling_params signature differs here: {e}")
    assert len(built) > 5
    assert rv.sampling_params_error(built, _names()) is None, sorted(set(built) - _names())


def test_http_generate_unknown_sampling_key_answers_400(client):
    c, tm = client
    r = c.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4, "frobnicate": [1]}})
    assert r.status_code == 400, r.text
    err = r.json().get("error")
    if isinstance(err, dict):  # the check's answer
        assert "sampling_params has an unknown key 'frobnicate'" in err["message"]
    else:  # 0.5.23's request parser refuses unknown sampling keys itself ({"error": "... frobnicate ..."})
        assert "frobnicate" in str(err)
    r = c.post("/generate", json={"input_ids": [[1], [2]],
                                  "sampling_params": [{"max_new_tokens": 4}, {"max_new_tokns": 4}]})
    assert r.status_code == 400 and "max_new_tokns" in r.text
    assert tm.started == []
    r = c.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert r.json()["error"]["message"] == "reached SGLang's generate_request" and tm.started == [True]
