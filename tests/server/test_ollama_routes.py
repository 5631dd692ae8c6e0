"""The Ollama-compatible endpoints driven with Ollama's official Python client (``ollama`` on PyPI)
against a real ``xpuspec serve`` process on the demo pair (F32, so greedy runs are exact), and the
errors, authentication and loading answers of the /api routes on an in-process app."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import jsonschema
import ollama
import openai
import pytest
from flask import Flask

from tests.server.conftest import LiveServer
from xpuspec.server import ServerConfig, create_app

ITEM = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "express": {"type": "boolean"},
    },
    "required": ["sku", "count", "express"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "", "parameters": WEATHER}}]
# The tiny demo model never chooses a tool by itself; a format that makes its whole reply a call in
# the JSON form tools.py parses ({"name": ..., "arguments": {...}}) has it write one.
CALL_FORMAT = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER},
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
HELLO = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell me about foxes."}]
GREEDY = {"temperature": 0, "num_predict": 24}


@pytest.fixture(scope="module")
def server(demo_live_server: LiveServer) -> LiveServer:
    return demo_live_server


@pytest.fixture(scope="module")
def client(server: LiveServer) -> ollama.Client:
    return ollama.Client(host=server.base_url, timeout=60)


def check_final(final: ollama.ChatResponse | ollama.GenerateResponse, eval_count: int | None = None) -> None:
    assert final.done is True and final.done_reason in ("stop", "length")
    assert final.prompt_eval_count and final.prompt_eval_count > 0
    assert final.eval_count and final.eval_count > 0
    if eval_count is not None:
        assert final.eval_count == eval_count
    for name in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(final[name], int) and final[name] >= 0, name
    assert final.total_duration >= final.prompt_eval_duration + final.eval_duration  # type: ignore[operator]


def test_chat_streamed_equals_not_streamed_and_ends_with_the_counters(
    client: ollama.Client, server: LiveServer
) -> None:
    whole = client.chat(model=server.model, messages=HELLO, options=GREEDY)
    assert whole.message.role == "assistant" and whole.message.content
    check_final(whole, eval_count=24)
    assert whole.done_reason == "length"
    parts = list(client.chat(model=server.model, messages=HELLO, options=GREEDY, stream=True))
    assert len(parts) >= 2 and all(not part.done and part.message.content for part in parts[:-1])
    assert "".join(part.message.content or "" for part in parts) == whole.message.content
    check_final(parts[-1], eval_count=24)
    assert parts[-1].message.content == "" and parts[-1].model == server.model


def test_greedy_chat_is_the_text_of_the_openai_route(client: ollama.Client, server: LiveServer) -> None:
    openai_client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="-", max_retries=0, timeout=60)
    expected = openai_client.chat.completions.create(
        model=server.model,
        messages=HELLO,
        temperature=0,
        max_tokens=48,  # type: ignore[arg-type]
    )
    reply = client.chat(model=server.model, messages=HELLO, options={"temperature": 0, "num_predict": 48})
    assert reply.message.content == expected.choices[0].message.content
    assert reply.prompt_eval_count == expected.usage.prompt_tokens  # type: ignore[union-attr]


def test_generate_streamed_and_not(client: ollama.Client, server: LiveServer) -> None:
    options = {"temperature": 0.9, "seed": 5, "num_predict": 16}
    whole = client.generate(
        model=server.model, prompt="Once upon a time", system="Be brief.", options=options
    )
    check_final(whole)
    assert whole.response
    parts = list(client.generate(model=server.model, prompt="Once upon a time", system="Be brief.",
                                 options=options, stream=True))  # fmt: skip
    assert "".join(part.response or "" for part in parts) == whole.response
    check_final(parts[-1], eval_count=whole.eval_count)
    # raw: the prompt as it is, without the chat template: fewer prompt tokens.
    raw = client.generate(model=server.model, prompt="Once upon a time", raw=True, options=options)
    assert raw.prompt_eval_count is not None and raw.prompt_eval_count < whole.prompt_eval_count  # type: ignore[operator]


def test_stop_and_the_name_with_latest(client: ollama.Client, server: LiveServer) -> None:
    whole = client.chat(model=server.model, messages=HELLO, options=GREEDY).message.content or ""
    stop = whole[len(whole) // 2 :][:3]
    assert stop.strip(), whole
    cut = client.chat(model=f"{server.model}:latest", messages=HELLO, options={**GREEDY, "stop": [stop]})
    assert cut.done_reason == "stop" and cut.message.content == whole[: whole.index(stop)]
    assert cut.model == f"{server.model}:latest"


def test_the_listed_name_works_on_every_route(client: ollama.Client, server: LiveServer) -> None:
    listed = client.list().models[0].model
    assert listed == f"{server.model}:latest"
    assert client.chat(model=listed, messages=ASK, options=GREEDY).done
    assert client.generate(model=listed, prompt="hi", options=GREEDY).done
    openai_client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    assert (
        openai_client.chat.completions.create(model=listed, messages=ASK, max_tokens=4).model == server.model
    )
    assert openai_client.completions.create(model=listed, prompt="hi", max_tokens=4).model == server.model
    assert openai_client.models.retrieve(listed).id == server.model
    assert [model.id for model in openai_client.models.list()] == [server.model]


def test_list_ps_show_and_version(client: ollama.Client, server: LiveServer) -> None:
    listed = client.list().models
    assert [model.model for model in listed] == [f"{server.model}:latest"]
    assert listed[0].size and listed[0].size > 0 and listed[0].details.format == "openvino"  # type: ignore[union-attr]
    running = client.ps().models
    assert [model.model for model in running] == [f"{server.model}:latest"]
    assert running[0].context_length == 512
    shown = client.show(f"{server.model}:latest")
    assert shown.capabilities == ["completion", "tools"] and shown.template
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 512
    assert httpx.get(f"{server.base_url}/api/version", timeout=10).json()["version"]


@pytest.mark.parametrize("stream", [False, True])
def test_format_schema_replies_validate(client: ollama.Client, server: LiveServer, stream: bool) -> None:
    messages = [{"role": "user", "content": "Order one item as JSON."}]
    reply = client.chat(model=server.model, messages=messages, format=ITEM, options={"temperature": 0},
                        stream=stream)  # fmt: skip
    text = "".join(part.message.content or "" for part in reply) if stream else reply.message.content  # type: ignore[union-attr]
    jsonschema.validate(json.loads(text or ""), ITEM)
    generated = client.generate(model=server.model, prompt="An item:", format=ITEM,
                                options={"temperature": 0.8, "seed": 1})  # fmt: skip
    jsonschema.validate(json.loads(generated.response or ""), ITEM)


def test_format_json_reply_is_an_object(client: ollama.Client, server: LiveServer) -> None:
    # Seeded: the tiny model's greedy JSON is one endless string; this seed closes its object.
    options = {"temperature": 1.0, "seed": 6, "num_predict": 300}
    reply = client.chat(model=server.model, messages=[{"role": "user", "content": "Reply in JSON."}],
                        format="json", options=options)  # fmt: skip
    assert reply.done_reason == "stop"
    assert isinstance(json.loads(reply.message.content or ""), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_come_in_ollamas_shape(client: ollama.Client, server: LiveServer, stream: bool) -> None:
    options = {"temperature": 0, "num_predict": 80}
    reply = client.chat(model=server.model, messages=ASK, tools=TOOLS, format=CALL_FORMAT, options=options,
                        stream=stream)  # fmt: skip
    if stream:
        parts = list(reply)  # type: ignore[arg-type]
        calls = [call for part in parts for call in part.message.tool_calls or ()]
        final = parts[-1]
        assert "".join(part.message.content or "" for part in parts) == ""
    else:
        calls, final = list(reply.message.tool_calls or ()), reply  # type: ignore[union-attr]
        assert reply.message.content == ""  # type: ignore[union-attr]
    assert final.done and final.done_reason == "stop"
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    arguments = calls[0].function.arguments
    assert isinstance(arguments, dict)
    jsonschema.validate(dict(arguments), WEATHER)
    # The call and its result go back as history: the template renders them and the model answers.
    history = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                          "arguments": dict(arguments)}}]},
        {"role": "tool", "content": '{"temp": 3}', "tool_name": "get_weather"},
    ]  # fmt: skip
    answer = client.chat(model=server.model, messages=history, tools=TOOLS, options=options)
    assert answer.done and answer.prompt_eval_count > final.prompt_eval_count  # type: ignore[operator]


def test_unknown_model_is_a_clear_404(client: ollama.Client, server: LiveServer) -> None:
    for call in (
        lambda: client.chat(model="llama3.2", messages=ASK),
        lambda: list(client.chat(model="llama3.2", messages=ASK, stream=True)),
        lambda: client.generate(model="llama3.2", prompt="hi"),
        lambda: client.show("llama3.2"),
    ):
        with pytest.raises(ollama.ResponseError) as raised:
            call()
        assert raised.value.status_code == 404
        assert (
            "'llama3.2' not found" in raised.value.error
            and repr(f"{server.model}:latest") in raised.value.error
        )


def test_refusals_are_ollamas_error_shape(client: ollama.Client, server: LiveServer) -> None:
    with pytest.raises(ollama.ResponseError) as raised:
        client.chat(model=server.model, messages=ASK, options={"num_ctx": 4096})
    assert raised.value.status_code == 400 and "num_ctx 4096 exceeds this model's context of 512" in str(
        raised.value
    )
    with pytest.raises(ollama.ResponseError) as raised:
        client.chat(model=server.model, messages=ASK, options={"mirostat": 2})
    assert raised.value.status_code == 400 and "options.mirostat is not supported" in raised.value.error
    for call, endpoint in (
        (lambda: client.pull(server.model), "pull"),
        (lambda: client.embed(model=server.model, input="x"), "embed"),
        (lambda: client.create(model="m", from_=server.model), "create"),
        (lambda: client.copy(server.model, "other"), "copy"),
        (lambda: client.delete(server.model), "delete"),
    ):
        with pytest.raises(ollama.ResponseError) as raised:
            call()
        assert raised.value.status_code == 501 and f"/api/{endpoint} is not supported" in raised.value.error
    missing = httpx.get(f"{server.base_url}/api/nothing", timeout=10)
    assert missing.status_code == 404 and "/api/chat" in missing.json()["error"]
    wrong = httpx.get(f"{server.base_url}/api/chat", timeout=10)
    assert wrong.status_code == 405 and wrong.json() == {"error": "GET is not allowed on /api/chat"}


def test_empty_requests_load_the_model_and_keep_alive_is_accepted(
    client: ollama.Client, server: LiveServer
) -> None:
    loaded = client.chat(model=server.model, messages=[], keep_alive=0)
    assert loaded.done and loaded.done_reason == "load" and loaded.message.content == ""
    assert client.generate(model=server.model, prompt="", keep_alive="5m").done_reason == "load"
    reply = client.chat(model=server.model, messages=HELLO, options=GREEDY, keep_alive=-1)
    assert reply.eval_count == 24


# Every option of the client's Options, at a value this server honours or treats as a no-op.
EVERY_OPTION = {
    "numa": False, "num_ctx": 512, "num_batch": 64, "num_gpu": 0, "main_gpu": 0, "low_vram": False,
    "f16_kv": True, "logits_all": False, "vocab_only": False, "use_mmap": True, "use_mlock": False,
    "embedding_only": False, "num_thread": 2, "num_keep": 4, "seed": 3, "num_predict": 6, "top_k": 20,
    "top_p": 0.9, "tfs_z": 1.0, "typical_p": 1.0, "repeat_last_n": 64, "temperature": 0.7,
    "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "mirostat": 0,
    "mirostat_tau": 5.0, "mirostat_eta": 0.1, "penalize_newline": True, "stop": ["\n\n"],
}  # fmt: skip


def test_every_field_the_client_sends_is_accepted_and_an_unknown_one_named(
    client: ollama.Client, server: LiveServer
) -> None:
    assert set(ollama.Options.model_fields) == set(EVERY_OPTION)  # a newer client's option fails here
    options = ollama.Options(**EVERY_OPTION)
    reply = client.chat(
        model=server.model, messages=HELLO, options=options, keep_alive="5m", think=False, format="",
        tools=[], logprobs=False, top_logprobs=0, stream=False,
    )  # fmt: skip
    assert reply.done and reply.eval_count is not None and reply.eval_count <= 6
    generated = client.generate(
        model=server.model, prompt="Foxes", system="Be brief.", options=options, raw=False, images=[],
        suffix="", template="", context=[], keep_alive=0, think=False, logprobs=False, top_logprobs=0,
        width=0, height=0, steps=0,
    )  # fmt: skip
    assert generated.done and generated.eval_count is not None and generated.eval_count <= 6
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=server.model, messages=HELLO, options={"num_predictt": 4})
    assert refused.value.status_code == 400
    assert refused.value.error.startswith("options.num_predictt is not a parameter this server knows")


# ------------------------------------------------------------------ in-process: authentication, loading
@pytest.fixture(scope="module")
def unloaded_app() -> Iterator[Flask]:
    """An app with an API key whose model never finishes loading."""
    release = threading.Event()

    def never_loads():  # type: ignore[no-untyped-def]
        release.wait(60)
        raise RuntimeError("test model")

    yield create_app(never_loads, ServerConfig(served_model_name="m", api_key="sekret"))
    release.set()


def test_api_routes_need_the_key_and_answer_while_loading(unloaded_app: Flask) -> None:
    client = unloaded_app.test_client()
    refused = client.get("/api/tags")
    assert refused.status_code == 401 and refused.get_json() == {
        "error": "missing API key: send 'Authorization: Bearer KEY'"
    }
    headers = {"Authorization": "Bearer sekret"}
    tags = client.get("/api/tags", headers=headers).get_json()
    assert [model["name"] for model in tags["models"]] == ["m:latest"]
    assert client.get("/api/ps", headers=headers).get_json() == {"models": []}
    loading = client.post("/api/chat", json={"model": "m", "messages": ASK}, headers=headers)
    assert loading.status_code == 503 and loading.get_json() == {"error": "the model is still loading"}
    malformed = client.post("/api/chat", data=b"{", headers=headers)
    assert malformed.status_code == 400 and isinstance(malformed.get_json()["error"], str)
