"""Host and Origin checks against the real server process: a web page cannot drive it (DNS rebinding,
cross-site simple requests), while the chat page's same-origin calls and API clients without an
Origin (curl, the official openai and ollama clients) still work."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from tests.server.conftest import LiveServer, start_server, stop_server
from xpuspec.server.origins import AccessPolicy, split_host

FOREIGN_ORIGIN = "http://evil.example"
LISTED_ORIGIN = "http://localhost:3000"


def completion_body(model: str) -> bytes:
    return json.dumps({"model": model, "prompt": "hi", "max_tokens": 2, "temperature": 0}).encode()


def assert_refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert "\n" not in error["message"] and error["message"]


@pytest.fixture(scope="module")
def listing_server(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server that lists one more Host name and two origins (one a port wildcard)."""
    server = start_server(
        pair_bundle,
        tmp_path_factory.mktemp("listing") / "server.log",
        "--allowed-hosts",
        "llm.lan",
        "--allowed-origins",
        "http://localhost:*,https://app.example",
    )
    yield server
    stop_server(server)


def test_a_foreign_host_is_refused_with_403(live_server: LiveServer) -> None:
    url = f"{live_server.base_url}/v1/completions"
    body = completion_body(live_server.model)
    headers = {"Content-Type": "application/json"}
    for host in ("rebound.example", f"rebound.example:{live_server.port}", "localhost.evil.example"):
        response = httpx.post(url, content=body, headers={**headers, "Host": host}, timeout=30)
        assert_refused(response, 403, "host_not_allowed")
    models = httpx.get(f"{live_server.base_url}/v1/models", headers={"Host": "rebound.example"}, timeout=10)
    assert_refused(models, 403, "host_not_allowed")


def test_loopback_names_and_ip_addresses_are_answered(live_server: LiveServer) -> None:
    for host in ("localhost", f"localhost:{live_server.port}", "127.0.0.1", "[::1]:8000", "app.localhost"):
        response = httpx.get(f"{live_server.base_url}/v1/models", headers={"Host": host}, timeout=10)
        assert response.status_code == 200, (host, response.text)


def test_a_cross_origin_text_plain_post_is_refused_with_403(live_server: LiveServer) -> None:
    # What a page on another site can send without a CORS preflight.
    response = httpx.post(
        f"{live_server.base_url}/v1/completions",
        content=completion_body(live_server.model),
        headers={"Content-Type": "text/plain", "Origin": FOREIGN_ORIGIN},
        timeout=30,
    )
    assert_refused(response, 403, "origin_not_allowed")
    assert "access-control-allow-origin" not in response.headers
    form = httpx.post(
        f"{live_server.base_url}/api/generate",
        content=b'{"model": "m", "prompt": "hi"}',
        headers={"Content-Type": "application/x-www-form-urlencoded", "Origin": FOREIGN_ORIGIN},
        timeout=30,
    )
    assert form.status_code == 403 and "origin" in form.json()["error"]


def test_a_cross_origin_preflight_is_refused(live_server: LiveServer) -> None:
    response = httpx.options(
        f"{live_server.base_url}/v1/chat/completions",
        headers={"Origin": FOREIGN_ORIGIN, "Access-Control-Request-Method": "POST"},
        timeout=10,
    )
    assert response.status_code == 403
    assert "access-control-allow-origin" not in response.headers


