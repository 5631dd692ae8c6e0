"""A short reply pays no drafting set-up it cannot recover: an adaptive request's draft model first
drafts at its ``SHORT_REPLY_TOKENS``-th output token (its first pass catches the draft's cache up
over the whole prompt), while prompt lookups, which need no set-up, may draft from the first."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import EXACT_PRESET
from tests.engine.test_exactness import PROMPTS
from tests.support.engine_runs import draft_whenever_the_cost_model_says
from xpuspec import Pipeline, SamplingParams
from xpuspec.spec_decode.policy.draft_choice import SHORT_REPLY_TOKENS, DraftDecision

ADAPTIVE = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def pipe(pair_bundle) -> Pipeline:
    """Adaptive γ that wants 2 drafts wherever it may draft, on every step: the rule alone decides."""
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    engine = pipe.engine
    engine.policy.draft_choice.prompt_lookup = None
    engine.policy.length_policy.best = lambda *args, max_gamma=None, **kwargs: (
        2 if max_gamma is None else min(2, max_gamma),
        1e9,
    )
    draft_whenever_the_cost_model_says(engine)
    return pipe


def _model_passes(pipe: Pipeline, params: SamplingParams) -> tuple[list[int], dict[str, int], list[int]]:
    """The tokens, the policy's decisions (steps) and the output length at each drafter call."""
    proposer = pipe.engine.proposer
    calls: list[int] = []
    propose = proposer.propose
    proposer.propose = lambda chunks, draw: (
        calls.append(chunks[0].sequence.num_output_tokens) or propose(chunks, draw)
    )
    try:
        result = pipe.generate(PROMPTS[0], params)[0]
    finally:
        del proposer.propose
    return result.token_ids, result.stats["drafting_decisions"], calls


def test_a_short_reply_never_runs_the_draft_model(pipe):
    target_only = pipe.generate(PROMPTS[0], dataclasses.replace(ADAPTIVE, num_draft_tokens=0))[0].token_ids
    short = dataclasses.replace(ADAPTIVE, max_tokens=SHORT_REPLY_TOKENS)
    tokens, decisions, calls = _model_passes(pipe, short)
    assert tokens == target_only[:SHORT_REPLY_TOKENS]
    assert calls == []
    assert set(decisions) == {DraftDecision.OFF_SHORT.value}


def test_a_longer_reply_and_a_fixed_gamma_draft_from_their_first_token(pipe):
    target_only = pipe.generate(PROMPTS[0], dataclasses.replace(ADAPTIVE, num_draft_tokens=0))[0].token_ids
    tokens, decisions, calls = _model_passes(pipe, ADAPTIVE)
    assert tokens == target_only
    assert calls and min(calls) == 1
    assert decisions[DraftDecision.MODEL.value] > 0 and DraftDecision.OFF_SHORT.value not in decisions
    fixed = dataclasses.replace(ADAPTIVE, max_tokens=SHORT_REPLY_TOKENS, num_draft_tokens=2)
    tokens, decisions, calls = _model_passes(pipe, fixed)
    assert tokens == target_only[:SHORT_REPLY_TOKENS] and min(calls) == 1
    assert DraftDecision.OFF_SHORT.value not in decisions
