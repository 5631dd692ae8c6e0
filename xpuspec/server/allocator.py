"""Bounding the heap the server's threads hold, and handing freed memory back to the system.

glibc's malloc gives each thread that allocates at once with another an arena of its own (up to 8 per
core), and keeps freed memory in every arena for reuse: after a burst of requests (their token lists,
responses, the plugin's step buffers) the process stays at its peak RSS though nothing uses those
pages. In a 30-minute soak the threads' arenas were the largest part of the growth after the KV cache
(docs/benchmarks.md, "A 30-minute soak of the server"). So the server
- caps the arenas at :data:`MAX_ARENAS` (``mallopt(M_ARENA_MAX)``) before its threads start, as
  ``MALLOC_ARENA_MAX`` would (a variable the user sets wins: :func:`limit_arenas`);
- trims the heap (``malloc_trim(0)``) once per idle spell, where it costs no request any time, and
  every :data:`BUSY_TRIM_INTERVAL_S` under a load that never pauses, where it costs a few ms.
Elsewhere than glibc there is nothing to call, and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

# Idle this long (nothing in flight) before the heap is trimmed: a pause between requests of one
# client is shorter, so a steady load is never interrupted by a trim.
IDLE_BEFORE_TRIM_S = 2.0
# Under a load that never leaves the engine idle, the heap is trimmed this often all the same.
BUSY_TRIM_INTERVAL_S = 60.0
# malloc arenas for the whole process: the engine loop, the listener and the plugin's worker threads
# allocate at once rarely enough that two arenas hold them without waiting on each other's locks.
MAX_ARENAS = 2
M_ARENA_MAX = -8  # glibc's malloc.h
ARENA_MAX_ENV = "MALLOC_ARENA_MAX"


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    libc = _libc()
    try:
        trim = libc.malloc_trim if libc is not None else None
    except AttributeError:  # not glibc (musl, macOS): no malloc_trim
        return None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def limit_arenas(count: int = MAX_ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``count`` unless ``MALLOC_ARENA_MAX`` is set (glibc read it at
    start); call before the threads that allocate start. Whether the cap was set."""
    if os.environ.get(ARENA_MAX_ENV):
        return False
    libc = _libc()
    try:
        mallopt = libc.mallopt if libc is not None else None
    except AttributeError:
        return False
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, count))


class IdleTrimmer:
    """``tick()`` often (the listener's loop): trims the heap once per idle spell of ``idle_s``, and
    every ``busy_interval_s`` while busy."""

    def __init__(
        self,
        busy: Callable[[], bool],
        idle_s: float = IDLE_BEFORE_TRIM_S,
        busy_interval_s: float = BUSY_TRIM_INTERVAL_S,
    ) -> None:
        self._busy = busy
        self._idle_s = idle_s
        self._busy_interval_s = busy_interval_s
        self._trim = _malloc_trim()
        self._last_busy = self._last_trim = time.monotonic()
        self._trimmed = True  # nothing to give back before the first request
        self.trims = 0

    def tick(self) -> None:
        if self._trim is None:
            return
        now = time.monotonic()
        if self._busy():
            self._last_busy, self._trimmed = now, False
            if now - self._last_trim >= self._busy_interval_s:
                self._trim_now(now)
        elif not self._trimmed and now - self._last_busy >= self._idle_s:
            self._trim_now(now)
            self._trimmed = True

    def _trim_now(self, now: float) -> None:
        assert self._trim is not None
        self._trim(0)
        self._last_trim = now
        self.trims += 1
