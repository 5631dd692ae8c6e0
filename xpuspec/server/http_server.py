"""The waitress listener of `xpuspec serve`, with limits that idle or hostile clients cannot exhaust.

- ``connection_limit`` (default 500) open connections; beyond it waitress stops accepting until one
  closes. The event loop uses ``poll``, so the limit is not capped by ``select``'s 1024 descriptors.
- A connection that has not finished sending a request's headers within ``header_timeout_s``
  (default 5 s, counted from its first byte, or from the connection's opening for a connection that
  never sent one) is closed: half-open connections cannot pile up to the limit.
- An idle keep-alive connection is closed after ``channel_timeout_s`` (default 30 s); a request being
  answered is never timed out (a long stream keeps its connection).
- ``threads`` (default 64) worker threads; each streaming response holds one for its duration, so
  this bounds concurrent streams (more wait in waitress's queue, they are not refused).
- ``/health`` is answered by the event-loop thread itself and ``/metrics`` on threads of its own
  (``lane_threads``, default 2), so streams that hold every worker cannot delay them.
- Bodies beyond ``max_request_body_bytes`` are cut by waitress before they are buffered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, create_server
from waitress.task import ThreadedTaskDispatcher

logger = logging.getLogger(__name__)

# Paths answered on the lane threads: cheap, and needed most when the server is busiest.
LANE_PATHS = frozenset({"/health", "/metrics"})
# Answered by the event-loop thread itself (see _LaneDispatcher): the cheapest, most urgent one.
INLINE_PATHS = frozenset({"/health"})
# The event loop's poll interval: how soon it notices the stop flag and sweeps stalled connections.
POLL_S = 0.2


@dataclass
class ListenerLimits:
    threads: int = 64
    lane_threads: int = 2
    connection_limit: int = 500
    channel_timeout_s: int = 30
    header_timeout_s: float = 5.0
    max_request_body_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        for name in ("threads", "lane_threads", "connection_limit", "channel_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.header_timeout_s > 0:
            raise ValueError(f"header_timeout_s must be > 0, got {self.header_timeout_s!r}")


class _TimedChannel(HTTPChannel):
    """A channel that remembers when its current request started arriving."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request_started = time.monotonic()
        self.never_sent = True

    def received(self, data: bytes) -> bool:
        if data and (self.request is None or self.never_sent):
            self.request_started = time.monotonic()
            self.never_sent = False
        return bool(super().received(data))

    def headers_overdue(self, now: float, timeout: float) -> bool:
        if self.requests or now - self.request_started <= timeout:
            return False  # a request is being answered, or this one is still in time
        partial = self.request
        return self.never_sent or (partial is not None and not partial.headers_finished)


class _LaneDispatcher(ThreadedTaskDispatcher):
    """Waitress's worker pool, a small pool of its own for the lane paths, and /health in the event loop.

    /health is answered by the event-loop thread itself, right after it read the request: no hand-over
    to a worker thread and back, each of which waits for the GIL behind busy stream and engine threads.
    Its handler only reads a few attributes of the engine loop, so it never holds the event loop up.
    """

    def __init__(self, lane_paths: frozenset[str], inline_paths: frozenset[str]) -> None:
        super().__init__()
        self.lane = ThreadedTaskDispatcher()
        self.lane_paths = lane_paths
        self.inline_paths = inline_paths
        self._inline: list[Any] = []
        self._inline_lock = threading.Lock()
        self.loop_thread: threading.Thread | None = None  # the thread running the event loop

    def add_task(self, task: Any) -> None:
        # Called with the channel's requests lock held, so requests[0] is the one to serve.
        requests = getattr(task, "requests", None)
        path = getattr(requests[0], "path", None) if requests else None
        if path in self.inline_paths and threading.current_thread() is self.loop_thread:
            with self._inline_lock:
                self._inline.append(task)  # served by run_inline, once the requests lock is released
        elif path in self.lane_paths or path in self.inline_paths:
            self.lane.add_task(task)
        else:
            super().add_task(task)

    def run_inline(self) -> None:
        """Serve the requests queued for the event-loop thread (call it from that thread)."""
        with self._inline_lock:
            tasks, self._inline = self._inline, []
        for task in tasks:
            try:
                task.service()
            except BaseException:
                logger.exception("serving %r failed", task)

    def shutdown(self, cancel_pending: bool = True, timeout: float = 5) -> bool:
        self.lane.shutdown(cancel_pending, timeout)
        return bool(super().shutdown(cancel_pending, timeout))


