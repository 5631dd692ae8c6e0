"""Clients that send complete headers and then drip the body cannot hold the connection limit: the
server closes them (body timeout, minimum body rate), /health and real requests get through, and a
request without the API key is refused as soon as its headers are in, before its body."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import LiveServer, start_server, stop_server
from xpuspec.server.http_server import ListenerLimits

API_KEY = "slow-bodies-key"
CONNECTION_LIMIT = 4
BODY_TIMEOUT_S = 3.0
MIN_BODY_RATE = 64  # bytes per second
# Each kind of dripper, more of them together than the connection limit.
NUM_TRICKLES = 3  # 4 bytes per second: below the minimum rate
NUM_STEADY = 3  # 256 bytes per second, for longer than the body timeout
# How long a dripper keeps sending unless the server closes it: longer than every bound below, so
# a server that never closes them fails the test rather than waiting it out.
DRIP_S = 40.0
# /health and a normal request must get through within this: the body timeout (the drippers beyond
# the connection limit are accepted, and timed, only once the first ones are closed) twice, plus room.
ANSWER_BOUND_S = 2 * BODY_TIMEOUT_S + 8.0


@pytest.fixture(scope="module")
def guarded_server(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(
        pair_bundle, tmp_path_factory.mktemp("slow-bodies") / "server.log",
        "--api-key", API_KEY, "--connection-limit", str(CONNECTION_LIMIT),
        "--body-timeout", str(BODY_TIMEOUT_S), "--min-body-rate", str(MIN_BODY_RATE),
    )  # fmt: skip
    yield server
    stop_server(server)


def _head(authorization: str | None, content_length: int) -> bytes:
    auth = f"Authorization: {authorization}\r\n" if authorization else ""
    return (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{auth}Content-Length: {content_length}\r\n\r\n"
    ).encode()


class Dripper(threading.Thread):
    """Complete headers, then ``chunk`` bytes of body every ``interval`` s, until the server closes the
    connection or ``DRIP_S`` passed; ``closed_by_server`` says which."""

    def __init__(self, port: int, chunk: int, interval: float, content_length: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(_head(f"Bearer {API_KEY}", content_length))
        self.chunk, self.interval = chunk, interval
        self.closed_by_server = False
        self.response = b""

    def run(self) -> None:
        deadline = time.monotonic() + DRIP_S
        try:
            while time.monotonic() < deadline:
                self.sock.sendall(b" " * self.chunk)
                self.sock.settimeout(self.interval)
                try:
                    data = self.sock.recv(65536)
                except TimeoutError:
                    continue
                self.response += data
                if not data:
                    self.closed_by_server = True
                    return
        except (BrokenPipeError, ConnectionResetError):
            self.closed_by_server = True
        finally:
            self.sock.close()


def test_dripped_bodies_are_closed_and_others_get_through(guarded_server: LiveServer) -> None:
    port = guarded_server.port
    drippers = [Dripper(port, 1, 0.25, 1000) for _ in range(NUM_TRICKLES)]
    drippers += [Dripper(port, 64, 0.25, 1 << 20) for _ in range(NUM_STEADY)]
    assert len(drippers) > CONNECTION_LIMIT
    for dripper in drippers:
        dripper.start()
    try:
        # Sent while every connection slot is held by a dripper: answered once the server closed some.
        health = httpx.get(f"{guarded_server.base_url}/health", timeout=ANSWER_BOUND_S)
        assert health.status_code == 200
        client = openai.OpenAI(
            base_url=f"{guarded_server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=ANSWER_BOUND_S
        )
        reply = client.completions.create(model=guarded_server.model, prompt="hi", max_tokens=4)
        assert reply.choices[0].finish_reason in ("stop", "length")
    finally:
        for dripper in drippers:
            dripper.join(DRIP_S + 5)
    assert all(d.closed_by_server for d in drippers), [d.closed_by_server for d in drippers]
    # Closed, not answered: none of the dripped requests reached the app.
    assert not any(d.response for d in drippers), [d.response[:80] for d in drippers]


@pytest.mark.parametrize(
    ("authorization", "code"), [(None, "missing_api_key"), ("Bearer wrong", "invalid_api_key")]
)
def test_a_request_without_the_key_is_refused_before_its_body(
    guarded_server: LiveServer, authorization: str | None, code: str
) -> None:
    with socket.create_connection(("127.0.0.1", guarded_server.port), timeout=BODY_TIMEOUT_S / 2) as sock:
        sock.sendall(_head(authorization, 4000) + b'{"model": ')  # the rest of the body never comes
        response = b""
        while data := sock.recv(65536):  # until the server closes: it does right after the 401
            response += data
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401"), response[:200]
    assert json.loads(body)["error"]["code"] == code


def test_the_key_still_admits_requests(guarded_server: LiveServer) -> None:
    url = f"{guarded_server.base_url}/v1/models"
    assert httpx.get(url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30).status_code == 200
    assert httpx.get(url, timeout=30).status_code == 401


@pytest.mark.parametrize(
    ("name", "value"),
    [("body_timeout_s", 0), ("body_timeout_s", -1.0), ("body_timeout_s", True), ("min_body_rate", -1),
     ("min_body_rate", 1.5)],
)  # fmt: skip
def test_bad_body_limits_are_refused_by_name(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=name):
        ListenerLimits(**{name: value})  # type: ignore[arg-type]
