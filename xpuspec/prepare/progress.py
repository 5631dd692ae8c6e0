"""Numbered, timed progress lines for the long steps of `xpuspec prepare`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

ProgressSink = Callable[[str], None]


# Set by prepare's signal handler. A Ctrl-C that lands inside library code can be swallowed there (a
# broad ``except`` around an export), so every step also ends by checking this flag: an interrupted
# prepare then still stops before the next step and before the bundle is committed.
interrupt_requested = threading.Event()


class StepProgress:
    """Announces ``[step/total] description ...`` and, when the step ends, its elapsed time."""

    def __init__(self, total_steps: int, sink: ProgressSink | None = None):
        self.total_steps = total_steps
        self.sink: ProgressSink = sink or logger.info
        self.current_step = 0
        self.started_at = time.monotonic()

    @contextmanager
    def step(self, description: str) -> Iterator[None]:
        self.current_step += 1
        label = f"[{self.current_step}/{self.total_steps}]"
        self.sink(f"{label} {description} ...")
        step_start = time.monotonic()
        yield
        if interrupt_requested.is_set():
            raise KeyboardInterrupt
        self.sink(f"{label} {description} ... {time.monotonic() - step_start:.1f}s")

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started_at
