"""Which peer row each xpuspec row is divided by."""

from __future__ import annotations

import pytest

from xpuspec.bench.figures import LatencyResult, RequestTiming
from xpuspec.bench.latency import ADAPTIVE, GENAI, GENAI_LOOKUP, XPUSPEC, _label, _peer_ratios


def _timed(engine: str, length: int | str | None, seconds: float) -> LatencyResult:
    result = LatencyResult(_label(engine, length), engine, length)
    result.record_round([RequestTiming(3, list(range(8)), seconds, 0.01, seconds / 8)])
    return result


@pytest.mark.parametrize(("lookup_seconds", "best_seconds"), [(1.0, 1.0), (3.0, 2.0)])
def test_adaptive_gamma_is_divided_by_the_best_of_genais_drafts_and_its_prompt_lookup(
    lookup_seconds: float, best_seconds: float
) -> None:
    results = [
        _timed(XPUSPEC, 2, 1.0),
        _timed(XPUSPEC, ADAPTIVE, 0.5),
        _timed(GENAI, 2, 2.0),
        _timed(GENAI, 4, 4.0),
        _timed(GENAI_LOOKUP, 4, lookup_seconds),
    ]
    summaries = {r.name: r.summary() for r in results}
    _peer_ratios(results, summaries)
    assert summaries[results[0].name]["ratio_to_peers"][GENAI] == pytest.approx(2.0)  # same γ, draft model
    assert summaries[results[1].name]["ratio_to_peers"][GENAI] == pytest.approx(best_seconds / 0.5)


def test_each_round_gives_its_own_ratio_to_the_same_peer_row() -> None:
    def rounds(engine: str, length: int | str, seconds: list[float]) -> LatencyResult:
        result = LatencyResult(_label(engine, length), engine, length)
        for value in seconds:
            result.record_round([RequestTiming(3, list(range(8)), value, 0.01, value / 8)])
        return result

    results = [
        rounds(XPUSPEC, 2, [1.0, 2.0, 1.5]),
        rounds(XPUSPEC, ADAPTIVE, [1.0, 1.0, 1.0]),
        rounds(GENAI, 2, [1.2, 1.6, 1.5]),
        rounds(GENAI_LOOKUP, 2, [0.9, 3.0, 3.0]),  # the best GenAI row (its fastest run: 0.9 s)
    ]
    summaries = {r.name: r.summary() for r in results}
    _peer_ratios(results, summaries)
    assert summaries[results[0].name]["ratio_to_peers"][GENAI] == pytest.approx(1.2)
    assert summaries[results[0].name]["round_ratios_to_genai"] == pytest.approx([1.2, 0.8, 1.0])
    assert summaries[results[1].name]["round_ratios_to_genai"] == pytest.approx([0.9, 3.0, 3.0])
    assert "round_ratios_to_genai" not in summaries[results[2].name]


def test_the_table_shows_the_per_round_range_only_over_several_rounds() -> None:
    from xpuspec.bench.report import latency_table

    def row(name: str, ratios: list[float]) -> dict:
        return {"name": name, "status": "ok", "tokens_per_s": 10.0, "round_ratios_to_genai": ratios}

    lines = latency_table({"configurations": [row("several", [0.9, 1.1, 1.0]), row("one", [1.05])]})
    several = next(line for line in lines if line.startswith("| several |"))
    one = next(line for line in lines if line.startswith("| one |"))
    assert "| 0.90-1.10 |" in several
    assert "1.05" not in one


def test_the_same_text_ratio_counts_only_prompts_both_engines_wrote_alike() -> None:
    def prompts(engine: str, outputs: list[list[int]], seconds: list[float]) -> LatencyResult:
        result = LatencyResult(_label(engine, 2), engine, 2)
        result.record_round(
            [
                RequestTiming(3, tokens, value, 0.01, value / 8)
                for tokens, value in zip(outputs, seconds, strict=True)
            ]
        )
        return result

    ours = prompts(XPUSPEC, [[1, 2], [3, 4], [5, 6]], [1.0, 2.0, 4.0])
    # Faster on the second prompt only because it wrote other tokens there.
    peer = prompts(GENAI, [[1, 2], [3, 9], [5, 6]], [1.5, 0.5, 4.5])
    summaries = {r.name: r.summary() for r in (ours, peer)}
    _peer_ratios([ours, peer], summaries)
    row = summaries[ours.name]
    assert row["ratio_to_peers"][GENAI] == pytest.approx(6.5 / 7.0)
    assert row["equal_outputs_with_genai"] == "2/3"
    assert row["ratio_to_genai_on_equal_outputs"] == pytest.approx(6.0 / 5.0)

    from xpuspec.bench.report import latency_table

    lines = latency_table({"configurations": [{**row, "name": "x", "status": "ok"}]})
    line = next(line for line in lines if line.startswith("| x |"))
    assert "| 1.20 (2/3) |" in line
