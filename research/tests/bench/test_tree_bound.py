"""`python -m research.bench.tree_bound`: the best tree of any shape for given acceptance and costs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from research.bench import tree_bound
from research.bench.tree_bound import best_options, best_tree_accepted


def _brute_force(rates: np.ndarray, nodes: int, level: int = 0) -> float:
    """Every split of ``nodes`` among a node's rank-ordered children, recursively (small n only)."""
    if nodes == 0 or level >= len(rates):
        return 0.0
    best = 0.0
    ranks = rates.shape[1]
    for sizes in itertools.product(range(nodes + 1), repeat=ranks):
        if sum(sizes) > nodes:
            continue
        accepted = sum(
            rates[level, rank] * (1.0 + _brute_force(rates, size - 1, level + 1))
            for rank, size in enumerate(sizes)
            if size
        )
        best = max(best, accepted)
    return best


def test_hand_computed_trees():
    rates = np.array([[0.5, 0.2, 0.1, 0.05]] * 4)
    assert best_tree_accepted(rates, 1, 4) == pytest.approx(0.5)
    assert best_tree_accepted(rates, 2, 4, max_width=1) == pytest.approx(0.5 + 0.25)  # a chain
    assert best_tree_accepted(rates, 2, 1) == pytest.approx(0.5 + 0.2)  # one level: two siblings
    # Three nodes: the first choice with its first child beside the second choice beats the chain.
    assert best_tree_accepted(rates, 3, 4) == pytest.approx(0.5 * 1.5 + 0.2)
    assert best_tree_accepted(rates, 3, 4, max_width=1) == pytest.approx(0.5 + 0.25 + 0.125)


@pytest.mark.parametrize("seed", range(4))
def test_dynamic_program_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    rates = rng.dirichlet(np.ones(4), size=3)[:, :3] * 0.9  # 3 levels, 3 ranks, rows sum below 1
    for nodes in range(1, 6):
        assert best_tree_accepted(rates, nodes, 3) == pytest.approx(_brute_force(rates, nodes)), nodes


def test_trees_win_only_where_the_second_choice_is_worth_its_cost():
    """A flat verification curve (a memory-bound device) lets a wide tree beat every chain; a
    curve that grows by a step's cost per token does not."""
    rates = np.array([[0.4, 0.2, 0.1, 0.05]] * 8)
    flat = {tokens: 1.0 for tokens in range(1, 18)}
    steep = {tokens: float(tokens) for tokens in range(1, 18)}
    for costs, tree_wins in ((flat, True), (steep, False)):
        chains = best_options(rates, costs, 0.01, 16, width=1)
        trees = best_options(rates, costs, 0.01, 16, width=None)
        best_chain = max(option.tokens_per_second for option in chains)
        best_tree = max(option.tokens_per_second for option in trees)
        assert (best_tree > 1.05 * best_chain) is tree_wins
        assert all(option.depth == option.nodes for option in chains)


def test_a_bad_tree_argument_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        tree_bound.main(["--tree", "4,4"])
    assert "--tree must be depth,width,nodes" in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_measures_and_prints_the_bound(capsys):
    arguments = "--bundle demo --prompts 2 --max-tokens 12 --rounds 1 --tree 3,3,9".split()
    assert tree_bound.main(arguments) == 0
    out = capsys.readouterr().out
    levels = [line for line in out.splitlines() if line.strip().startswith("level ")]
    assert len(levels) == tree_bound.EXTRAPOLATED_LEVELS
    rates = np.array([[float(value) for value in line.split(":")[1].split()] for line in levels])
    assert rates.min() >= 0.0 and rates.sum(axis=1).max() <= 1.0 + 1e-9
    assert rates[0].sum() > 0.0  # the demo draft's trees accept something at the first level
    assert "best chain:" in out and "bound: the best tree at" in out
