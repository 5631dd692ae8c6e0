"""Ollama request bodies into the OpenAI request models the server already prepares and runs.

/api/chat becomes a ``ChatCompletionRequest``; /api/generate becomes one too (the prompt as the user
message, ``system`` before it), or a ``CompletionRequest`` with ``raw: true`` or for a model without
a chat template. Everything after that (templating, tools, structured output, limits, the engine
loop) is the OpenAI routes' code. The functions here take no Flask request: a Ray Serve ingress can
call them as they are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from xpuspec.server import unsupported
from xpuspec.server.choices import PreparedRequest
from xpuspec.server.config import LATEST_TAG, ServerConfig
from xpuspec.server.errors import APIError
from xpuspec.server.ollama_schemas import (
    UNLIMITED_PREDICT,
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaGenerationFields,
    OllamaMessage,
    OllamaOptions,
)
from xpuspec.server.schemas import ChatCompletionRequest, CompletionRequest, first_error
from xpuspec.server.unsupported import Check

RequestModel = TypeVar("RequestModel", ChatCompletionRequest, CompletionRequest)


def _neutral(*values: object) -> Callable[[object], bool]:
    return lambda value: value is None or any(value == v and type(value) is not bool for v in values)


def _off(value: object) -> bool:
    return value is None or value is False


def _empty(value: object) -> bool:
    return value is None or value in ("", [], {})


# field -> (is it at its neutral value?, what the client may send instead), as for the OpenAI routes.
SHARED: dict[str, Check] = {
    "think": (_off, "omit it or send false: this model does not think"),
    "logprobs": (_off, "omit it or send false"),
    "top_logprobs": (_neutral(0), "omit it or send 0"),
}
GENERATE: dict[str, Check] = {
    **SHARED,
    "suffix": (_empty, "omit it: fill-in-the-middle is not supported"),
    "images": (_empty, "omit it: this model reads text only"),
    "context": (_empty, "omit it: send the conversation to /api/chat instead"),
    "template": (_empty, "omit it: the model's own chat template is used (or raw: true)"),
    # Image generation's fields (Ollama's experimental image models).
    "width": (_neutral(0), "omit it: this server generates text"),
    "height": (_neutral(0), "omit it: this server generates text"),
    "steps": (_neutral(0), "omit it: this server generates text"),
}
# Sampling options xpuspec does not implement; load-time options are ignored (nothing to load).
OPTIONS: dict[str, Check] = {
    "options.typical_p": (_neutral(1), "omit it or send 1"),
    "options.tfs_z": (_neutral(1), "omit it or send 1"),
    "options.mirostat": (_neutral(0), "omit it or send 0"),
}
# Options accepted with any value that change nothing here (docs/ollama.md lists them): how llama.cpp
# loads the model (the bundle was compiled for its device when prepared), and settings that matter
# only with an option above at a value refused (mirostat's tau and eta) or with a context shift,
# which xpuspec never does (num_keep).
OPTION_NO_OPS = frozenset(
    {
        "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
        "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "mirostat_tau",
        "mirostat_eta", "penalize_newline",
    }
)  # fmt: skip


def check_supported(body: Mapping[str, object], checks: Mapping[str, Check]) -> None:
    """A 400 naming the first field sent with a value this server does not implement."""
    options = body.get("options")
    fields = {
        **body,
        **({f"options.{k}": v for k, v in options.items()} if isinstance(options, dict) else {}),
    }
    unsupported.check_supported(fields, {**checks, **OPTIONS})


def check_known(body: Mapping[str, object], fields: Iterable[str], checks: Mapping[str, Check]) -> None:
    """A 400 naming the first field (or option) that is neither implemented, checked nor a no-op."""
    unsupported.check_known(body, fields, checks)
    options = body.get("options")
    if isinstance(options, dict):
        checked = (name.removeprefix("options.") for name in OPTIONS)
        unsupported.check_known(
            options, OllamaOptions.model_fields, checked, OPTION_NO_OPS, prefix="options."
        )


def resolve_model(name: str, config: ServerConfig) -> str:
    """The served name, when ``name`` names it (an alias, or either with ``:latest``); else Ollama's 404."""
    if config.serves(name):
        return config.served_model_name
    served = tagged(config.served_model_name)
    raise APIError(
        404, f"model {name!r} not found; this server serves {served!r}", param="model", code="model_not_found"
    )


def tagged(name: str) -> str:
    """``name`` as Ollama lists it: with a tag (``:latest`` unless it has one)."""
    return name if ":" in name else name + LATEST_TAG


def _response_format(format_: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if not format_:
        return None
    if format_ == "json":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "format", "schema": format_}}


