"""Greedy tree speculation is token-identical to the target alone (exact preset), like chains are.

Same prompts and reference as ``test_exactness``: alone, 16 in flight, under preemption, with fixed
and automatic shapes, and with trees, chains and plain decodes of different requests in one batch.
Each test also checks that trees really ran and that some accepted a node beyond the first choice.
"""

from __future__ import annotations

import pytest

from tests.conftest import EXACT_PRESET
from tests.engine.test_exactness import MAX_TOKENS, PROMPTS, _mismatches
from xpuspec import Pipeline, SamplingParams

pytestmark = pytest.mark.slow

FIXED = {"depth": 4, "width": 3, "nodes": 10}


def _params(draft_tree, **extra) -> SamplingParams:
    return SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, draft_tree=draft_tree, **extra
    )


@pytest.fixture(scope="module")
def target_only(pair_bundle) -> list[list[int]]:
    pipe = Pipeline(pair_bundle, drafter="none", properties=EXACT_PRESET)
    return [pipe.generate(prompt, _params(None))[0].token_ids for prompt in PROMPTS]


@pytest.fixture(scope="module")
def pipe(pair_bundle) -> Pipeline:
    return Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)


def _tree_stats(results) -> tuple[int, int, int]:
    """(trees verified, nodes verified, drafts accepted) over ``results``."""
    return (
        sum(r.stats["tree_verifications"] for r in results),
        sum(r.stats["tree_nodes_verified"] for r in results),
        sum(r.stats["accepted"] for r in results),
    )


@pytest.mark.parametrize("draft_tree", [FIXED, "auto"], ids=["fixed", "auto"])
def test_one_request_at_a_time(pipe, target_only, draft_tree, monkeypatch):
    # This tiny draft costs as much as its target, so "auto" would rightly not draft: report a cheap
    # draft and a verification that costs the same for any number of nodes (a memory-bound device),
    # so that the policy picks trees from the measured acceptance alone, not from timings that a
    # loaded machine can make look steep.
    monkeypatch.setattr(pipe.engine.cost_model, "draft_cost", lambda num_tokens: 1e-6 * num_tokens)
    monkeypatch.setattr(pipe.engine.cost_model, "target_cost", lambda num_tokens, num_sequences=None: 1e-3)
    monkeypatch.setattr(pipe.engine.policy.draft_choice.payoff, "pays", lambda num_sequences, kind: True)
    results = [pipe.generate(prompt, _params(draft_tree))[0] for prompt in PROMPTS]
    assert _mismatches(target_only, results) == []
    trees, nodes, accepted = _tree_stats(results)
    assert trees > 0 and nodes > trees * 4, "trees of several nodes must have been verified"
    assert 0 < accepted


def test_sixteen_in_flight(pipe, target_only):
    results = pipe.generate(PROMPTS[:16], _params(FIXED))
    assert _mismatches(target_only[:16], results) == []
    assert _tree_stats(results)[0] > 0


def test_mixed_batch_of_trees_chains_and_plain_decodes(pipe, target_only):
    params = [
        _params(FIXED) if i % 3 == 0 else _params(None, num_draft_tokens=4 if i % 3 == 1 else 0)
        for i in range(len(PROMPTS))
    ]
    results = pipe.generate(PROMPTS, params)
    assert _mismatches(target_only, results) == []
    assert all(r.stats["tree_verifications"] > 0 for r in results[::3])
    assert all(r.stats["tree_verifications"] == 0 for i, r in enumerate(results) if i % 3)


def test_preemption_keeps_output_exact(pair_bundle, target_only):
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET, num_kv_blocks=12, draft_tree=FIXED)
    results = pipe.generate(PROMPTS, _params(None))
    assert _mismatches(target_only, results) == []
    assert sum(r.stats["num_preemptions"] for r in results) > 0
    assert _tree_stats(results)[0] > 0
    assert pipe.engine.block_manager.num_used_blocks == 0


def test_trees_accept_more_than_the_first_choice(pipe, target_only):
    """A tree accepts at least as many drafts per target pass as the chain of its first choices
    would, and here strictly more: some accepted paths leave the draft's top-1 chain."""
    tree = pipe.generate(PROMPTS, _params(FIXED))
    chain = pipe.generate(PROMPTS, _params(None, num_draft_tokens=FIXED["depth"]))
    assert _mismatches(target_only, tree) == [] and _mismatches(target_only, chain) == []
    tree_rate = sum(r.stats["accepted"] for r in tree) / sum(r.stats["verification_steps"] for r in tree)
    chain_rate = sum(r.stats["accepted"] for r in chain) / sum(r.stats["verification_steps"] for r in chain)
    assert tree_rate > chain_rate


def test_trees_keep_the_step_shape(pipe, target_only, monkeypatch):
    """A fixed tree's steps verify 1 + nodes tokens even where the tree has fewer nodes (cut near
    ``max_tokens``): the missing nodes are padding, roots of their own in the tree mask, so the
    plugin does not re-prepare its graph. An automatic tree smaller than the last step's is padded
    while shrinking does not pay. The output stays the target's."""
    runner = pipe.engine.target
    steps: list[tuple[str, int, int]] = []  # (kind, tokens with padding, padding) of tree steps
    fill_inputs = runner._fill_inputs

    def recording(chunks, lane=None):
        if any(chunk.tree_parents is not None for chunk in chunks):
            tokens = sum(len(c.token_ids) + c.padding for c in chunks)
            steps.append(("fixed" if recording.fixed else "auto", tokens, sum(c.padding for c in chunks)))
        return fill_inputs(chunks, lane)

    monkeypatch.setattr(runner, "_fill_inputs", recording)
    recording.fixed = True
    results = [pipe.generate(prompt, _params(FIXED))[0] for prompt in PROMPTS[:8]]
    assert _mismatches(target_only[:8], results) == []
    fixed = [(tokens, padding) for kind, tokens, padding in steps if kind == "fixed"]
    assert {tokens for tokens, _ in fixed} == {1 + FIXED["nodes"]}
    assert any(padding for _, padding in fixed), "no tree was cut: padding did not run"
    # Automatic trees: a cheap draft and verification costs that grow with the tokens, so that the
    # policy picks trees of different sizes, and a change of shape that costs a whole step.
    cost_model = pipe.engine.cost_model
    monkeypatch.setattr(cost_model, "draft_cost", lambda num_tokens: 1e-6 * num_tokens)
    monkeypatch.setattr(
        cost_model, "target_cost", lambda num_tokens, num_sequences=None: 1e-3 + 2e-5 * num_tokens
    )
    monkeypatch.setattr(pipe.engine.policy.draft_choice.payoff, "pays", lambda num_sequences, kind: True)
    recording.fixed = False
    results = [pipe.generate(prompt, _params("auto"))[0] for prompt in PROMPTS[:8]]
    assert _mismatches(target_only[:8], results) == []
    assert any(padding for kind, _, padding in steps if kind == "auto"), "no auto tree was padded"
