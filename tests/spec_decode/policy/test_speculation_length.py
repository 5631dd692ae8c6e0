"""Speculation length: Leviathan et al.'s formulas, the online cost fits, acceptance tracking, the policy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xpuspec.spec_decode.policy.acceptance import AcceptanceRates, AcceptanceTracker
from xpuspec.spec_decode.policy.cost_model import (
    SHAPE_CHANGE_HORIZON_STEPS,
    CostModel,
    LinearCostFit,
    expected_speedup,
    expected_tokens_per_step,
)
from xpuspec.spec_decode.policy.speculation_length import COSTS_REFRESH_RECORDS, SpeculationLengthPolicy


def _cost_model(target_fixed: float, target_per_token: float, draft_fixed: float) -> CostModel:
    """A cost model fitted from exact measurements of the given linear costs."""
    model = CostModel()
    for num_tokens in (1, 4, 16, 64, 256):
        for _ in range(30):
            model.record_target_step(num_tokens, target_fixed + target_per_token * num_tokens)
    for num_sequences in (1, 2, 8, 32):
        for _ in range(30):
            model.record_draft_step(num_sequences, draft_fixed)
    return model


# Memory-bound target: extra verified tokens are nearly free; a draft step costs 5% of it.
CHEAP_TOKENS = _cost_model(target_fixed=0.1, target_per_token=1e-5, draft_fixed=0.005)


@pytest.mark.parametrize(("alpha", "gamma"), [(0.0, 3), (0.5, 0), (0.5, 4), (0.9, 8), (0.999, 5)])
def test_expected_tokens_matches_closed_form(alpha: float, gamma: int) -> None:
    assert expected_tokens_per_step(alpha, gamma) == pytest.approx((1 - alpha ** (gamma + 1)) / (1 - alpha))


def test_expected_speedup_limits() -> None:
    assert expected_speedup(1.0, 4, 0.0) == pytest.approx(5.0)  # α → 1, free draft: γ + 1
    assert expected_speedup(1.0, 4, 0.25) == pytest.approx(5.0 / 2.0)  # α → 1: (γ+1)/(γc+1)
    assert expected_speedup(1.0 - 1e-12, 4, 0.25) == pytest.approx(2.5)
    assert expected_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)  # nothing accepted: pure overhead
    assert expected_speedup(0.7, 0, 0.3) == 1.0  # no speculation: no change
    # Leviathan et al., Table/Figure 3 regime: α=0.8, c=0.05, γ=4 → about 3x.
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))


def test_linear_fit_recovers_a_line_and_uses_the_prior_before_data() -> None:
    fit = LinearCostFit(prior_intercept=0.02, prior_slope=0.001)
    assert fit(10) == pytest.approx(0.03)
    for size in np.tile([1, 8, 32, 128], 50):
        fit.record(size, 0.05 + 0.0002 * size)
    assert fit.intercept == pytest.approx(0.05, rel=0.02)
    assert fit.slope == pytest.approx(0.0002, rel=0.02)


def test_linear_fit_keeps_the_prior_slope_when_all_sizes_are_equal() -> None:
    fit = LinearCostFit(prior_intercept=0.02, prior_slope=0.001)
    for _ in range(100):
        fit.record(4, 0.2)
    assert fit(4) == pytest.approx(0.2, rel=0.01)
    assert fit.slope == pytest.approx(0.001, rel=0.05)


def test_linear_fit_never_goes_negative_and_forgets_old_regimes() -> None:
    fit = LinearCostFit(prior_intercept=0.01, prior_slope=0.001, decay=0.9)
    for size in np.tile([1, 100], 50):
        fit.record(size, 0.5 - 0.004 * size)  # noisy data suggesting a negative slope
    assert fit.slope == 0.0 and fit.intercept > 0
    for size in np.tile([1, 100], 100):
        fit.record(size, 0.01 + 0.001 * size)
    assert fit(100) == pytest.approx(0.11, rel=0.05)


def test_acceptance_tracker_estimates_the_per_token_rate() -> None:
    rng = np.random.default_rng(0)
    alpha, num_drafts = 0.8, 8
    tracker = AcceptanceTracker(prior=0.3, decay=0.999)
    for _ in range(2000):
        accepted = 0
        while accepted < num_drafts and rng.random() < alpha:
            accepted += 1
        tracker.update(num_drafts, accepted)
    assert tracker.rate == pytest.approx(alpha, abs=0.03)  # accepted/drafted would give ~0.5


def test_acceptance_tracker_prior_and_relaxation() -> None:
    tracker = AcceptanceTracker(prior=0.6)
    assert tracker.rate == 0.6
    for _ in range(20):
        tracker.update(4, 0)
    low = tracker.rate
    assert low < 0.2
    for _ in range(50):
        tracker.update(0, 0)  # not speculating: drift back towards the prior, slowly
    assert tracker.rate < 0.3  # a retry changes the step's shape twice: not every few steps
    for _ in range(500):
        tracker.update(0, 0)
    assert tracker.rate > 0.5
    with pytest.raises(ValueError):
        tracker.update(2, 3)


def test_high_acceptance_and_cheap_draft_speculate_more() -> None:
    policy = SpeculationLengthPolicy(max_draft_tokens=8, cost_model=CHEAP_TOKENS)
    high = policy.choose(acceptance_rate=0.9, batch_tokens=1, num_sequences=1)
    medium = policy.choose(acceptance_rate=0.6, batch_tokens=1, num_sequences=1)
    assert high >= 6
    assert 1 <= medium < high


def test_hopeless_acceptance_does_not_speculate() -> None:
    policy = SpeculationLengthPolicy(cost_model=CHEAP_TOKENS)
    assert policy.choose(acceptance_rate=0.0, batch_tokens=1, num_sequences=1) == 0
    assert policy.choose(acceptance_rate=0.03, batch_tokens=1, num_sequences=1) == 0


def test_expensive_draft_speculates_less() -> None:
    expensive_draft = _cost_model(target_fixed=0.1, target_per_token=1e-5, draft_fixed=0.05)
    cheap = SpeculationLengthPolicy(cost_model=CHEAP_TOKENS).choose(0.7, 1, 1)
    expensive = SpeculationLengthPolicy(cost_model=expensive_draft).choose(0.7, 1, 1)
    assert expensive < cheap


def test_large_batch_with_per_token_target_cost_speculates_less() -> None:
    compute_bound = _cost_model(target_fixed=0.05, target_per_token=0.002, draft_fixed=0.005)
    policy = SpeculationLengthPolicy(cost_model=compute_bound)
    chosen = [policy.choose(0.7, batch_tokens=size, num_sequences=size) for size in (1, 4, 16, 64, 256)]
    assert chosen == sorted(chosen, reverse=True)
    assert chosen[0] >= 2 and chosen[-1] == 0


def test_gamma_is_monotone_in_acceptance_rate() -> None:
    for cost_model in (CHEAP_TOKENS, _cost_model(0.05, 0.002, 0.01)):
        policy = SpeculationLengthPolicy(max_draft_tokens=12, cost_model=cost_model)
        for num_sequences in (1, 8, 64):
            chosen = [policy.choose(alpha, num_sequences, num_sequences) for alpha in np.linspace(0, 1, 41)]
            assert chosen == sorted(chosen)


def test_full_acceptance_with_free_tokens_uses_the_maximum() -> None:
    policy = SpeculationLengthPolicy(max_draft_tokens=5, cost_model=CHEAP_TOKENS)
    assert policy.choose(1.0, 1, 1) == 5
    assert SpeculationLengthPolicy(max_draft_tokens=0, cost_model=CHEAP_TOKENS).choose(1.0, 1, 1) == 0


def test_choice_agrees_with_leviathan_formula_for_a_flat_target() -> None:
    """With a target whose cost does not grow with tokens, the rate is the speedup formula's."""
    policy = SpeculationLengthPolicy(max_draft_tokens=10, cost_model=CHEAP_TOKENS, min_speedup=1.0)
    cost_ratio = CHEAP_TOKENS.draft_cost(1) / CHEAP_TOKENS.target_cost(1)
    for alpha in (0.5, 0.7, 0.9):
        best = max(range(11), key=lambda gamma: expected_speedup(alpha, gamma, cost_ratio))
        assert abs(policy.choose(alpha, 1, 1) - best) <= 1  # the target's tiny per-token cost may shift it
        assert math.isclose(
            policy.tokens_per_second(alpha, 0, 1, 1) * expected_speedup(alpha, 3, cost_ratio),
            policy.tokens_per_second(alpha, 3, 1, 1),
            rel_tol=1e-3,
        )


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="acceptance_rate"):
        SpeculationLengthPolicy().choose(1.5, 1, 1)
    with pytest.raises(ValueError, match="max_draft_tokens"):
        SpeculationLengthPolicy(max_draft_tokens=-1)
    with pytest.raises(ValueError, match="decay"):
        LinearCostFit(0.1, 0.1, decay=0.0)


