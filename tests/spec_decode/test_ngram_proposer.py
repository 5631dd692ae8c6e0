"""Prompt-lookup (n-gram) drafting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xpuspec.spec_decode.ngram_proposer import NgramIndex, NgramProposer


def _reference_propose(
    tokens: list[int], num_tokens: int, max_ngram: int, min_ngram: int, periodic_extension: bool
) -> list[int]:
    """Brute force: longest n first, most recent earlier occurrence followed by at least one token."""
    length = len(tokens)
    for ngram in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = tokens[length - ngram :]
        for start in range(length - ngram - 1, -1, -1):
            if tokens[start : start + ngram] == suffix:
                extended = list(tokens)
                position = start + ngram
                proposal: list[int] = []
                while len(proposal) < num_tokens:
                    if position >= len(extended):
                        if not periodic_extension:
                            break
                        extended.append(extended[position - (length - start - ngram)])
                    proposal.append(extended[position])
                    position += 1
                return proposal
    return []


@pytest.mark.parametrize(
    ("tokens", "num_tokens", "expected"),
    [
        ([1, 2, 3, 4, 1, 2], 2, [3, 4]),  # trigram absent, bigram "1 2" found at 0
        ([1, 2, 3, 4, 1, 2], 10, [3, 4, 1, 2, 3, 4, 1, 2, 3, 4]),  # runs on periodically
        ([5, 1, 2, 9, 7, 1, 2, 8, 3, 1, 2], 3, [8, 3, 1]),  # most recent occurrence wins
        ([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 2, [9, 2]),  # the longest n-gram (3) beats a recent bigram
        ([1, 2, 3, 4], 3, []),  # nothing recurs
        ([7], 3, []),
        ([], 3, []),
        ([4, 4, 4], 3, [4, 4, 4]),
        ([1, 2, 1, 2], 0, []),
    ],
)
def test_proposals(tokens: list[int], num_tokens: int, expected: list[int]) -> None:
    assert NgramProposer(max_ngram=3, min_ngram=1).propose(tokens, num_tokens) == expected


def test_without_periodic_extension_stops_at_the_end_of_the_sequence() -> None:
    proposer = NgramProposer(periodic_extension=False)
    assert proposer.propose([1, 2, 3, 4, 1, 2], 10) == [3, 4, 1, 2]


def test_min_ngram_rejects_short_matches() -> None:
    tokens = [1, 2, 3, 9, 5, 3]  # only the unigram "3" recurs
    assert NgramProposer(min_ngram=1).propose(tokens, 2) == [9, 5]
    assert NgramProposer(min_ngram=2).propose(tokens, 2) == []


def test_numpy_input_and_python_int_output() -> None:
    tokens = np.array([10, 20, 30, 10, 20], dtype=np.int32)
    proposal = NgramProposer().propose(tokens, 2)
    assert proposal == [30, 10]
    assert all(type(token) is int for token in proposal)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), max_size=40),
    num_tokens=st.integers(0, 8),
    min_ngram=st.integers(1, 3),
    extra_ngram=st.integers(0, 3),
    periodic_extension=st.booleans(),
)
def test_matches_brute_force(
    tokens: list[int], num_tokens: int, min_ngram: int, extra_ngram: int, periodic_extension: bool
) -> None:
    max_ngram = min_ngram + extra_ngram
    proposer = NgramProposer(max_ngram=max_ngram, min_ngram=min_ngram, periodic_extension=periodic_extension)
    expected = _reference_propose(tokens, num_tokens, max_ngram, min_ngram, periodic_extension)
    assert proposer.propose(tokens, num_tokens) == expected


def test_long_sequence() -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50_000, size=4000)
    tokens[-3:] = tokens[1000:1003]  # plant a trigram; the random rest almost surely has no other
    assert NgramProposer().propose(tokens, 5) == tokens[1003:1008].tolist()


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 0), (1, 2)])
def test_bad_configuration_raises(max_ngram: int, min_ngram: int) -> None:
    with pytest.raises(ValueError, match="ngram"):
        NgramProposer(max_ngram=max_ngram, min_ngram=min_ngram)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), max_size=60),
    growth=st.lists(st.integers(1, 5), min_size=1, max_size=20),
    num_tokens=st.integers(0, 8),
    min_ngram=st.integers(1, 3),
    extra_ngram=st.integers(0, 3),
    periodic_extension=st.booleans(),
)
def test_an_index_kept_as_the_sequence_grows_proposes_what_a_fresh_lookup_does(
    tokens: list[int],
    growth: list[int],
    num_tokens: int,
    min_ngram: int,
    extra_ngram: int,
    periodic_extension: bool,
) -> None:
    lookup = NgramProposer(
        max_ngram=min_ngram + extra_ngram, min_ngram=min_ngram, periodic_extension=periodic_extension
    )
    index = NgramIndex(lookup)
    seen = 0
    for step in growth:  # the sequence as the engine sees it: a few more tokens each step
        seen = min(len(tokens), seen + step)
        prefix = tokens[:seen]
        assert index.propose_with_match(prefix, num_tokens) == lookup.propose_with_match(prefix, num_tokens)


def test_an_index_notices_a_sequence_that_shrank_or_changed() -> None:
    lookup = NgramProposer(max_ngram=3)
    index = NgramIndex(lookup)
    assert index.propose_with_match([1, 2, 3, 1, 2], 2) == ([3, 1], 2)
    assert index.propose_with_match([1, 2], 2) == ([], 0)  # shorter: indexed afresh
    changed = [7, 8, 9, 7, 8]
    assert index.propose_with_match(changed, 2) == lookup.propose_with_match(changed, 2) == ([9, 7], 2)
    assert index.propose_with_match([5, 6, 5, 6, 9, 5], 3) == lookup.propose_with_match([5, 6, 5, 6, 9, 5], 3)
