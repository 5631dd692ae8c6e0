"""What the routes of one app share: configuration, the engine loop, metrics, open responses."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from flask import Flask, current_app

from xpuspec.api.engine_loop import EngineLoop
from xpuspec.server.config import ServerConfig
from xpuspec.server.metrics import ServerMetrics
from xpuspec.server.origins import AccessPolicy

EXTENSION_KEY = "xpuspec"


@dataclass
class ServerState:
    config: ServerConfig
    loop: EngineLoop
    metrics: ServerMetrics
    access: AccessPolicy = field(default_factory=AccessPolicy)
    started: int = field(default_factory=lambda: int(time.time()))
    _open_responses: int = 0
    _open_streams: int = 0
    _lock: threading.Condition = field(default_factory=threading.Condition)

    # Responses whose body is still being produced: a drain waits for them, not only for the engine.
    # Streamed ones are counted apart: how many are open sets how often each one sends a frame.
    def response_opened(self, streamed: bool = False) -> None:
        with self._lock:
            self._open_responses += 1
            self._open_streams += streamed

    def response_closed(self, streamed: bool = False) -> None:
        with self._lock:
            self._open_responses -= 1
            self._open_streams -= streamed
            self._lock.notify_all()

    def stream_interval(self) -> float:
        """The least time between two text frames of a stream now (``ServerConfig.stream_interval_for``)."""
        return self.config.stream_interval_for(self._open_streams)

    @property
    def open_responses(self) -> int:
        return self._open_responses

    def wait_responses_closed(self, timeout: float | None) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self._open_responses == 0, timeout)


def server_state(app: Flask | None = None) -> ServerState:
    state: ServerState = (app or current_app).extensions[EXTENSION_KEY]
    return state
