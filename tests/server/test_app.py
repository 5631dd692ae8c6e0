"""The in-process app: authentication, loading, queue limits, mid-stream failures, metrics, OpenAPI."""

from __future__ import annotations

import json
import threading

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.server.conftest import wait_until
from xpuspec.server import ServerConfig, create_app, server_state

MODEL = "bundle"


def sse_payloads(raw: str) -> list[str]:
    return [frame[len("data: ") :] for frame in raw.split("\n\n") if frame.startswith("data: ")]


@pytest.fixture(scope="module")
def unloaded_app() -> Flask:
    """An app whose model never finishes loading: enough for authentication and /health."""
    release = threading.Event()

    def never_loads():  # type: ignore[no-untyped-def]
        release.wait(60)
        raise RuntimeError("test model")

    app = create_app(never_loads, ServerConfig(served_model_name="m", api_key="sekret"))
    yield app
    release.set()


def test_health_is_503_while_loading_and_open_without_a_key(unloaded_app: Flask) -> None:
    response = unloaded_app.test_client().get("/health")
    assert response.status_code == 503
    assert response.get_json() == {"status": "loading"}


@pytest.mark.parametrize(
    ("headers", "code"),
    [({}, "missing_api_key"), ({"Authorization": "Bearer wrong"}, "invalid_api_key"),
     ({"Authorization": "Basic sekret"}, "missing_api_key")],
)  # fmt: skip
@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/openapi.json", "/v1/xpuspec/state"])
def test_every_endpoint_but_health_needs_the_key(
    unloaded_app: Flask, headers: dict[str, str], code: str, path: str
) -> None:
    response = unloaded_app.test_client().get(path, headers=headers)
    assert response.status_code == 401
    assert response.get_json()["error"]["type"] == "authentication_error"
    assert response.get_json()["error"]["code"] == code


def test_the_right_key_passes_and_generation_waits_for_the_model(unloaded_app: Flask) -> None:
    client = unloaded_app.test_client()
    headers = {"Authorization": "Bearer sekret"}
    models = client.get("/v1/models", headers=headers)
    assert models.status_code == 200
    assert [card["id"] for card in models.get_json()["data"]] == ["m"]
    response = client.post("/v1/completions", json={"model": "m", "prompt": "x"}, headers=headers)
    assert response.status_code == 503
    assert response.headers["Retry-After"]
    assert response.get_json()["error"]["code"] == "loading"


def test_queue_full_is_503_with_retry_after(client: FlaskClient, served_app: Flask) -> None:
    loop = server_state(served_app).loop
    saved = loop.max_in_flight
    loop.max_in_flight = 1
    try:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 100, "ignore_eos": True, "stream": True}
        holding = client.post("/v1/completions", json=body)  # in flight until its stream is closed
        refused = client.post("/v1/completions", json={**body, "stream": False})
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "1"
        assert refused.get_json()["error"]["code"] == "queue_full"
        holding.close()
    finally:
        loop.max_in_flight = saved
    assert wait_until(lambda: loop.num_in_flight == 0, 30)
    assert (
        client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 2}).status_code
        == 200
    )


def test_a_mid_stream_engine_failure_is_an_error_frame_then_done(
    client: FlaskClient, served_app: Flask
) -> None:
    engine = server_state(served_app).loop.pipeline.engine  # type: ignore[union-attr]
    real_step = engine.step
    calls = {"count": 0}

    def failing_step():  # type: ignore[no-untyped-def]
        calls["count"] += 1
        if calls["count"] == 3:
            raise RuntimeError("injected fault")
        return real_step()

    engine.step = failing_step
    try:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 60, "ignore_eos": True, "stream": True}
        payloads = sse_payloads(client.post("/v1/completions", json=body).get_data(as_text=True))
    finally:
        del engine.step  # back to the class's method
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert "injected fault" in error["message"] and error["type"] == "server_error"
    assert all(
        "finish_reason" not in p or json.loads(p)["choices"][0]["finish_reason"] is None
        for p in payloads[:-2]
    )
    state = client.get("/v1/xpuspec/state").get_json()
    assert state["num_in_flight"] == 0 and state["kv_blocks_used"] == 0
    assert client.get("/health").status_code == 200
    assert (
        client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 2}).status_code
        == 200
    )


def test_metrics_count_tokens_requests_and_speculation(client: FlaskClient) -> None:
    body = {"model": MODEL, "prompt": "a b c", "max_tokens": 12, "ignore_eos": True, "temperature": 0}
    body["num_draft_tokens"] = 4  # the cost model might otherwise choose not to draft
    assert client.post("/v1/completions", json=body).status_code == 200
    text = client.get("/metrics").get_data(as_text=True)
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples["xpuspec_generation_tokens_total"] >= 12
    assert samples['xpuspec_requests_finished_total{finish_reason="length"}'] >= 1
    assert samples["xpuspec_time_to_first_token_seconds_count"] >= 1
    assert samples["xpuspec_time_per_output_token_seconds_count"] >= 1
    assert samples["xpuspec_spec_draft_tokens_total"] > 0
    assert 0.0 <= samples["xpuspec_spec_acceptance_rate"] <= 1.0
    assert samples['xpuspec_spec_draft_tokens_per_position_total{position="0"}'] > 0
    assert 'xpuspec_spec_accepted_tokens_per_position_total{position="0"}' in samples
    assert samples["xpuspec_kv_cache_blocks_total"] > 0 and samples["xpuspec_kv_cache_usage_ratio"] == 0.0
    assert 'xpuspec_http_requests_total{endpoint="/v1/completions",status="200"}' in samples
    assert "xpuspec_queue_depth" in samples


def test_openapi_describes_the_endpoints_from_the_pydantic_models(client: FlaskClient) -> None:
    document = client.get("/openapi.json").get_json()
    assert document["openapi"].startswith("3.")
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"} <= set(
        document["paths"]
    )
    request_schema = document["components"]["schemas"]["CompletionRequest"]
    assert {"model", "prompt", "max_tokens", "num_draft_tokens"} <= set(request_schema["properties"])
