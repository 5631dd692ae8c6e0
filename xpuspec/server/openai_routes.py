"""The OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from flask import Blueprint, Response, jsonify, request
from pydantic import BaseModel, ValidationError

from xpuspec.api.engine_loop import Generation, NotAcceptingError, QueueFullError
from xpuspec.api.requests import RequestPreparer
from xpuspec.server import tools, unsupported
from xpuspec.server.access_log import TOKENS_KEY, request_id
from xpuspec.server.choices import PreparedRequest, check_model, prepare_chat, prepare_completion
from xpuspec.server.errors import APIError
from xpuspec.server.json_body import parse_json_object, require_json_content_type
from xpuspec.server.provenance import Speculation, speculation_of
from xpuspec.server.responses import ClientGone, Kind, ResponseContext, collect, stream
from xpuspec.server.schemas import ChatCompletionRequest, CompletionRequest, first_error
from xpuspec.server.state import ServerState, server_state

openai_api = Blueprint("openai_api", __name__, url_prefix="/v1")

Body = TypeVar("Body", bound=BaseModel)
# nginx's code for "client closed request": only logs and metrics ever see it.
CLIENT_CLOSED_REQUEST = 499


def parse_body(schema: type[Body], checks: Mapping[str, unsupported.Check]) -> Body:
    require_json_content_type(request.headers.get("Content-Type"))
    raw = request.get_data(cache=False)  # raises 413 beyond MAX_CONTENT_LENGTH
    data = parse_json_object(raw)
    unsupported.check_supported(data, checks)
    unsupported.check_known(data, schema.model_fields, checks, unsupported.OPENAI_NO_OPS)
    try:
        return schema.model_validate(data, strict=True)
    except ValidationError as error:
        message, param = first_error(error)
        raise APIError(400, message, param=param, code="invalid_value") from None


def ready_requests(state: ServerState) -> RequestPreparer:
    """The loaded model's request preparer, or the 503 of a model still loading or failed."""
    loop = state.loop
    if not loop.ready.is_set():
        raise APIError(503, "the model is still loading", code="loading", headers={"Retry-After": "5"})
    requests = loop.requests
    if loop.load_error is not None or requests is None:
        raise APIError(503, "the model failed to load; see the server log", code="load_failed")
    return requests


class TrackedStream:
    """A response body that tells the state when it is closed, even if never iterated."""

    def __init__(self, frames: Generator[str, None, None], on_close: Callable[[], None]) -> None:
        self._frames = frames
        self._on_close: Callable[[], None] | None = on_close

    def __iter__(self) -> Iterator[str]:
        return self._frames

    def close(self) -> None:
        try:
            self._frames.close()
        finally:
            if self._on_close is not None:
                self._on_close()
                self._on_close = None


