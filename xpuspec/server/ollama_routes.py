"""The Ollama-compatible endpoints: /api/chat, /api/generate, /api/tags, /api/ps, /api/show, /api/version.

Each generation request is translated into the OpenAI request models (``ollama_requests.py``) and
goes through the OpenAI routes' own preparation, engine loop submission, disconnect handling and
metrics; only the framing differs (``ollama_responses.py``). Errors anywhere under /api, the 401 of
authentication included, are Ollama's shape ``{"error": "..."}``. What Ollama does and xpuspec cannot
(pulling, creating, copying or deleting models, embeddings) answers 501 with a message saying so.
See docs/ollama.md.
"""

from __future__ import annotations

import json
import time
from typing import TypeVar, cast

from flask import Blueprint, Response, jsonify, request
from pydantic import BaseModel, ValidationError

from xpuspec.server import ollama_models
from xpuspec.server.choices import PreparedRequest, prepare_chat, prepare_completion
from xpuspec.server.errors import APIError
from xpuspec.server.json_body import parse_json_object, require_json_content_type
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
from xpuspec.server.ollama_responses import OllamaContext, created_at, ollama_body, ollama_stream
from xpuspec.server.ollama_schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaShowRequest
from xpuspec.server.openai_routes import Framing, ready_requests, respond, start_generation
from xpuspec.server.responses import Kind
from xpuspec.server.schemas import ChatCompletionRequest, CompletionRequest, first_error
from xpuspec.server.state import server_state
from xpuspec.server.unsupported import Check

ollama_api = Blueprint("ollama_api", __name__, url_prefix="/api")

Body = TypeVar("Body", bound=BaseModel)
ENDPOINTS = ("chat", "generate", "tags", "ps", "show", "version")
# Ollama endpoints xpuspec cannot serve: the message says why and what to do instead.
NOT_IMPLEMENTED = {
    "pull": "xpuspec serves the one model it was started with and downloads none; "
    "start `xpuspec serve --bundle FOLDER` with another bundle",
    "push": "xpuspec does not publish models",
    "create": "xpuspec cannot create models: prepare a bundle with `xpuspec prepare` and serve it",
    "copy": "xpuspec cannot copy models: name aliases with `xpuspec serve --served-model-name`",
    "delete": "xpuspec cannot delete the model it serves",
    "embed": "this server has no embedding model",
    "embeddings": "this server has no embedding model",
    "blobs": "xpuspec does not store model blobs",
}


@ollama_api.after_request
def _ollama_error_shape(response: Response) -> Response:
    """Every error under /api (raised here, by authentication or by Flask) as ``{"error": "message"}``."""
    if response.status_code >= 400 and response.is_json:
        body = response.get_json(silent=True)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and "message" in error:
            response.set_data(json.dumps({"error": error["message"]}))
    return response


def _parse(schema: type[Body], checks: dict[str, Check], generates: bool = True) -> Body:
    """The body as ``schema``; a request that generates has every field known (a 400 names one not)."""
    # Ollama's documentation posts with a bare `curl -d`: allowed where no page can be the sender.
    content_type, origin = request.headers.get("Content-Type"), request.headers.get("Origin")
    require_json_content_type(content_type, curl_form_allowed=origin is None)
    data = parse_json_object(request.get_data(cache=False))  # raises 413 beyond MAX_CONTENT_LENGTH
    check_supported(data, checks)
    if generates:
        check_known(data, schema.model_fields, checks)
    try:
        return schema.model_validate(data, strict=True)
    except ValidationError as error:
        message, param = first_error(error)
        raise APIError(400, message, param=param, code="invalid_value") from None


def _loaded_reply(model: str, generate: bool) -> Response:
    """Ollama's answer to a request without a prompt: the model is loaded (as it always is here)."""
    body: dict[str, object] = {"model": model, "created_at": created_at()}
    body.update({"response": ""} if generate else {"message": {"role": "assistant", "content": ""}})
    return jsonify({**body, "done": True, "done_reason": "load"})


