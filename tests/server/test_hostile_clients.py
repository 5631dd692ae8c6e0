"""Hostile clients cannot lock out real ones: 120 connections that never finish their headers plus 32
streams; /health answers within 100 ms throughout, every stream completes, and the server closes the
half-open connections itself (header timeout)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from tests.server.conftest import LiveServer, wait_until

NUM_HALF_OPEN = 120
NUM_STREAMS = 32
MAX_TOKENS = 160
HEALTH_BOUND_S = 0.1  # the behaviour bound of issue 10: /health within 100 ms under full load
HEALTH_INTERVAL_S = 0.02


def http_request(port: int, head: bytes, body: bytes = b"", timeout: float = 120) -> bytes:
    """Send one request on a fresh connection (Connection: close) and read the whole response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + body)
        received = []
        while data := sock.recv(65536):
            received.append(data)
    return b"".join(received)


def stream_completion(port: int, model: str, index: int) -> bytes:
    body = json.dumps(
        {"model": model, "prompt": f"stream {index}", "max_tokens": MAX_TOKENS, "temperature": 0,
         "ignore_eos": True, "stream": True}
    ).encode()  # fmt: skip
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    return http_request(port, head, body)


# The /health poller runs in a process of its own: the 32 client threads of this process would
# otherwise compete with it for the GIL and add their own delays to what it measures.
POLLER = r"""
import json, select, socket, sys, time
port, interval = int(sys.argv[1]), float(sys.argv[2])
latencies, statuses = [], []
while not select.select([sys.stdin], [], [], interval)[0]:
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        response = b""
        while data := sock.recv(65536):
            response += data
    latencies.append(time.perf_counter() - started)
    statuses.append(response.split(b"\r\n", 1)[0].decode())
print(json.dumps({"latencies": latencies, "statuses": statuses}))
"""


def half_open(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 40\r\n"
    )  # no blank line
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def hostile_round(server: LiveServer) -> list[float]:
    """One round: half-open connections, then 32 streams, /health polled from another process until
    the streams completed and the server dropped every half-open connection; the poll latencies."""
    port = server.port
    poller = subprocess.Popen(
        [sys.executable, "-c", POLLER, str(port), str(HEALTH_INTERVAL_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    hostile = [half_open(port) for _ in range(NUM_HALF_OPEN)]
    opened = time.monotonic()
    try:
        with ThreadPoolExecutor(NUM_STREAMS) as pool:
            streams = [pool.submit(stream_completion, port, server.model, i) for i in range(NUM_STREAMS)]
            # The server must drop the half-open connections itself (its header timeout).
            assert wait_until(
                lambda: all(f.done() for f in streams) and all(closed_by_server(s) for s in hostile), 120
            ), "half-open connections still open, or streams still running, after 120 s"
            waited = time.monotonic() - opened
            responses = [future.result() for future in streams]
    finally:
        for sock in hostile:
            sock.close()
        measured, _ = poller.communicate("stop\n", timeout=60)
    for response in responses:
        assert response.startswith(b"HTTP/1.1 200"), response[:300]
        frames = [line[6:] for line in response.split(b"\n") if line.startswith(b"data: ")]
        assert frames[-1] == b"[DONE]"
        reasons = [json.loads(f)["choices"][0]["finish_reason"] for f in frames[:-1]]
        assert [r for r in reasons if r] == ["length"]
    polls = json.loads(measured)
    latencies: list[float] = polls["latencies"]
    assert set(polls["statuses"]) == {"HTTP/1.1 200 OK"}, set(polls["statuses"])
    assert len(latencies) >= 20
    print(
        f"/health: {len(latencies)} polls, max {max(latencies) * 1000:.1f} ms, "
        f"median {sorted(latencies)[len(latencies) // 2] * 1000:.1f} ms; "
        f"streams done and half-open connections dropped after {waited:.1f} s"
    )
    return latencies


def test_half_open_connections_and_32_streams_never_delay_health(live_server: LiveServer) -> None:
    latencies = hostile_round(live_server)
    if max(latencies) >= HEALTH_BOUND_S:
        # One more round: on this shared 2-core machine the OS (or a garbage collection) can stall
        # a whole process once in a while. A server that starves /health fails every round.
        latencies = hostile_round(live_server)
    assert max(latencies) < HEALTH_BOUND_S, sorted(latencies)[-5:]
    assert wait_until(lambda: live_server.state()["num_in_flight"] == 0, 30)
