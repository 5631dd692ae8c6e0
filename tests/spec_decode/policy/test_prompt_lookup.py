"""Prompt lookup beside a draft model: the per-step choice against the draft's chain, and its acceptance."""

from __future__ import annotations

import pytest

from xpuspec.core.sequence import Sequence
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.policy.cost_model import CostModel
from xpuspec.spec_decode.policy.prompt_lookup import LONG_MATCH, PromptLookup
from xpuspec.spec_decode.policy.speculation_length import SpeculationLengthPolicy
from xpuspec.spec_decode.suffix_index import SharedSuffixIndex

# A target whose verification grows 10% per extra token, a draft pass at 30% of a target step.
VERIFY_MS = {n: 10.0 * (1 + 0.1 * (n - 1)) for n in range(1, 10)}
DRAFT_MS = 3.0


def _policy() -> SpeculationLengthPolicy:
    model = CostModel()
    for n, ms in VERIFY_MS.items():
        model.calibrate_target(1, n, ms / 1000)
    model.calibrate_draft(DRAFT_MS / 1000)
    return SpeculationLengthPolicy(max_draft_tokens=8, cost_model=model)


def _sequence(tokens: list[int], request_id: str = "r") -> Sequence:
    return Sequence(request_id, tokens[:1], SamplingParams(max_tokens=64), output_token_ids=tokens[1:])


REPEATING = [7, 1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3, 4, 5, 6, 9, 9, 1, 2]  # "1 2" recurs: "3 4 5 6 9 9 ..."


def test_free_drafts_cost_the_verification_alone() -> None:
    policy = _policy()
    with_draft = policy.step_costs(1, 1)
    free = policy.step_costs(1, 1, drafting=False)
    assert free[0] == with_draft[0]
    for gamma in range(1, 9):
        assert free[gamma] == pytest.approx(VERIFY_MS[gamma + 1] / 1000)
        assert with_draft[gamma] > free[gamma] + 0.9 * gamma * DRAFT_MS / 1000


def test_best_respects_max_gamma_and_reports_its_rate() -> None:
    policy = _policy()
    gamma, rate = policy.best(0.9, 1, 1, drafting=False)
    assert gamma > 3
    capped, capped_rate = policy.best(0.9, 1, 1, drafting=False, max_gamma=2)
    assert capped == 2 and capped_rate < rate
    assert capped_rate == pytest.approx((1 + 0.9 + 0.81) / (VERIFY_MS[3] / 1000))
    assert policy.choose(0.9, 1, 1) == policy.best(0.9, 1, 1)[0]


def test_a_recurring_tail_is_drafted_when_it_predicts_more() -> None:
    lookup, policy = PromptLookup(), _policy()
    sequence = _sequence(REPEATING)
    plain = 1000 / VERIFY_MS[1]
    draft = lookup.choose(sequence, policy, plain, 1, None)
    # The pool's starting rate (0.6) with free drafts beats plain decoding: the continuation of
    # "9 9 1 2", the longest recurring tail (MAX_NGRAM tokens).
    assert draft is not None and draft.ngram == 4 and len(draft.token_ids) >= 2
    assert draft.token_ids == [3, 4, 5, 6, 9, 9, 1, 2][: len(draft.token_ids)]
    assert lookup.choose(sequence, policy, 1e9, 1, None) is None  # the draft model predicts more


def test_no_lookup_without_a_recurring_ngram() -> None:
    assert PromptLookup().choose(_sequence([1, 2, 3, 4, 5, 6, 7, 8]), _policy(), 0.0, 1, None) is None
    # "8" recurs, "7 8" does not: a 1-token match, unless longer ones are asked for.
    short = PromptLookup().choose(_sequence([8, 1, 2, 3, 7, 8]), _policy(), 0.0, 1, None)
    assert short is not None and short.ngram == 1 and short.token_ids[0] == 1
    assert PromptLookup(min_ngram=2).choose(_sequence([8, 1, 2, 3, 7, 8]), _policy(), 0.0, 1, None) is None


def test_short_and_long_matches_are_tracked_apart() -> None:
    """Failing 1-token matches stop 1-token lookups, not those of longer matches."""
    lookup, policy = PromptLookup(), _policy()
    plain = 1000 / VERIFY_MS[1]
    short, long = _sequence([8, 1, 2, 3, 7, 8]), _sequence(REPEATING, "long")
    assert lookup.choose(short, policy, plain, 1, None) is not None
    for _ in range(40):
        lookup.update("r", 1, 4, 0)
    assert lookup.choose(short, policy, plain, 1, None) is None
    assert lookup.choose(long, policy, plain, 1, None) is not None
    assert lookup.acceptance[True].pool.rate > 0.5 > 0.1 > lookup.acceptance[False].pool.rate
    assert LONG_MATCH == 2


