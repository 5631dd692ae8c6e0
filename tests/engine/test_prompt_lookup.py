"""Prompt lookup beside the draft model, through the engine: exact, counted, and only where it may run."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import EXACT_PRESET
from tests.engine.test_exactness import PROMPTS, target_only_outputs
from tests.support.engine_runs import draft_whenever_the_cost_model_says
from xpuspec import Pipeline, SamplingParams
from xpuspec.engine.engine import EngineConfig

MAX_TOKENS = 48
ADAPTIVE = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def target_only(pair_bundle) -> list[list[int]]:
    return target_only_outputs(pair_bundle, ADAPTIVE)


@pytest.fixture(scope="module")
def pipe(pair_bundle) -> Pipeline:
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    # These tests are of what lookups draft and that it stays exact, at every batch; whether drafting
    # pays on this machine is the policy's tests' question (tests/spec_decode/policy/).
    draft_whenever_the_cost_model_says(pipe.engine)
    return pipe


def test_adaptive_gamma_looks_up_and_stays_exact(pipe, target_only):
    """One request at a time (decode bursts between drafting steps, sequences ending inside them)."""
    failures = pipe.engine.num_engine_failures
    results = [pipe.generate(prompt, ADAPTIVE)[0] for prompt in PROMPTS]
    assert [r.token_ids for r in results] == target_only
    assert [r.finish_reason for r in results] == ["length"] * len(PROMPTS)
    assert pipe.engine.num_engine_failures == failures
    lookup_drafted = sum(r.stats["lookup_drafted"] for r in results)
    assert lookup_drafted > 0, "no lookup was drafted: the comparison would not test it"
    assert 0 < sum(r.stats["lookup_accepted"] for r in results) <= lookup_drafted
    # Lookup drafts are part of the drafts; the draft model drafted too (where nothing recurred).
    assert sum(r.stats["drafted"] for r in results) >= lookup_drafted


def test_sixteen_in_flight(pipe, target_only, monkeypatch):
    # A lookup is priced above the draft model wherever one matches: which drafts a batch of 16 takes
    # would otherwise follow this machine's timings, and where it took none the test tested nothing.
    monkeypatch.setattr(
        pipe.engine.policy.length_policy,
        "best",
        lambda rate, *args, drafting=True, max_gamma=None, **kwargs: (
            2 if max_gamma is None else min(2, max_gamma),
            1e9 if drafting else 2e9,
        ),
    )
    results = pipe.generate(PROMPTS[:16], ADAPTIVE)
    assert [r.token_ids for r in results] == target_only[:16]
    assert sum(r.stats["lookup_drafted"] for r in results) > 0


def test_lookup_acceptance_is_tracked_apart_from_the_draft_models(pipe):
    def lookup_tested() -> float:
        return sum(rates.pool._tested for rates in pipe.engine.prompt_lookup.acceptance.values())

    draft_pool = pipe.engine.policy.acceptance.pool
    tested = (lookup_tested(), draft_pool._tested)
    results = pipe.generate(PROMPTS[:4], ADAPTIVE)
    lookup_drafted = sum(r.stats["lookup_drafted"] for r in results)
    model_drafted = sum(r.stats["drafted"] for r in results) - lookup_drafted
    # Changed, not grown: a pool's counts decay as they take new drafts in.
    assert (lookup_tested() != tested[0]) == (lookup_drafted > 0)
    assert (draft_pool._tested != tested[1]) == (model_drafted > 0)


@pytest.mark.parametrize(
    "params",
    [
        dataclasses.replace(ADAPTIVE, num_draft_tokens=4),  # fixed γ: the draft model, like for like
        dataclasses.replace(ADAPTIVE, temperature=0.8, seed=7),  # seeded: drafting repeats run for run
    ],
    ids=["fixed-gamma", "seeded"],
)
def test_fixed_gamma_and_seeded_requests_never_look_up(pipe, params):
    results = pipe.generate(PROMPTS[:6], params)
    assert sum(r.stats["drafted"] for r in results) > 0
    assert sum(r.stats["lookup_drafted"] for r in results) == 0


def test_sampled_requests_look_up_too(pipe):
    """Unseeded sampled requests verify lookups with a one-hot q (the rejection sampler's
    deterministic-drafter rule, tested statistically in tests/spec_decode/test_rejection_sampler.py)."""
    params = dataclasses.replace(ADAPTIVE, temperature=0.3)
    results = pipe.generate(PROMPTS, params)
    assert all(r.finish_reason == "length" and len(r.token_ids) == MAX_TOKENS for r in results)
    assert sum(r.stats["lookup_drafted"] for r in results) > 0


def test_the_switch_turns_it_off(pair_bundle):
    config = EngineConfig(prompt_lookup=False)
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET, engine_config=config)
    assert pipe.engine.prompt_lookup is None
    results = pipe.generate(PROMPTS[:6], ADAPTIVE)
    assert sum(r.stats["lookup_drafted"] for r in results) == 0


def test_only_beside_a_draft_model(pair_bundle):
    assert Pipeline(pair_bundle, drafter="ngram", properties=EXACT_PRESET).engine.prompt_lookup is None
    assert Pipeline(pair_bundle, drafter="none", properties=EXACT_PRESET).engine.prompt_lookup is None


@pytest.mark.parametrize("tree_rate", [1e-9, 1e12], ids=["lookup-predicts-more", "tree-predicts-more"])
def test_an_auto_tree_gives_way_to_a_lookup_that_predicts_more(pair_bundle, target_only, tree_rate):
    """Where the "auto" policy picks a tree and a lookup exists, the cost model's prediction for each
    decides; either way the output stays target-only's. The tree policy is pinned to a tree with a
    chosen prediction, so the test does not depend on which shapes pay on this machine."""
    from xpuspec.sample.draft_tree import TreeShape

    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    assert pipe.engine.tree_drafter is not None
    pipe.engine.tree_policy.choose_with_rate = lambda *args: (TreeShape(3, 2, 6), tree_rate)
    draft_whenever_the_cost_model_says(pipe.engine)
    params = dataclasses.replace(ADAPTIVE, draft_tree="auto")
    results = [pipe.generate(prompt, params)[0] for prompt in PROMPTS[:8]]
    assert [r.token_ids for r in results] == target_only[:8]
    lookup_drafted = sum(r.stats["lookup_drafted"] for r in results)
    assert sum(r.stats["tree_verifications"] for r in results) > 0
    if tree_rate < 1:
        assert lookup_drafted > 0 and sum(r.stats["lookup_accepted"] for r in results) > 0
    else:
        assert lookup_drafted == 0


def test_a_tree_the_request_fixed_is_never_replaced_by_a_lookup(pipe):
    from xpuspec.sample.draft_tree import TreeShape

    params = dataclasses.replace(ADAPTIVE, draft_tree=TreeShape(3, 2, 6))
    results = pipe.generate(PROMPTS[:4], params)
    assert sum(r.stats["tree_verifications"] for r in results) > 0
    assert sum(r.stats["lookup_drafted"] for r in results) == 0


def test_lookups_do_not_keep_the_draft_models_probe_from_coming(pair_bundle):
    """With drafting priced hopeless, the draft model only drafts in probes. Lookup steps come often
    on these repetitive outputs; they must not count as the draft model drafting, or the probe that
    would re-measure a draft model estimated too low (on a busy moment) never comes."""
    from xpuspec.spec_decode.policy.cost_model import MAX_TOKENS_PER_SEQUENCE
    from xpuspec.spec_decode.policy.verify_costs import VerifyCostCurve

    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    engine = pipe.engine
    engine.cost_model.drafting = VerifyCostCurve(MAX_TOKENS_PER_SEQUENCE)
    for gamma in range(1, engine.config.max_draft_tokens + 1):
        engine.cost_model.calibrate_drafting(1, gamma, 10.0)
    params = dataclasses.replace(ADAPTIVE, max_tokens=200)
    results = [pipe.generate(prompt, params)[0] for prompt in PROMPTS[:8]]  # ~25 steps each
    lookup_drafted = sum(r.stats["lookup_drafted"] for r in results)
    assert lookup_drafted > 0, "no lookups: the test would not exercise them"
    assert sum(r.stats["drafted"] for r in results) - lookup_drafted >= 1  # a probe came


@pytest.mark.parametrize("shrink", [False, True], ids=["padding kept", "shrinking at once"])
def test_adaptive_decode_steps_keep_their_count_until_shrinking_pays(pair_bundle, target_only, shrink):
    """A decode step that needs fewer tokens than the last (a shorter lookup or chain) is padded up to
    the last step's count while ``shrink_pays`` says no; one that needs one token (γ = 0, a burst
    pass) runs on the target's decode lane unpadded. The choice is
    pinned here, so the test does not rest on this machine's timings."""
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    pipe.engine.cost_model.shrink_pays = lambda *args: shrink
    draft_whenever_the_cost_model_says(pipe.engine)  # steps without drafting are not padded
    runner = pipe.engine.target
    fill_inputs = runner._fill_inputs
    steps: list[tuple[int, int]] = []  # (tokens with padding, padding) of each decode step

    def recording(chunks, lane=None):
        if all(chunk.num_logits == len(chunk.token_ids) for chunk in chunks):
            steps.append((sum(len(c.token_ids) + c.padding for c in chunks), sum(c.padding for c in chunks)))
        return fill_inputs(chunks, lane)

    runner._fill_inputs = recording
    counts = []
    for prompt, expected in zip(PROMPTS[:8], target_only[:8], strict=True):
        steps.clear()
        assert pipe.generate(prompt, ADAPTIVE)[0].token_ids == expected
        counts.append(list(steps))
    padded = [padding for request in counts for _, padding in request if padding]
    if shrink:
        assert not padded
        assert any(a > b for request in counts for (a, _), (b, _) in zip(request, request[1:], strict=False))
    else:
        assert padded, "no step needed fewer tokens than the last: nothing was padded"
        # After the prefill, a request's decode steps on the target's main copy never shrink; steps of
        # one token run unpadded on its decode lane, which changes no shape (StepShape).
        assert runner.caps.decode_lane
        for request in counts:
            tokens = [count for count, _ in request if count > 1]
            assert tokens == sorted(tokens)
        assert any(
            (a, b) == (1, 0) and request[index - 1][0] > 1
            for request in counts
            for index, (a, b) in enumerate(request)
            if index
        ), "no one-token step after a larger one: the decode lane was not exercised"