def test_acceptance_rates_keep_one_tracker_per_request() -> None:
    rates = AcceptanceRates(prior=0.5)
    rates.update("a", 4, 4)
    rates.update("b", 4, 0)
    assert rates.rate("a") > 0.5 > rates.rate("b")
    rates.forget("a")
    assert rates.rate("a") == 0.5


def test_choose_without_timing_ignores_measurements() -> None:
    policy = SpeculationLengthPolicy(cost_model=_cost_model(0.01, 0.0, draft_fixed=0.01))
    untimed = [policy.choose_without_timing(alpha) for alpha in (0.2, 0.6, 0.9)]
    assert untimed == sorted(untimed) and untimed[-1] > 0
    assert policy.choose(0.9, 1, 1) != untimed[-1]  # the measured costs would choose differently
    assert [policy.choose_without_timing(alpha) for alpha in (0.2, 0.6, 0.9)] == untimed


def _curve_model(verify_ms: dict[int, float], draft_ms: float, python_ms: float = 0.0) -> CostModel:
    """A cost model measured online: decode steps verifying n tokens, plain single-token draft passes."""
    model = CostModel()
    for _ in range(20):
        for n, ms in verify_ms.items():
            model.record_target_step(n, ms / 1000, num_sequences=1)
        passes = [(1, draft_ms / 1000)] * 4
        model.record_drafting(passes, 4 * (draft_ms + python_ms) / 1000)
    return model


