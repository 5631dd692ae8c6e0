"""SIGTERM drains: the request in flight completes, then the process exits 0."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer, start_server, stop_server, wait_until


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM is a POSIX signal")
def test_sigterm_finishes_the_running_stream_then_exits_zero(pair_bundle: Path, tmp_path: Path) -> None:
    server = start_server(pair_bundle, tmp_path / "server.log")
    try:
        body = {
            "model": server.model, "prompt": "drain me", "max_tokens": 300, "temperature": 0,
            "stream": True, "ignore_eos": True, "drafter": "none",
        }  # fmt: skip
        texts: list[str] = []
        reasons: list[str] = []
        frames = 0
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=120) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            for line in lines:
                if not line.startswith("data: "):
                    continue
                frames += 1
                if frames == 1:
                    server.process.send_signal(signal.SIGTERM)
                    assert wait_until(lambda: health(server) != 200, 10)
                payload = line[len("data: ") :]
                if payload == "[DONE]":
                    break
                choice = json.loads(payload)["choices"][0]
                texts.append(choice["text"])
                if choice["finish_reason"]:
                    reasons.append(choice["finish_reason"])
        assert reasons == ["length"]
        assert server.process.wait(60) == 0, server.log()[-3000:]
    finally:
        stop_server(server)


def health(server: LiveServer) -> int:
    """/health's status; 0 once the listener is closed (the drain can end before we look)."""
    try:
        response = httpx.get(f"{server.base_url}/health", timeout=5)
    except httpx.TransportError:
        return 0
    if response.status_code == 503:
        assert response.json()["status"] == "draining"
    return response.status_code