def tenant_of(authorization: str) -> str | None:
    """The tenant of a request with this Authorization header: a digest of its bearer key (the key
    itself is kept nowhere), or None (the anonymous tenant) without one. The engine's cross-request
    lookup drafts a request from its own tenant's earlier requests only."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return hashlib.sha256(token.strip().encode()).hexdigest()[:32]


def start_generation(
    kind: Kind, prepared: PreparedRequest, context_type: type[ResponseContext] = ResponseContext
) -> tuple[Generation, ResponseContext]:
    """Submit a prepared request to the engine loop (400 beyond the per-request bounds, 503 when full
    or not accepting) and the context its response is built with; shared with the Ollama routes."""
    state = server_state()
    # Bounds one request can never get past: a 400, since retrying (a 503) could never succeed.
    limit = min(state.config.max_choices, state.loop.max_in_flight)
    if len(prepared.choices) > limit:
        raise APIError(
            400,
            f"{len(prepared.choices)} choices (prompts x n); this server runs at most {limit} per request",
            param="n",
            code="invalid_value",
        )
    tenant = tenant_of(request.headers.get("Authorization", ""))
    for choice in prepared.choices:
        choice.tenant = tenant
    try:
        generation = state.loop.submit(prepared.choices)
    except QueueFullError as error:
        raise APIError(
            503,
            f"the server is busy ({error}); retry later",
            code="queue_full",
            headers={"Retry-After": str(state.config.retry_after_s)},
        ) from None
    except NotAcceptingError as error:
        raise APIError(503, f"not accepting requests: {error}", code="unavailable") from None
    context = context_type(
        kind=kind,
        model=state.config.served_model_name,
        num_prompt_tokens=prepared.num_prompt_tokens,
        num_choices=len(prepared.choices),
        num_choices_per_prompt=prepared.num_choices_per_prompt,
        client_disconnected=request.environ.get("waitress.client_disconnected"),
        id=request_id(request.environ),
        constrained=any(c.params.constraint() is not None for c in prepared.choices[:1]),
    )
    # What the choices generated, finished or not: an aborted request's line counts its output too.
    request.environ[TOKENS_KEY] = lambda: max(context.num_completion_tokens, generation.num_generated_tokens)
    return generation, context


def _generate(
    kind: Kind, body: CompletionRequest | ChatCompletionRequest, prepared: PreparedRequest
) -> Response:
    if body.stream and body.stream_options is not None and body.stream_options.include_speculation:
        for choice in prepared.choices:
            choice.provenance = True
    generation, context = start_generation(kind, prepared)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    speculation = None
    if body.stream and body.stream_options is not None and body.stream_options.include_speculation:
        speculation = speculation_of(prepared.choices[0].params, ready_requests(server_state()).drafter)
    streamed = bool(body.stream)
    return respond(generation, context, prepared, streamed, OPENAI_FRAMING, include_usage, speculation)


@dataclass(frozen=True)
class Framing:
    """How a protocol writes a generation's response: its stream's mimetype, its frames made from the
    OpenAI frames, and its whole body made from the OpenAI body."""

    mimetype: str
    frames: Callable[[Generator[str, None, None]], Generator[str, None, None]]
    body: Callable[[dict[str, Any]], dict[str, Any]]


OPENAI_FRAMING = Framing("text/event-stream", lambda frames: frames, lambda body: body)


def respond(
    generation: Generation,
    context: ResponseContext,
    prepared: PreparedRequest,
    streamed: bool,
    framing: Framing,
    include_usage: bool = False,
    speculation: Speculation | None = None,
) -> Response:
    """A submitted generation's response, streamed or whole, tool calls rewritten, in ``framing``'s
    protocol; shared with the Ollama routes. The state counts the response open until it is closed."""
    state = server_state()
    state.response_opened(streamed=streamed)
    if streamed:
        frames_of = stream(generation, context, include_usage, state.stream_interval, speculation)
        if prepared.tools is not None:
            frames_of = tools.rewrite_stream(frames_of, prepared.tools.max_calls, prepared.tools.forced)
        frames = TrackedStream(framing.frames(frames_of), lambda: state.response_closed(streamed=True))
        return Response(
            frames,
            mimetype=framing.mimetype,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        body_out = collect(generation, context)
        if prepared.tools is not None:
            body_out = tools.rewrite_body(body_out, prepared.tools.max_calls, prepared.tools.forced)
        return jsonify(framing.body(body_out))
    except ClientGone:
        return Response(status=CLIENT_CLOSED_REQUEST)
    finally:
        state.response_closed()


@openai_api.post("/completions")
def completions() -> Response:
    body = parse_body(CompletionRequest, unsupported.COMPLETION)
    state = server_state()
    check_model(body, state.config)
    return _generate("completion", body, prepare_completion(body, ready_requests(state)))


@openai_api.post("/chat/completions")
def chat_completions() -> Response:
    body = parse_body(ChatCompletionRequest, unsupported.CHAT)
    state = server_state()
    check_model(body, state.config)
    return _generate("chat", body, prepare_chat(body, ready_requests(state)))


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": state.started, "owned_by": "xpuspec"}


@openai_api.get("/models")
def list_models() -> Response:
    state = server_state()
    # One name per model: aliases are accepted on requests but not listed again.
    return jsonify({"object": "list", "data": [_model_card(state, state.config.served_model_name)]})


@openai_api.get("/models/<string:model>")
def get_model(model: str) -> Response:
    """The served model's card under its listed name, asked for by that name or any alias."""
    state = server_state()
    if not state.config.serves(model):
        raise APIError(404, f"the model {model!r} does not exist", param="model", code="model_not_found")
    return jsonify(_model_card(state, state.config.served_model_name))


# OpenAI endpoints this server does not serve, each with a one-line reason (a 404, which the openai
# client does not retry, rather than the generic "no such route").
NOT_SERVED = {
    "embeddings": "embeddings are not served: this server generates text (/v1/chat/completions, "
    "/v1/completions) with its one model; use an embedding server for /v1/embeddings",
    "responses": "the Responses API is not served: use /v1/chat/completions",
    "images": "images are not served: this server generates text",
    "audio": "audio is not served: this server generates text",
    "moderations": "moderations are not served: this server generates text",
}


@openai_api.route("/<any(" + ", ".join(NOT_SERVED) + "):endpoint>", methods=["GET", "POST"])
@openai_api.route("/<any(" + ", ".join(NOT_SERVED) + "):endpoint>/<path:rest>", methods=["GET", "POST"])
def not_served(endpoint: str, rest: str = "") -> Response:
    raise APIError(404, NOT_SERVED[endpoint], code="not_served")
