"""Deterministic replay of adaptive γ over greedy acceptance traces and a given cost curve.

Wall-clock benchmarks of adaptive γ on a shared CPU are noisy (±10% per round), which hides the 5%
effects a policy change makes. This replay runs the real :class:`~xpuspec.engine.engine.LLMEngine`
(its scheduler, :class:`~xpuspec.spec_decode.policy.speculation_length.SpeculationLengthPolicy`, acceptance
tracking, cost model, calibration and probes: what ships) against a simulated target and draft on a
simulated clock:

- the target's greedy tokens and the draft's teacher-forced greedy agreement come from a trace
  (:mod:`research.bench.acceptance_traces`): a chain of γ drafts started at continuation token i is
  accepted for exactly ``min(γ, run of matches from i)`` tokens, as in the real greedy run;
- every target pass advances the clock by the curve's verification cost for its tokens (plus the
  shape-change cost when its token count differs from the previous pass's); every drafting phase
  by the curve's drafting cost for γ, reported to the engine as passes plus the loop's Python, as
  the real draft proposer does.

It reports decode tokens per simulated second for target-only, every fixed γ and adaptive, per
cost curve. Run: ``python -m research.bench.policy_replay [TRACES.json ...]`` (default: the traces in
``research/bench/traces``, recorded on SmolLM2 and its draft and on the demo pair).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xpuspec.api.engine_driver import EngineDriver
from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.interfaces import DrafterCaps, ExecutorCaps
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.engine.engine import EngineConfig, LLMEngine
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.proposal import Proposal

#: Traces recorded with research.bench.acceptance_traces: SmolLM2-135M-Instruct and its shipped draft
#: on the 24 held-out instructions (α 0.31), the demo pair on 12 held-out code prompts (α 0.83).
SHIPPED_TRACES = [
    Path(__file__).resolve().parent / "traces" / name for name in ("smollm2_heldout.json", "demo_code.json")
]
VOCAB = 8
TARGET_TOKEN = 1  # every target token (only agreement matters, not which token it is)
WRONG_TOKEN = 2  # a draft that disagrees
PROMPT_TOKEN = 3
EOS = 7
MS = 1e-3


@dataclass(frozen=True)
class CostCurve:
    """Simulated costs in ms. ``verify_ms[n - 1]``: a decode step verifying n tokens (past the table,
    its last step grows by ``verify_slope_ms`` per token). Drafting γ tokens: a first pass
    ``first_draft_ms`` (its catch-up of k tokens adds ``catch_up_ms_per_token`` · (k - 1)), then
    ``next_draft_ms`` per further pass; each includes ``draft_python_ms`` of the loop's Python."""

    name: str
    verify_ms: tuple[float, ...]
    verify_slope_ms: float
    first_draft_ms: float
    next_draft_ms: float
    shape_change_ms: float
    draft_python_ms: float = 0.064
    catch_up_ms_per_token: float = 0.02
    prefill_ms_per_token: float = 0.15

    def verify(self, tokens: int) -> float:
        if tokens <= len(self.verify_ms):
            return self.verify_ms[tokens - 1]
        return self.verify_ms[-1] + self.verify_slope_ms * (tokens - len(self.verify_ms))

    def drafting(self, gamma: int) -> float:
        return 0.0 if gamma <= 0 else self.first_draft_ms + (gamma - 1) * self.next_draft_ms


