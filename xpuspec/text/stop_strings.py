"""Stop strings on streamed text: emit what cannot be part of a stop string, hold back the rest.

A stop string may arrive split over several deltas ("<|im" + "_end|>"), so the tail of the text
that could still grow into a stop string is held until it either completes one (generation stops
and the stop string is dropped) or stops matching (it is released).

The text stops at the first stop string to be completed when reading the text left to right (the
smallest end position; of several ending there, the one starting first). That point depends only
on the text, not on how it was split into deltas.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

logger = logging.getLogger(__name__)


class StopStringMatcher:
    """Filter one sequence's text deltas against its stop strings. One instance per sequence."""

    def __init__(self, stop: Sequence[str]) -> None:
        if isinstance(stop, str):
            raise ValueError(f"stop must be a list of strings, got the string {stop!r}")
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {list(stop)!r}")
        self._stop = tuple(dict.fromkeys(stop))  # de-duplicated, order kept
        self._longest = max((len(s) for s in self._stop), default=0)
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def held_text(self) -> str:
        return self._held

    def push(self, delta: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit now, whether a stop string was hit).

        Once a stop string is hit the emitted text ends right before it, and every later push
        returns ``("", True)``.
        """
        if self._stopped:
            return "", True
        if not self._stop:
            return delta, False
        # Everything before the held text was checked already: no stop string starts there.
        text = self._held + delta
        stop_start = self._first_completed_stop(text)
        if stop_start is not None:
            self._stopped = True
            self._held = ""
            return text[:stop_start], True
        hold_from = self._start_of_possible_stop(text)
        self._held = text[hold_from:]
        return text[:hold_from], False

    def flush(self) -> str:
        """Release the held text at the end of generation (nothing after a stop)."""
        held, self._held = self._held, ""
        return "" if self._stopped else held

    def _first_completed_stop(self, text: str) -> int | None:
        best: tuple[int, int] | None = None  # (end, start)
        for stop in self._stop:
            start = text.find(stop)
            if start < 0:
                continue
            candidate = (start + len(stop), start)
            if best is None or candidate < best:
                best = candidate
        return None if best is None else best[1]

    def _start_of_possible_stop(self, text: str) -> int:
        """Start of the longest suffix of ``text`` that begins some stop string (len(text) if none)."""
        for length in range(min(len(text), self._longest - 1), 0, -1):
            suffix = text[-length:]
            if any(stop.startswith(suffix) for stop in self._stop):
                return len(text) - length
        return len(text)
