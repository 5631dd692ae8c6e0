"""Bad requests get OpenAI-shaped errors with the right status, and the server stays healthy."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

MODEL = "bundle"  # the pair bundle's folder name: the served model name
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hello", "max_tokens": 4, **fields}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}


def without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


def raw_completion(key: str, literal: str) -> bytes:
    """A completion body with ``literal`` spliced in as it is (json.dumps could not write it)."""
    return f'{{"model": "{MODEL}", "prompt": "hello", "max_tokens": 4, "{key}": {literal}}}'.encode()


TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}


@dataclass
class BadRequest:
    name: str
    path: str
    body: Any  # a dict is sent as JSON, bytes as they are
    status: int
    param: str | None = None
    code: str | None = None
    method: str = "POST"


CASES = [
    BadRequest("malformed json", COMPLETIONS, b'{"model": ', 400, code="invalid_json"),
    BadRequest("empty body", COMPLETIONS, b"", 400, code="invalid_json"),
    BadRequest("json array", COMPLETIONS, b"[1, 2]", 400, code="invalid_json"),
    BadRequest("not utf-8", COMPLETIONS, b'{"model": "\xff"}', 400, code="invalid_json"),
    BadRequest("missing model", COMPLETIONS, without(completion(), "model"), 400, "model"),
    BadRequest("model not a string", COMPLETIONS, completion(model=7), 400, "model"),
    BadRequest("missing prompt", COMPLETIONS, without(completion(), "prompt"), 400, "prompt"),
    BadRequest("prompt a number", COMPLETIONS, completion(prompt=123), 400, "prompt"),
    BadRequest("prompt empty list", COMPLETIONS, completion(prompt=[]), 400, "prompt"),
    BadRequest("prompt mixed list", COMPLETIONS, completion(prompt=["a", 3]), 400, "prompt.1"),
    BadRequest("prompt lone surrogate", COMPLETIONS, completion(prompt="\ud800"), 400, "prompt"),
    BadRequest("token id negative", COMPLETIONS, completion(prompt=[1, -2]), 400, "prompt.1"),
    BadRequest("token id beyond vocab", COMPLETIONS, completion(prompt=[1, 10**6]), 400, "prompt"),
    BadRequest("max_tokens a string", COMPLETIONS, completion(max_tokens="5"), 400, "max_tokens"),
    BadRequest("max_tokens zero", COMPLETIONS, completion(max_tokens=0), 400, "max_tokens"),
    BadRequest("max_tokens fractional", COMPLETIONS, completion(max_tokens=1.5), 400, "max_tokens"),
    BadRequest(
        "beyond the context",
        COMPLETIONS,
        completion(max_tokens=10_000),
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    BadRequest("temperature negative", COMPLETIONS, completion(temperature=-0.1), 400, "temperature"),
    BadRequest("temperature too high", COMPLETIONS, completion(temperature=2.5), 400, "temperature"),
    BadRequest("temperature a string", COMPLETIONS, completion(temperature="hot"), 400, "temperature"),
    BadRequest("top_p zero", COMPLETIONS, completion(top_p=0), 400, "top_p"),
    BadRequest("top_p above one", COMPLETIONS, completion(top_p=1.5), 400, "top_p"),
    BadRequest("top_k negative", COMPLETIONS, completion(top_k=-1), 400, "top_k"),
    BadRequest("dry_multiplier negative", CHAT, chat(dry_multiplier=-0.5), 400, "dry_multiplier"),
    BadRequest("dry_base below one", CHAT, chat(dry_base=0.5), 400, "dry_base"),
    BadRequest("dry_include_prompt a word", CHAT, chat(dry_include_prompt="no?"), 400, "dry_include_prompt"),
    BadRequest("dry_allowed_length zero", CHAT, chat(dry_allowed_length=0), 400, "dry_allowed_length"),
    BadRequest("dry_penalty_last_n -2", CHAT, chat(dry_penalty_last_n=-2), 400, "dry_penalty_last_n"),
    BadRequest(
        "dry_sequence_breakers a string", CHAT, chat(dry_sequence_breakers="\n"), 400, "dry_sequence_breakers"
    ),
    BadRequest(
        "dry_sequence_breakers empty string",
        CHAT,
        chat(dry_sequence_breakers=["\n", ""]),
        400,
        "dry_sequence_breakers.1",
    ),
    # Found by the schema fuzzer: an empty pattern passed the schema and failed in SamplingParams (500).
    BadRequest("guided_regex empty", COMPLETIONS, completion(guided_regex=""), 400, "guided_regex"),
    BadRequest("guided_grammar empty", CHAT, chat(guided_grammar=""), 400, "guided_grammar"),
    BadRequest("n zero", COMPLETIONS, completion(n=0), 400, "n"),
    BadRequest("n too large", COMPLETIONS, completion(n=17), 400, "n"),
    BadRequest("n a bool", COMPLETIONS, completion(n=True), 400, "n"),
    BadRequest("too many choices", COMPLETIONS, completion(prompt=["a"] * 10, n=16), 400, "n"),
    BadRequest("stop a number", COMPLETIONS, completion(stop=5), 400, "stop"),
    BadRequest("stop empty string", COMPLETIONS, completion(stop=[""]), 400, "stop.0"),
    BadRequest("too many stops", COMPLETIONS, completion(stop=[str(i) for i in range(17)]), 400, "stop"),
    BadRequest("seed a string", COMPLETIONS, completion(seed="x"), 400, "seed"),
    BadRequest("stream a string", COMPLETIONS, completion(stream="yes"), 400, "stream"),
    BadRequest(
        "stream_options without stream",
        COMPLETIONS,
        completion(stream_options={"include_usage": True}),
        400,
        "stream_options",
    ),
    BadRequest(
        "num_draft_tokens too large", COMPLETIONS, completion(num_draft_tokens=17), 400, "num_draft_tokens"
    ),
    BadRequest("unknown drafter", COMPLETIONS, completion(drafter="medusa"), 400, "drafter"),
    BadRequest(
        "drafter none with drafts",
        COMPLETIONS,
        completion(drafter="none", num_draft_tokens=3),
        400,
        "num_draft_tokens",
    ),
    BadRequest("echo", COMPLETIONS, completion(echo=True), 400, "echo", "unsupported_parameter"),
    BadRequest("logprobs", COMPLETIONS, completion(logprobs=1), 400, "logprobs", "unsupported_parameter"),
    BadRequest(
        "unknown model", COMPLETIONS, completion(model="../../etc/passwd"), 404, "model", "model_not_found"
    ),
    BadRequest("chat unknown model", CHAT, chat(model="gpt-4"), 404, "model", "model_not_found"),
    BadRequest("chat missing messages", CHAT, without(chat(), "messages"), 400, "messages"),
    BadRequest("chat empty messages", CHAT, chat(messages=[]), 400, "messages"),
    BadRequest(
        "chat unknown role", CHAT, chat(messages=[{"role": "robot", "content": "x"}]), 400, "messages.0.role"
    ),
    BadRequest(
        "chat content a number",
        CHAT,
        chat(messages=[{"role": "user", "content": 5}]),
        400,
        "messages.0.content",
    ),
    BadRequest("chat message not an object", CHAT, chat(messages=["hi"]), 400),
    BadRequest(
        "chat max_completion_tokens zero", CHAT, chat(max_completion_tokens=0), 400, "max_completion_tokens"
    ),
    BadRequest(
        "chat beyond the context",
        CHAT,
        chat(max_completion_tokens=5000),
        400,
        "max_completion_tokens",
        "context_length_exceeded",
    ),
    BadRequest("seed negative", COMPLETIONS, completion(seed=-1), 400, "seed"),
    BadRequest("seed 2**64", COMPLETIONS, completion(seed=2**64), 400, "seed"),
    BadRequest("temperature subnormal", COMPLETIONS, completion(temperature=1e-320), 400, "temperature"),
    BadRequest("temperature below 1e-4", COMPLETIONS, completion(temperature=5e-5), 400, "temperature"),
    BadRequest("NaN literal", COMPLETIONS, raw_completion("temperature", "NaN"), 400, code="invalid_json"),
    BadRequest(
        "Infinity literal", COMPLETIONS, raw_completion("top_p", "-Infinity"), 400, code="invalid_json"
    ),
    BadRequest(
        "float overflow", COMPLETIONS, raw_completion("temperature", "1e999"), 400, code="invalid_json"
    ),
    BadRequest(
        "5000-digit integer", COMPLETIONS, raw_completion("seed", "9" * 5000), 400, code="invalid_json"
    ),
    BadRequest(
        "depth 1000", COMPLETIONS, raw_completion("prompt", "[" * 1000 + "]" * 1000), 400, code="invalid_json"
    ),
    BadRequest(
        "depth 1000 of objects",
        COMPLETIONS,
        raw_completion("x", '{"a":' * 1000 + "1" + "}" * 1000),
        400,
        code="invalid_json",
    ),
    *[
        BadRequest(f"unsupported {name}", path, body, 400, name, "unsupported_parameter")
        for name, path, body in [
            ("best_of", COMPLETIONS, completion(best_of=2)),
            ("suffix", COMPLETIONS, completion(suffix="}")),
            ("logit_bias", COMPLETIONS, completion(logit_bias={"5": 10})),
            ("repetition_penalty", COMPLETIONS, completion(repetition_penalty=1.2)),
            ("logprobs", CHAT, chat(logprobs=True)),
            ("top_logprobs", CHAT, chat(top_logprobs=2)),
        ]
    ],
    BadRequest(
        "chat content null without tool_calls",
        CHAT,
        chat(messages=[{"role": "user", "content": None}]),
        400,
        "messages.0",
    ),
    BadRequest(
        "chat tool_calls on a user message",
        CHAT,
        chat(messages=[{"role": "user", "content": "x", "tool_calls": [TOOL_CALL]}]),
        400,
        "messages.0",
    ),
    BadRequest("unknown route", "/v1/embedings", completion(), 404, code="not_found"),
    BadRequest("embeddings", "/v1/embeddings", {"model": MODEL, "input": "x"}, 404, code="not_served"),
    BadRequest("wrong method", COMPLETIONS, None, 405, code="method_not_allowed", method="GET"),
    BadRequest("wrong method on models", "/v1/models", None, 405, code="method_not_allowed", method="PUT"),
    BadRequest("unknown model card", "/v1/models/nope", None, 404, "model", "model_not_found", method="GET"),
    BadRequest(
        "body too large", COMPLETIONS, completion(prompt="x" * (2 << 20)), 413, code="request_too_large"
    ),
]


def send(client: FlaskClient, case: BadRequest):  # type: ignore[no-untyped-def]
    data = case.body if isinstance(case.body, bytes) or case.body is None else json.dumps(case.body)
    return client.open(case.path, method=case.method, data=data, content_type="application/json")


def test_the_suite_has_enough_distinct_cases() -> None:
    assert len({case.name for case in CASES}) == len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_request_gets_an_openai_error(client: FlaskClient, case: BadRequest) -> None:
    response = send(client, case)
    assert response.status_code == case.status, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    if case.param is not None:
        assert error["param"] == case.param
    if case.code is not None:
        assert error["code"] == case.code


def test_parameters_the_engine_refuses_after_the_schema_passed_them_are_a_400(
    client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xpuspec.server import choices

    def refuse(**fields: Any) -> None:
        raise ValueError("stop must hold at most 4 strings")

    monkeypatch.setattr(choices, "SamplingParams", refuse)
    response = client.post(COMPLETIONS, json=completion())
    assert response.status_code == 400
    assert response.get_json()["error"]["message"] == "stop must hold at most 4 strings"
    assert response.get_json()["error"]["code"] == "invalid_value"


def test_valid_requests_succeed_after_every_bad_one(client: FlaskClient) -> None:
    for case in CASES:
        send(client, case)
    assert client.get("/health").status_code == 200
    response = client.post(COMPLETIONS, json=completion(temperature=0))
    assert response.status_code == 200
    body = response.get_json()
    assert body["object"] == "text_completion" and len(body["choices"]) == 1
    assert body["usage"]["completion_tokens"] <= 4
    response = client.post(CHAT, json=chat(temperature=0))
    assert response.status_code == 200
    assert response.get_json()["choices"][0]["message"]["role"] == "assistant"


def test_dry_under_llama_servers_names_is_accepted(client: FlaskClient) -> None:
    dry = {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1}
    for breakers in (["\n", ":", '"', "*"], []):
        response = client.post(CHAT, json=chat(temperature=0, dry_sequence_breakers=breakers, **dry))
        assert response.status_code == 200, response.get_data(as_text=True)
        assert response.get_json()["usage"]["completion_tokens"] >= 1


def test_embeddings_say_they_are_not_served(client: FlaskClient) -> None:
    for path in ("/v1/embeddings", "/v1/responses", "/v1/audio/speech"):
        message = client.post(path, json={"model": MODEL, "input": "x"}).get_json()["error"]["message"]
        assert "not served" in message and "\n" not in message and "lives under /v1" not in message, message
    assert (
        client.post("/v1/embeddings", json={})
        .get_json()["error"]["message"]
        .startswith("embeddings are not served: this server generates text")
    )


def test_wrong_method_names_the_allowed_ones(client: FlaskClient) -> None:
    response = client.get(COMPLETIONS)
    assert response.status_code == 405
    assert "POST" in response.headers["Allow"]


def test_token_id_prompts_and_prompt_lists_give_one_choice_each(client: FlaskClient) -> None:
    response = client.post(COMPLETIONS, json=completion(prompt=[[5, 6, 7], [8, 9]], n=2, temperature=0))
    assert response.status_code == 200
    body = response.get_json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"]["prompt_tokens"] == 5
    # Greedy: the two choices of each prompt agree.
    texts = [choice["text"] for choice in body["choices"]]
    assert texts[0] == texts[1] and texts[2] == texts[3]


def test_server_drafter_or_none_per_request(client: FlaskClient, served_app: Flask) -> None:
    from xpuspec.server import server_state

    own = server_state(served_app).loop.pipeline.drafter  # type: ignore[union-attr]
    texts = []
    for drafter in (own, "auto", "none"):
        response = client.post(COMPLETIONS, json=completion(temperature=0, drafter=drafter, max_tokens=8))
        assert response.status_code == 200, response.get_json()
        texts.append(response.get_json()["choices"][0]["text"])
    assert len(set(texts)) == 1  # speculation never changes a greedy output


def test_neutral_values_of_unsupported_parameters_and_documented_no_ops_are_accepted(
    client: FlaskClient,
) -> None:
    # What SDKs send by default must keep working, and OpenAI's bookkeeping fields change nothing.
    body = completion(
        temperature=0, best_of=1, logit_bias={}, presence_penalty=0, frequency_penalty=0.0, suffix=None,
        echo=False, user="someone", repeat_penalty=1, repetition_penalty=1.0,
    )  # fmt: skip
    response = client.post(COMPLETIONS, json=body)
    assert response.status_code == 200, response.get_json()
    body = chat(temperature=0, response_format={"type": "text"}, tool_choice="none", logprobs=False, tools=[])
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.get_json()
    no_ops = {"user": "u", "metadata": {"k": "v"}, "store": True, "service_tier": "auto"}
    no_ops |= {"prompt_cache_key": "k", "safety_identifier": "s"}
    response = client.post(CHAT, json=chat(temperature=0, **no_ops))
    assert response.status_code == 200, response.get_json()


@pytest.mark.parametrize(
    ("path", "body", "name"),
    [
        (COMPLETIONS, completion(some_future_field={"x": 1}), "some_future_field"),
        (COMPLETIONS, completion(n_predict=8), "n_predict"),  # llama.cpp's name for max_tokens
        (CHAT, chat(max_token=8), "max_token"),
        (CHAT, chat(cache_prompt=True), "cache_prompt"),
    ],
)
def test_an_unknown_field_is_a_400_naming_it(client: FlaskClient, path: str, body: dict, name: str) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["param"] == name and error["code"] == "unknown_parameter"
    assert error["message"].startswith(f"{name} is not a parameter this server knows")


def test_tool_calls_and_tool_messages_are_accepted_in_history(client: FlaskClient) -> None:
    messages = [
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "user", "content": "and so?"},
    ]
    response = client.post(CHAT, json=chat(messages=messages, temperature=0))
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["choices"][0]["message"]["role"] == "assistant"


def test_brackets_inside_strings_are_not_nesting(client: FlaskClient) -> None:
    # 40 open brackets (beyond the depth limit of 32), and an escaped quote that must not end the string.
    prompt = '\\"' + "[" * 40
    response = client.post(COMPLETIONS, json=completion(prompt=prompt, temperature=0, max_tokens=2))
    assert response.status_code == 200, response.get_json()


def test_seed_wraps_per_choice_at_2_to_the_64(client: FlaskClient) -> None:
    # Choice 1 of seed 2**64 - 1 uses seed 0: the same text as a lone request with seed 0.
    body = completion(seed=2**64 - 1, n=2, temperature=1.0, max_tokens=8, ignore_eos=True)
    pair = client.post(COMPLETIONS, json=body)
    assert pair.status_code == 200, pair.get_json()
    lone = client.post(COMPLETIONS, json={**body, "seed": 0, "n": 1})
    assert pair.get_json()["choices"][1]["text"] == lone.get_json()["choices"][0]["text"]


def test_nesting_depth_counts_brackets_outside_strings_only() -> None:
    from xpuspec.server.json_body import nesting_depth

    assert nesting_depth(b'{"a": "[[[{{{", "b": [[1], {"c": "]]]"}]}') == 3
    assert nesting_depth(b'{"a": "\\"[[[[["}') == 1
    assert nesting_depth(b'{"a": "x\\\\", "b": [[[1]]]}') == 4  # an escaped backslash, then a real quote
    assert nesting_depth(b"") == 0
    assert nesting_depth(b"[" * 1000) == 1000


def test_nesting_depth_matches_the_parsed_structure_on_random_bodies() -> None:
    import random

    from xpuspec.server.json_body import nesting_depth

    rng = random.Random(0)

    def make(level: int) -> Any:
        roll = rng.random()
        if level > 5 or roll < 0.3:
            return "".join(rng.choice('ab\\"[]{}') for _ in range(rng.randint(0, 8)))
        if roll < 0.6:
            return [make(level + 1) for _ in range(rng.randint(0, 3))]
        return {str(i) + rng.choice('[{\\"'): make(level + 1) for i in range(rng.randint(0, 3))}

    def depth(value: Any) -> int:
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            return 1 + max((depth(item) for item in value), default=0)
        return 0

    for _ in range(300):
        value = make(0)
        assert nesting_depth(json.dumps(value).encode()) == depth(value), value
