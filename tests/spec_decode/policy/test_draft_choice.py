"""The kind of work a step is measured as (``DraftChoice.work_kind``): the drafting payoff is kept
apart per kind, so a batch that mostly answers freely must not be measured as one that copies."""

from __future__ import annotations

from tests.spec_decode.policy.test_prompt_lookup import REPEATING, _sequence
from xpuspec.core.sequence import Sequence
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.policy.acceptance import AcceptanceRates
from xpuspec.spec_decode.policy.cost_model import CostModel
from xpuspec.spec_decode.policy.draft_choice import COPY_SHARE, DraftChoice
from xpuspec.spec_decode.policy.drafting_payoff import WorkKind
from xpuspec.spec_decode.policy.prompt_lookup import PromptLookup
from xpuspec.spec_decode.policy.speculation_length import SpeculationLengthPolicy
from xpuspec.spec_decode.policy.step_shape import StepShape
from xpuspec.spec_decode.policy.tree_policy import TreeShapePolicy

SHORT_MATCH = [8, 1, 2, 3, 7, 8]  # "8" recurs once: a 1-token match
NO_MATCH = [1, 2, 3, 4, 5, 6, 7, 8]


def _choice() -> DraftChoice:
    cost_model = CostModel()
    return DraftChoice(
        max_draft_tokens=8,
        acceptance=AcceptanceRates(),
        length_policy=SpeculationLengthPolicy(8, cost_model),
        tree_policy=TreeShapePolicy(cost_model, 8),
        prompt_lookup=PromptLookup(),
        drafts_trees=False,
        step_shape=StepShape(True, 512),
    )


def _batch(copying: int, short: int, free: int) -> list[Sequence]:
    tokens = [REPEATING] * copying + [SHORT_MATCH] * short + [NO_MATCH] * free
    return [_sequence(t, f"r{i}") for i, t in enumerate(tokens)]


def test_one_copying_sequence_alone_is_copy_work() -> None:
    choice = _choice()
    assert choice.work_kind(_batch(1, 0, 0)) is WorkKind.COPY
    assert choice.work_kind(_batch(0, 1, 0)) is WorkKind.SHORT_MATCH
    assert choice.work_kind(_batch(0, 0, 1)) is WorkKind.FREE


def test_a_batch_is_copy_work_only_where_a_good_share_of_it_copies() -> None:
    choice = _choice()
    needed = int(16 * COPY_SHARE)
    assert choice.work_kind(_batch(1, 7, 8)) is WorkKind.SHORT_MATCH
    assert choice.work_kind(_batch(needed - 1, 0, 17 - needed)) is WorkKind.SHORT_MATCH
    assert choice.work_kind(_batch(needed, 0, 16 - needed)) is WorkKind.COPY
    assert choice.work_kind(_batch(0, 0, 16)) is WorkKind.FREE


def test_requests_outside_adaptive_drafting_do_not_count() -> None:
    choice = _choice()
    fixed = Sequence(
        "fixed",
        REPEATING[:1],
        SamplingParams(max_tokens=64, num_draft_tokens=2),
        output_token_ids=REPEATING[1:],
    )
    seeded = Sequence(
        "seeded",
        REPEATING[:1],
        SamplingParams(max_tokens=64, temperature=1.0, seed=3),
        output_token_ids=REPEATING[1:],
    )
    assert choice.work_kind([fixed, seeded, *_batch(0, 0, 2)]) is WorkKind.FREE
    assert choice.work_kind([fixed, seeded, *_batch(1, 0, 3)]) is WorkKind.COPY
