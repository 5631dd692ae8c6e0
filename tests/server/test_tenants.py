"""Each request's tenant comes from its bearer key and reaches the engine's cross-request lookup."""

from __future__ import annotations

from flask import Flask

from xpuspec.server import server_state
from xpuspec.server.openai_routes import tenant_of
from xpuspec.spec_decode.suffix_index import SharedSuffixIndex


def test_the_tenant_is_a_digest_of_the_bearer_key() -> None:
    assert tenant_of("") is None and tenant_of("Basic abc") is None and tenant_of("Bearer ") is None
    assert tenant_of("Bearer key-a") == tenant_of("bearer  key-a ") != tenant_of("Bearer key-b")
    assert "key-a" not in tenant_of("Bearer key-a")  # the key itself is kept nowhere


def test_requests_are_indexed_under_their_keys_tenant(served_app: Flask) -> None:
    engine = server_state(served_app).loop.pipeline.engine
    lookup = engine.prompt_lookup
    previous, lookup.shared = lookup.shared, SharedSuffixIndex(4096)
    try:
        client = served_app.test_client()
        body = {"model": "m", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0.0}
        body["model"] = client.get("/v1/models").get_json()["data"][0]["id"]
        for headers in ({"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}, {}):
            response = client.post("/v1/completions", json=body, headers=headers)
            assert response.status_code == 200, response.get_json()
        # The engine retires a request before its last event reaches the response.
        assert lookup.shared.tenants() == [tenant_of("Bearer key-a"), tenant_of("Bearer key-b"), None]
    finally:
        lookup.shared = previous
