"""The arithmetic of research/bench/cross_tokenizer.py: the break-even acceptance, first differences."""

from __future__ import annotations

import pytest

from research.bench.cross_tokenizer import break_even_acceptance, first_difference


def test_break_even_acceptance_solves_the_cost_model() -> None:
    terms = {"verify_1": 100.0, "verify_gamma": 140.0, "drafting_gamma": 20.0}
    alpha = break_even_acceptance(terms, gamma=3)
    assert alpha is not None
    assert 1 + alpha + alpha**2 + alpha**3 == pytest.approx(1.6, abs=1e-6)  # (20 + 140) / 100
    # Free drafting and a flat verification curve: any acceptance pays.
    assert break_even_acceptance(
        {"verify_1": 1.0, "verify_gamma": 1.0, "drafting_gamma": 0.0}, 3
    ) == pytest.approx(0.0, abs=1e-6)
    # Dearer than γ + 1 plain steps: nothing pays.
    assert break_even_acceptance({"verify_1": 1.0, "verify_gamma": 3.0, "drafting_gamma": 2.0}, 3) is None


def test_first_difference_per_prompt() -> None:
    assert first_difference([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]) == [1]
    assert first_difference([[1, 2]], [[1, 2, 3]]) == [2]
    assert first_difference([[7]], [[7]]) == []
