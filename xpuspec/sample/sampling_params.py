"""Per-request sampling settings: the contract between the Python API, the server and the engine."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from xpuspec.sample.draft_tree import TreeShape, parse_draft_tree

MAX_DRAFT_TOKENS = 16
# The smallest non-zero temperature. Below it 1 / temperature overflows float64 for ordinary logit
# gaps (a subnormal temperature makes every probability NaN), and the distribution is greedy anyway.
MIN_TEMPERATURE = 1e-4
MAX_TEMPERATURE = 100.0
# Seeds feed numpy's SeedSequence with the token position beside them: unsigned 64-bit integers.
SEED_LIMIT = 2**64


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class SamplingParams:
    """How one request is decoded.

    ``temperature == 0`` is greedy decoding; otherwise it lies in [1e-4, 100]. ``seed`` (an
    integer in [0, 2**64)) makes a sampled request repeatable whatever else runs beside it.
    ``num_draft_tokens`` fixes the speculation length γ for this request; ``None`` lets the
    engine's cost model choose it per step.

    At most one output constraint: ``response_format`` (OpenAI's shapes: ``{"type": "text"}``,
    ``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema": {"schema": ...}}``),
    ``guided_regex`` or ``guided_grammar`` (Lark, or llama.cpp's GBNF); see :mod:`xpuspec.structured`.
    """

    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    num_draft_tokens: int | None = None
    response_format: dict | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    # Tree speculation (xpuspec.spec_decode.tree): None drafts a chain; "auto" lets the cost model
    # choose the shape; {"depth": d, "width": w, "nodes": n} (or a TreeShape) fixes it.
    draft_tree: TreeShape | str | dict | None = None

    def __post_init__(self) -> None:
        self.draft_tree = parse_draft_tree(self.draft_tree)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, tuple):
            self.stop = list(self.stop)
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def seeded(self) -> bool:
        """Sampled with a seed: its tokens must repeat whatever the timings. A greedy request's seed
        changes nothing (clients often send one), so it is not seeded."""
        return self.seed is not None and not self.greedy

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field and what it accepts."""
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_finite_number(self.temperature) or not (
            self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE
        ):
            raise ValueError(
                f"temperature must be 0 (greedy) or a finite number in [{MIN_TEMPERATURE}, "
                f"{MAX_TEMPERATURE}], got {self.temperature!r}"
            )
        if not _is_finite_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT):
            raise ValueError(f"seed must be None or an integer in [0, 2**64), got {self.seed!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        parse_draft_tree(self.draft_tree)
        if self.num_draft_tokens is not None and (
            not _is_int(self.num_draft_tokens) or not 0 <= self.num_draft_tokens <= MAX_DRAFT_TOKENS
        ):
            raise ValueError(
                f"num_draft_tokens must be None (adaptive) or an integer in [0, {MAX_DRAFT_TOKENS}], "
                f"got {self.num_draft_tokens!r}"
            )
        self.constraint()  # raises for a bad shape; the grammar itself is checked by the engine

    @property
    def constrained(self) -> bool:
        """Whether an output constraint is set (:meth:`constraint` compiles it)."""
        return not (
            self.response_format is None and self.guided_regex is None and self.guided_grammar is None
        )

    def constraint(self):
        """The output constraint (``xpuspec.structured.Constraint``) or None."""
        if not self.constrained:
            return None
        from xpuspec.structured.constraint import constraint_of  # llguidance only when used

        return constraint_of(self.response_format, self.guided_regex, self.guided_grammar)