# A tiny pair (the demo's shape): one token 1.0 ms, any multi-token verification >= 1.65 ms, and a
# draft pass almost half a target step. Single-token costs alone (c = 0.45) predict 1.5x at α = 0.83.
TINY = {1: 1.0, **{n: 1.6 + 0.05 * n for n in range(2, 10)}}


def test_the_policy_reads_the_verification_cost_by_tokens_and_does_not_draft_where_it_loses() -> None:
    model = _curve_model(TINY, draft_ms=0.45)
    assert model.target_cost(5, num_sequences=1) == pytest.approx(1.85e-3)
    assert model.step_cost(4, batch_tokens=1, num_sequences=1) == pytest.approx(1.85e-3 + 4 * 0.45e-3)
    assert expected_speedup(0.83, 4, 0.45) > 1.0  # the single-token view would draft
    policy = SpeculationLengthPolicy(8, model)
    assert policy.choose(0.83, batch_tokens=1, num_sequences=1) == 0
    for gamma in range(1, 9):
        assert model.predicted_speedup(0.83, gamma) < 1.0
    # Near-certain acceptance pays even here.
    assert policy.choose(0.99, batch_tokens=1, num_sequences=1) > 0


def test_a_flat_verification_curve_drafts_long() -> None:
    """A large target (memory bound): verifying 9 tokens costs little more than one; cheap draft."""
    model = _curve_model({n: 20.0 + 0.2 * n for n in range(1, 10)}, draft_ms=1.0)
    policy = SpeculationLengthPolicy(8, model)
    gamma = policy.choose(0.8, batch_tokens=1, num_sequences=1)
    assert gamma >= 4
    costs = policy.step_costs(1, 1)
    rates = [expected_tokens_per_step(0.8, g) / costs[g] for g in range(9)]
    assert gamma == int(np.argmax(rates))