def _respond(
    kind: Kind,
    body: ChatCompletionRequest | CompletionRequest,
    prepared: PreparedRequest,
    model: str,
    received: float,
    generate: bool,
) -> Response:
    generation, started = start_generation(kind, prepared, OllamaContext)
    context = cast(OllamaContext, started)
    context.received, context.requested_model, context.generate = received, model, generate
    framing = Framing(
        "application/x-ndjson",
        lambda frames: ollama_stream(frames, context),
        lambda reply: ollama_body(reply, context),
    )
    return respond(generation, context, prepared, bool(body.stream), framing)


@ollama_api.post("/chat")
def chat() -> Response:
    received = time.perf_counter()
    body = _parse(OllamaChatRequest, SHARED)
    state = server_state()
    served = resolve_model(body.model, state.config)
    if not body.messages:
        return _loaded_reply(body.model, generate=False)
    requests = ready_requests(state)
    check_num_ctx(body.options, requests.max_model_len)
    openai_body = chat_request(body, served)
    prepared = prepare_chat(openai_body, requests)
    apply_limits(prepared, body.options, requests.max_model_len, requests.sampling_defaults.max_tokens)
    return _respond("chat", openai_body, prepared, body.model, received, generate=False)


@ollama_api.post("/generate")
def generate() -> Response:
    received = time.perf_counter()
    body = _parse(OllamaGenerateRequest, GENERATE)
    state = server_state()
    served = resolve_model(body.model, state.config)
    if not body.prompt:
        return _loaded_reply(body.model, generate=True)
    requests = ready_requests(state)
    check_num_ctx(body.options, requests.max_model_len)
    templated = not body.raw and requests.chat_template is not None
    openai_body = generate_request(body, served, templated)
    if isinstance(openai_body, ChatCompletionRequest):
        prepared = prepare_chat(openai_body, requests)
    else:
        prepared = prepare_completion(openai_body, requests)
    apply_limits(prepared, body.options, requests.max_model_len, requests.sampling_defaults.max_tokens)
    kind: Kind = "chat" if templated else "completion"
    return _respond(kind, openai_body, prepared, body.model, received, generate=True)


@ollama_api.get("/tags")
def tags() -> Response:
    state = server_state()
    return jsonify(
        {"models": ollama_models.model_entries((state.config.served_model_name,), state.loop.requests)}
    )


@ollama_api.get("/ps")
def running() -> Response:
    state = server_state()
    loop = state.loop
    requests = loop.requests if loop.ready.is_set() and loop.load_error is None else None
    return jsonify({"models": ollama_models.running_entries((state.config.served_model_name,), requests)})


@ollama_api.post("/show")
def show() -> Response:
    body = _parse(OllamaShowRequest, {}, generates=False)  # a lookup: other fields change nothing
    name = body.model or body.name
    if not name:
        raise APIError(400, "model is required", param="model", code="invalid_value")
    state = server_state()
    resolve_model(name, state.config)
    return jsonify(ollama_models.show(name, ready_requests(state)))


@ollama_api.get("/version")
def version() -> Response:
    return jsonify(ollama_models.version())


@ollama_api.route("/<path:rest>", methods=["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"])
def not_served(rest: str) -> Response:
    """Ollama's model management and embeddings (501), a known route with the wrong method (405),
    anything else under /api (404): all in Ollama's error shape."""
    endpoint = rest.split("/", 1)[0]
    if endpoint in NOT_IMPLEMENTED:
        raise APIError(
            501, f"/api/{endpoint} is not supported: {NOT_IMPLEMENTED[endpoint]}", code="not_supported"
        )
    if rest in ENDPOINTS:
        raise APIError(405, f"{request.method} is not allowed on /api/{rest}", code="method_not_allowed")
    served = ", ".join(f"/api/{name}" for name in ENDPOINTS)
    raise APIError(404, f"no such endpoint /api/{rest}; xpuspec serves {served}", code="not_found")