class HttpListener:
    """A bound (and listening) waitress server; ``serve`` runs its event loop in the calling thread."""

    def __init__(self, app: Any, host: str, port: int, limits: ListenerLimits | None = None) -> None:
        """Bind ``host:port``; raises OSError (e.g. EADDRINUSE) before any thread is started."""
        self.limits = limits or ListenerLimits()
        self.map: dict[int, Any] = {}
        self.dispatcher = _LaneDispatcher(LANE_PATHS, INLINE_PATHS)
        self.server = create_server(
            app,
            map=self.map,
            _dispatcher=self.dispatcher,
            host=host,
            port=port,
            threads=self.limits.threads,
            connection_limit=self.limits.connection_limit,
            channel_timeout=self.limits.channel_timeout_s,
            cleanup_interval=max(1, min(30, self.limits.channel_timeout_s // 2)),
            max_request_body_size=self.limits.max_request_body_bytes,
            asyncore_use_poll=True,
            # Lets a waiting response notice that its client hung up (waitress reads ahead one request).
            channel_request_lookahead=1,
            ident="xpuspec",
        )
        for dispatcher in self.map.values():
            if isinstance(dispatcher, BaseWSGIServer):
                dispatcher.channel_class = _TimedChannel
        self.dispatcher.set_thread_count(self.limits.threads)
        self.dispatcher.lane.set_thread_count(self.limits.lane_threads)

    @property
    def port(self) -> int:
        port = getattr(self.server, "effective_port", None)
        if port is None:  # several addresses (e.g. "localhost" on IPv4 and IPv6): the first one's
            port = self.server.effective_listen[0][1]
        return int(port)

    def serve(self, stop: Callable[[], bool], tick: Callable[[], None] | None = None) -> None:
        """Answer requests until ``stop()``; ``tick`` runs in this thread about every ``POLL_S``."""
        next_sweep = 0.0
        self.dispatcher.loop_thread = threading.current_thread()
        while not stop():
            wasyncore.loop(timeout=POLL_S, map=self.map, use_poll=True, count=1)
            self.dispatcher.run_inline()
            now = time.monotonic()
            if now >= next_sweep:
                self._close_overdue(now)
                next_sweep = now + min(0.5, self.limits.header_timeout_s / 4)
            if tick is not None:
                tick()

    def _close_overdue(self, now: float) -> None:
        overdue = [
            channel
            for channel in list(self.map.values())
            if isinstance(channel, _TimedChannel)
            and not channel.will_close
            and channel.headers_overdue(now, self.limits.header_timeout_s)
        ]
        for channel in overdue:
            channel.will_close = True  # closed by the event loop's next write pass
        if overdue:
            logger.debug("closed %d connections whose request headers did not finish in time", len(overdue))

    def close(self, flush_timeout_s: float = 5.0) -> None:
        """Stop listening, flush what clients are still owed (up to ``flush_timeout_s``), stop the threads."""
        for dispatcher in list(self.map.values()):
            if isinstance(dispatcher, BaseWSGIServer):
                dispatcher.close()  # stop listening; open connections stay until flushed
        deadline = time.monotonic() + flush_timeout_s
        while time.monotonic() < deadline and any(
            getattr(channel, "total_outbufs_len", 0) for channel in list(self.map.values())
        ):
            wasyncore.loop(timeout=POLL_S, map=self.map, use_poll=True, count=1)
        self.dispatcher.shutdown(timeout=2)
