"""A real `xpuspec serve` in a subprocess on a free loopback port, and a streaming client for it."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

import xpuspec

logger = logging.getLogger(__name__)

# The package's parent: the child imports this same xpuspec even when it is not pip-installed.
SOURCE_ROOT = Path(xpuspec.__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``with ServerProcess(...) as server:`` starts the server, waits for /health, stops it on exit."""

    def __init__(
        self,
        bundle: Path | None,
        log_path: Path,
        drafter: str = "auto",
        properties: dict[str, Any] | None = None,
        startup_timeout_s: float = 300.0,
        prefix_caching: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.command = [sys.executable, "-m", "xpuspec.cli", "serve", "--port", str(self.port)]
        self.command += ["--host", "127.0.0.1", "--drafter", drafter]
        # Off unless asked: the peers run with prefix caching off and the load prompts repeat, so a
        # cache would compare unlike with like.
        if not prefix_caching:
            self.command += ["--no-prefix-caching"]
        if bundle is not None:
            self.command += ["--bundle", str(bundle)]
        for key, value in (properties or {}).items():
            self.command += ["--property", f"{key}={value}"]
        self.command += list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        self.model = ""

    def __enter__(self) -> ServerProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_ROOT), env.get("PYTHONPATH")]))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_healthy()
            self.model = httpx.get(f"{self.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: {self._log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(0.25)
        raise TimeoutError(
            f"the server was not healthy within {self.startup_timeout_s:.0f} s: {self._log_tail()}"
        )

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(
                self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            )
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM (the server drains), then SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def metrics(self) -> dict[str, float]:
        """The /metrics samples, keyed by name with labels (``name{label="v"}``)."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    samples[name] = float(value)
                except ValueError:
                    continue
        return samples


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON events of an OpenAI-style server-sent event stream (``data: {...}`` lines up to
    ``data: [DONE]``); ``RuntimeError`` for a response that is not a 200, or an error event."""
    if response.status_code != 200:
        response.read()
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: ") :])
        if "error" in event:
            error = event["error"]
            raise RuntimeError(str(error.get("message") if isinstance(error, dict) else error))
        yield event


@dataclass
class StreamedCompletion:
    output_tokens: int
    seconds: float
    ttft_s: float | None
    tpot_s: float | None
    error: str | None = None
    cached_prompt_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens


def stream_completion(
    client: httpx.Client, server: ServerProcess, body: dict[str, Any]
) -> StreamedCompletion:
    """POST one streaming /v1/completions; time the first and last text chunk, count usage tokens."""
    payload = {**body, "model": server.model, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = last = None
    tokens = cached = 0
    try:
        with client.stream(
            "POST", f"{server.base_url}/v1/completions", json=payload, timeout=600
        ) as response:
            if response.status_code != 200:
                response.read()
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
            # Raw bytes split at the SSE event boundary: the client shares the machine with the
            # server, so it parses each event once and skips httpx's text and line decoders.
            pending = b""
            for data in response.iter_raw():
                pending += data
                *complete, pending = pending.split(b"\n\n")
                for raw in complete:
                    if not raw.startswith(b"data: ") or raw == b"data: [DONE]":
                        continue
                    event = json.loads(raw[len(b"data: ") :])
                    if any(choice.get("text") for choice in event.get("choices", ())):
                        last = time.perf_counter()
                        first = first or last
                    if event.get("usage"):
                        tokens = int(event["usage"]["completion_tokens"])
                        details = event["usage"].get("prompt_tokens_details") or {}
                        cached = int(details.get("cached_tokens") or 0)
    except (httpx.HTTPError, RuntimeError, json.JSONDecodeError) as error:
        return StreamedCompletion(0, time.perf_counter() - started, None, None, str(error))
    tpot = (last - first) / (tokens - 1) if first is not None and last is not None and tokens > 1 else None
    ttft = first - started if first else None
    return StreamedCompletion(tokens, time.perf_counter() - started, ttft, tpot, cached_prompt_tokens=cached)
