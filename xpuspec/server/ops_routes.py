"""Operations endpoints: /health, /metrics, /openapi.json and the admin view /v1/xpuspec/state."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from prometheus_client import CONTENT_TYPE_LATEST

from xpuspec.server.openapi import openapi_document
from xpuspec.server.state import server_state

operations = Blueprint("operations", __name__)


@operations.get("/health")
def health() -> tuple[Response, int]:
    """ok only while the engine loop is stepping; served on waitress's lane threads (http_server.py)."""
    loop = server_state().loop
    if loop.load_error is not None:
        return jsonify({"status": "failed"}), 503
    if not loop.ready.is_set():
        return jsonify({"status": "loading"}), 503
    if loop.draining:
        return jsonify({"status": "draining"}), 503
    if not loop.stepping:
        return jsonify({"status": "stalled"}), 503
    return jsonify({"status": "ok"}), 200


@operations.get("/metrics")
def metrics() -> Response:
    return Response(server_state().metrics.render(), content_type=CONTENT_TYPE_LATEST)


@operations.get("/openapi.json")
def openapi() -> Response:
    state = server_state()
    return jsonify(
        openapi_document(state.config.served_model_name, with_auth=state.config.api_key is not None)
    )


@operations.get("/v1/xpuspec/state")
def engine_state() -> Response:
    state = server_state()
    loop = state.loop
    snapshot = loop.snapshot
    return jsonify(
        {
            "ready": loop.ready.is_set() and loop.load_error is None,
            "draining": loop.draining,
            "kv_blocks_used": snapshot.kv_blocks_used,
            "kv_blocks_total": snapshot.kv_blocks_total,
            "num_running": snapshot.num_running,
            "num_waiting": snapshot.num_waiting,
            "num_in_flight": loop.num_in_flight,
            "engine_failures": snapshot.engine_failures,
            "requests_failed": snapshot.requests_failed,
        }
    )
