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

    def failing_step(interrupt=None):  # type: ignore[no-untyped-def]
        calls["count"] += 1
        if calls["count"] == 3:
            raise RuntimeError("injected fault")
        return real_step(interrupt=interrupt)

    failures_before = client.get("/v1/xpuspec/state").get_json()
    engine.step = failing_step
    try:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 60, "ignore_eos": True, "stream": True}
        payloads = sse_payloads(client.post("/v1/completions", json=body).get_data(as_text=True))
    finally:
        del engine.step  # back to the class's method
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    # A generic message naming the client's own request; the fault's detail is in the server log only.
    assert error["message"].startswith("engine failure, request id ") and error["type"] == "server_error"
    assert "injected fault" not in error["message"]
    # The engine recovers by ending each request in the failed step with finish_reason "error".
    assert [json.loads(p)["choices"][0]["finish_reason"] for p in payloads[:-2] if json.loads(p)["choices"]][
        -1
    ] == "error"
    state = client.get("/v1/xpuspec/state").get_json()
    assert state["num_in_flight"] == 0 and state["kv_blocks_used"] == 0
    assert state["engine_failures"] == failures_before["engine_failures"] + 1
    assert state["requests_failed"] == failures_before["requests_failed"] + 1
    samples = metric_samples(client)
    assert samples["xpuspec_engine_failures_total"] == state["engine_failures"]
    assert samples["xpuspec_requests_failed_total"] == state["requests_failed"]
    assert client.get("/health").status_code == 200
    assert (
        client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 2}).status_code
        == 200
    )


def metric_samples(client: FlaskClient) -> dict[str, float]:
    text = client.get("/metrics").get_data(as_text=True)
    return {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


# A prompt the injected fault below refuses: the request that carries it fails alone.
POISON = [7, 7, 7, 7, 7, 7]


@pytest.fixture
def poisoned_admission(served_app: Flask):  # type: ignore[no-untyped-def]
    """Engine admission raises (as a bad parameter or a broken tokenizer would) for the POISON prompt."""
    engine = server_state(served_app).loop.pipeline.engine  # type: ignore[union-attr]
    real_add = engine.add_request

    def add_request(request_id, prompt_token_ids, params, **options):  # type: ignore[no-untyped-def]
        if list(prompt_token_ids) == POISON:
            raise ValueError("injected fault for this request")
        return real_add(request_id, prompt_token_ids, params, **options)

    engine.add_request = add_request
    yield
    del engine.add_request  # back to the class's method


def test_a_request_that_fails_alone_ends_with_error_and_the_others_are_untouched(
    client: FlaskClient, served_app: Flask, poisoned_admission: None
) -> None:
    body = {"model": MODEL, "prompt": "a b c", "max_tokens": 40, "ignore_eos": True, "temperature": 0}
    clean = client.post("/v1/completions", json=body).get_json()["choices"][0]["text"]
    before = metric_samples(client)
    neighbour = client.post("/v1/completions", json={**body, "stream": True})  # running meanwhile
    failed_stream = client.post("/v1/completions", json={**body, "prompt": POISON, "stream": True})
    payloads = sse_payloads(failed_stream.get_data(as_text=True))
    failed_whole = client.post("/v1/completions", json={**body, "prompt": POISON})
    neighbour_payloads = sse_payloads(neighbour.get_data(as_text=True))

    # The failing stream: its choice closes with finish_reason "error", then the error frame, then [DONE].
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["code"] == "request_failed" and "injected fault" in error["message"]
    assert json.loads(payloads[-3])["choices"][0]["finish_reason"] == "error"
    # Non-streaming: a clear 500 in the OpenAI shape.
    assert failed_whole.status_code == 500
    assert failed_whole.get_json()["error"]["code"] == "request_failed"
    # The neighbour streamed on to its normal end, token-identical to a clean run.
    chunks = [json.loads(p)["choices"][0] for p in neighbour_payloads[:-1]]
    assert "".join(chunk["text"] for chunk in chunks) == clean
    assert [chunk["finish_reason"] for chunk in chunks if chunk["finish_reason"]] == ["length"]
    after = metric_samples(client)
    assert after["xpuspec_requests_failed_total"] == before["xpuspec_requests_failed_total"] + 2
    assert after["xpuspec_engine_failures_total"] == before["xpuspec_engine_failures_total"]
    state = client.get("/v1/xpuspec/state").get_json()
    assert state["num_in_flight"] == 0 and state["kv_blocks_used"] == 0
    assert client.get("/health").get_json() == {"status": "ok"}


def test_an_unexpected_admission_error_fails_its_request_and_the_loop_serves_on(
    client: FlaskClient, served_app: Flask
) -> None:
    """Not the engine's refusal (ValueError) but a bug: it must not end the loop every request needs."""
    engine = server_state(served_app).loop.pipeline.engine  # type: ignore[union-attr]

    def add_request(*args, **options):  # type: ignore[no-untyped-def]
        raise TypeError("a bug in admission")

    body = {"model": MODEL, "prompt": "a b c", "max_tokens": 8, "temperature": 0}
    engine.add_request = add_request
    try:
        failed = client.post("/v1/completions", json=body)
    finally:
        del engine.add_request  # back to the class's method
    assert failed.status_code == 500
    assert "a bug in admission" in failed.get_json()["error"]["message"]
    served = client.post("/v1/completions", json=body)
    assert served.status_code == 200 and served.get_json()["choices"][0]["finish_reason"] == "length"


def test_health_says_stalled_while_the_engine_does_not_step(client: FlaskClient, served_app: Flask) -> None:
    loop = server_state(served_app).loop
    engine = loop.pipeline.engine  # type: ignore[union-attr]
    real_step = engine.step
    release = threading.Event()

    def hung_step(interrupt=None):  # type: ignore[no-untyped-def]
        release.wait(30)  # a device call that does not return
        return real_step(interrupt=interrupt)

    saved, loop.stall_after_s = loop.stall_after_s, 0.5
    engine.step = hung_step
    # The request runs in a thread of its own: the test client reads a streamed body's first frame
    # before it returns, and that frame waits for the hung step.
    bodies: list[str] = []
    body = {"model": MODEL, "prompt": "a", "max_tokens": 4, "stream": True}
    poster = threading.Thread(
        target=lambda: bodies.append(
            served_app.test_client().post("/v1/completions", json=body).get_data(as_text=True)
        )
    )
    try:
        poster.start()
        assert wait_until(lambda: client.get("/health").status_code == 503, 10)
        assert client.get("/health").get_json() == {"status": "stalled"}
        release.set()
        assert wait_until(lambda: client.get("/health").status_code == 200, 10)
        poster.join(30)
        assert not poster.is_alive() and sse_payloads(bodies[0])[-1] == "[DONE]"
    finally:
        release.set()
        poster.join(30)
        del engine.step
        loop.stall_after_s = saved


def test_metrics_count_tokens_requests_and_speculation(client: FlaskClient) -> None:
    body = {"model": MODEL, "prompt": "a b c", "max_tokens": 12, "ignore_eos": True, "temperature": 0}
    body["num_draft_tokens"] = 4  # the cost model might otherwise choose not to draft
    assert client.post("/v1/completions", json=body).status_code == 200
    samples = metric_samples(client)
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
