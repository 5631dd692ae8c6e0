"""Compile properties chosen by measurement: the step cost and greedy agreement of candidate settings.

For one model (target or draft) on one device, `xpuspec plan` compiles candidate settings of
inference precision, KV-cache precision and dynamic-quantisation group size, and for each measures

- **greedy agreement** with the exact reference (f32 compute, f32 KV cache, no dynamic quantisation):
  how many of a few short greedy continuations (4 prompts x 32 tokens by default) are token-identical
  to the reference's;
- **step cost**: the median time of a single-token decode step, in interleaved rounds (every candidate
  once per round, the order reversed every other round) until the ranking against the plugin's
  default is clear or a round limit is reached.

The fastest candidate whose agreement is at least the default's replaces the default only when it is
clearly faster: every one of its rounds faster than every round of the default over at least
``confirm_rounds`` rounds each (5: a chance of 1 / C(10, 5) < 0.4% under no difference) and a median
gain above a margin (5%). Otherwise
the plugin's default stays and the record says the candidates were within noise.

Candidates are pruned to keep planning fast:
1. compute x KV precision: the device's compute precisions (f32, and bf16 / f16 where the device
   lists them), each with a u8 cache, a cache of its own precision and an f32 cache;
2. dynamic-quantisation group size (0 / 32 / 64 / 128 / 256), only at f32 compute with int8/int4
   weights (at bf16 the CPU does not quantise activations), with the fastest f32 cache of step 1.
A combination the device refuses (e.g. an f32 model with a bf16 cache on the CPU) is recorded with
its error and skipped.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from xpuspec.executor.properties import EXACT_PROPERTIES, readable

logger = logging.getLogger(__name__)

GROUP_SIZES = (0, 32, 64, 128, 256)
DEFAULT_GROUP = 128
# OPTIMIZATION_CAPABILITIES names -> INFERENCE_PRECISION_HINT values.
COMPUTE_PRECISIONS = {"FP32": "f32", "BF16": "bf16", "FP16": "f16"}
COMPRESSED_WEIGHTS = ("int8", "int4")


@dataclass(frozen=True)
class TuneConfig:
    """How much to measure per candidate."""

    num_prompts: int = 4  # greedy-agreement prompts
    max_tokens: int = 32  # tokens per agreement prompt
    steps_per_round: int = 16  # single-token decode steps timed per candidate and round
    min_rounds: int = 3
    max_rounds: int = 8
    confirm_rounds: int = 5  # replacing the default needs at least this many rounds of both
    margin: float = 0.05  # a candidate must be this much faster (median) than the default to replace it

    def __post_init__(self) -> None:
        for name in ("num_prompts", "max_tokens", "steps_per_round", "min_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.min_rounds <= self.confirm_rounds <= self.max_rounds:
            raise ValueError(
                f"need min_rounds <= confirm_rounds <= max_rounds, got {self.min_rounds}, "
                f"{self.confirm_rounds}, {self.max_rounds}"
            )
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")


@dataclass
class PropertyCandidate:
    """One setting of the tuned keys, with what was measured of it."""

    properties: dict[str, Any]  # the tuned keys; {} is the plugin's default
    is_default: bool = False
    round_ms: list[float] = field(default_factory=list)  # median step time of each round
    agreement: int | None = None  # prompts whose greedy tokens equal the exact reference's
    error: str | None = None

    @property
    def label(self) -> str:
        return "plugin default" if self.is_default else readable(self.properties)

    @property
    def step_ms(self) -> float | None:
        return statistics.median(self.round_ms) if self.round_ms else None

    @property
    def spread(self) -> float | None:
        """(slowest - fastest round) / median: how noisy the measurement was."""
        if len(self.round_ms) < 2 or not self.step_ms:
            return None
        return (max(self.round_ms) - min(self.round_ms)) / self.step_ms

    def as_dict(self) -> dict[str, Any]:
        return {
            "properties": self.label,
            "step_ms": None if self.step_ms is None else round(self.step_ms, 3),
            "spread": None if self.spread is None else round(self.spread, 3),
            "rounds": len(self.round_ms),
            "agreement": self.agreement,
            "error": self.error,
        }


@dataclass
class TuneResult:
    """The choice for one role on one device, and why."""

    role: str
    device: str
    chosen: dict[str, Any]  # {} keeps the plugin default
    reason: str
    default_properties: dict[str, Any]  # the plugin default's tuned keys, as compiled
    candidates: list[PropertyCandidate]
    num_prompts: int
    max_tokens: int

    def summary(self) -> str:
        """One readable line: what was chosen and why."""
        chosen = (
            readable(self.chosen) if self.chosen else f"plugin default ({readable(self.default_properties)})"
        )
        return f"{chosen}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "chosen": self.chosen or "plugin default",
            "plugin_default": readable(self.default_properties),
            "reason": self.reason,
            "agreement_check": f"{self.num_prompts} prompts x {self.max_tokens} greedy tokens vs exact",
            "candidates": [c.as_dict() for c in self.candidates],
        }


def compute_precisions(device_precisions: Sequence[str]) -> list[str]:
    """f32 always, then bf16 / f16 where the device lists them."""
    found = ["f32"]
    for name, hint in COMPUTE_PRECISIONS.items():
        if name in device_precisions and hint not in found:
            found.append(hint)
    return found


def first_stage(device_precisions: Sequence[str], compressed: bool) -> list[dict[str, Any]]:
    """Compute x KV candidates (step 1 of the pruning order)."""
    candidates = []
    for compute in compute_precisions(device_precisions):
        for kv in dict.fromkeys(("u8", compute, "f32")):
            properties: dict[str, Any] = {"INFERENCE_PRECISION_HINT": compute, "KV_CACHE_PRECISION": kv}
            if compressed and compute == "f32":
                properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = DEFAULT_GROUP
            candidates.append(properties)
    return candidates


def group_stage(kv: str) -> list[dict[str, Any]]:
    """Group-size candidates at f32 compute with the chosen cache (step 2)."""
    return [
        {
            "INFERENCE_PRECISION_HINT": "f32",
            "KV_CACHE_PRECISION": kv,
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": group,
        }
        for group in GROUP_SIZES
        if group != DEFAULT_GROUP
    ]


def clearly_faster(
    candidate: PropertyCandidate, default: PropertyCandidate, margin: float, min_rounds: int = 3
) -> bool:
    """Every round of ``candidate`` beat every round of ``default``, by more than ``margin`` at the median."""
    if len(candidate.round_ms) < min_rounds or len(default.round_ms) < min_rounds:
        return False
    assert candidate.step_ms is not None and default.step_ms is not None
    return max(candidate.round_ms) < min(default.round_ms) and candidate.step_ms < default.step_ms * (
        1 - margin
    )


class _Subject:
    """One compiled candidate: a paged runner, its greedy continuations and its step timings."""

    def __init__(self, runner: Any, block_table: list[int]) -> None:
        self.runner = runner
        self.block_table = block_table

    def greedy(self, prompt: list[int], max_tokens: int) -> list[int]:
        from xpuspec.core.chunks import SequenceChunk

        logits = self.runner.forward([SequenceChunk(prompt, 0, self.block_table, 1)])
        tokens = [int(logits[0].argmax())]
        while len(tokens) < max_tokens:
            position = len(prompt) + len(tokens) - 1
            logits = self.runner.forward([SequenceChunk([tokens[-1]], position, self.block_table, 1)])
            tokens.append(int(logits[0].argmax()))
        return tokens

    def step_ms(self, prompt: list[int], steps: int) -> float:
        """Median milliseconds of ``steps`` single-token decode steps after ``prompt``."""
        from xpuspec.core.chunks import SequenceChunk

        self.runner.forward([SequenceChunk(prompt, 0, self.block_table, 1)])
        token, times = prompt[-1], []
        for index in range(steps):
            chunk = SequenceChunk([token], len(prompt) + index, self.block_table, 1)
            started = time.perf_counter()
            logits = self.runner.forward([chunk])
            times.append(time.perf_counter() - started)
            token = int(logits[0].argmax())
        return statistics.median(times) * 1000


class _Trial:
    """The candidates compiled so far for one model, and how each agrees with the exact reference."""

    def __init__(
        self,
        make_runner: Callable[[dict[str, Any]], Any],
        role: str,
        context: int,
        prompts: Sequence[list[int]],
        max_tokens: int,
        progress: Callable[[str], None],
    ) -> None:
        self.make_runner, self.role, self.context = make_runner, role, context
        self.prompts, self.max_tokens, self.progress = prompts, max_tokens, progress
        self.subjects: dict[int, _Subject] = {}
        self.expected: list[list[int]] = []  # the exact reference's greedy tokens for each prompt

    def compile(self, candidate: PropertyCandidate) -> None:
        """Compile ``candidate``'s runner, or record why the device refused it or it has too few blocks."""
        try:
            runner = self.make_runner(candidate.properties)
        except (RuntimeError, ValueError) as error:  # a combination the device refuses
            candidate.error = f"{type(error).__name__}: {_essence(str(error))}"
            self.progress(f"  {self.role}: {candidate.label}: refused ({candidate.error})")
            return
        blocks = -(-self.context // runner.block_size)
        if runner.num_blocks < blocks:
            candidate.error = f"needs {blocks} KV blocks, the runner has {runner.num_blocks}"
            return
        self.subjects[id(candidate)] = _Subject(runner, list(range(blocks)))

    def agreement(self, candidate: PropertyCandidate) -> None:
        """Count the prompts on which ``candidate`` (where compiled) writes the reference's tokens."""
        subject = self.subjects.get(id(candidate))
        if subject is not None:
            got = [subject.greedy(p, self.max_tokens) for p in self.prompts]
            candidate.agreement = sum(g == e for g, e in zip(got, self.expected, strict=True))

    def measured(self, candidates: list[PropertyCandidate]) -> list[PropertyCandidate]:
        return [c for c in candidates if id(c) in self.subjects]


def tune_role(
    make_runner: Callable[[dict[str, Any]], Any],
    role: str,
    device: str,
    device_precisions: Sequence[str],
    weights: str | None,
    default_properties: dict[str, Any],
    prompts: Sequence[list[int]],
    timing_prompt: list[int],
    config: TuneConfig = TuneConfig(),
    progress: Callable[[str], None] = lambda line: None,
) -> TuneResult:
    """Measure the candidates for one model and choose; ``make_runner(properties)`` compiles a paged
    runner with the plugin's defaults overlaid by ``properties`` ({} for the plugin default).

    ``default_properties`` are the tuned keys of the plugin's default, for the record; ``prompts`` are
    token ids, each short enough for ``max_tokens`` more in the runner's blocks.
    """
    compressed = weights in COMPRESSED_WEIGHTS
    context = (
        max(len(p) for p in [*prompts, timing_prompt]) + max(config.max_tokens, config.steps_per_round) + 1
    )
    trial = _Trial(make_runner, role, context, prompts, config.max_tokens, progress)
    reference = PropertyCandidate(dict(EXACT_PROPERTIES))
    trial.compile(reference)
    if reference.error is not None:
        reason = f"not tuned: the exact reference failed ({reference.error})"
        return TuneResult(
            role, device, {}, reason, default_properties, [reference], len(prompts), config.max_tokens
        )
    trial.expected = [trial.subjects[id(reference)].greedy(p, config.max_tokens) for p in prompts]
    reference.agreement = len(prompts)

    # The default stands for the candidate with the same settings (it is compiled once, as the default).
    default = PropertyCandidate({}, is_default=True)
    candidates = [default]
    for properties in first_stage(device_precisions, compressed):
        if properties == default_properties:
            continue
        candidates.append(reference if properties == reference.properties else PropertyCandidate(properties))
    for candidate in candidates:
        if id(candidate) not in trial.subjects and candidate.error is None:
            trial.compile(candidate)
        if candidate is not reference:
            trial.agreement(candidate)
    _time_rounds(trial.measured(candidates), trial.subjects, timing_prompt, default, config)
    if compressed:
        _group_stage(trial, candidates, reference, default, default_properties, timing_prompt, config)

    for candidate in candidates:
        progress(f"  {role}: {candidate.label}: " + _describe(candidate))
    chosen, reason = choose_properties(candidates, default, config.margin, config.confirm_rounds)
    return TuneResult(
        role, device, chosen, reason, default_properties, candidates, len(prompts), config.max_tokens
    )


def _group_stage(
    trial: _Trial,
    candidates: list[PropertyCandidate],
    reference: PropertyCandidate,
    default: PropertyCandidate,
    default_properties: dict[str, Any],
    timing_prompt: list[int],
    config: TuneConfig,
) -> None:
    """Step 2 (compressed weights): group sizes at f32, with the f32-compute cache that was fastest in
    step 1; the new candidates join ``candidates`` and every candidate is timed again."""
    at_f32 = [
        c
        for c in candidates
        if c.step_ms is not None and c.properties.get("INFERENCE_PRECISION_HINT") == "f32"
    ]
    if not at_f32:
        return
    kv = min(at_f32, key=lambda c: c.step_ms or 0.0).properties["KV_CACHE_PRECISION"]
    for properties in group_stage(kv):
        if properties == reference.properties:
            if reference not in candidates:
                candidates.append(reference)
            continue
        if properties == default_properties or any(c.properties == properties for c in candidates):
            continue
        candidate = PropertyCandidate(properties)
        candidates.append(candidate)
        trial.compile(candidate)
        trial.agreement(candidate)
    _time_rounds(trial.measured(candidates), trial.subjects, timing_prompt, default, config, restart=True)


def _time_rounds(
    measured: list[PropertyCandidate],
    subjects: dict[int, _Subject],
    prompt: list[int],
    default: PropertyCandidate,
    config: TuneConfig,
    restart: bool = False,
) -> None:
    """Interleaved rounds until the fastest eligible candidate vs the default is clear, or max_rounds."""
    if restart:
        for candidate in measured:
            candidate.round_ms = []
    for round_index in range(config.max_rounds):
        order = measured if round_index % 2 == 0 else measured[::-1]
        for candidate in order:
            candidate.round_ms.append(subjects[id(candidate)].step_ms(prompt, config.steps_per_round))
        if round_index + 1 < config.min_rounds:
            continue
        best = _fastest_eligible(measured, default)
        if (
            best is None
            or best is default
            or clearly_faster(best, default, config.margin, config.confirm_rounds)
        ):
            return
        if (
            best.step_ms is not None
            and default.step_ms is not None
            and best.step_ms > default.step_ms * (1 - config.margin)
        ):
            return  # the best is within the margin at the median: more rounds would not change the choice


def _fastest_eligible(
    candidates: list[PropertyCandidate], default: PropertyCandidate
) -> PropertyCandidate | None:
    floor = default.agreement or 0
    eligible = [
        c for c in candidates if c.error is None and c.step_ms is not None and (c.agreement or 0) >= floor
    ]
    return min(eligible, key=lambda c: c.step_ms or 0.0) if eligible else None


def choose_properties(
    candidates: list[PropertyCandidate], default: PropertyCandidate, margin: float, confirm_rounds: int = 3
) -> tuple[dict[str, Any], str]:
    if default.error is not None or default.step_ms is None:
        return {}, f"not tuned: the plugin default did not run ({default.error})"
    fastest = _fastest_eligible(candidates, default)
    agreement = f"agreement {default.agreement}"
    if fastest is None or fastest is default:
        return {}, f"the default was the fastest of those with {agreement} or more"
    # Among the candidates the fastest is not clearly ahead of, the first in the pruning order that is
    # clearly faster than the default wins: noise in which of them came out on top changes nothing.
    floor = default.agreement or 0
    contenders = [
        c
        for c in candidates
        if c.step_ms is not None
        and c.error is None
        and (c.agreement or 0) >= floor
        and (c is fastest or not clearly_faster(fastest, c, margin))
    ]
    if default in contenders:
        contenders = []
    best = next((c for c in contenders if clearly_faster(c, default, margin, confirm_rounds)), fastest)
    ratio = (best.step_ms or 0.0) / default.step_ms
    if clearly_faster(best, default, margin, confirm_rounds):
        return dict(best.properties), (
            f"{ratio:.2f}x the default's step time ({best.step_ms:.3f} vs {default.step_ms:.3f} ms, every "
            f"one of {len(best.round_ms)} rounds faster), agreement {best.agreement} vs the default's "
            f"{default.agreement}"
        )
    return {}, (
        f"kept: the fastest with {agreement} or more ({best.label}, {ratio:.2f}x) is within noise "
        f"(spread {best.spread or 0:.0%} / {default.spread or 0:.0%} over {len(best.round_ms)} rounds)"
    )


def _essence(message: str) -> str:
    """The telling line of an OpenVINO exception (its first lines are source locations)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    telling = [line for line in lines if not line.startswith("Exception from ")]
    return (telling[-1] if telling else lines[0] if lines else "failed")[:200]


def _describe(candidate: PropertyCandidate) -> str:
    if candidate.error is not None:
        return candidate.error
    spread = "" if candidate.spread is None else f" ±{candidate.spread / 2:.0%}"
    return f"{candidate.step_ms:.3f} ms/step{spread}, agreement {candidate.agreement}"
