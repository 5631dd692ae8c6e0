"""Through the real engine, at one request: a drafter that always misses stops drafting, one that always
hits keeps drafting (``xpuspec.spec_decode.policy.drafting_payoff``).

Nothing here rests on this machine's timings: the engine runs on a simulated clock, which a target pass
advances by a fixed cost plus a cost per token and a drafting phase by a fixed cost, so whole steps with
drafting on and off have known rates. The cost model always wants γ = 2 where drafting is allowed, so
the payoff's decision alone decides whether a step drafts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import F32
from tests.engine.test_custom_drafter import ScriptedDrafter
from tests.support.engine_runs import run_engine
from xpuspec import SamplingParams
from xpuspec.core.proposal import Proposal, TokenDraw
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.engine.engine import EngineConfig, LLMEngine
from xpuspec.executor.paged_runner import PagedModelRunner
from xpuspec.models.bundle import ModelBundle
from xpuspec.spec_decode.policy.drafting_payoff import FIRST_CYCLE_STEPS, WorkKind

PROMPT = [5, 6, 7, 8]
MAX_TOKENS = 160
ADAPTIVE = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
PASS_SECONDS, TOKEN_SECONDS, DRAFTING_SECONDS = 0.010, 0.001, 0.003


class SimulatedClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedTarget:
    """The real target; each pass advances the clock by its simulated cost."""

    def __init__(self, runner: PagedModelRunner, clock: SimulatedClock) -> None:
        self._runner, self._clock = runner, clock

    def _charge(self, chunks: list[Any]) -> None:
        self._clock.now += PASS_SECONDS + TOKEN_SECONDS * sum(len(c.token_ids) + c.padding for c in chunks)

    def forward(self, chunks: list[Any]) -> Any:
        self._charge(chunks)
        return self._runner.forward(chunks)

    def start(self, chunks: list[Any]) -> None:
        self._charge(chunks)
        self._runner.start(chunks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


class TimedDrafter(ScriptedDrafter):
    def __init__(self, clock: SimulatedClock, continuations: dict[tuple[int, ...], list[int]] | None) -> None:
        super().__init__(continuations)
        self._clock = clock

    def propose(self, chunks: list[ScheduledChunk], draw: TokenDraw) -> dict[str, Proposal]:
        self._clock.now += DRAFTING_SECONDS
        return super().propose(chunks, draw)


def make_engine(pair_bundle: Path, continuation: list[int] | None) -> LLMEngine:
    clock = SimulatedClock()
    runner = PagedModelRunner(ModelBundle.open(pair_bundle).target.path, properties=F32, num_blocks=64)
    drafter = TimedDrafter(clock, None if continuation is None else {tuple(PROMPT): continuation})
    engine = LLMEngine(
        TimedTarget(runner, clock),  # type: ignore[arg-type]
        drafter,
        EngineConfig(max_num_seqs=4, max_model_len=256, prompt_lookup=False),
        [],
        clock=clock,
    )
    engine.policy.length_policy.best = lambda *args, **kwargs: (2, 1e9)  # type: ignore[method-assign]
    return engine


@pytest.fixture(scope="module")
def target_only(pair_bundle) -> list[int]:
    runner = PagedModelRunner(ModelBundle.open(pair_bundle).target.path, properties=F32, num_blocks=64)
    engine = LLMEngine(runner, None, EngineConfig(max_num_seqs=4, max_model_len=256), [])
    return run_engine(engine, [PROMPT], ADAPTIVE)[0][0]


def test_a_drafter_that_always_misses_stops_drafting(pair_bundle, target_only):
    engine = make_engine(pair_bundle, None)  # repeats the last token: these prompts never accept it
    tokens, stats = run_engine(engine, [PROMPT], ADAPTIVE)
    assert tokens[0] == target_only
    payoff = engine.policy.draft_choice.payoff
    on, off = payoff.rates(1, WorkKind.FREE)
    assert 0 < on < off
    assert not payoff.pays(1, WorkKind.FREE)
    # It drafted in its first cycle (so the test can fail), then only in the rare probes.
    assert 0 < stats[0].verification_steps < FIRST_CYCLE_STEPS + MAX_TOKENS // 8


def test_a_drafter_that_always_hits_keeps_drafting(pair_bundle, target_only):
    engine = make_engine(pair_bundle, target_only)  # an oracle of the target's own output
    tokens, stats = run_engine(engine, [PROMPT], ADAPTIVE)
    assert tokens[0] == target_only
    payoff = engine.policy.draft_choice.payoff
    on, off = payoff.rates(1, WorkKind.FREE)
    # Its steps beat the plain steps' predicted rate by more than CLEAR_WIN: no step went without
    # drafts to measure them.
    assert on > 0 and off == 0.0
    assert payoff.pays(1, WorkKind.FREE)
    assert stats[0].accepted == stats[0].drafted > MAX_TOKENS // 2
