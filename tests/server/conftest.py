"""Fixtures of the server tests: one in-process app (Flask test client) and one real server process,
each loaded once per session from the tiny ``pair_bundle``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import F32

REPO_ROOT = Path(__file__).resolve().parents[2]
# Small caches keep memory low; the tiny model's context is 512 tokens.
NUM_KV_BLOCKS = 256
STARTUP_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


@pytest.fixture(scope="session")
def served_app(pair_bundle: Path) -> Iterator[Flask]:
    """The app in this process over the pair bundle (F32), with a short context for cheap fuzzing."""
    from xpuspec.api.pipeline import Pipeline
    from xpuspec.engine.engine import EngineConfig
    from xpuspec.server import ServerConfig, create_app, server_state

    def load() -> Pipeline:
        return Pipeline(
            pair_bundle,
            properties=F32,
            num_kv_blocks=NUM_KV_BLOCKS,
            engine_config=EngineConfig(max_model_len=128),
        )

    app = create_app(load, ServerConfig(served_model_name=pair_bundle.name))
    loop = server_state(app).loop
    assert loop.ready.wait(STARTUP_TIMEOUT_S) and loop.load_error is None, loop.load_error
    yield app
    loop.stop()


@pytest.fixture
def client(served_app: Flask) -> FlaskClient:
    return served_app.test_client()


@dataclass
class LiveServer:
    process: subprocess.Popen
    port: int
    model: str
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def state(self) -> dict:
        return httpx.get(f"{self.base_url}/v1/xpuspec/state", timeout=10).json()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(bundle: Path, log_path: Path, *extra: str) -> LiveServer:
    """`python -m xpuspec.cli serve` on a free loopback port, returned once /health says ready."""
    port = free_port()
    properties = [arg for key, value in F32.items() for arg in ("--property", f"{key}={value}")]
    command = [
        sys.executable, "-m", "xpuspec.cli", "serve", "--bundle", str(bundle), "--port", str(port),
        "--num-kv-blocks", str(NUM_KV_BLOCKS), *properties, *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("XPUSPEC_API_KEY", None)
    log = log_path.open("wb")
    with log:  # the child writes through its own copy of the descriptor
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = LiveServer(process, port, bundle.name, log_path)

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}:\n{server.log()}")
        try:
            return httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    if not wait_until(ready, STARTUP_TIMEOUT_S, interval=0.2):
        process.kill()
        raise RuntimeError(f"the server did not become ready:\n{server.log()}")
    return server


def stop_server(server: LiveServer) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@pytest.fixture(scope="session")
def live_server(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(pair_bundle, tmp_path_factory.mktemp("server") / "server.log")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def demo_live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A real server over the demo bundle (its context fits tool prompts), shared by the modules that
    need a real tokenizer's text."""
    from xpuspec.models.demo import demo_bundle_path

    server = start_server(demo_bundle_path(), tmp_path_factory.mktemp("demo-server") / "server.log")
    yield server
    stop_server(server)


@pytest.fixture
def openai_client(live_server: LiveServer):  # type: ignore[no-untyped-def]
    import openai

    # No retries: a 5xx must fail the test, not be hidden by a retry.
    return openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