def test_the_draft_loops_python_counts_per_drafted_token() -> None:
    lean = _curve_model(TINY, draft_ms=0.1)
    slow = _curve_model(TINY, draft_ms=0.1, python_ms=0.5)
    assert lean.draft_python == pytest.approx(0.0, abs=1e-9)
    assert slow.draft_python == pytest.approx(0.5e-3, rel=0.2)
    assert slow.draft_cost(1) == pytest.approx(lean.draft_cost(1) + slow.draft_python)
    lean_gamma = SpeculationLengthPolicy(8, lean).choose(0.9, 1, 1)
    assert lean_gamma > 0 and SpeculationLengthPolicy(8, slow).choose(0.9, 1, 1) < lean_gamma


def test_catch_up_passes_do_not_count_as_drafting_steps() -> None:
    model = CostModel()
    model.calibrate_draft(0.0004)
    model.record_drafting([(200, 0.02), (1, 0.0004), (1, 0.0004)], 0.0208)  # a 200-token catch-up first
    assert model.draft_passes.table(1)[1]["steps"] == 2
    assert model.draft_cost(1) == pytest.approx(0.0004, rel=0.01)


def test_policy_costs_are_cached_until_a_measurement_changes_them() -> None:
    model = _curve_model(TINY, draft_ms=0.45)
    policy = SpeculationLengthPolicy(8, model)
    first = policy.step_costs(1, 1)
    assert policy.step_costs(1, 1) is first
    model.record_target_step(2, 0.0001, num_sequences=1)
    assert policy.step_costs(1, 1) is first  # one step moves the estimates little: not recomputed
    assert policy.step_costs(2, 2) is not first  # another step shape is
    for _ in range(COSTS_REFRESH_RECORDS):
        model.record_target_step(2, 0.0001, num_sequences=1)
    refreshed = policy.step_costs(1, 1)
    assert refreshed is not first and refreshed[1] < first[1]


def test_mean_step_cost_uses_every_measured_step() -> None:
    model = _curve_model({1: 1.0, 5: 2.0}, draft_ms=0.5)
    model.record_target_step(5, 0.004, num_sequences=1)  # one slow step: the mean moves, not by much
    assert model.mean_step_cost(0) == pytest.approx(1e-3)
    assert model.mean_step_cost(4) == pytest.approx((20 * 2e-3 + 4e-3) / 21 + 4 * 0.5e-3, rel=0.01)


@pytest.mark.parametrize("measured", [TINY, {1: 1.0, 3: 2.0}, {4: 3.0}])
def test_step_costs_at_once_equal_one_by_one(measured: dict[int, float]) -> None:
    model = _curve_model(measured, draft_ms=0.3)
    for n in (2, 7):
        model.calibrate_target(1, n, 0.0015)
    for batch_tokens, num_sequences in ((1, 1), (40, 1), (2, 2)):
        at_once = model.step_costs(8, batch_tokens, num_sequences)
        assert at_once == pytest.approx([model.step_cost(g, batch_tokens, num_sequences) for g in range(9)])


