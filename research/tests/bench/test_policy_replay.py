"""The adaptive-γ replay (research.bench.policy_replay) on synthetic traces: what the shipped policy does
with a draft that is never right and with one that is always right. Simulated clock: no timing."""

from __future__ import annotations

import json

from research.bench.policy_replay import HERE, SHIPPED_TRACES, CostCurve, replay
from xpuspec.spec_decode.policy import drafting_payoff

NEVER = [{"prompt_tokens": 16, "match": [0] * 128} for _ in range(12)]
ALWAYS = [{"prompt_tokens": 16, "match": [1] * 96} for _ in range(3)]
#: Verification nearly free per token, drafting cheap: with a perfect draft, long γ wins.
CHEAP = CostCurve("cheap", tuple(10 + 0.2 * n for n in range(17)), 0.2, 1.0, 0.5, 4.5)


def test_a_draft_that_is_never_right_ends_at_gamma_0_within_1_percent_of_target_only():
    target_only = replay(NEVER, HERE, 0)
    adaptive = replay(NEVER, HERE, None)
    assert target_only.gamma_histogram == {0: target_only.steps}
    assert adaptive.accepted == 0
    assert adaptive.gamma_histogram[0] >= 0.97 * adaptive.steps  # a few probes and first steps
    assert adaptive.tokens_per_s >= 0.99 * target_only.tokens_per_s
    assert replay(NEVER, HERE, 1).tokens_per_s < target_only.tokens_per_s


def test_a_perfect_draft_with_cheap_verification_drafts_long():
    adaptive = replay(ALWAYS, CHEAP, None)
    assert adaptive.accepted == adaptive.drafted
    long_steps = sum(count for gamma, count in adaptive.gamma_histogram.items() if gamma >= 6)
    # A new engine measures steps without drafting once (the payoff's first probe), then drafts long.
    probes = drafting_payoff.PROBE_OFF_STEPS
    assert adaptive.gamma_histogram.get(0, 0) <= probes
    assert long_steps >= 0.8 * (adaptive.steps - probes)
    best_fixed = max(replay(ALWAYS, CHEAP, gamma).tokens_per_s for gamma in (0, 1, 2, 4, 8))
    assert adaptive.tokens_per_s >= 0.95 * best_fixed
    assert adaptive.tokens_per_s > 3 * replay(ALWAYS, CHEAP, 0).tokens_per_s


def test_the_replay_is_deterministic():
    traces = [{"prompt_tokens": 20, "match": [(i * 7) % 3 != 0 for i in range(64)]} for _ in range(2)]
    first, second = replay(traces, HERE, None), replay(traces, HERE, None)
    assert first == second


def test_on_the_default_models_trace_adaptive_gamma_keeps_up_with_the_best_fixed_gamma():
    """SmolLM2 and its draft (α 0.31) on this machine's measured costs: γ = 1 beats target-only by ~5%
    and γ = 2 loses; adaptive γ must come within 1% of the better (it ran 3.9% below before its
    acceptance estimate was shrunk towards the pooled rate and the 5% margin dropped)."""
    traces = json.loads(SHIPPED_TRACES[0].read_text(encoding="utf-8"))["traces"]
    best = max(replay(traces, HERE, gamma).tokens_per_s for gamma in (0, 1, 2))
    assert replay(traces, HERE, None).tokens_per_s >= 0.99 * best
