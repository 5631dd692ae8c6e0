"""The load bench's speculation figures from two /metrics scrapes (no server runs)."""

from __future__ import annotations

from xpuspec.bench.load import SPEC_COUNTERS, _speculation_delta


def _scrape(drafted: list[float], accepted: list[float]) -> dict[str, float]:
    metrics = {SPEC_COUNTERS[0]: sum(drafted), SPEC_COUNTERS[1]: sum(accepted)}
    for position, (d, a) in enumerate(zip(drafted, accepted, strict=True)):
        metrics[f'xpuspec_spec_draft_tokens_per_position_total{{position="{position}"}}'] = d
        metrics[f'xpuspec_spec_accepted_tokens_per_position_total{{position="{position}"}}'] = a
    return metrics


def test_a_level_reports_only_the_positions_it_drafted():
    # An earlier adaptive configuration drafted 8 positions; this level drafts 4.
    before = _scrape([10] * 8, [5] * 8)
    after = _scrape([18, 18, 18, 18, 10, 10, 10, 10], [13, 9, 7, 5, 5, 5, 5, 5])
    delta = _speculation_delta(before, after)
    assert delta["drafted"] == 32 and delta["accepted"] == 14
    assert delta["acceptance_per_position"] == [1.0, 0.5, 0.25, 0.0]
