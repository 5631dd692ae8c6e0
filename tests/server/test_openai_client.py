"""The real server process driven with the official `openai` client (F32, so greedy runs are exact)."""

from __future__ import annotations

import inspect

import httpx
import openai
import pytest

from tests.server.conftest import LiveServer, wait_until

PROMPT = "The quick brown fox"


def test_models_lists_the_served_name(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    assert [model.id for model in openai_client.models.list()] == [live_server.model]


def test_completion_stream_equals_non_stream_at_temperature_zero(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    kwargs = dict(model=live_server.model, prompt=PROMPT, max_tokens=24, temperature=0)
    whole = openai_client.completions.create(**kwargs)
    assert whole.usage is not None and whole.usage.completion_tokens == 24
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 24
    chunks = list(
        openai_client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    text_chunks = [chunk for chunk in chunks if chunk.choices]
    assert "".join(chunk.choices[0].text for chunk in text_chunks) == whole.choices[0].text
    reasons = [chunk.choices[0].finish_reason for chunk in text_chunks if chunk.choices[0].finish_reason]
    assert reasons == ["length"]
    assert text_chunks[-1].choices[0].finish_reason == "length"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    # The same counts; cached_tokens may differ (the first request left its prompt in the cache).
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(usage_chunk.usage, k) for k in counts] == [getattr(whole.usage, k) for k in counts]
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_chat_stream_equals_non_stream_at_temperature_zero(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    kwargs = dict(model=live_server.model, messages=messages, max_completion_tokens=20, temperature=0)
    whole = openai_client.chat.completions.create(**kwargs)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage is not None and whole.usage.completion_tokens <= 20
    chunks = list(openai_client.chat.completions.create(**kwargs, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text == whole.choices[0].message.content
    reasons = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices[0].finish_reason]
    assert reasons == [whole.choices[0].finish_reason]


def test_a_stop_string_split_across_tokens(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    # Without drafting every step adds one token; a streamed piece is the text of one or more whole
    # tokens (steps within the stream interval share a frame), so piece boundaries are token boundaries.
    base = dict(
        model=live_server.model, prompt=PROMPT, max_tokens=40, temperature=0, extra_body={"drafter": "none"}
    )
    pieces = [c.choices[0].text for c in openai_client.completions.create(**base, stream=True)]
    full = "".join(pieces)
    stop = None
    offset = 0
    for left, right in zip(pieces, pieces[1:], strict=False):
        offset += len(left)
        candidate = left[-2:] + right[:2]
        if len(left) >= 1 and len(right) >= 1 and "\ufffd" not in candidate and len(candidate) >= 2:
            if full.find(candidate) == offset - len(left[-2:]) and offset > 4:
                stop = candidate
                break
    if stop is None:
        pytest.skip(f"no stop string spanning two tokens in {pieces!r}")
    expected = full[: full.find(stop)]
    whole = openai_client.completions.create(**{**base, "stop": [stop, "never-seen"]})
    assert whole.choices[0].text == expected
    assert whole.choices[0].finish_reason == "stop"
    streamed = list(openai_client.completions.create(**{**base, "stop": stop}, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert [c.choices[0].finish_reason for c in streamed if c.choices[0].finish_reason] == ["stop"]
    # With speculation the stop string is found the same way.
    drafted = openai_client.completions.create(**{**base, "stop": stop, "extra_body": {}})
    assert drafted.choices[0].text == expected


def test_n_choices_are_indexed_and_seeded_sampling_repeats(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    kwargs = dict(model=live_server.model, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=1234, n=3)
    first = openai_client.completions.create(**kwargs)
    second = openai_client.completions.create(**kwargs)
    assert [choice.index for choice in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert first.usage is not None and 3 <= first.usage.completion_tokens <= 3 * 16
    assert second.usage is not None and first.usage.prompt_tokens == second.usage.prompt_tokens
    # Each choice has its own seed (seed + index), so a lone request with seed 1235 repeats choice 1.
    lone = openai_client.completions.create(**{**kwargs, "n": 1, "seed": 1235})
    assert lone.choices[0].text == first.choices[1].text
    streamed = list(openai_client.completions.create(**kwargs, stream=True))
    by_index: dict[int, str] = {}
    finishes: dict[int, int] = {}
    for chunk in streamed:
        choice = chunk.choices[0]
        by_index[choice.index] = by_index.get(choice.index, "") + choice.text
        finishes[choice.index] = finishes.get(choice.index, 0) + (choice.finish_reason is not None)
    assert by_index == {c.index: c.text for c in first.choices}
    assert finishes == {0: 1, 1: 1, 2: 1}


def test_errors_reach_the_client_in_openai_shape(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        openai_client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    assert not_found.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        openai_client.completions.create(model=live_server.model, prompt="x", max_tokens=100_000)
    response = httpx.post(
        f"{live_server.base_url}/v1/completions",
        content=b"{nope",
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    assert httpx.get(f"{live_server.base_url}/health", timeout=10).status_code == 200


def test_a_client_leaving_mid_stream_aborts_its_request(demo_live_server: LiveServer) -> None:
    # The demo model, not the tiny pair: the tiny one can finish a whole reply before the client's
    # first chunks arrive, and a finished request is not an aborted one.
    live_server = demo_live_server
    openai_client = openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="-", max_retries=0)

    def cancelled() -> float:
        text = httpx.get(f"{live_server.base_url}/metrics", timeout=10).text
        line = next(line for line in text.splitlines() if line.startswith("xpuspec_requests_cancelled_total"))
        return float(line.split()[1])

    before = cancelled()
    raw = openai_client.completions.with_raw_response.create(
        model=live_server.model, prompt=PROMPT, max_tokens=480, temperature=0, stream=True,
        extra_body={"ignore_eos": True, "drafter": "none"},
    )  # fmt: skip
    stream = raw.parse()
    received = [chunk.choices[0].text for chunk, _ in zip(stream, range(3), strict=False)]
    stream.close()
    assert wait_until(lambda: cancelled() == before + 1, 30), live_server.log()[-2000:]
    assert wait_until(lambda: live_server.state()["kv_blocks_used"] == 0, 10)
    assert live_server.state()["num_in_flight"] == 0
    # The access line of the aborted request counts the tokens it generated (at least those received).
    rid = raw.headers["x-request-id"]
    assert wait_until(lambda: f"id={rid}" in live_server.log(), 10)
    line = next(line for line in live_server.log().splitlines() if line.endswith(f"id={rid}"))
    tokens = int(line.split("tokens=")[1].split()[0])
    assert tokens >= len([text for text in received if text]) >= 1, line


# Every parameter the client's create() takes, at a value this server honours or treats as a no-op.
CHAT_PARAMETERS = {
    "audio": None, "frequency_penalty": 0, "function_call": "none", "functions": [], "logit_bias": {},
    "logprobs": False, "max_completion_tokens": 4, "max_tokens": 4, "metadata": {"who": "test"},
    "modalities": ["text"], "moderation": None, "n": 2, "parallel_tool_calls": False, "prediction": None,
    "presence_penalty": 0, "prompt_cache_key": "k", "prompt_cache_options": {"x": 1},
    "prompt_cache_retention": "in_memory", "reasoning_effort": None, "response_format": {"type": "text"},
    "safety_identifier": "s", "seed": 1, "service_tier": "auto", "stop": ["\n\n"], "store": False,
    "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.5, "tool_choice": "none",
    "tools": [], "top_logprobs": 0, "top_p": 0.9, "user": "u", "verbosity": "medium",
    "web_search_options": {},
}  # fmt: skip
COMPLETION_PARAMETERS = {
    "best_of": 1, "echo": False, "frequency_penalty": 0, "logit_bias": {}, "logprobs": None,
    "max_tokens": 4, "n": 2, "presence_penalty": 0, "seed": 1, "stop": "\n\n", "stream": True,
    "stream_options": {"include_usage": True}, "suffix": None, "temperature": 0.5, "top_p": 0.9, "user": "u",
}  # fmt: skip
REQUEST_OPTIONS = {
    "self",
    "model",
    "messages",
    "prompt",
    "extra_headers",
    "extra_query",
    "extra_body",
    "timeout",
}


@pytest.mark.parametrize(
    ("create", "parameters", "fixed"),
    [
        (
            openai.resources.chat.completions.Completions.create,
            CHAT_PARAMETERS,
            {"messages": [{"role": "user", "content": "hi"}]},
        ),
        (openai.resources.completions.Completions.create, COMPLETION_PARAMETERS, {"prompt": PROMPT}),
    ],
)
def test_every_parameter_of_the_client_is_accepted(
    openai_client: openai.OpenAI, live_server: LiveServer, create, parameters, fixed
) -> None:  # type: ignore[no-untyped-def]
    # A parameter a newer client adds fails here until the server implements, ignores or refuses it.
    assert set(inspect.signature(create).parameters) - REQUEST_OPTIONS == set(parameters)
    kind = openai_client.chat.completions if "messages" in fixed else openai_client.completions
    stream = kind.create(model=live_server.model, **fixed, **parameters)  # type: ignore[call-overload]
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 8
