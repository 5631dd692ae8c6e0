"""Tree shapes, draft trees and tree acceptance on made-up distributions (no model)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from xpuspec import SamplingParams
from xpuspec.sample.draft_tree import TreeShape, parse_draft_tree
from xpuspec.spec_decode.policy.cost_model import CostModel, LinearCostFit
from xpuspec.spec_decode.policy.tree_policy import RankAcceptance, TreeShapePolicy
from xpuspec.spec_decode.tree import DraftTree
from xpuspec.spec_decode.tree_acceptance import TreeAcceptance
from xpuspec.spec_decode.tree_build import draw_without_replacement

VOCAB = 5


def test_shapes_parse_and_reject_bad_values():
    assert parse_draft_tree({"depth": 3, "width": 2, "nodes": 6}) == TreeShape(3, 2, 6)
    assert parse_draft_tree("auto") == "auto" and parse_draft_tree(None) is None
    for bad in (
        {"depth": 3},
        {"depth": 0, "width": 2, "nodes": 4},
        {"depth": 5, "width": 2, "nodes": 4},
        "big",
        3,
    ):
        with pytest.raises(ValueError, match="draft_tree"):
            parse_draft_tree(bad)
    with pytest.raises(ValueError, match="nodes"):
        SamplingParams(draft_tree={"depth": 2, "width": 2, "nodes": 17})


def _policy(target_per_token: float, draft_per_token: float) -> TreeShapePolicy:
    costs = CostModel(LinearCostFit(0.020, target_per_token), LinearCostFit(0.002, draft_per_token))
    return TreeShapePolicy(costs, max_nodes=16)


def test_auto_shape_is_a_tree_when_verifying_is_cheap_and_seconds_ranks_accept():
    policy = _policy(target_per_token=0.0002, draft_per_token=0.00005)
    for _ in range(50):  # the target's token is often the draft's second choice
        policy.acceptance.record([2, 2, 2], [0, 1])
        policy.acceptance.record([2, 2], [1])
    shape = policy.choose(chain_alpha=0.5, batch_tokens=1, num_sequences=1)
    assert shape is not None and shape.width >= 2 and shape.nodes <= 16


def test_auto_shape_shrinks_to_chains_then_nothing():
    rank_two_useless = _policy(target_per_token=0.0002, draft_per_token=0.00005)
    for _ in range(50):
        rank_two_useless.acceptance.record([4, 4, 4], [0, 0])
    # Second choices never accepted: a chain (the chain policy's γ) predicts as well.
    assert rank_two_useless.choose(chain_alpha=0.8, batch_tokens=1, num_sequences=1) is None
    # Under load every verified token costs (a compute-bound target pass): no tree.
    loaded = _policy(target_per_token=0.004, draft_per_token=0.0005)
    assert loaded.choose(chain_alpha=0.6, batch_tokens=16, num_sequences=16) is None
    # A draft as slow as the target: no drafting at all.
    assert _policy(0.0002, 0.02).choose(chain_alpha=0.6, batch_tokens=1, num_sequences=1) is None


def test_auto_shape_skips_the_search_only_where_no_tree_can_win():
    rng = np.random.default_rng(0)
    searched = 0
    for _ in range(300):
        policy = _policy(
            target_per_token=float(rng.choice([0.00005, 0.0002, 0.001, 0.004])),
            draft_per_token=float(rng.choice([0.00001, 0.00005, 0.0005])),
        )
        for _ in range(int(rng.integers(0, 40))):
            depth = int(rng.integers(1, 4))
            policy.acceptance.record(
                [int(rng.integers(1, 5))] * depth, list(rng.integers(0, 3, size=depth - 1))
            )
        alpha = float(rng.uniform(0.05, 0.95))
        batch = int(rng.choice([1, 2, 4, 16, 64]))
        # The pruned answer equals the exhaustive search's, for every cost model, α and batch.
        assert policy.choose_with_rate(alpha, batch, batch) == policy._choose(round(alpha, 2), batch, batch)
        searched += not policy._hopeless[(batch, batch)]
    assert 0 < searched < 300  # both branches ran


def test_auto_shape_under_load_costs_no_search_per_sequence():
    loaded = _policy(target_per_token=0.004, draft_per_token=0.0005)
    calls = []
    rates = loaded.acceptance.rates
    loaded.acceptance.rates = lambda alpha: calls.append(alpha) or rates(alpha)  # type: ignore[method-assign]
    for alpha in np.linspace(0.1, 0.9, 16):  # 16 sequences, each with its own α
        assert loaded.choose(float(alpha), batch_tokens=16, num_sequences=16) is None
    assert calls == []  # no per-α search: the batch alone rules trees out


def test_rank_acceptance_counts_the_path():
    counts = RankAcceptance()
    for _ in range(200):
        counts.record([3, 3], [2])  # depth 1: rank 2 accepted; depth 2: a miss among 3 children
    rates = counts.rates(chain_alpha=0.6)
    assert rates[0, 2] > 0.9 and rates[0, 0] < 0.1
    assert rates[1, :3].sum() < 0.1


def test_draft_tree_checks_order_and_parents():
    tree = DraftTree([7, 8, 9, 10], [-1, -1, 0, 0])
    assert tree.depths() == [1, 1, 2, 2] and tree.depth == 2
    assert tree.children(-1) == [0, 1] and tree.children(0) == [2, 3]
    assert tree.chunk_parents() == [-1, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="parent"):
        DraftTree([1, 2], [-1, 1])
    with pytest.raises(ValueError, match="breadth-first"):
        DraftTree([1, 2, 3], [-1, 0, -1])


def _one_hot_logits(tokens: list[int]) -> np.ndarray:
    logits = np.zeros((len(tokens), VOCAB), dtype=np.float32)
    logits[np.arange(len(tokens)), tokens] = 5.0
    return logits


def test_greedy_takes_the_longest_matching_path_and_the_next_token():
    # Root children 1 and 2; node 1 (token 2) has children 3 (token 4) and 4 (token 0).
    tree = DraftTree([1, 2, 4, 0], [-1, -1, 1, 1])
    # Target argmax: after root 2, after node0 anything, after node1 0, after node3 3.
    logits = _one_hot_logits([2, 3, 0, 1, 3])
    result = TreeAcceptance().verify_greedy(tree, logits)
    assert result.accepted_nodes == [1, 3] and result.token_ids == [2, 0, 3]
    # Nothing matches: one target token.
    result = TreeAcceptance().verify_greedy(tree, _one_hot_logits([4, 0, 0, 0, 0]))
    assert result.accepted_nodes == [] and result.token_ids == [4]


def _sampled_tree(rng, q_root, q_child, width=3):
    """Draw a two-level tree as the drafter does: `width` children of the root without replacement,
    the first of them expanded with `width` children."""
    first = draw_without_replacement(q_root, width, rng)
    second = draw_without_replacement(q_child[first[0]], width, rng)
    tokens = first + second
    parents = [-1] * len(first) + [0] * len(second)
    probs = np.stack([q_root] * len(first) + [q_child[first[0]]] * len(second))
    return DraftTree(tokens, parents, probs)


@pytest.mark.parametrize("broken", [False, True])
def test_sampled_tree_emits_the_target_distribution(broken, monkeypatch):
    """Joint law of the first two emitted tokens against p(t1) p(t2|t1), by chi-square."""
    rng = np.random.default_rng(0)
    p_root = np.array([0.05, 0.4, 0.3, 0.2, 0.05])
    q_root = np.array([0.3, 0.1, 0.3, 0.1, 0.2])
    p_next = rng.dirichlet(np.ones(VOCAB), size=VOCAB)  # p(t2 | t1)
    q_next = rng.dirichlet(np.ones(VOCAB), size=VOCAB)
    if broken:
        monkeypatch.setattr(TreeAcceptance, "residual", staticmethod(lambda residual, q_i: residual))
    acceptance = TreeAcceptance()
    counts = np.zeros((VOCAB, VOCAB))
    num_samples = 20000
    for _ in range(num_samples):
        tree = _sampled_tree(rng, q_root, q_next)
        # Target rows: root, then each node's next-token law given its path.
        rows = [p_root] + [
            p_next[tree.token_ids[i]] if tree.parents[i] < 0 else p_root for i in range(len(tree))
        ]
        result = acceptance.verify_sampled(tree, np.stack(rows), rng)
        if len(result.token_ids) < 2:  # the second token comes from the next step: the target row
            t1 = result.token_ids[0]
            t2 = int(rng.choice(VOCAB, p=p_next[t1]))
        else:
            t1, t2 = result.token_ids[:2]
        counts[t1, t2] += 1
    expected = (p_root[:, None] * p_next * num_samples).ravel()
    p_value = chisquare(counts.ravel(), expected).pvalue
    if broken:
        assert p_value < 1e-3
    else:
        assert p_value > 1e-3


def test_draw_without_replacement_is_distinct_and_stops_at_the_support():
    rng = np.random.default_rng(1)
    drawn = draw_without_replacement(np.array([0.5, 0.0, 0.5, 0.0]), 3, rng)
    assert sorted(drawn) == [0, 2]