def test_lookup_acceptance_is_its_own_and_stops_lookups_that_fail() -> None:
    lookup, policy = PromptLookup(), _policy()
    sequence = _sequence(REPEATING)
    assert lookup.choose(sequence, policy, 1000 / VERIFY_MS[1], 1, None) is not None
    for _ in range(40):  # every lookup rejected at once
        lookup.update("r", 3, 4, 0)
    assert lookup.acceptance[True].rate("r", pooled_prior=True) < 0.1
    assert lookup.choose(sequence, policy, 1000 / VERIFY_MS[1], 1, None) is None
    lookup.forget("r")
    other = _sequence(REPEATING, "other")  # a new sequence starts from the pool: low as well
    assert lookup.choose(other, policy, 1000 / VERIFY_MS[1], 1, None) is None


def _shared_lookup() -> PromptLookup:
    """A lookup whose index holds one earlier request of tenant "key": "40 41 42 43 44 45 46 47"."""
    lookup = PromptLookup(shared=SharedSuffixIndex(1000))
    lookup.admit("earlier", "key")
    lookup.retire("earlier", [40, 41, 42, 43, 44, 45, 46, 47])
    return lookup


def test_an_earlier_requests_continuation_is_drafted_for_the_same_tenant_only() -> None:
    lookup, policy = _shared_lookup(), _policy()
    plain = 1000 / VERIFY_MS[1]
    sequence = _sequence([1, 2, 41, 42, 43])  # nothing recurs in its own tokens
    lookup.admit("r", "key")
    draft = lookup.choose(sequence, policy, plain, 1, None)
    assert draft is not None and draft.shared and draft.ngram == 3
    assert draft.token_ids == [44, 45, 46, 47][: len(draft.token_ids)]
    lookup.admit("other", "another key")
    assert lookup.choose(_sequence([1, 2, 41, 42, 43], "other"), policy, plain, 1, None) is None
    assert lookup.choose(_sequence([1, 2, 41, 42, 43], "anonymous"), policy, plain, 1, None) is None


def test_shared_acceptance_is_tracked_apart_and_stops_shared_drafts_that_fail() -> None:
    lookup, policy = _shared_lookup(), _policy()
    plain = 1000 / VERIFY_MS[1]
    own_rate = lookup.acceptance[True].pool.rate
    lookup.admit("r", "key")
    assert lookup.choose(_sequence([1, 2, 41, 42, 43]), policy, plain, 1, None) is not None
    for _ in range(40):  # every shared draft rejected at once
        lookup.update("r", 3, 4, 0, shared=True)
    assert lookup.shared_drafted == 160 and lookup.shared_accepted == 0
    assert lookup.acceptance[True].pool.rate == own_rate  # the sequence's own lookups keep theirs
    assert lookup.choose(_sequence([1, 2, 41, 42, 43]), policy, plain, 1, None) is None
    # Its own recurring tail is still drafted, by its own rate.
    both = lookup.choose(_sequence([41, 42, 43, 9, 41, 42, 43]), policy, plain, 1, None)
    assert both is not None and not both.shared and both.token_ids[0] == 9


def test_a_request_never_admitted_reads_no_tenants_documents() -> None:
    lookup, policy = PromptLookup(shared=SharedSuffixIndex(1000)), _policy()
    lookup.admit("earlier", None)
    lookup.retire("earlier", [40, 41, 42, 43, 44, 45])
    plain = 1000 / VERIFY_MS[1]
    assert lookup.choose(_sequence([1, 2, 41, 42, 43], "unknown"), policy, plain, 1, None) is None
    lookup.admit("anonymous", None)
    assert lookup.choose(_sequence([1, 2, 41, 42, 43], "anonymous"), policy, plain, 1, None) is not None


def test_a_request_joins_the_index_when_it_retires() -> None:
    lookup = PromptLookup(shared=SharedSuffixIndex(1000))
    lookup.admit("r", None)
    lookup.forget("r")  # forgotten, not retired: nothing indexed
    assert lookup.shared.num_documents == 0
    lookup.admit("r", None)
    lookup.retire("r", [5, 6, 7, 8, 9])
    assert lookup.shared.num_documents == 1 and lookup.shared.tenants() == [None]
    PromptLookup().retire("r", [5, 6, 7, 8, 9])  # without an index: only forgotten
