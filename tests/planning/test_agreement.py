"""Greedy agreement: counting identical outputs and where the others first differ."""

from __future__ import annotations

import pytest

from xpuspec.planning.agreement import compare, first_difference, greedy_token_ids, speculative_agreement


def test_first_difference_counts_a_length_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one stopped (EOS) where the other went on
    assert first_difference([], []) is None


def test_compare_counts_identical_outputs_and_the_median_first_difference():
    agreement = compare([[1, 2, 3], [4, 5, 6], [7, 8, 9], [1]], [[1, 2, 3], [4, 0, 6], [0, 8, 9], [1]])
    assert (agreement.same, agreement.total, agreement.first_differences) == (2, 4, (1, 0))
    assert agreement.median_first_difference == 0.5 and not agreement.all_same
    assert agreement.describe() == "2/4 identical (first difference at token 0.5, median)"
    assert agreement.as_dict() == {"same": 2, "total": 4, "median_first_difference": 0.5}
    same = compare([[1, 2]], [[1, 2]])
    assert same.all_same and same.describe() == "1/1 identical" and same.median_first_difference is None
    with pytest.raises(ValueError, match="2 reference outputs but 1"):
        compare([[1], [2]], [[1]])


@pytest.mark.slow
def test_greedy_token_ids_in_flight_and_speculative_agreement_on_the_demo_pair():
    """Exact mode on the demo pair: drafting, and batching two at a time, change no token."""
    from xpuspec import Pipeline

    prompts = ["def add(a, b):\n", "import os\n", "class Stack:\n"]
    alone = Pipeline("demo", drafter="none", properties="exact", use_placement=False)
    speculative = Pipeline("demo", properties="exact", use_placement=False)
    reference = greedy_token_ids(alone, prompts, 12)
    assert all(reference)
    assert speculative_agreement(speculative, alone, prompts, 12, in_flight=2).all_same
    assert compare(reference, greedy_token_ids(speculative, prompts, 12, in_flight=3)).all_same
    with pytest.raises(ValueError, match="in_flight"):
        greedy_token_ids(alone, prompts, 12, in_flight=0)
