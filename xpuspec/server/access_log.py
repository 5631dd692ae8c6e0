"""One access-log line per request, written when its response closes (a stream's end, not its start).

``method path status tokens=N 0.123s id=REQUEST_ID`` on the ``xpuspec.access`` logger; each record carries
its path as ``record.path``, so a filter (:class:`HealthProbeFilter`) can leave probes out. Every response
carries its request id in ``X-Request-Id``; completion ids are ``cmpl-``/``chatcmpl-`` plus the same id,
so a client's report and the server's log line can be matched.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from werkzeug.wsgi import ClosingIterator

ACCESS_LOGGER = "xpuspec.access"
HEALTH_PATH = "/health"
# WSGI environ keys: the request id, and a callable giving the completion tokens produced so far.
REQUEST_ID_KEY = "xpuspec.request_id"
TOKENS_KEY = "xpuspec.completion_tokens"

access_logger = logging.getLogger(ACCESS_LOGGER)

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def request_id(environ: dict[str, Any]) -> str:
    """The id AccessLog gave this request (a fresh one when the app runs without it)."""
    given: str = environ.setdefault(REQUEST_ID_KEY, uuid.uuid4().hex)
    return given


class AccessLog:
    """WSGI middleware: a request id for every request, and its log line once the response is closed."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        started = time.perf_counter()
        rid = request_id(environ)
        statuses: list[str] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            statuses.append(status)
            return start_response(status, [*headers, ("X-Request-Id", rid)], exc_info)

        def log() -> None:
            if not access_logger.isEnabledFor(logging.INFO):
                return
            tokens = environ.get(TOKENS_KEY)
            access_logger.info(
                "%s %s %s tokens=%s %.3fs id=%s",
                environ.get("REQUEST_METHOD", "-"),
                environ.get("PATH_INFO", "-"),
                statuses[-1].split(" ", 1)[0] if statuses else "-",
                tokens() if tokens is not None else "-",
                time.perf_counter() - started,
                rid,
                extra={"path": environ.get("PATH_INFO", "-")},
            )

        return ClosingIterator(self.app(environ, start), [log])


class HealthProbeFilter(logging.Filter):
    """Drops the access lines of ``/health``: a readiness loop or a load balancer probes it every few
    seconds, and its lines would bury the requests (``xpuspec serve --log-health`` keeps them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "path", None) != HEALTH_PATH
