"""EAGLE-3 tree drafting through the whole engine: exact greedy output (fixed and automatic shapes,
alone, 16 in flight, under preemption), accepted paths off the first branch, the sampled distribution,
and the drafted trees against the torch reference head run node by node along each path.

Same target pair and random head as ``test_eagle3_drafter``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from research.training.eagle3_torch import random_head, save_head  # noqa: E402
from tests.conftest import EXACT_PRESET, F32  # noqa: E402
from tests.engine.test_exactness import PROMPTS, _mismatches  # noqa: E402
from tests.engine.test_sampling_distribution import PROMPT, SIGNIFICANCE  # noqa: E402
from tests.engine.test_sampling_distribution import exact_joint as exact_joint  # noqa: E402, PLC0414
from tests.spec_decode.test_eagle3_drafter import (  # noqa: E402
    DRAFT_VOCAB,
    HEAD_SEED,
    NUM_PROMPTS,
    TAPS,
    greedy,
    unfused_target_states,
)
from tests.spec_decode.test_eagle3_drafter import head as head  # noqa: E402, PLC0414 (fixture)
from tests.spec_decode.test_eagle3_drafter import target_config as target_config  # noqa: E402, PLC0414
from tests.spec_decode.test_eagle3_drafter import target_only as target_only  # noqa: E402, PLC0414
from tests.support.statistics import goodness_of_fit, sampling_engine_config  # noqa: E402
from xpuspec import Pipeline, SamplingParams  # noqa: E402
from xpuspec.sample.draft_tree import TreeShape  # noqa: E402
from xpuspec.spec_decode.eagle3.tree import Eagle3TreeDrafter  # noqa: E402
from xpuspec.spec_decode.tree_acceptance import TreeAcceptance  # noqa: E402
from xpuspec.spec_decode.tree_build import TreeBuild  # noqa: E402

pytestmark = pytest.mark.slow

FIXED = {"depth": 3, "width": 2, "nodes": 6}


def tree_params(draft_tree, max_tokens: int = 32) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, draft_tree=draft_tree)


def _tree_stats(results) -> tuple[int, int, int]:
    """(trees verified, nodes verified, drafts accepted) over ``results``."""
    return (
        sum(r.stats["tree_verifications"] for r in results),
        sum(r.stats["tree_nodes_verified"] for r in results),
        sum(r.stats["accepted"] for r in results),
    )


@pytest.fixture(scope="module")
def pipe(pair_bundle, head) -> Pipeline:
    # No default draft_tree: requests choose (the exact preset's f32 KV cache moves token by token).
    return Pipeline(pair_bundle, drafter="eagle3", eagle3_head=head[2], properties=EXACT_PRESET)


def test_the_engine_drafts_eagle3_trees(pipe):
    assert isinstance(pipe.engine.tree_drafter, Eagle3TreeDrafter)


# ----------------------------------------------------------------------------- exact greedy output


@pytest.mark.parametrize("draft_tree", [FIXED, "auto"], ids=["fixed", "auto"])
def test_one_request_at_a_time(pipe, target_only, draft_tree, monkeypatch):
    # The tiny head costs about as much as the tiny target, so "auto" would rightly not draft: report
    # a cheap draft and a verification that costs the same for any number of nodes, so that the policy
    # picks trees from the measured acceptance alone (timings on a loaded machine can look steep).
    monkeypatch.setattr(pipe.engine.cost_model, "draft_cost", lambda num_tokens: 1e-6 * num_tokens)
    monkeypatch.setattr(pipe.engine.cost_model, "target_cost", lambda num_tokens, num_sequences=None: 1e-3)
    results = [pipe.generate(prompt, tree_params(draft_tree))[0] for prompt in PROMPTS[:NUM_PROMPTS]]
    assert _mismatches(target_only, results) == []
    trees, nodes, _accepted = _tree_stats(results)
    assert trees > 0 and nodes > 2 * trees, "trees of several nodes must have been verified"
    assert len(pipe.engine.proposer.states) == 0  # every finished sequence released
    assert all(name.startswith("\x00") for name in pipe.engine.proposer.head.sequences)  # calibration's only


def test_sixteen_in_flight(pipe, target_only):
    prompts = PROMPTS[:NUM_PROMPTS] + PROMPTS[: 16 - NUM_PROMPTS]
    results = pipe.generate(prompts, tree_params(FIXED))
    assert _mismatches(target_only + target_only[: 16 - NUM_PROMPTS], results) == []
    assert _tree_stats(results)[0] > 0


def test_mixed_batch_of_trees_and_chains(pipe, target_only):
    params = [tree_params(FIXED) if i % 2 == 0 else greedy(3) for i in range(NUM_PROMPTS)]
    results = pipe.generate(PROMPTS[:NUM_PROMPTS], params)
    assert _mismatches(target_only, results) == []
    assert all(r.stats["tree_verifications"] > 0 for r in results[::2])
    assert all(r.stats["tree_verifications"] == 0 and r.stats["drafted"] > 0 for r in results[1::2])


def test_preemption_keeps_output_exact(pair_bundle, head, target_only):
    pipe = Pipeline(
        pair_bundle,
        drafter="eagle3",
        eagle3_head=head[2],
        properties=EXACT_PRESET,
        num_kv_blocks=12,
        draft_tree=FIXED,
    )
    results = pipe.generate(PROMPTS[:NUM_PROMPTS], tree_params(None))
    assert _mismatches(target_only, results) == []
    assert sum(r.stats["num_preemptions"] for r in results) > 0
    assert _tree_stats(results)[0] > 0
    assert pipe.engine.block_manager.num_used_blocks == 0
    assert len(pipe.engine.proposer.states) == 0


# ----------------------------------------------------------------------------- accepted paths


def test_accepted_paths_off_the_first_branch_stay_exact(
    pair_bundle, target_config, target_only, tmp_path, monkeypatch
):
    """A head whose logits rank the target's next token second at every fourth position (a wrong
    token first) and first elsewhere: the tree's second branch is accepted and followed deeper, and
    the output is still the target's. Every seventh position is left to the random head (rejections).
    """
    prompt_index = 4
    plain = Pipeline(pair_bundle, drafter="none", properties=EXACT_PRESET)
    tokens = plain.encode(PROMPTS[prompt_index]) + target_only[prompt_index]
    wanted = sorted(set(tokens))
    others = [t for t in range(target_config["vocab_size"]) if t not in set(wanted)][::3]
    draft_ids = np.array(sorted(wanted + others[: max(0, DRAFT_VOCAB - len(wanted))]))
    module, config = random_head(target_config, len(draft_ids), seed=HEAD_SEED, aux_layer_ids=TAPS)
    module.set_draft_vocabulary(draft_ids)
    head_dir = save_head(module, config, tmp_path / "oracle")

    pipe = Pipeline(
        pair_bundle, drafter="eagle3", eagle3_head=head_dir, properties=EXACT_PRESET, draft_tree=FIXED
    )
    ov_head = pipe.engine.proposer.head
    draft_of = {int(t): d for d, t in enumerate(ov_head.target_ids)}
    run = ov_head.run

    def oracle_run(steps):
        results = run(steps)
        for step, result in zip(steps, results, strict=True):
            for index, row in enumerate(step.logits_rows):
                predicted = int(step.positions[row]) + 2  # slot j predicts the token at j + 2
                if predicted >= len(tokens) or predicted % 7 == 0:
                    continue
                right = draft_of[tokens[predicted]]
                result.logits[index] = 0.0
                result.logits[index, right] = 8.0
                if predicted % 4 == 0:
                    result.logits[index, (right + 1) % len(draft_ids)] = 9.0
        return results

    monkeypatch.setattr(ov_head, "run", oracle_run)
    paths: list[list[int]] = []
    record = pipe.engine.tree_policy.record
    monkeypatch.setattr(
        pipe.engine.tree_policy, "record", lambda counts, ranks: (paths.append(ranks), record(counts, ranks))
    )
    result = pipe.generate(PROMPTS[prompt_index], tree_params(FIXED))[0]
    assert result.token_ids == target_only[prompt_index]
    assert any(len(ranks) >= 2 and ranks[0] >= 1 for ranks in paths), paths
    assert any(len(ranks) == 3 for ranks in paths), paths  # whole depth-3 paths accepted
    assert result.stats["accepted"] > result.stats["verification_steps"]  # > 1 draft per step


# ----------------------------------------------------------------------------- sampled requests

TREE = {"depth": 2, "width": 2, "nodes": 4}
# max_tokens 6 leaves the first speculative step a budget of 4 nodes: 2 children of the root and 2 of
# the better one (the scheduler grants at most max_tokens - outputs - 1 drafts).
SAMPLED = dict(max_tokens=6, temperature=1.5, top_k=3, top_p=1.0, min_p=0.0, ignore_eos=True, draft_tree=TREE)
NUM_SAMPLES = 2000  # the engine test's 6000 is minutes on this machine; 27 cells still see ~70 each


def _sample_triples(pair_bundle, head_dir) -> list[tuple[int, ...]]:
    pipe = Pipeline(
        pair_bundle,
        drafter="eagle3",
        eagle3_head=head_dir,
        properties=F32,
        draft_tree=TREE,
        engine_config=sampling_engine_config(pair_bundle),
    )
    results = pipe.generate([PROMPT] * NUM_SAMPLES, SamplingParams(**SAMPLED))
    assert all(r.stats["tree_verifications"] >= 1 for r in results)
    assert all(r.stats["tree_nodes_verified"] >= TREE["nodes"] for r in results)
    return [tuple(r.token_ids[:3]) for r in results]


def test_tree_sampling_follows_the_target(pair_bundle, head, exact_joint):
    p_value = goodness_of_fit(_sample_triples(pair_bundle, head[2]), exact_joint)
    assert p_value > SIGNIFICANCE, f"chi-square p = {p_value:.2e}"


def test_broken_tree_rule_is_caught_at_this_sample_size(pair_bundle, head, exact_joint, monkeypatch):
    monkeypatch.setattr(TreeAcceptance, "residual", staticmethod(lambda residual, q_i: residual))
    p_value = goodness_of_fit(_sample_triples(pair_bundle, head[2]), exact_joint)
    assert p_value < SIGNIFICANCE, f"a broken rule passed: chi-square p = {p_value:.2e}"


# ----------------------------------------------------------------------------- trees against the reference


class _Recorder:
    """Wraps the tree drafter's ``propose``: (tokens computed, shape, budget, proposal) of every tree."""

    def __init__(self, drafter: Eagle3TreeDrafter):
        self.calls: list[tuple[int, TreeShape, int, object]] = []
        self._propose = drafter.propose

    def __call__(self, requests, rngs=None):
        before = {
            c.sequence.request_id: (c.sequence.num_computed_tokens, shape, c.num_draft_tokens)
            for c, shape in requests
        }
        proposals = self._propose(requests, rngs)
        for request_id, proposal in proposals.items():
            self.calls.append((*before[request_id], proposal))
        return proposals


