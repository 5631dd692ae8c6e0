"""What ``Pipeline.generate`` returns, and what its streams raise: plain data, no runtime."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenerationResult:
    """One request's output. finish_reason "error" means the request failed alone (its sampling,
    its text) or with the whole engine step; ``error`` says why, and the text is what came before."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    stats: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class GenerationError(RuntimeError):
    """A streamed request ended with finish_reason "error"."""
