"""The offline prompt-lookup measure: coverage and acceptance counted against a known continuation."""

from __future__ import annotations

from research.bench.lookup_acceptance import measure


def test_counts_lookups_and_their_accepted_runs() -> None:
    prompt = [1, 2, 3, 4, 5]
    continuation = [1, 2, 3, 9]  # after "... 5 1 2": "3 4 5" is looked up, "3" holds, "4" does not
    result = measure([prompt], [continuation], min_ngram=2, max_ngram=3, gamma=3)
    assert result.positions == 4
    # Position 0 (tail "4 5") and 1 (tail "5 1") find nothing; 2 (tail "1 2") and 3 ("2 3") do.
    assert result.lookups == 2
    assert result.first_accepted == 1  # "3" at position 2; "4" at position 3 misses "9"
    assert result.accepted == 1
    assert result.coverage == 0.5 and result.first_token_rate == 0.5 and result.accepted_per_lookup == 0.5


def test_a_longer_minimum_finds_fewer() -> None:
    prompt, continuation = [5, 1, 2, 3, 7, 1, 2], [3, 7, 1, 2, 3]
    short, long = (measure([prompt], [continuation], min_ngram=n, gamma=2) for n in (1, 3))
    assert long.lookups < short.lookups
    assert long.first_token_rate == 1.0  # every 3-gram match here continues as before
