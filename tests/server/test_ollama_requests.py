"""Ollama request bodies into the OpenAI request models: names, options, defaults, refusals, limits."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from xpuspec.api.engine_loop import ChoiceRequest
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.server.choices import PreparedRequest
from xpuspec.server.config import ServerConfig
from xpuspec.server.errors import APIError
from xpuspec.server.ollama_requests import (
    GENERATE,
    SHARED,
    apply_limits,
    chat_request,
    check_known,
    check_num_ctx,
    check_supported,
    generate_request,
    resolve_model,
)
from xpuspec.server.ollama_schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaOptions
from xpuspec.server.schemas import ChatCompletionRequest, CompletionRequest


def chat(**fields: object) -> OllamaChatRequest:
    return OllamaChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}, strict=True
    )


def test_model_names_with_and_without_the_latest_tag() -> None:
    config = ServerConfig(served_model_name="m", model_aliases=("alias",))
    for name in ("m", "m:latest", "alias", "alias:latest"):
        assert resolve_model(name, config) == "m"
    with pytest.raises(APIError) as raised:
        resolve_model("m:7b", ServerConfig(served_model_name="m"))
    assert raised.value.status == 404 and raised.value.message.startswith("model 'm:7b' not found")


def test_options_become_sampling_fields_unset_ones_left_to_the_models_defaults() -> None:
    default = chat_request(chat(), "m")
    # Unset: the engine gives them the model's defaults, as on /v1/* (xpuspec.sample.defaults).
    assert (default.temperature, default.top_p, default.top_k, default.seed) == (None, None, None, None)
    assert default.stream is True and default.response_format is None
    options = {"temperature": 0, "top_p": 0.5, "top_k": 3, "seed": 7, "stop": ["\n"], "drafter": "none"}
    penalties = {"min_p": 0.1, "repeat_penalty": 1.2, "repeat_last_n": 32, "presence_penalty": 0.5}
    request = chat_request(
        chat(options={**options, **penalties, "frequency_penalty": -0.5}, stream=False), "m"
    )
    assert (request.temperature, request.top_p, request.top_k, request.seed) == (0, 0.5, 3, 7)
    assert (request.min_p, request.repeat_penalty, request.repeat_last_n) == (0.1, 1.2, 32)
    assert (request.presence_penalty, request.frequency_penalty) == (0.5, -0.5)
    assert request.stop == ["\n"] and request.drafter == "none" and request.stream is False
    assert chat_request(chat(options={"seed": -1}), "m").seed is None  # Ollama's "random"


def test_llama_cpps_dry_options_pass_through_under_llama_servers_names() -> None:
    assert chat_request(chat(), "m").dry_multiplier is None  # unset: the model's default
    dry = {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 3, "dry_penalty_last_n": 256}
    request = chat_request(chat(options={**dry, "dry_sequence_breakers": ["\n"]}), "m")
    assert request.model_dump(include=set(dry)) == dry
    assert request.dry_sequence_breakers == ["\n"]
    assert chat_request(chat(options={"dry_include_prompt": False}), "m").dry_include_prompt is False
    with pytest.raises(ValidationError, match="dry_base"):
        chat(options={"dry_base": 0.5})


def test_format_json_and_a_schema_are_response_formats() -> None:
    assert chat_request(chat(format="json"), "m").response_format.as_dict() == {"type": "json_object"}  # type: ignore[union-attr]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    response_format = chat_request(chat(format=schema), "m").response_format
    assert response_format is not None and response_format.json_schema is not None
    assert response_format.type == "json_schema" and response_format.json_schema.schema_ == schema
    assert chat_request(chat(format=""), "m").response_format is None


def test_tool_history_gets_ids_and_json_text_arguments() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "w", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "3 C", "tool_name": "w"},
    ]
    tools = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    request = chat_request(chat(messages=messages, tools=tools), "m")
    call = request.messages[1].tool_calls[0]  # type: ignore[index]
    assert call.id and call.function.name == "w" and json.loads(call.function.arguments) == {"city": "Oslo"}
    assert request.messages[1].content == "" and request.messages[2].name == "w"
    assert request.tools is not None and request.tools[0].function.name == "w"
    with pytest.raises(APIError, match="images are not supported"):
        chat_request(chat(messages=[{"role": "user", "content": "x", "images": ["aGk="]}]), "m")


def test_generate_is_a_chat_with_the_system_message_unless_raw() -> None:
    body = OllamaGenerateRequest.model_validate(
        {"model": "m", "prompt": "hi", "system": "terse"}, strict=True
    )
    templated = generate_request(body, "m", templated=True)
    assert isinstance(templated, ChatCompletionRequest)
    assert [(m.role, m.text) for m in templated.messages] == [("system", "terse"), ("user", "hi")]
    raw = generate_request(body, "m", templated=False)
    assert isinstance(raw, CompletionRequest) and raw.prompt == "hi"


def test_what_xpuspec_cannot_honour_is_a_400_naming_it() -> None:
    check_supported({"think": False, "options": {"repeat_penalty": 1, "num_gpu": 99, "min_p": 0}}, SHARED)
    for body, checks, name in (
        ({"think": True}, SHARED, "think"),
        ({"options": {"typical_p": 0.5}}, SHARED, "options.typical_p"),
        ({"options": {"mirostat": 2}}, SHARED, "options.mirostat"),
        ({"suffix": "end"}, GENERATE, "suffix"),
        ({"context": [1, 2]}, GENERATE, "context"),
    ):
        with pytest.raises(APIError) as raised:
            check_supported(body, checks)
        assert raised.value.status == 400 and raised.value.param == name
        assert raised.value.message.startswith(f"{name} is not supported")
    with pytest.raises(ValidationError, match="num_predict must be at least 1"):
        OllamaOptions.model_validate({"num_predict": 0}, strict=True)


def test_every_field_is_known_a_no_op_or_a_400_naming_it() -> None:
    load_time = {"num_gpu": 99, "num_thread": 4, "use_mmap": True, "numa": False, "num_batch": 512}
    fine = {"model": "m", "keep_alive": "5m", "think": False, "options": {"temperature": 0, **load_time}}
    check_known(fine, OllamaChatRequest.model_fields, SHARED)
    generate, chat_fields = OllamaGenerateRequest.model_fields, OllamaChatRequest.model_fields
    for body, fields, checks, name in (
        ({"model": "m", "promt": "hi"}, generate, GENERATE, "promt"),
        ({"model": "m", "options": {"temprature": 0}}, chat_fields, SHARED, "options.temprature"),
        ({"model": "m", "raw": True}, chat_fields, SHARED, "raw"),  # /api/generate's
    ):  # fmt: skip
        with pytest.raises(APIError) as raised:
            check_known(body, fields, checks)
        assert (
            raised.value.status == 400
            and raised.value.param == name
            and raised.value.code == "unknown_parameter"
        )


def prepared(num_prompt_tokens: int) -> PreparedRequest:
    return PreparedRequest(
        [ChoiceRequest(0, [1] * num_prompt_tokens, SamplingParams())], num_prompt_tokens, 1
    )


@pytest.mark.parametrize(
    ("options", "expected"),
    [({}, 64), ({"num_predict": -1}, 490), ({"num_predict": -2}, 490), ({"num_predict": 8}, 8),
     ({"num_predict": 900}, 490), ({"num_ctx": 50}, 40), ({"num_ctx": 100, "num_predict": 50}, 50)],
)  # fmt: skip
def test_num_predict_is_a_cap_within_num_ctx(options: dict, expected: int) -> None:
    """Absent: the default reply cap (64 here); -1 and -2: the room the context leaves."""
    request = prepared(10)
    apply_limits(request, OllamaOptions.model_validate(options, strict=True), 500, 64)
    assert request.choices[0].params.max_tokens == expected


def test_num_ctx_beyond_the_model_or_below_the_prompt_is_a_400() -> None:
    check_num_ctx(OllamaOptions(num_ctx=500), 500)
    with pytest.raises(APIError, match="num_ctx 501 exceeds this model's context of 500"):
        check_num_ctx(OllamaOptions(num_ctx=501), 500)
    with pytest.raises(APIError, match="the prompt has 10 tokens") as raised:
        apply_limits(prepared(10), OllamaOptions(num_ctx=10), 500, 64)
    assert raised.value.code == "context_length_exceeded"
