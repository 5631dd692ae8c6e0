"""How the latency section pairs rows with their peer and with the exact reference (no timings run)."""

from __future__ import annotations

import pytest

from xpuspec.bench.figures import LatencyResult, RequestTiming
from xpuspec.bench.latency import genai_default_properties
from xpuspec.bench.latency_labels import (
    ADAPTIVE,
    GENAI,
    GENAI_DEFAULT,
    XPUSPEC,
    XPUSPEC_DEFAULT,
    XPUSPEC_EXACT,
    row_label,
)
from xpuspec.bench.latency_ratios import compare_tokens, peer_ratios


def _result(engine: str, length, tokens: list[list[int]], seconds: float) -> LatencyResult:
    result = LatencyResult(row_label(engine, length), engine, length)
    result.record_round([RequestTiming(3, ids, seconds / len(tokens), None, None) for ids in tokens])
    return result


def test_rows_pair_with_the_peer_of_their_group_and_the_exact_reference():
    exact = [[1, 2, 3], [4, 5, 6]]
    results = [
        _result(XPUSPEC_EXACT, None, exact, 2.0),
        _result(XPUSPEC, None, [[1, 2, 3], [4, 5, 7]], 1.0),  # 6 tokens/s
        _result(XPUSPEC, ADAPTIVE, exact, 0.5),  # 12 tokens/s
        _result(GENAI, None, exact, 2.0),  # 3 tokens/s
        _result(GENAI, 2, exact, 1.0),  # 6 tokens/s
        _result(GENAI, 4, exact, 0.75),  # 8 tokens/s: GenAI's best fixed γ
        _result(XPUSPEC_DEFAULT, None, exact, 0.5),  # 12 tokens/s
        _result(GENAI_DEFAULT, None, [[9, 9, 9], [4, 5, 6]], 1.5),  # 4 tokens/s
    ]
    summaries = {r.name: r.summary() for r in results}
    compare_tokens(results, summaries)
    peer_ratios(results, summaries)
    assert summaries["xpuspec target-only"]["same_tokens_as_exact"] == "1/2"
    assert summaries["OpenVINO GenAI default target-only"]["same_tokens_as_exact"] == "1/2"
    assert summaries["xpuspec exact target-only"]["same_tokens_as_exact"] == "2/2"
    # Speculative against the same engine's target-only row (the same properties).
    assert summaries["xpuspec speculative (adaptive γ)"]["same_tokens_as_target_only"] == "1/2"
    assert summaries["OpenVINO GenAI speculative (γ=2)"]["same_tokens_as_target_only"] == "2/2"
    assert "same_tokens_as_target_only" not in summaries["xpuspec target-only"]
    assert summaries["xpuspec target-only"]["ratio_to_peers"][GENAI] == 2.0  # same properties, same γ
    assert summaries["xpuspec speculative (adaptive γ)"]["ratio_to_peers"][GENAI] == 1.5  # vs GenAI's best
    assert summaries["xpuspec default target-only"]["ratio_to_peers"] == {GENAI: 3.0}  # vs GenAI's default
    assert "ratio_to_peers" not in summaries["OpenVINO GenAI target-only"]


