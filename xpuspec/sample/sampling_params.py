"""Per-request sampling settings: the contract between the Python API, the server and the engine."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from xpuspec.sample.defaults import SamplingDefaults
from xpuspec.sample.draft_tree import TreeShape, parse_draft_tree
from xpuspec.sample.dry import MAX_DRY_BASE

MAX_DRAFT_TOKENS = 16
# The smallest non-zero temperature. Below it 1 / temperature overflows float64 for ordinary logit
# gaps (a subnormal temperature makes every probability NaN), and the distribution is greedy anyway.
MIN_TEMPERATURE = 1e-4
MAX_TEMPERATURE = 100.0
# Seeds feed numpy's SeedSequence with the token position beside them: unsigned 64-bit integers.
SEED_LIMIT = 2**64
# OpenAI's range for presence_penalty and frequency_penalty.
MAX_ADDITIVE_PENALTY = 2.0
# DRY's sequence breakers: llama.cpp truncates a breaker to 40 characters; xpuspec refuses longer ones.
MAX_SEQUENCE_BREAKERS = 32
MAX_BREAKER_LENGTH = 40
# The fields whose None means "the model's default" (xpuspec.sample.defaults).
DEFAULTED_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "dry_include_prompt",
)


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

    Every field left at ``None`` among ``max_tokens`` and the sampling fields takes the model's default
    (:mod:`xpuspec.sample.defaults`: its generation config, else llama.cpp's; the reply cap) when the
    request is added (:meth:`with_defaults`). Repetition controls, applied to the logits before the
    temperature: ``repeat_penalty`` (llama.cpp's: a logit of a token among the last ``repeat_last_n``
    tokens of prompt and output is divided by it if positive, multiplied if not; 1 is off;
    ``repeat_last_n`` -1 is the whole sequence, 0 off), ``presence_penalty`` and ``frequency_penalty``
    (OpenAI's, in [-2, 2]: minus ``presence`` once and ``frequency`` per occurrence in the output),
    and llama.cpp's DRY (:mod:`xpuspec.sample.dry`): a token that would extend a repeat of ``n >=
    dry_allowed_length`` tokens of the sequence loses ``dry_multiplier * dry_base ** (n -
    dry_allowed_length)`` (``dry_multiplier`` 0 is off; ``dry_penalty_last_n`` tokens looked back over,
    -1 the whole sequence, 0 off; a token holding one of ``dry_sequence_breakers`` ends a repeat;
    ``dry_include_prompt`` False, an xpuspec field: DRY looks back over the reply alone, so that
    quoting the prompt is not a repeat).
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # 0: no top-k cut
    min_p: float | None = None  # 0: no min-p cut
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    dry_multiplier: float | None = None  # 0: off
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None  # -1: the whole sequence; 0: off
    dry_sequence_breakers: list[str] | None = None
    dry_include_prompt: bool | None = None  # False: DRY's history is the reply alone (llama.cpp: True)
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
        if isinstance(self.dry_sequence_breakers, tuple):
            self.dry_sequence_breakers = list(self.dry_sequence_breakers)
        self.validate()

    def with_defaults(self, defaults: SamplingDefaults) -> SamplingParams:
        """These params with every unset field (None) at ``defaults``; self if none is unset."""
        missing = {name: getattr(defaults, name) for name in DEFAULTED_FIELDS if getattr(self, name) is None}
        if "dry_sequence_breakers" in missing:
            missing["dry_sequence_breakers"] = list(missing["dry_sequence_breakers"])
        return dataclasses.replace(self, **missing) if missing else self

    @property
    def resolved(self) -> bool:
        """Whether every defaulted field has a value (the engine takes only resolved params)."""
        return all(getattr(self, name) is not None for name in DEFAULTED_FIELDS)

    @property
    def token_limit(self) -> int:
        """``max_tokens`` of resolved params (the engine's): raises on unresolved ones."""
        if self.max_tokens is None:
            raise ValueError("these SamplingParams are unresolved: call with_defaults first")
        return self.max_tokens

    @property
    def penalized(self) -> bool:
        """Whether a repetition control changes the logits."""
        repeat = self.repeat_penalty not in (None, 1.0) and self.repeat_last_n != 0
        return repeat or bool(self.presence_penalty) or bool(self.frequency_penalty) or self.dry

    @property
    def dry(self) -> bool:
        """Whether DRY changes the logits: a multiplier, and a history to look back over."""
        return bool(self.dry_multiplier) and self.dry_penalty_last_n != 0

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
        self._validate_sampling()
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

    def _validate_sampling(self) -> None:
        """The defaulted fields: None (the model's default) or a value in range."""
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature is not None and (
            not _is_finite_number(self.temperature)
            or not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE)
        ):
            raise ValueError(
                f"temperature must be 0 (greedy) or a finite number in [{MIN_TEMPERATURE}, "
                f"{MAX_TEMPERATURE}], got {self.temperature!r}"
            )
        if self.top_p is not None and (not _is_finite_number(self.top_p) or not 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 0):
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if self.min_p is not None and (not _is_finite_number(self.min_p) or not 0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be a number in [0, 1] (0 disables it), got {self.min_p!r}")
        if self.repeat_penalty is not None and (
            not _is_finite_number(self.repeat_penalty) or not self.repeat_penalty > 0
        ):
            raise ValueError(
                f"repeat_penalty must be a number > 0 (1 disables it), got {self.repeat_penalty!r}"
            )
        if self.repeat_last_n is not None and (not _is_int(self.repeat_last_n) or self.repeat_last_n < -1):
            raise ValueError(
                f"repeat_last_n must be an integer >= -1 (-1: the whole sequence, 0: off), "
                f"got {self.repeat_last_n!r}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value is not None and (
                not _is_finite_number(value) or not -MAX_ADDITIVE_PENALTY <= value <= MAX_ADDITIVE_PENALTY
            ):
                raise ValueError(
                    f"{name} must be a number in [-{MAX_ADDITIVE_PENALTY:g}, {MAX_ADDITIVE_PENALTY:g}] "
                    f"(0 disables it), got {value!r}"
                )
        self._validate_dry()

    def _validate_dry(self) -> None:
        """llama.cpp's DRY fields: None (the model's default) or a value in range."""
        if self.dry_multiplier is not None and (
            not _is_finite_number(self.dry_multiplier) or self.dry_multiplier < 0
        ):
            raise ValueError(
                f"dry_multiplier must be a number >= 0 (0 disables it), got {self.dry_multiplier!r}"
            )
        if self.dry_base is not None and (
            not _is_finite_number(self.dry_base) or not 1.0 <= self.dry_base <= MAX_DRY_BASE
        ):
            raise ValueError(f"dry_base must be a number in [1, {MAX_DRY_BASE:g}], got {self.dry_base!r}")
        if self.dry_allowed_length is not None and (
            not _is_int(self.dry_allowed_length) or self.dry_allowed_length < 1
        ):
            raise ValueError(f"dry_allowed_length must be an integer >= 1, got {self.dry_allowed_length!r}")
        if self.dry_penalty_last_n is not None and (
            not _is_int(self.dry_penalty_last_n) or self.dry_penalty_last_n < -1
        ):
            raise ValueError(
                f"dry_penalty_last_n must be an integer >= -1 (-1: the whole sequence, 0: off), "
                f"got {self.dry_penalty_last_n!r}"
            )
        if self.dry_include_prompt is not None and not isinstance(self.dry_include_prompt, bool):
            raise ValueError(f"dry_include_prompt must be a bool, got {self.dry_include_prompt!r}")
        breakers = self.dry_sequence_breakers
        if breakers is not None and (
            not isinstance(breakers, list)
            or len(breakers) > MAX_SEQUENCE_BREAKERS
            or not all(isinstance(b, str) and 0 < len(b) <= MAX_BREAKER_LENGTH for b in breakers)
        ):
            raise ValueError(
                f"dry_sequence_breakers must be a list of at most {MAX_SEQUENCE_BREAKERS} strings of 1 to "
                f"{MAX_BREAKER_LENGTH} characters, got {breakers!r}"
            )

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
