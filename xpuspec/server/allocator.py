"""Handing the heap memory that finished requests freed back to the system once the server is idle.

glibc's malloc keeps freed memory in its arenas for reuse: after a burst of requests (their token
lists, responses, the plugin's step buffers) the process stays at its peak RSS though nothing uses
those pages. ``malloc_trim(0)`` returns them; run when the engine has had nothing in flight for a
while, it costs no request any time. Elsewhere than glibc there is nothing to call, and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

# Idle this long (nothing in flight) before the heap is trimmed: a pause between requests of one
# client is shorter, so a steady load is never interrupted by a trim.
IDLE_BEFORE_TRIM_S = 2.0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class IdleTrimmer:
    """``tick()`` often (the listener's loop): trims the heap once per idle spell of ``idle_s``."""

    def __init__(self, busy: Callable[[], bool], idle_s: float = IDLE_BEFORE_TRIM_S) -> None:
        self._busy = busy
        self._idle_s = idle_s
        self._trim = _malloc_trim()
        self._last_busy = time.monotonic()
        self._trimmed = True  # nothing to give back before the first request
        self.trims = 0

    def tick(self) -> None:
        if self._trim is None:
            return
        now = time.monotonic()
        if self._busy():
            self._last_busy, self._trimmed = now, False
        elif not self._trimmed and now - self._last_busy >= self._idle_s:
            self._trim(0)
            self._trimmed = True
            self.trims += 1