def test_genai_defaults_are_explicit_cpu_plugin_defaults():
    properties = genai_default_properties()
    assert properties["INFERENCE_PRECISION_HINT"] in ("bf16", "f16", "f32")
    assert properties["KV_CACHE_PRECISION"] != "u8"  # GenAI's cache ports follow the compute precision
    assert isinstance(properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"], int)


def _timed(engine: str, length, tokens: int, tpot_s: float, drafted=0, accepted=0, tested=0):
    result = LatencyResult(row_label(engine, length), engine, length)
    timing = RequestTiming(3, list(range(tokens)), tokens * tpot_s, tpot_s, tpot_s)
    if drafted:
        timing.drafted, timing.accepted, timing.tested = drafted, accepted, tested
    result.record_round([timing])
    return result


def test_fixed_gamma_rows_carry_leviathans_prediction_from_the_measured_cost_curve():
    from xpuspec.bench.cost_curves import cost_curve, median_curve
    from xpuspec.bench.figures import add_speedups
    from xpuspec.spec_decode.policy.cost_model import CostModel, expected_tokens_per_step

    model = CostModel()
    for _ in range(10):
        model.record_target_step(1, 0.001, num_sequences=1)
        model.record_target_step(5, 0.002, num_sequences=1)
        model.record_drafting([(1, 0.0002)] * 4, 0.0008)
    curves = median_curve([cost_curve(model, 4), cost_curve(model, 4)])
    assert curves["step_ms"][4] == 2.0 + 4 * 0.2 and curves["verify_steps"] == {1: 10, 5: 10}
    # γ = 0 is the target-only run's mean step where that engine measured one
    target_only = CostModel()
    assert cost_curve(model, 4, target_only)["step_ms"][0] == pytest.approx(1.0)  # nothing measured
    target_only.record_target_step(1, 0.0015, num_sequences=1)
    assert cost_curve(model, 4, target_only)["step_ms"][0] == pytest.approx(1.5)
    alpha = 0.8  # 8 accepted of 10 tested
    results = [
        # target-only's fastest round ran faster than the run's mean 1-token step (1.0 ms)
        _timed(XPUSPEC, None, 64, 0.0008),
        _timed(XPUSPEC, 4, 64, 0.0009, drafted=16, accepted=8, tested=10),
        _timed(GENAI, None, 64, 0.001),
        _timed(GENAI, 4, 64, 0.0008, drafted=16, accepted=8, tested=10),
    ]
    summaries = {r.name: r.summary() for r in results}
    add_speedups(results, summaries, {XPUSPEC: {g: ms / 1000 for g, ms in curves["step_ms"].items()}})
    row = summaries["xpuspec speculative (γ=4)"]
    predicted = expected_tokens_per_step(alpha, 4) * 1.0 / 2.8  # step(0) / step(4), one curve
    assert row["predicted_speedup"] == pytest.approx(predicted)
    assert row["decode_speedup"] == pytest.approx(0.8 / 0.9)
    assert row["measured_over_predicted"] == pytest.approx((0.8 / 0.9) / predicted)
    assert summaries["OpenVINO GenAI speculative (γ=4)"]["predicted_speedup"] is None  # no cost curve
    assert summaries["xpuspec target-only"]["predicted_speedup"] is None


def test_a_round_interleaves_configurations_prompt_by_prompt_and_reverses_their_order():
    from xpuspec.bench.latency import _interleaved_round
    from xpuspec.bench.latency_rows import Row

    calls: list[tuple[str, int]] = []

    class Runner:
        def __init__(self, name: str) -> None:
            self.name = name

        def generate(self, token_ids, max_tokens, draft_length):
            calls.append((self.name, token_ids[0]))
            return RequestTiming(1, [token_ids[0]] * max_tokens, 0.1, None, None)

    entries = [Row(LatencyResult(name, XPUSPEC, None), name, None) for name in ("a", "b", "c")]
    built = {name: Runner(name) for name in ("a", "b", "c")}
    done: list[int] = []
    timings = _interleaved_round(entries, built, [[10], [11], [12]], 2, done.append)
    assert calls == [
        ("a", 10), ("b", 10), ("c", 10),
        ("c", 11), ("b", 11), ("a", 11),
        ("a", 12), ("b", 12), ("c", 12),
    ]  # fmt: skip
    assert done == [0, 1, 2]
    assert [[t.token_ids[0] for t in row] for row in timings] == [[10, 11, 12]] * 3


def test_a_peer_that_fails_mid_round_is_skipped_and_the_others_go_on():
    from xpuspec.bench.latency import _interleaved_round
    from xpuspec.bench.latency_rows import Row

    class Runner:
        def __init__(self, fail_on: int | None) -> None:
            self.fail_on = fail_on

        def generate(self, token_ids, max_tokens, draft_length):
            if token_ids[0] == self.fail_on:
                raise RuntimeError("peer crashed")
            return RequestTiming(1, [1], 0.1, None, None)

    ours = Row(LatencyResult("ours", XPUSPEC, None), "ours", None)
    peer = Row(LatencyResult("peer", GENAI, None), "peer", None)
    built = {"ours": Runner(None), "peer": Runner(11)}
    timings = _interleaved_round([ours, peer], built, [[10], [11], [12]], 1)
    assert len(timings[0]) == 3
    assert peer.engine_key is None and peer.result.status == "skipped"
    assert "peer crashed" in peer.result.reason


def test_figures_come_from_each_prompts_fastest_run_over_the_rounds():
    result = LatencyResult("row", XPUSPEC, None)
    for first, second in ((1.0, 4.0), (3.0, 1.0)):
        timings = [RequestTiming(3, [1, 2], first, None, None), RequestTiming(3, [3], second, None, None)]
        result.record_round(timings)
    summary = result.summary()
    assert result.round_seconds == [5.0, 4.0]
    assert summary["seconds"] == 2.0  # 1.0 from the first round, 1.0 from the second
    assert summary["tokens_per_s"] == 1.5


def test_adaptive_gamma_is_divided_by_genais_target_only_where_its_drafting_is_slower():
    """GenAI's best configuration is its target-only run when its fixed-γ rows lose to it (a random
    target no draft predicts): a fixed-γ row there would flatter xpuspec's default."""
    tokens = [[1, 2, 3], [4, 5, 6]]
    results = [
        _result(XPUSPEC_DEFAULT, ADAPTIVE, tokens, 1.0),
        _result(GENAI_DEFAULT, None, tokens, 1.2),
        _result(GENAI_DEFAULT, 2, tokens, 1.6),
        _result(GENAI_DEFAULT, 4, tokens, 2.0),
    ]
    summaries = {r.name: r.summary() for r in results}
    peer_ratios(results, summaries)
    assert summaries["xpuspec default speculative (adaptive γ)"]["ratio_to_peers"][GENAI] == pytest.approx(
        1.2
    )
