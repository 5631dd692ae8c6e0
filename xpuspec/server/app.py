"""The application factory: ``create_app(pipeline_or_factory, ServerConfig(...))``."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from flask import Flask, Response, request
from flask.json.provider import DefaultJSONProvider

from xpuspec.api.engine_loop import EngineLoop
from xpuspec.server.access_log import AccessLog
from xpuspec.server.chat_page import chat_page, is_public
from xpuspec.server.config import ServerConfig
from xpuspec.server.errors import APIError, error_response, register_error_handlers
from xpuspec.server.metrics import ServerMetrics
from xpuspec.server.ollama_routes import ollama_api
from xpuspec.server.openai_routes import openai_api
from xpuspec.server.ops_routes import operations
from xpuspec.server.origins import AccessPolicy, cors_headers
from xpuspec.server.state import EXTENSION_KEY, ServerState, server_state

if TYPE_CHECKING:
    from xpuspec.api.pipeline import Pipeline
    from xpuspec.api.requests import RequestPreparer

logger = logging.getLogger(__name__)

UNAUTHENTICATED_PATHS = ("/health",)


def create_app(
    pipeline: Pipeline | Callable[[], Pipeline] | Callable[[], RequestPreparer],
    config: ServerConfig | None = None,
    *,
    start: bool = True,
    make_loop: Callable[..., EngineLoop] = EngineLoop,
) -> Flask:
    """A Flask app serving ``pipeline``; a factory is called in the engine thread (the app answers
    /health with 503 until it returns). ``start=False`` leaves ``server_state(app).loop.start()``
    to the caller. ``make_loop`` builds the engine loop from :class:`EngineLoop`'s arguments: a
    subclass may run the engine elsewhere (``xpuspec.cluster`` forwards each submission to a replica,
    and its factory makes only a :class:`~xpuspec.api.requests.RequestPreparer`: the routes read the
    loop's ``requests``, never its engine).
    """
    config = config or ServerConfig()
    factory = pipeline if callable(pipeline) else (lambda: pipeline)  # a Pipeline is not callable
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    json_provider = DefaultJSONProvider(app)
    json_provider.sort_keys = False
    json_provider.ensure_ascii = False
    app.json = json_provider

    # The gauges read the loop lazily (at scrape time), so the metrics can exist before the loop.
    metrics = ServerMetrics(lambda: loop.snapshot, lambda: loop.num_in_flight)
    loop = make_loop(
        factory,
        max_in_flight=config.max_queue,
        on_finish=metrics.record_finished,
        on_cancel=metrics.cancelled_requests.inc,
    )
    access = AccessPolicy(config.allowed_hosts, config.allowed_origins)
    app.extensions[EXTENSION_KEY] = ServerState(config=config, loop=loop, metrics=metrics, access=access)

    register_error_handlers(app)
    app.before_request(_check_access)  # before authentication: a preflight carries no key
    app.before_request(_authenticate)
    app.after_request(_count_request)
    app.after_request(_allow_listed_origin)
    app.register_blueprint(openai_api)
    app.register_blueprint(ollama_api)
    app.register_blueprint(operations)
    app.register_blueprint(chat_page)
    app.wsgi_app = AccessLog(app.wsgi_app)  # type: ignore[method-assign]  # as Flask documents middleware
    if start:
        loop.start()
    return app


def authentication_error(path: str, authorization: str, api_key: str | None) -> APIError | None:
    """The 401 a request to ``path`` with this Authorization header gets, or None if it may pass."""
    if api_key is None or path in UNAUTHENTICATED_PATHS or is_public(path):
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return APIError(401, "missing API key: send 'Authorization: Bearer KEY'", code="missing_api_key")
    if not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        return APIError(401, "invalid API key", code="invalid_api_key")
    return None


def unauthenticated_request(config: ServerConfig) -> Callable[[str, Mapping[str, str]], bool] | None:
    """For the listener (``reject_early``): does a request with these headers get a 401? Such a
    request is answered as soon as its headers are in, so a client without the key cannot hold a
    connection by sending its body slowly. None without an API key."""
    api_key = config.api_key
    if api_key is None:
        return None

    def refused(path: str, headers: Mapping[str, str]) -> bool:
        # waitress keeps header names upper-cased with "_" for "-".
        return authentication_error(path, headers.get("AUTHORIZATION", ""), api_key) is not None

    return refused


def _check_access() -> Response | None:
    """403 for a foreign Host or Origin; a listed origin's CORS preflight is answered here."""
    access = server_state().access
    host, origin = request.headers.get("Host"), request.headers.get("Origin")
    error = access.refusal(host, origin)
    if error is not None:
        return error_response(error)
    if (
        origin is not None
        and request.method == "OPTIONS"
        and "Access-Control-Request-Method" in request.headers
    ):
        response = Response(status=204)
        if not access.is_same_origin(origin, host):
            requested = request.headers.get("Access-Control-Request-Headers")
            response.headers.update(cors_headers(origin, requested, preflight=True))
        return response
    return None


def _allow_listed_origin(response: Response) -> Response:
    """Lets a page of a listed origin read the answer (a same-origin page needs no header)."""
    origin = request.headers.get("Origin")
    access = server_state().access
    if (
        origin is not None
        and response.status_code != 403
        and "Access-Control-Allow-Origin" not in response.headers
    ):
        if access.origin_listed(origin) and not access.is_same_origin(origin, request.headers.get("Host")):
            response.headers.update(cors_headers(origin, None, preflight=False))
    return response


def _authenticate() -> Response | None:
    error = authentication_error(
        request.path, request.headers.get("Authorization", ""), server_state().config.api_key
    )
    return None if error is None else error_response(error)


def _count_request(response: Response) -> Response:
    endpoint = request.url_rule.rule if request.url_rule is not None else "unmatched"
    server_state().metrics.http_requests.labels(endpoint, str(response.status_code)).inc()
    return response
