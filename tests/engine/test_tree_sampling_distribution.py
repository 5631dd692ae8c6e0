"""Sampled tree speculation follows the target's distribution, through the whole engine.

The test of ``test_sampling_distribution`` (chi-square of the first three tokens' joint
frequencies against the exact target probabilities), with every request drafting a tree: two
candidates for t2 drawn without replacement, the best of them expanded with two candidates for
t3, so recursive rejection sampling over siblings decides at both depths. A deliberately broken
rule must fail it with the same sample budget (the power check).
"""

from __future__ import annotations

import pytest

from tests.conftest import F32
from tests.engine.test_sampling_distribution import NUM_SAMPLES, PROMPT, SIGNIFICANCE
from tests.engine.test_sampling_distribution import exact_joint as exact_joint  # noqa: PLC0414 (fixture)
from tests.support.statistics import goodness_of_fit, sampling_engine_config
from xpuspec import Pipeline, SamplingParams
from xpuspec.spec_decode.tree_acceptance import TreeAcceptance

pytestmark = pytest.mark.slow

# max_tokens 6 leaves the first speculative step a budget of 4 nodes: 2 children of the root and
# 2 of the better one (the scheduler grants at most max_tokens - outputs - 1 drafts).
TREE = {"depth": 2, "width": 2, "nodes": 4}
PARAMS = dict(max_tokens=6, temperature=1.5, top_k=3, top_p=1.0, min_p=0.0, ignore_eos=True, draft_tree=TREE)


def sample_triples(pair_bundle) -> list[tuple[int, ...]]:
    pipe = Pipeline(
        pair_bundle, drafter="draft", properties=F32, engine_config=sampling_engine_config(pair_bundle)
    )
    results = pipe.generate([PROMPT] * NUM_SAMPLES, SamplingParams(**PARAMS))
    # Every request verified a tree, the first one of 4 nodes (t2 and t3 both drafted).
    assert all(r.stats["tree_verifications"] >= 1 for r in results)
    assert all(r.stats["tree_nodes_verified"] >= TREE["nodes"] for r in results)
    return [tuple(r.token_ids[:3]) for r in results]


def test_tree_sampling_follows_target(pair_bundle, exact_joint):
    p_value = goodness_of_fit(sample_triples(pair_bundle), exact_joint)
    assert p_value > SIGNIFICANCE, f"chi-square p = {p_value:.2e}"


def test_broken_tree_rule_is_caught(pair_bundle, exact_joint, monkeypatch):
    # A rejected sibling leaves the target row as it was: rejected tokens come back too often.
    # (One broken rule keeps the suite's time budget; always-accept fails as clearly.)
    monkeypatch.setattr(TreeAcceptance, "residual", staticmethod(lambda residual, q_i: residual))
    p_value = goodness_of_fit(sample_triples(pair_bundle), exact_joint)
    assert p_value < SIGNIFICANCE, f"a broken rule passed: chi-square p = {p_value:.2e}"


def test_seeded_requests_keep_chains(pair_bundle):
    """Seeded requests are verified by the position-coupled race, which trees do not fit: they
    draft chains even when a tree is asked for, and stay reproducible."""
    pipe = Pipeline(pair_bundle, drafter="draft", properties=F32)
    params = SamplingParams(**{**PARAMS, "seed": 7, "num_draft_tokens": 2})
    first, second = pipe.generate([PROMPT, PROMPT], params)
    assert first.token_ids == second.token_ids
    assert first.stats["tree_verifications"] == 0 and first.stats["drafted"] > 0
