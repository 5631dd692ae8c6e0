"""Progress of a long benchmark on stderr (through logging): which part, which round, time left, and
the bench process's resident memory (so what holds memory shows row by row)."""

from __future__ import annotations

import logging
import time

from xpuspec.bench.budget import GIB, rss_bytes

logger = logging.getLogger(__name__)


class Progress:
    """Counts units of work; each report says how many are done and estimates the time left."""

    def __init__(self, section: str, total_units: int) -> None:
        self.section = section
        self.total_units = max(1, total_units)
        self.done_units = 0
        self.started = time.monotonic()

    def advance(self, message: str, units: int = 1) -> None:
        self.done_units += units
        elapsed = time.monotonic() - self.started
        left = elapsed / self.done_units * (self.total_units - self.done_units)
        rss = rss_bytes()
        logger.info(
            "[%s %d/%d, %.0f s, ~%.0f s left%s] %s",
            self.section,
            self.done_units,
            self.total_units,
            elapsed,
            left,
            f", RSS {rss / GIB:.2f} GB" if rss is not None else "",
            message,
        )