def test_new_sequences_start_from_the_pooled_acceptance_unless_asked_for_the_fixed_prior() -> None:
    rates = AcceptanceRates(prior=0.6)
    for index in range(30):
        rates.update(f"old-{index}", 4, 0)  # a draft that is never accepted
        rates.update(f"old-{index}", 0, 0)  # steps without drafts leave the pool alone
        rates.forget(f"old-{index}")
    assert rates.pool.rate < 0.1
    rates.update("new", 0, 0)  # its prefill step, before it ever chose γ
    assert rates.rate("new", pooled_prior=True) < 0.1
    assert rates.rate("seeded") == pytest.approx(0.6)  # the fixed prior: repeatable
    policy = SpeculationLengthPolicy(8, _curve_model({n: 20.0 + 0.2 * n for n in range(1, 10)}, draft_ms=1.0))
    assert policy.choose(rates.rate("another", pooled_prior=True), 1, 1) == 0
    assert policy.choose(rates.rate("seeded"), 1, 1) > 0


def test_steps_that_change_shape_measure_the_change_not_the_curve() -> None:
    model = _curve_model(TINY, draft_ms=0.3)
    steady = model.verify.table(1)[3]["steps"]
    model.record_target_step(3, 0.0065, num_sequences=1, shape_changed=True)
    assert model.verify.table(1)[3]["steps"] == steady  # the curve describes steady steps
    assert model.shape_change == pytest.approx(0.1 * (0.0065 - model.target_cost(3, 1)))
    model.calibrate_shape_change(0.004)
    model.calibrate_shape_change(-0.001)  # a noisy sample: the median of the samples is kept
    model.calibrate_shape_change(0.005)
    assert model.shape_change == pytest.approx(0.004)


def test_a_costly_change_of_shape_keeps_gamma_where_it_is() -> None:
    """A large target: verifying 3 tokens costs little more than one, a draft pass is cheap, so at
    α = 0.3 γ = 1 or 2 pays ~20% per step. From γ = 0 the policy changes only if the change's share
    (shape_change / SHAPE_CHANGE_HORIZON_STEPS) does not eat the gain; staying costs nothing."""
    model = _curve_model({n: 10.0 + 0.5 * n for n in range(1, 10)}, draft_ms=0.3)
    policy = SpeculationLengthPolicy(8, model)
    free = policy.choose(0.3, 1, 1, previous_tokens_per_sequence=1)
    assert free > 0
    model.calibrate_shape_change(0.012)  # 12 ms: 3 ms per step over the horizon
    assert policy.choose(0.3, 1, 1, previous_tokens_per_sequence=1) == 0  # stays at γ = 0
    assert policy.choose(0.3, 1, 1, previous_tokens_per_sequence=free + 1) == free  # stays at γ
    assert policy.choose(0.3, 1, 1) == free  # a new batch: every γ changes the shape alike
    costs = policy.step_costs(1, 1, previous_tokens_per_sequence=1)
    assert costs[0] == pytest.approx(model.target_cost(1, 1))
    assert costs[free] == pytest.approx(model.step_cost(free, 1, 1) + 0.012 / SHAPE_CHANGE_HORIZON_STEPS)


def test_on_a_decode_lane_gamma_zero_pays_no_change_after_a_verification() -> None:
    """With a decode lane the one-token step runs on a copy of its own: leaving a verification for
    γ = 0 costs no change, so a costly change no longer holds γ above 0 where drafting loses."""
    model = _curve_model({n: 10.0 + 0.5 * n for n in range(1, 10)}, draft_ms=0.3)
    model.calibrate_shape_change(0.012)
    policy = SpeculationLengthPolicy(8, model)
    costs = policy.step_costs(1, 1, previous_tokens_per_sequence=3)
    assert costs[0] == pytest.approx(model.target_cost(1, 1) + 0.012 / SHAPE_CHANGE_HORIZON_STEPS)
    model.decode_lane = True
    model.calibrate_shape_change(0.012)  # a calibration: the policy's cached costs are recomputed
    costs = policy.step_costs(1, 1, previous_tokens_per_sequence=3)
    assert costs[0] == pytest.approx(model.target_cost(1, 1))
    assert costs[2] == pytest.approx(model.step_cost(2, 1, 1))  # the main copy's shape kept
    assert costs[3] == pytest.approx(model.step_cost(3, 1, 1) + 0.012 / SHAPE_CHANGE_HORIZON_STEPS)