def test_a_same_origin_post_as_the_chat_page_sends_it_works(live_server: LiveServer) -> None:
    for origin in (live_server.base_url, f"http://localhost:{live_server.port}"):
        host = origin.removeprefix("http://")
        response = httpx.post(
            f"{live_server.base_url}/v1/completions",
            content=completion_body(live_server.model),
            headers={"Content-Type": "application/json", "Origin": origin, "Host": host},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert "access-control-allow-origin" not in response.headers  # same origin: no CORS needed


def test_a_json_route_without_a_json_body_type_is_415(live_server: LiveServer) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        response = httpx.post(
            f"{live_server.base_url}/v1/chat/completions",
            content=b'{"model": "m", "messages": []}',
            headers=headers,
            timeout=30,
        )
        assert_refused(response, 415, "unsupported_media_type")
    charset = httpx.post(
        f"{live_server.base_url}/v1/completions",
        content=completion_body(live_server.model),
        headers={"Content-Type": "application/json; charset=utf-8"},
        timeout=60,
    )
    assert charset.status_code == 200, charset.text


def test_ollama_routes_take_a_bare_curl_post_but_not_text_plain(live_server: LiveServer) -> None:
    # `curl -d` (Ollama's documented usage) sends the form type, with no Origin.
    body = json.dumps({"model": live_server.model, "prompt": "hi", "stream": False,
                       "options": {"num_predict": 2, "temperature": 0}}).encode()  # fmt: skip
    url = f"{live_server.base_url}/api/generate"
    curl = httpx.post(
        url, content=body, headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=60
    )
    assert curl.status_code == 200, curl.text
    plain = httpx.post(url, content=body, headers={"Content-Type": "text/plain"}, timeout=30)
    assert plain.status_code == 415 and "Content-Type" in plain.json()["error"]


def test_the_official_clients_still_work(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    completion = openai_client.completions.create(
        model=live_server.model, prompt="hi", max_tokens=2, temperature=0
    )
    assert completion.choices[0].text is not None
    ollama_client = ollama.Client(host=live_server.base_url, timeout=60)
    reply = ollama_client.generate(model=live_server.model, prompt="hi", options={"num_predict": 2})
    assert reply.done is True
    assert [model.model for model in ollama_client.list().models] == [f"{live_server.model}:latest"]


def test_listed_hosts_and_origins_are_answered_with_cors(listing_server: LiveServer) -> None:
    url = f"{listing_server.base_url}/v1/completions"
    body = completion_body(listing_server.model)
    listed = httpx.post(
        url, content=body, headers={"Content-Type": "application/json", "Host": "LLM.lan:8000"}, timeout=60
    )
    assert listed.status_code == 200, listed.text
    for origin in (LISTED_ORIGIN, "https://app.example"):
        preflight = httpx.options(
            url,
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,authorization",
            },
            timeout=10,
        )
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == origin
        assert preflight.headers["access-control-allow-headers"] == "content-type,authorization"
        answer = httpx.post(
            url, content=body, headers={"Content-Type": "application/json", "Origin": origin}, timeout=60
        )
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == origin
    other = httpx.post(
        url,
        content=body,
        headers={"Content-Type": "application/json", "Origin": "http://app.example"},
        timeout=30,
    )
    assert_refused(other, 403, "origin_not_allowed")  # https was listed, not http


@pytest.mark.parametrize(
    ("host", "expected"),
    [("LocalHost:80", ("localhost", 80)), ("[::1]:8000", ("::1", 8000)), ("::1", ("::1", None)),
     ("example.com.", ("example.com", None)), ("10.0.0.2:x", ("10.0.0.2", None))],
)  # fmt: skip
def test_split_host(host: str, expected: tuple[str, int | None]) -> None:
    assert split_host(host) == expected


def test_the_policy_without_lists() -> None:
    policy = AccessPolicy()
    assert policy.host_allowed(None) and policy.host_allowed("192.168.1.5:8000")
    assert not policy.host_allowed("my-laptop") and not policy.host_allowed("127.0.0.1.nip.io")
    assert policy.is_same_origin("http://localhost", "localhost:80")
    assert not policy.is_same_origin("https://localhost", "localhost:80")
    assert not policy.is_same_origin("null", "localhost")
    assert policy.refusal("localhost", "null") is not None
    assert AccessPolicy(allowed_hosts=("*",)).host_allowed("anything.example")
    assert AccessPolicy(allowed_origins=("*",)).refusal("localhost", "null") is None