def _reference_tree(module, ov_head, states, tokens, computed: int, shape: TreeShape, budget: int):
    """The tree the drafting rules build from the torch head's logits, each node's row computed from
    scratch as the chain along its root-to-node path (so no mask is involved)."""
    target_ids = ov_head.target_ids
    with torch.no_grad():
        fused = module.fuse(torch.from_numpy(states[:computed]))[None]  # [1, computed, hidden]
        embeds = torch.from_numpy(ov_head.embed(tokens[1 : computed + 1]))[None]
        root_logits, root_hidden, root_cache = module(embeds, fused, torch.arange(computed)[None])

    build = TreeBuild(
        SimpleNamespace(sequence=SimpleNamespace(params=tree_params(None), request_id="ref")),  # type: ignore[arg-type]
        shape,
        budget,
        None,
    )

    def path_logits(node: int) -> np.ndarray:  # [draft vocab]
        path = [node]
        while build.nodes[path[-1]].parent >= 0:
            path.append(build.nodes[path[-1]].parent)
        hidden, cache = root_hidden[:, -1:], root_cache
        with torch.no_grad():
            for step, path_node in enumerate(reversed(path), start=1):
                embeds = torch.from_numpy(ov_head.embed([build.nodes[path_node].token]))[None]
                position = torch.tensor([[computed - 1 + step]])
                logits, hidden, cache = module(embeds, hidden, position, cache)
        return logits[0, -1].numpy()

    vocab = ov_head.config.vocab_size
    build.expand([-1], root_logits[0, -1:].numpy(), vocab, target_ids)
    for depth in range(1, shape.depth):
        frontier = build.choose_frontier(depth)
        if not frontier:
            break
        build.expand(frontier, np.stack([path_logits(node) for node in frontier]), vocab, target_ids)
    return build.proposal()


