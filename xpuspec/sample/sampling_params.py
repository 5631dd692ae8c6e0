"""Per-request sampling settings: the contract between the Python API, the server and the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_DRAFT_TOKENS = 16


@dataclass
class SamplingParams:
    """How one request is decoded.

    ``temperature == 0`` is greedy decoding. ``num_draft_tokens`` fixes the speculation
    length γ for this request; ``None`` lets the engine's cost model choose it per step.
    """

    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    num_draft_tokens: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field and what it accepts."""
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be a number in [0, 100], got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if self.num_draft_tokens is not None and (
            not isinstance(self.num_draft_tokens, int)
            or isinstance(self.num_draft_tokens, bool)
            or not 0 <= self.num_draft_tokens <= MAX_DRAFT_TOKENS
        ):
            raise ValueError(
                f"num_draft_tokens must be None (adaptive) or an integer in [0, {MAX_DRAFT_TOKENS}], "
                f"got {self.num_draft_tokens!r}"
            )
