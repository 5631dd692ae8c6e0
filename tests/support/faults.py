"""Fault injection for the isolation tests: a real runner that fails on demand, and text parts that do."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from xpuspec.core.chunks import SequenceChunk
from xpuspec.text import IncrementalDetokenizer, StopStringMatcher

# The exact-precision compile properties every exact comparison needs (see common notes).
EXACT = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}


class FaultyRunner:
    """Wraps a real model runner (target or draft). On demand it raises on one inference, or
    writes NaN into the logits rows of the sequences ``poison(sequence_id)`` picks. Everything
    else is the wrapped runner's."""

    def __init__(self, runner: Any) -> None:
        self._runner = runner
        self.caps = runner.caps  # what the wrapped runner can do (the rest is forwarded below)
        self.num_inferences = 0
        self.fail_at: int | None = None  # raise when starting this inference (1-based count)
        self.fail_when: Callable[[], bool] | None = None  # or raise (once) on the first inference it holds
        self.hold: threading.Event | None = None  # every inference waits for it (to line requests up)
        self.poison: Callable[[str | None], bool] | None = None
        self._started: list[SequenceChunk] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def forward(self, chunks: list[SequenceChunk]) -> np.ndarray:
        self._count()
        return self._poisoned(chunks, self._runner.forward(chunks))

    def start(self, chunks: list[SequenceChunk]) -> None:
        self._count()
        self._runner.start(chunks)
        self._started = chunks

    def wait(self) -> np.ndarray:
        chunks, self._started = self._started, None
        logits = self._runner.wait()
        return self._poisoned(chunks or [], logits)

    def _count(self) -> None:
        if self.hold is not None:
            self.hold.wait(60)
        self.num_inferences += 1
        due = self.fail_when is not None and self.fail_when()
        if due:
            self.fail_when = None
        if due or self.num_inferences == self.fail_at:
            raise RuntimeError("injected inference failure")

    def _poisoned(self, chunks: list[SequenceChunk], logits: np.ndarray) -> np.ndarray:
        if self.poison is None:
            return logits
        result = None
        row = 0
        for chunk in chunks:
            if chunk.num_logits and self.poison(chunk.sequence_id):
                result = np.array(logits, copy=True) if result is None else result
                result[row : row + chunk.num_logits, 3] = np.nan  # one NaN per row is enough
            row += chunk.num_logits
        return logits if result is None else result


class RaisingDetokenizer(IncrementalDetokenizer):
    """Decodes normally until its ``fail_after``-th push, which raises."""

    fail_after = 2

    def push(self, token_ids):  # type: ignore[no-untyped-def]
        self.num_pushes = getattr(self, "num_pushes", 0) + 1
        if self.num_pushes >= self.fail_after:
            raise RuntimeError("injected detokenizer failure")
        return super().push(token_ids)


class RaisingStopMatcher(StopStringMatcher):
    """Matches normally until its ``fail_after``-th push, which raises."""

    fail_after = 2

    def push(self, delta):  # type: ignore[no-untyped-def]
        self.num_pushes = getattr(self, "num_pushes", 0) + 1
        if self.num_pushes >= self.fail_after:
            raise RuntimeError("injected stop-string matcher failure")
        return super().push(delta)


def fail_nth(real: type, faulty: type, index: int) -> Callable[..., Any]:
    """A factory to patch over ``real``: its ``index``-th instance (0-based) is ``faulty``."""
    created = [0]

    def make(*args: Any, **kwargs: Any) -> Any:
        number, created[0] = created[0], created[0] + 1
        return (faulty if number == index else real)(*args, **kwargs)

    return make
