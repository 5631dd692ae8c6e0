"""The waitress listener of `xpuspec serve`, with limits that idle or hostile clients cannot exhaust.

- ``connection_limit`` (default 500) open connections; beyond it waitress stops accepting until one
  closes. The event loop uses ``poll``, so the limit is not capped by ``select``'s 1024 descriptors.
- A connection that has not finished sending a request's headers within ``header_timeout_s``
  (default 5 s, counted from its first byte, or from the connection's opening for a connection that
  never sent one) is closed: half-open connections cannot pile up to the limit.
- A connection whose request body has not all arrived ``body_timeout_s`` (default 30 s) after its
  headers ended, or that after ``BODY_RATE_GRACE_S`` sends it slower than ``min_body_rate`` (default
  1024 bytes/s, averaged since the headers ended; 0 turns it off), is closed: headers followed by a body
  dripped byte by byte cannot hold a connection either.
- With an API key, a request without the right key is answered 401 as soon as its headers are in
  (``reject_early``), without waiting for its body.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import BaseWSGIServer, create_server
from waitress.task import ThreadedTaskDispatcher

from xpuspec.server.access_log import WSGIApp

logger = logging.getLogger(__name__)

# Paths answered on the lane threads: cheap, and needed most when the server is busiest.
LANE_PATHS = frozenset({"/health", "/metrics"})
# Answered by the event-loop thread itself (see _LaneDispatcher): the cheapest, most urgent one.
INLINE_PATHS = frozenset({"/health"})
# The event loop's poll interval: how soon it notices the stop flag and sweeps stalled connections.
POLL_S = 0.2
# A body is judged by its rate only after this long: one or two writes of a normal client fit in it.
BODY_RATE_GRACE_S = 2.0
# (path, request headers as waitress keeps them, e.g. "AUTHORIZATION") -> answer before the body?
RejectEarly = Callable[[str, Mapping[str, str]], bool]


@dataclass
class ListenerLimits:
    threads: int = 64
    lane_threads: int = 2
    connection_limit: int = 500
    channel_timeout_s: int = 30
    header_timeout_s: float = 5.0
    body_timeout_s: float = 30.0
    min_body_rate: int = 1024  # bytes per second; 0: no minimum
    max_request_body_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        for name in ("threads", "lane_threads", "connection_limit", "channel_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        rate = self.min_body_rate
        if not isinstance(rate, int) or isinstance(rate, bool) or rate < 0:
            raise ValueError(f"min_body_rate must be an integer >= 0 (bytes per second), got {rate!r}")

    @property
    def sweep_interval_s(self) -> float:
        """How often stalled connections are looked for: a fraction of the shortest timeout."""
        return min(0.5, self.header_timeout_s / 4, self.body_timeout_s / 4)


class _TimedChannel(HTTPChannel):
    """A channel that remembers when its current request started arriving, and when its body did."""

    reject_early: RejectEarly | None = None  # set on a subclass per listener

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.request_started = time.monotonic()
        self.never_sent = True
        self.body_of: HTTPRequestParser | None = None  # the partial request whose body is arriving
        self.body_started = 0.0
        self.discarding = False  # answered before its body: what else the client sends is dropped

    def received(self, data: bytes) -> bool:
        if self.discarding:
            return False
        if data and (self.request is None or self.never_sent):
            self.request_started = time.monotonic()
            self.never_sent = False
        accepted = bool(super().received(data))
        partial = self.request
        if partial is not None and partial.headers_finished and partial is not self.body_of:
            self.body_of, self.body_started = partial, time.monotonic()
            if self.reject_early is not None and self.reject_early(partial.path, partial.headers):
                self._answer_without_body(partial)
        return accepted

    def _answer_without_body(self, partial: HTTPRequestParser) -> None:
        """Hand the request to the app now, with an empty body, and close the connection after it."""
        with self.requests_lock:
            partial.close()  # the body received so far: never read
            partial.body_rcv = None
            partial.headers["CONTENT_LENGTH"] = "0"
            partial.headers["CONNECTION"] = "close"
            partial.completed = True
            self.requests.append(partial)
            self.request = None
            self.discarding = True
            if len(self.requests) == 1:  # as waitress does: otherwise service() queues it in turn
                self.server.add_task(self)

    def headers_overdue(self, now: float, timeout: float) -> bool:
        if self.requests or now - self.request_started <= timeout:
            return False  # a request is being answered, or this one is still in time
        partial = self.request
        return self.never_sent or (partial is not None and not partial.headers_finished)

    def body_overdue(self, now: float, timeout: float, min_rate: int) -> bool:
        """Its headers are in, its body is not, and it is past ``timeout`` or below ``min_rate``."""
        partial = self.request
        if self.requests or partial is None or partial is not self.body_of or partial.completed:
            return False  # no body arriving, or a request is being answered
        elapsed = now - self.body_started
        if elapsed > timeout:
            return True
        return elapsed > BODY_RATE_GRACE_S and partial.body_bytes_received < min_rate * elapsed


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
        self._inline: list[HTTPChannel] = []
        self._inline_lock = threading.Lock()
        self.loop_thread: threading.Thread | None = None  # the thread running the event loop

    def add_task(self, task: HTTPChannel) -> None:
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

    def __init__(
        self,
        app: WSGIApp,
        host: str,
        port: int,
        limits: ListenerLimits | None = None,
        reject_early: RejectEarly | None = None,
    ) -> None:
        """Bind ``host:port``; raises OSError (e.g. EADDRINUSE) before any thread is started.

        ``reject_early(path, headers)`` True: the request goes to ``app`` as soon as its headers are
        in, with an empty body, and the connection closes after the answer (``app`` must refuse it
        without reading a body, e.g. a missing API key)."""
        self.limits = limits or ListenerLimits()
        self.map: dict[int, wasyncore.dispatcher] = {}  # waitress's socket map: fd -> its dispatcher
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
        rejecting = {"reject_early": staticmethod(reject_early)} if reject_early is not None else {}
        channel_class = type("_Channel", (_TimedChannel,), rejecting)
        for dispatcher in self.map.values():
            if isinstance(dispatcher, BaseWSGIServer):
                dispatcher.channel_class = channel_class
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
                next_sweep = now + self.limits.sweep_interval_s
            if tick is not None:
                tick()

    def _close_overdue(self, now: float) -> None:
        limits = self.limits
        stalled_headers = stalled_bodies = 0
        for channel in list(self.map.values()):
            if not isinstance(channel, _TimedChannel) or channel.will_close:
                continue
            if channel.headers_overdue(now, limits.header_timeout_s):
                stalled_headers += 1
            elif channel.body_overdue(now, limits.body_timeout_s, limits.min_body_rate):
                stalled_bodies += 1
            else:
                continue
            channel.will_close = True  # closed by the event loop's next write pass
        if stalled_headers or stalled_bodies:
            logger.debug(
                "closed %d connections whose request headers, %d whose body, did not arrive in time",
                stalled_headers,
                stalled_bodies,
            )

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