def test_trees_equal_the_torch_reference(pair_bundle, head, monkeypatch):
    module, _config, head_dir = head
    pipe = Pipeline(
        pair_bundle, drafter="eagle3", eagle3_head=head_dir, properties=EXACT_PRESET, draft_tree=FIXED
    )
    recorder = _Recorder(pipe.engine.tree_drafter)
    monkeypatch.setattr(pipe.engine.tree_drafter, "propose", recorder)
    prompt = PROMPTS[3]
    result = pipe.generate(prompt, tree_params(FIXED, max_tokens=24))[0]
    tokens = pipe.encode(prompt) + result.token_ids
    assert len(recorder.calls) > 2, "few trees were drafted"
    assert any(computed > len(pipe.encode(prompt)) for computed, *_ in recorder.calls)

    states = unfused_target_states(pair_bundle, tokens)  # [len(tokens), 3 * hidden]
    ov_head = pipe.engine.proposer.head
    for computed, shape, budget, proposal in recorder.calls:
        expected = _reference_tree(module, ov_head, states, tokens, computed, shape, budget)
        assert (proposal.token_ids, proposal.tree_parents) == (expected.token_ids, expected.tree_parents), (
            f"after {computed} tokens"
        )
    # Trees with several levels and branches: the masks decided what each node saw.
    assert any(max(proposal.tree_parents) >= 1 for *_, proposal in recorder.calls)