#: This machine (2 cores, SmolLM2-135M bf16 target, its 3-layer draft): the engine's mean decode step.
HERE = CostCurve("here", (10.11, 10.71, 11.76, 13.74, 13.48, 13.67, 16.0, 16.4), 0.4, 1.67, 0.9, 4.5)
#: An AVX2 machine: verification dearer per token; shape change assumed as here.
AVX2 = CostCurve("avx2", (17.9, 21.9, 25.5, 29.0), 3.5, 1.5, 1.15, 4.5)
#: Verification nearly free per token: long γ should win with a good draft.
CHEAP_VERIFY = CostCurve("cheap-verify", tuple(10 + 0.2 * n for n in range(17)), 0.2, 1.67, 0.9, 4.5)
CURVES = {curve.name: curve for curve in (HERE, AVX2, CHEAP_VERIFY)}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SimulatedTarget:
    """A paged target whose greedy token is always TARGET_TOKEN; each pass costs the curve's time."""

    block_size = 16
    num_blocks = 4096
    vocab_size = VOCAB
    caps = ExecutorCaps()

    def __init__(self, curve: CostCurve, clock: Clock) -> None:
        self.curve, self.clock = curve, clock
        self._last_tokens: int | None = None
        self.shape_changes = 0
        self._started = np.zeros((0, VOCAB), dtype=np.float32)  # the logits of the last start()

    def forward(self, chunks: list[SequenceChunk]) -> np.ndarray:
        tokens = sum(len(c.token_ids) for c in chunks)
        decode = all(c.num_logits == len(c.token_ids) for c in chunks)
        per_sequence = tokens // max(len(chunks), 1)
        if decode:
            ms = self.curve.verify(per_sequence)
        else:
            ms = self.curve.verify(1) + self.curve.prefill_ms_per_token * tokens
        if self._last_tokens is not None and tokens != self._last_tokens:
            ms += self.curve.shape_change_ms
            self.shape_changes += 1
        self._last_tokens = tokens
        self.clock.now += ms * MS
        rows = sum(c.num_logits for c in chunks)
        logits = np.zeros((rows, VOCAB), dtype=np.float32)
        logits[:, TARGET_TOKEN] = 1.0
        return logits

    def start(self, chunks: list[SequenceChunk]) -> None:
        self._started = self.forward(chunks)

    def wait(self) -> np.ndarray:
        return self._started

    def warm_up(self, max_model_len: int) -> None:
        pass

    def release(self, sequence_id: str) -> None:
        pass


class TraceDrafter:
    """Drafts TARGET_TOKEN where the trace says the draft agrees with the target, else WRONG_TOKEN."""

    caps = DrafterCaps()

    def __init__(self, curve: CostCurve, clock: Clock) -> None:
        self.curve, self.clock = curve, clock
        self.matches: dict[str, Seq[int]] = {}
        self.step_timings: list[tuple[int, float]] = []
        self.gammas: dict[int, int] = {}  # drafting phases by γ

    def release(self, sequence_id: str) -> None:
        pass

    def recover(self) -> None:
        pass

    def warm_up(self, max_model_len: int) -> None:
        pass

    def measure_step_seconds(self, context: int = 1, tokens: int = 1) -> float:
        python = self.curve.draft_python_ms
        if tokens > 1:  # the calibration's first pass: a catch-up of ``tokens``
            ms = self.curve.first_draft_ms + self.curve.catch_up_ms_per_token * (tokens - 2) - python
        else:
            ms = self.curve.next_draft_ms - python
        return ms * MS

    def propose(self, chunks: list[ScheduledChunk], draw: Any) -> dict[str, Proposal]:
        curve = self.curve
        proposals: dict[str, Proposal] = {}
        timings: list[tuple[int, float]] = []
        wall = 0.0
        for chunk in chunks:  # batch 1 in this replay: one sequence at a time
            gamma = chunk.num_draft_tokens
            if gamma == 0:
                continue
            sequence = chunk.sequence
            caught_up = sequence.num_tokens - sequence.num_draft_computed_tokens
            sequence.num_draft_computed_tokens = sequence.num_tokens + gamma - 1
            first = curve.first_draft_ms + curve.catch_up_ms_per_token * max(caught_up - 2, 0)
            passes = [(caught_up, first)] + [(1, curve.next_draft_ms)] * (gamma - 1)
            timings += [(tokens, (ms - curve.draft_python_ms) * MS) for tokens, ms in passes]
            wall += sum(ms for _, ms in passes) * MS
            match = self.matches[sequence.request_id]
            start = sequence.num_tokens - sequence.num_prompt_tokens
            token_ids = [
                TARGET_TOKEN if start + j < len(match) and match[start + j] else WRONG_TOKEN
                for j in range(gamma)
            ]
            proposals[sequence.request_id] = Proposal(token_ids, None)
            self.gammas[gamma] = self.gammas.get(gamma, 0) + 1
        self.clock.now += wall
        self.step_timings = timings
        return proposals