def _common(body: OllamaGenerationFields, served: str) -> dict[str, Any]:
    """The OpenAI fields of an Ollama request: sampling (unset: the model's defaults), format, streaming."""
    options = body.options or OllamaOptions()
    seed = options.seed if options.seed is not None and options.seed >= 0 else None
    fields: dict[str, Any] = {
        "model": served,
        "stream": body.stream is not False,
        "temperature": options.temperature,
        "top_p": options.top_p,
        "top_k": options.top_k,
        "min_p": options.min_p,
        "repeat_penalty": options.repeat_penalty,
        "repeat_last_n": options.repeat_last_n,
        "presence_penalty": options.presence_penalty,
        "frequency_penalty": options.frequency_penalty,
        "dry_multiplier": options.dry_multiplier,
        "dry_base": options.dry_base,
        "dry_allowed_length": options.dry_allowed_length,
        "dry_penalty_last_n": options.dry_penalty_last_n,
        "dry_sequence_breakers": options.dry_sequence_breakers,
        "dry_include_prompt": options.dry_include_prompt,
        "seed": seed,
        "stop": options.stop or None,
        "response_format": _response_format(body.format),
        "drafter": options.drafter,
        "num_draft_tokens": options.num_draft_tokens,
    }
    return {key: value for key, value in fields.items() if value is not None}


def _validated(model: type[RequestModel], fields: dict[str, Any]) -> RequestModel:
    try:
        return model.model_validate(fields, strict=True)
    except ValidationError as error:
        message, param = first_error(error)
        raise APIError(400, message, param=param, code="invalid_value") from None


def _message(message: OllamaMessage, index: int) -> dict[str, Any]:
    """An Ollama message as an OpenAI one: calls get ids and JSON-text arguments, results their tool."""
    if message.images:
        raise APIError(
            400, "images are not supported: this model reads text only", param=f"messages.{index}.images"
        )
    converted: dict[str, Any] = {"role": message.role, "content": message.content or ""}
    if message.tool_calls:
        converted["tool_calls"] = [
            {
                "id": call.id or f"call_{index}_{number}",
                "type": "function",
                "function": {"name": call.function.name, "arguments": json.dumps(call.function.arguments)},
            }
            for number, call in enumerate(message.tool_calls)
        ]
    if message.role == "tool" and message.tool_name:
        converted["name"] = message.tool_name
    return converted


def chat_request(body: OllamaChatRequest, served: str) -> ChatCompletionRequest:
    fields = _common(body, served)
    fields["messages"] = [_message(message, index) for index, message in enumerate(body.messages)]
    if body.tools:
        fields["tools"] = [tool.model_dump(exclude_none=True) for tool in body.tools]
    return _validated(ChatCompletionRequest, fields)


def generate_request(
    body: OllamaGenerateRequest, served: str, templated: bool
) -> ChatCompletionRequest | CompletionRequest:
    """``templated``: the model has a chat template and the request is not raw."""
    fields = _common(body, served)
    if not templated:
        # A placeholder the prepared request's max_tokens replaces (apply_limits): the room left is
        # known only once the prompt is encoded.
        return _validated(CompletionRequest, {**fields, "prompt": body.prompt or "", "max_tokens": 1})
    messages = [{"role": "system", "content": body.system}] if body.system else []
    messages.append({"role": "user", "content": body.prompt or ""})
    return _validated(ChatCompletionRequest, {**fields, "messages": messages})


def check_num_ctx(options: OllamaOptions | None, model_context: int) -> None:
    num_ctx = options.num_ctx if options is not None else None
    if num_ctx is not None and num_ctx > model_context:
        raise APIError(
            400,
            f"num_ctx {num_ctx} exceeds this model's context of {model_context} tokens: "
            f"send at most {model_context}, or leave it out",
            param="options.num_ctx",
            code="context_length_exceeded",
        )


def apply_limits(
    prepared: PreparedRequest, options: OllamaOptions | None, model_context: int, default_cap: int
) -> None:
    """Each choice's max_tokens: num_predict (absent: ``default_cap``, the default reply cap), at most
    what is left of num_ctx (or the model's context).

    As in Ollama, num_predict is a cap: a reply that fills the context ends with done_reason "length";
    -1 and -2 ask for the whole room.
    """
    options = options or OllamaOptions()
    context = options.num_ctx or model_context
    room = context - prepared.num_prompt_tokens
    if room < 1:
        raise APIError(
            400,
            f"the prompt has {prepared.num_prompt_tokens} tokens, which leaves no room in a context of "
            f"{context} tokens: shorten it, or raise options.num_ctx (at most {model_context})",
            param="options.num_ctx",
            code="context_length_exceeded",
        )
    predict = options.num_predict
    if predict in UNLIMITED_PREDICT:
        max_tokens = room
    else:
        max_tokens = min(default_cap if predict is None else predict, room)
    for choice in prepared.choices:
        choice.params.max_tokens = max_tokens
