"""DraftingPayoff: adaptive drafting at a batch and kind of work stops where its whole steps gave fewer
tokens per second than steps without it, and comes back where they give more; batch 1 included."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import EXACT_PRESET
from tests.engine.test_exactness import PROMPTS
from xpuspec import Pipeline, SamplingParams
from xpuspec.spec_decode.policy import drafting_payoff
from xpuspec.spec_decode.policy.drafting_payoff import (
    CYCLE_STEPS,
    FIRST_CYCLE_STEPS,
    MAX_CYCLE_STEPS,
    PROBE_OFF_STEPS,
    DraftingPayoff,
    WorkKind,
)

FREE, COPY = WorkKind.FREE, WorkKind.COPY


def run(
    payoff: DraftingPayoff,
    steps: int,
    on_rate: float,
    off_rate: float,
    batch: int = 4,
    kind: WorkKind = FREE,
) -> list[bool]:
    """``steps`` steps at ``batch`` sequences, each emitting tokens at the rate of its way; the ways."""
    ways = []
    for _ in range(steps):
        way = payoff.pays(batch, kind)
        payoff.record(batch, kind, way, round(1000 * (on_rate if way else off_rate)), 1.0)
        ways.append(way)
    return ways


def test_batch_one_is_measured_as_every_batch_is() -> None:
    payoff = DraftingPayoff()
    ways = run(payoff, 3 * CYCLE_STEPS, on_rate=1.0, off_rate=5.0, batch=1)
    assert ways[: FIRST_CYCLE_STEPS - PROBE_OFF_STEPS] == [True] * (FIRST_CYCLE_STEPS - PROBE_OFF_STEPS)
    assert ways[FIRST_CYCLE_STEPS : 2 * FIRST_CYCLE_STEPS] == [False] * FIRST_CYCLE_STEPS
    assert payoff.rates(1, FREE) == (pytest.approx(1000), pytest.approx(5000))


def test_kinds_of_work_are_measured_apart() -> None:
    """Where a lookup finds text to copy drafting pays; where only the draft model drafts it loses: each
    kind keeps its own way, however the steps of both interleave."""
    payoff = DraftingPayoff()
    ways: dict[WorkKind, list[bool]] = {COPY: [], FREE: []}
    for step in range(6 * CYCLE_STEPS):
        kind = COPY if step % 3 else FREE
        ways[kind] += run(payoff, 1, on_rate=2.0 if kind is COPY else 0.6, off_rate=1.0, batch=1, kind=kind)
    assert ways[COPY][-CYCLE_STEPS:].count(True) >= CYCLE_STEPS - PROBE_OFF_STEPS
    assert ways[FREE][-CYCLE_STEPS:].count(False) >= CYCLE_STEPS // 2 - drafting_payoff.PROBE_ON_STEPS
    assert payoff.rates(1, COPY)[0] > payoff.rates(1, COPY)[1]
    assert payoff.rates(1, FREE)[0] < payoff.rates(1, FREE)[1]


def test_drafting_that_loses_stops_after_a_cycle_and_is_retried_ever_more_rarely() -> None:
    payoff = DraftingPayoff()
    first = run(payoff, FIRST_CYCLE_STEPS, on_rate=0.7, off_rate=1.0)
    # A new bucket drafts, and measures the other way in its short first cycle's last steps.
    assert first == [True] * (FIRST_CYCLE_STEPS - PROBE_OFF_STEPS) + [False] * PROBE_OFF_STEPS
    on, off = payoff.rates(4, FREE)
    assert on == pytest.approx(700) and off == pytest.approx(1000)
    # Stopped: the next cycles draft only in their probe steps, and each confirmation doubles them.
    later = run(payoff, 4 * MAX_CYCLE_STEPS, on_rate=0.7, off_rate=1.0)
    drafted = [i for i, way in enumerate(later) if way]
    assert 0 < len(drafted) < 0.1 * len(later)
    assert later[: CYCLE_STEPS - drafting_payoff.PROBE_ON_STEPS] == [False] * (
        CYCLE_STEPS - drafting_payoff.PROBE_ON_STEPS
    )
    gaps = [b - a for a, b in zip(drafted, drafted[1:], strict=False) if b - a > 1]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]


def test_drafting_within_the_margin_stays_on_and_drafting_that_recovers_comes_back() -> None:
    payoff = DraftingPayoff()
    ways = run(payoff, 3 * CYCLE_STEPS, on_rate=0.97, off_rate=1.0)  # within MARGIN: a draw
    assert all(ways[: FIRST_CYCLE_STEPS - PROBE_OFF_STEPS]) and sum(ways) > 0.85 * len(ways)
    payoff = DraftingPayoff()
    run(payoff, 2 * CYCLE_STEPS, on_rate=0.5, off_rate=1.0)
    assert not payoff.pays(4, FREE)
    recovered = run(payoff, 4 * MAX_CYCLE_STEPS, on_rate=1.5, off_rate=1.0)
    assert recovered[-CYCLE_STEPS:].count(True) >= CYCLE_STEPS - PROBE_OFF_STEPS


def test_the_first_step_after_a_switch_is_left_out() -> None:
    """It pays the change of shapes whichever way it runs."""
    payoff = DraftingPayoff()
    payoff.pays(4, FREE)
    payoff.record(4, FREE, True, 1, 1.0)  # the bucket's first step: nothing before it to compare
    payoff.record(4, FREE, False, 1000, 1.0)  # a switch
    assert payoff.rates(4, FREE) == (0.0, 0.0)
    payoff.record(4, FREE, False, 7, 1.0)
    assert payoff.rates(4, FREE) == (0.0, pytest.approx(7.0))


def test_nothing_is_decided_before_both_ways_are_measured() -> None:
    payoff = DraftingPayoff()
    payoff.pays(4, FREE)
    for _ in range(10 * CYCLE_STEPS):
        payoff.record(4, FREE, True, 1, 1.0)  # never a step without drafting: "off" stays unmeasured
    assert payoff.pays(4, FREE) or payoff.rates(4, FREE)[1] == 0.0


@pytest.fixture(scope="module")
def pipe(pair_bundle) -> Pipeline:
    """Adaptive γ that always wants 2 drafts where it may draft: what the payoff gates, and nothing
    that depends on this machine's timings."""
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    choice = pipe.engine.policy.draft_choice
    choice.prompt_lookup = None
    choice.length_policy.best = lambda *args, **kwargs: (2, 1e9)
    return pipe


