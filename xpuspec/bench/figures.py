"""What a benchmark measures: one request's timings, one configuration's summary, one load level."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from xpuspec.spec_decode.policy import expected_tokens_per_step

OK = "ok"
SKIPPED = "skipped"


@dataclass
class RequestTiming:
    """One batch-1 request: its tokens, latencies and (where the engine reports them) speculation counts."""

    prompt_tokens: int
    token_ids: list[int]
    seconds: float  # wall time of the whole request
    ttft_s: float | None
    tpot_s: float | None  # mean gap between output tokens after the first
    drafted: int | None = None
    accepted: int | None = None
    # Draft tokens tested under Leviathan et al.'s model: accepted plus one rejected per step that
    # rejected; drafts after a rejection are never tested. accepted / tested estimates α.
    tested: int | None = None
    verification_steps: int | None = None
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _sum(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _add_lists(lists: list[list[int]]) -> list[int]:
    width = max((len(x) for x in lists), default=0)
    return [sum(x[i] for x in lists if i < len(x)) for i in range(width)]


@dataclass
class LatencyResult:
    """One batch-1 configuration over the rounds (which interleave configurations prompt by prompt).

    Its figures are those of each prompt's fastest run over the rounds, summed: on a shared machine
    interference only ever slows a run down, and a slow spell that spans part of a round would spoil
    a whole best round but only some prompts' runs.
    """

    name: str
    engine: str  # "xpuspec" | "OpenVINO GenAI" | "transformers" | "llama.cpp"
    draft_length: int | str | None  # None: target only; "adaptive"; or a fixed γ
    status: str = OK
    reason: str | None = None
    round_seconds: list[float] = field(default_factory=list)
    requests: list[RequestTiming] = field(default_factory=list)  # each prompt's fastest run
    prompt_seconds: list[list[float]] = field(default_factory=list)  # [round][prompt] wall seconds

    def record_round(self, timings: list[RequestTiming]) -> None:
        """One round: a run of every prompt, in prompt order."""
        if len(self.requests) != len(timings):
            self.requests = list(timings)
        else:
            pairs = zip(self.requests, timings, strict=True)
            self.requests = [min(kept, new, key=lambda t: t.seconds) for kept, new in pairs]
        self.round_seconds.append(sum(t.seconds for t in timings))
        self.prompt_seconds.append([t.seconds for t in timings])

    def summary(self) -> dict[str, Any]:
        """The figures of each prompt's fastest run; speed-ups are filled in by :func:`add_speedups`."""
        if self.status != OK:
            return {"status": self.status, "reason": self.reason}
        timings = self.requests
        tokens = sum(len(t.token_ids) for t in timings)
        seconds = sum(t.seconds for t in timings)
        drafted, accepted = _sum([t.drafted for t in timings]), _sum([t.accepted for t in timings])
        tested, steps = _sum([t.tested for t in timings]), _sum([t.verification_steps for t in timings])
        drafted_at = _add_lists([t.drafted_per_position for t in timings])
        accepted_at = _add_lists([t.accepted_per_position for t in timings])
        return {
            "status": OK,
            "requests": len(timings),
            "output_tokens": tokens,
            "seconds": seconds,
            "round_seconds": self.round_seconds,
            "prompt_seconds": self.prompt_seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else None,
            "ttft_ms": _ms(_median([t.ttft_s for t in timings])),
            "tpot_ms": _ms(_median([t.tpot_s for t in timings])),
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted and accepted is not None else None,
            "alpha": accepted / tested if tested and accepted is not None else None,
            "verification_steps": steps,
            "mean_draft_length": drafted / steps if drafted is not None and steps else None,
            "mean_accepted_per_step": accepted / steps if accepted is not None and steps else None,
            "drafted_per_position": drafted_at,
            "accepted_per_position": accepted_at,
            "acceptance_per_position": [
                a / d if d else None for a, d in zip(accepted_at, drafted_at, strict=True)
            ],
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def add_speedups(
    results: list[LatencyResult],
    summaries: dict[str, dict[str, Any]],
    step_costs: dict[str, dict[int, float]] | None = None,
    baseline_of: dict[str, str] | None = None,
) -> None:
    """Speed-up of each configuration over its engine's target-only run, and Leviathan's prediction.

    ``step_costs`` maps an engine to its measured mean seconds of a decode step by γ (γ drafting
    passes plus verifying γ + 1 tokens, the engine's Python included; from its cost curve). For a
    fixed-γ row the prediction is ``(1 − α^(γ+1)) / (1 − α) · step(0) / step(γ)`` at the
    row's measured α, compared with the measured decode speed-up ``TPOT(target-only) / TPOT(γ)``
    (TPOT: time per output token after the first, so prefill is left out of both). ``baseline_of``
    names, for an engine without target-only rows, the engine whose target-only run it is compared with.
    """
    baselines = {r.engine: summaries[r.name] for r in results if r.draft_length is None and r.status == OK}
    for result in results:
        summary = summaries[result.name]
        if result.status != OK:
            continue
        baseline = baselines.get(result.engine) or baselines.get(
            (baseline_of or {}).get(result.engine, ""), {}
        )
        rate, base_rate = summary.get("tokens_per_s"), baseline.get("tokens_per_s")
        summary["speedup"] = rate / base_rate if rate and base_rate else None
        summary["predicted_speedup"] = summary["decode_speedup"] = summary["measured_over_predicted"] = None
        base_tpot, tpot = baseline.get("tpot_ms"), summary.get("tpot_ms")
        if result.draft_length is None or not base_tpot or not tpot:
            continue
        summary["decode_speedup"] = base_tpot / tpot
        alpha = summary.get("alpha")
        costs = (step_costs or {}).get(result.engine, {})
        draft_length = result.draft_length
        if not isinstance(draft_length, int) or alpha is None:
            continue
        step, plain = costs.get(draft_length, 0.0), costs.get(0, 0.0)
        if not step or not plain:
            continue
        # Both steps from the same cost curve (means over the run): a fastest-round TPOT over a mean
        # step would credit the prediction with the machine's noise.
        predicted = expected_tokens_per_step(alpha, draft_length) * plain / step
        summary["predicted_speedup"] = predicted
        summary["measured_over_predicted"] = summary["decode_speedup"] / predicted


@dataclass
class LoadLevel:
    """One concurrency level of a load sweep."""

    concurrency: int
    requests: int
    output_tokens: int
    seconds: float
    ttft_ms: float | None = None  # median over requests
    tpot_ms: float | None = None
    errors: int = 0
    speculation: dict[str, Any] | None = None  # from the server's /metrics, this level only

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s}


@dataclass
class LoadResult:
    """One configuration's concurrency sweep."""

    name: str
    engine: str
    status: str = OK
    reason: str | None = None
    levels: list[LoadLevel] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "engine": self.engine, "status": self.status}
        if self.status != OK:
            data["reason"] = self.reason
        else:
            data["levels"] = [level.as_dict() for level in self.levels]
        return data