def test_the_drafting_phase_is_costed_by_gamma_as_measured() -> None:
    """A catch-up pass and a cold first pass make drafting dearer than γ one-token passes: the
    policy reads the measured phase by γ; a resume after a stretch of γ = 0 is left out of it."""
    model = _curve_model(TINY, draft_ms=0.2)
    assert model.drafting_cost(2, 1) == pytest.approx(2 * model.draft_cost(1))  # nothing measured yet
    for _ in range(10):
        model.record_drafting([(2, 0.0007), (1, 0.0002)], 0.0011, num_sequences=1, gamma=2)
    assert model.drafting_cost(2, 1) == pytest.approx(0.0011)
    model.record_drafting([(200, 0.02), (1, 0.0002)], 0.0205, num_sequences=1, gamma=2)  # a resume
    assert model.drafting_cost(2, 1) == pytest.approx(0.0011)
    assert model.step_costs(4, 1, 1)[2] == pytest.approx(model.target_cost(3, 1) + 0.0011)
    assert model.step_cost(2, 1, 1) == pytest.approx(model.target_cost(3, 1) + 0.0011)
    assert model.mean_step_cost(2) == pytest.approx(model.verify.table(1)[3]["mean"] + 0.0011)
    # Other γ follow the measured one through the calibrated shape, or γ passes before any.
    model.calibrate_drafting(1, 1, 0.0005)
    model.calibrate_drafting(1, 2, 0.0008)
    assert 0.0005 <= model.drafting_cost(1, 1) < model.drafting_cost(2, 1)


def test_padded_steps_shrink_once_their_padding_has_cost_a_change_there_and_back() -> None:
    model = CostModel()
    for tokens in range(1, 6):  # 1 ms and 0.1 ms more per verified token
        model.calibrate_target(1, tokens, 1e-3 + 1e-4 * (tokens - 1))
    model.calibrate_shape_change(1e-3)
    # From 5 tokens to 1 the padding costs 0.4 ms a step: more than 2 changes after 6 steps.
    assert [model.shrink_pays(5, 1, 1, steps) for steps in range(1, 8)] == [False] * 5 + [True] * 2
    # Needing 4 of the 5, a lull must last over 20 steps.
    assert not model.shrink_pays(5, 4, 1, 19) and model.shrink_pays(5, 4, 1, 21)


def test_a_step_between_two_multiples_of_the_batch_is_read_between_them_on_the_curve() -> None:
    """Sequences verifying different numbers of tokens (lookups, padding) make step sizes that are no
    multiple of the batch: they are priced on the curve, not by the line fitted over prefills too
    (which put 9 tokens at 2.38 ms where the curve put 8 at 1.70 on the demo pair at batch 4)."""
    model = CostModel()
    for tokens, seconds in ((1, 1.0e-3), (2, 1.2e-3), (3, 1.6e-3)):
        for _ in range(3):
            model.record_target_step(4 * tokens, seconds, num_sequences=4)
    model.record_target_step(60, 9e-3)  # a prefill: the line is far steeper than the curve
    assert model.target_cost(8, 4) == pytest.approx(1.2e-3)
    assert model.target_cost(9, 4) == pytest.approx(1.3e-3)  # a quarter of the way from 8 to 12
    assert model.target_cost(11, 4) == pytest.approx(1.5e-3)
    assert model.target_cost(9, 4) < model.target(9)
    assert model.target_cost(9) == model.target(9)  # no batch: the line