def test_the_engine_stops_adaptive_drafting_at_a_batch_where_it_lost(pipe) -> None:
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    expected = [pipe.generate(prompt, params)[0].token_ids for prompt in PROMPTS[:4]]
    # Only the measured payoff decides here, not the pricing of the batched step as a whole (its own
    # tests: test_batch_step.py).
    pipe.engine.policy.prices_batched_steps = False
    # A new bucket of 3-4 sequences drafts (the control: otherwise nothing below could fail).
    drafting = pipe.generate(PROMPTS[:4], params)
    assert [r.token_ids for r in drafting] == expected
    assert sum(r.stats["drafted"] for r in drafting) > 0
    payoff = pipe.engine.policy.draft_choice.payoff
    run(payoff, 2 * CYCLE_STEPS, on_rate=0.5, off_rate=1.0)  # ... then lost there
    while payoff._buckets[4, FREE].step:  # to a cycle's start, so no probe falls into the next request
        run(payoff, 1, on_rate=0.5, off_rate=1.0)
    assert not payoff.pays(4, FREE)
    results = pipe.generate(PROMPTS[:4], params)
    assert [r.token_ids for r in results] == expected
    assert sum(r.stats["drafted"] for r in results) == 0
    assert payoff._buckets[4, FREE].step > 0, "the engine's steps were not recorded"
    # A greedy request's seed changes nothing: it is adaptive like the others (clients often send one).
    while payoff._buckets[4, FREE].step:
        run(payoff, 1, on_rate=0.5, off_rate=1.0)
    seeded = pipe.generate(PROMPTS[:4], dataclasses.replace(params, seed=7))
    assert [r.token_ids for r in seeded] == expected
    assert sum(r.stats["drafted"] for r in seeded) == 0
    # A fixed γ keeps its drafts; a request alone (batch 1) is measured in a bucket of its own, which
    # a new engine's first request finds untried: it drafts.
    fixed = pipe.generate(PROMPTS[:4], dataclasses.replace(params, num_draft_tokens=2))
    assert [r.token_ids for r in fixed] == expected and sum(r.stats["drafted"] for r in fixed) > 0
    payoff._buckets.pop((1, FREE), None)
    assert pipe.generate(PROMPTS[0], params)[0].stats["drafted"] > 0
    assert not payoff.pays(4, FREE)


def test_a_clear_win_over_the_predicted_plain_rate_skips_the_probes() -> None:
    """Drafting whose steps give CLEAR_WIN times the plain steps' predicted rate never probes steps
    without drafts; one that gives less does."""
    for on_rate, probes in ((2.5, 0), (1.5, PROBE_OFF_STEPS)):
        payoff = DraftingPayoff()
        ways = []
        for _ in range(FIRST_CYCLE_STEPS):
            way = payoff.pays(1, COPY)
            payoff.record(1, COPY, way, round(1000 * (on_rate if way else 1.0)), 1.0, plain_rate=1000.0)
            ways.append(way)
        assert ways.count(False) == probes