@dataclass
class ReplayResult:
    tokens: int
    seconds: float  # decode time: from each request's first token to its last
    drafted: int
    accepted: int
    steps: int
    gamma_histogram: dict[int, int]
    shape_changes: int  # target passes whose token count differed from the previous pass's

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def replay(
    traces: Seq[dict[str, Any]], curve: CostCurve, num_draft_tokens: int | None, max_draft_tokens: int = 8
) -> ReplayResult:
    """Every trace in turn (batch 1) on one calibrated engine, as a latency benchmark runs them."""
    clock = Clock()
    drafter = TraceDrafter(curve, clock)
    target = SimulatedTarget(curve, clock)
    engine = LLMEngine(
        target,
        drafter,
        EngineConfig(
            max_draft_tokens=max_draft_tokens,
            enable_prefix_caching=False,
            decode_burst_steps=1,
            prompt_lookup=False,  # the traces give acceptance, not tokens to look up
        ),
        [EOS],
        clock=clock,
    )
    engine.calibrate()
    driver = EngineDriver(engine, tokenizer=None)  # synthetic models: tokens, no text
    target.shape_changes = 0
    histogram: dict[int, int] = {}
    tokens = drafted = accepted = steps = 0
    seconds = 0.0
    for index, trace in enumerate(traces):
        request_id = f"trace-{index}"
        match = trace["match"]
        drafter.matches[request_id] = match
        params = SamplingParams(
            max_tokens=len(match), temperature=0.0, ignore_eos=True, num_draft_tokens=num_draft_tokens
        )
        driver.add(request_id, [PROMPT_TOKEN] * int(trace.get("prompt_tokens", 32)), params)
        first_token_at = None
        drafter.gammas = {}  # the prefill step's drafting is left out, as its time is
        for step in driver.run([request_id]):
            output = step.output
            if first_token_at is None:
                first_token_at = clock.now
                drafter.gammas = {}
                continue
            steps += 1
            tokens += len(output.new_token_ids)
            if output.finished:
                drafted += output.stats.drafted
                accepted += output.stats.accepted
        seconds += clock.now - first_token_at
        for gamma, count in drafter.gammas.items():
            histogram[gamma] = histogram.get(gamma, 0) + count
    histogram[0] = steps - sum(histogram.values())
    return ReplayResult(
        tokens, seconds, drafted, accepted, steps, dict(sorted(histogram.items())), target.shape_changes
    )


def replay_table(
    traces: Seq[dict[str, Any]], curves: Seq[CostCurve], gammas: Seq[int]
) -> dict[str, dict[str, ReplayResult]]:
    """curve name -> mode ("target-only", "γ=k", "adaptive") -> result."""
    table: dict[str, dict[str, ReplayResult]] = {}
    for curve in curves:
        row = {"target-only": replay(traces, curve, 0)}
        row |= {f"γ={gamma}": replay(traces, curve, gamma) for gamma in gammas}
        row["adaptive"] = replay(traces, curve, None)
        table[curve.name] = row
    return table


def format_table(name: str, table: dict[str, dict[str, ReplayResult]]) -> str:
    lines = []
    for curve, row in table.items():
        fixed = max(r.tokens_per_s for mode, r in row.items() if mode != "adaptive")
        adaptive = row["adaptive"]
        cells = "  ".join(f"{mode} {r.tokens_per_s:6.1f}" for mode, r in row.items())
        lines.append(
            f"{name:>10} {curve:>12}: {cells}  | adaptive/best {adaptive.tokens_per_s / fixed - 1:+.1%}"
            f"  accepted/step {adaptive.accepted / max(adaptive.steps, 1):.2f}"
            f"  shape changes {adaptive.shape_changes}"
            f"  γ histogram {adaptive.gamma_histogram}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Replay adaptive γ over acceptance traces (simulated clock)."
    )
    parser.add_argument(
        "traces",
        nargs="*",
        type=Path,
        default=SHIPPED_TRACES,
        help="JSON from research.bench.acceptance_traces (default: the shipped SmolLM2 and demo traces)",
    )
    parser.add_argument("--curves", default=",".join(CURVES), help=f"comma-separated, of {sorted(CURVES)}")
    parser.add_argument("--gammas", default="1,2,3,4,5,6,7,8", help="fixed γ to compare with")
    args = parser.parse_args(argv)
    curves = [CURVES[name] for name in args.curves.split(",")]
    gammas = [int(g) for g in args.gammas.split(",")]
    for path in args.traces:
        data = json.loads(path.read_text(encoding="utf-8"))
        name = f"{data.get('bundle', path.stem)} α={data.get('greedy_match_rate', float('nan')):.2f}"
        print(format_table(name, replay_table(data["traces"], curves, gammas)), flush=True)


if __name__ == "__main__":
    main()
