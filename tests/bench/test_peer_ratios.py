"""Which peer row each xpuspec row is divided by."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from xpuspec.bench.config import BenchConfig
from xpuspec.bench.figures import LatencyResult, RequestTiming
from xpuspec.bench.latency import _interleaved_round
from xpuspec.bench.latency_labels import (
    ADAPTIVE,
    GENAI,
    GENAI_DEFAULT,
    GENAI_LOOKUP,
    TREE_AUTO,
    XPUSPEC,
    XPUSPEC_DEFAULT,
    row_label,
)
from xpuspec.bench.latency_ratios import peer_ratios
from xpuspec.bench.latency_rows import adjacent_peers, configurations


def _timed(engine: str, length: int | str | None, seconds: float) -> LatencyResult:
    result = LatencyResult(row_label(engine, length), engine, length)
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
    peer_ratios(results, summaries)
    assert summaries[results[0].name]["ratio_to_peers"][GENAI] == pytest.approx(2.0)  # same γ, draft model
    assert summaries[results[1].name]["ratio_to_peers"][GENAI] == pytest.approx(best_seconds / 0.5)


def test_each_round_gives_its_own_ratio_to_the_same_peer_row() -> None:
    def rounds(engine: str, length: int | str, seconds: list[float]) -> LatencyResult:
        result = LatencyResult(row_label(engine, length), engine, length)
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
    peer_ratios(results, summaries)
    # The median of the run-by-run ratios (1.2, 0.8, 1.0), not the best rounds' 1.2 / 1.0.
    assert summaries[results[0].name]["ratio_to_peers"][GENAI] == pytest.approx(1.0)
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
        result = LatencyResult(row_label(engine, 2), engine, 2)
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
    peer_ratios([ours, peer], summaries)
    row = summaries[ours.name]
    assert row["ratio_to_peers"][GENAI] == pytest.approx(1.125)  # median of 1.5, 0.25 and 1.125
    assert row["equal_outputs_with_genai"] == "2/3"
    assert row["ratio_to_genai_on_equal_outputs"] == pytest.approx((1.5 + 1.125) / 2)

    from xpuspec.bench.report import latency_table

    lines = latency_table({"configurations": [{**row, "name": "x", "status": "ok"}]})
    line = next(line for line in lines if line.startswith("| x |"))
    assert "| 1.31 (2/3) |" in line


def test_the_ratio_pairs_runs_of_the_same_prompt_and_round() -> None:
    """A slow spell that hit the peer's runs of one round and ours of another moves the best-of-rounds
    ratio; the paired median follows the runs that ran on a machine alike for both."""

    def rounds(engine: str, seconds: list[list[float]]) -> LatencyResult:
        result = LatencyResult(row_label(engine, None), engine, None)
        for values in seconds:
            result.record_round(
                [RequestTiming(3, list(range(8)), value, 0.01, value / 8) for value in values]
            )
        return result

    # Four prompts, three rounds. Ours took 1.0 s a prompt but 1.1 s in round 0; GenAI 1.0 s but
    # 0.93 s in round 0, as if the machine were quiet for GenAI's runs and busy for ours.
    ours = rounds(XPUSPEC, [[1.1] * 4, [1.0] * 4, [1.0] * 4])
    peer = rounds(GENAI, [[0.93] * 4, [1.0] * 4, [1.0] * 4])
    summaries = {r.name: r.summary() for r in (ours, peer)}
    peer_ratios([ours, peer], summaries)
    row = summaries[ours.name]
    assert row["tokens_per_s"] / summaries[peer.name]["tokens_per_s"] == pytest.approx(0.93)
    assert row["ratio_to_peers"][GENAI] == pytest.approx(1.0)
    assert len(row["paired_ratios_to_genai"]) == 12


def _bench_rows(tmp_path: Path, draft_lengths: tuple[int, ...]):  # type: ignore[no-untyped-def]
    """The bench's rows and engines for a bundle with a draft (nothing is built or run)."""
    model = SimpleNamespace(path=Path("/nowhere"))
    bundle = SimpleNamespace(target=model, draft=model, eagle3=None)
    config = BenchConfig(out=tmp_path, draft_lengths=draft_lengths)
    return configurations(
        config,
        bundle,  # type: ignore[arg-type]
        lambda *args: None,
        {"INFERENCE_PRECISION_HINT": "f32"},
        (None, None),
    )


def test_every_row_runs_right_beside_the_row_it_is_divided_by(tmp_path: Path) -> None:
    configs, engines = _bench_rows(tmp_path, (2, 4))
    active = [c for c in configs if c.engine_key is not None]
    if not any(c.result.engine == GENAI for c in active):
        pytest.skip("OpenVINO GenAI is not installed: no peer rows")
    ordered = adjacent_peers(active)
    assert sorted(map(id, ordered)) == sorted(map(id, active))  # every row, once

    runs: list[tuple[int, str]] = []  # (prompt, row) in the order they ran

    class Runner:
        def __init__(self, key: str) -> None:
            self.key = key

        def generate(self, token_ids: list[int], max_tokens: int, length: object) -> RequestTiming:
            row = next(c.result.name for c in ordered if (c.engine_key, c.draft_length) == (self.key, length))
            runs.append((token_ids[0], row))
            return RequestTiming(1, [0], 0.1, 0.01, 0.01)

    _interleaved_round(ordered, {key: Runner(key) for key in engines}, [[0], [1], [2]], 4)
    pairs = [
        (row_label(ours, length), row_label(peer, length))
        for ours, peer in ((XPUSPEC, GENAI), (XPUSPEC_DEFAULT, GENAI_DEFAULT))
        for length in (None, 2, 4)
    ]
    for prompt in range(3):
        order = [row for index, row in runs if index == prompt]
        assert len(order) == len(ordered)
        for ours, peer in pairs:
            assert abs(order.index(ours) - order.index(peer)) == 1, (ours, peer, order)
        adaptive = order.index(row_label(XPUSPEC, ADAPTIVE))
        lookups = [order.index(row_label(GENAI_LOOKUP, length)) for length in (2, 4)]
        assert sorted(abs(index - adaptive) for index in lookups) == [1, 2]  # GenAI's prompt lookup
        assert row_label(XPUSPEC, TREE_AUTO) in order


def test_each_xpuspec_engine_compiles_beside_its_peer_first_in_turn(tmp_path: Path) -> None:
    from xpuspec.bench.latency_labels import GENAI_LOOKUP_KEY
    from xpuspec.bench.latency_rows import compile_order

    _, engines = _bench_rows(tmp_path, (2,))
    if f"{GENAI}/none" not in engines:
        pytest.skip("OpenVINO GenAI is not installed: no peer engines")
    pairs = [
        (f"{XPUSPEC}/none", f"{GENAI}/none"),
        (f"{XPUSPEC}/draft", f"{GENAI}/draft"),
        (f"{XPUSPEC}/{ADAPTIVE}", GENAI_LOOKUP_KEY),
        (f"{XPUSPEC_DEFAULT}/none", f"{GENAI_DEFAULT}/none"),
        (f"{XPUSPEC_DEFAULT}/draft", f"{GENAI_DEFAULT}/draft"),
    ]
    for round_index in range(2):
        order = [engine.key for engine in compile_order(engines, round_index)]
        assert sorted(order) == sorted(engines)
        for ours, peer in pairs:
            first, second = (ours, peer) if round_index == 0 else (peer, ours)
            assert order.index(second) == order.index(first) + 1, (round_index, order)
