"""A batched step's adaptive drafts, chosen per sequence, must pay for the step as a whole
(``xpuspec.spec_decode.policy.batch_step``): one sequence's lookup does not change the shape of
every sequence's step for its own small gain."""

from __future__ import annotations

from xpuspec.core.sequence import Sequence
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.policy import DraftDecision, SpeculationPolicy
from xpuspec.spec_decode.policy.batch_step import AdaptiveDraft, drafts_pay, step_seconds
from xpuspec.spec_decode.policy.cost_model import CostModel

STEP = 0.010  # seconds of a decode step of 8 sequences, one token each


def _costs(shape_change: float) -> CostModel:
    """8 sequences: each verified token per sequence adds a tenth of a step; a change of the step's
    shape costs ``shape_change``."""
    model = CostModel()
    for tokens in range(1, 9):
        model.calibrate_target(8, tokens, STEP * (1.0 + 0.1 * (tokens - 1)))
    model.calibrate_shape_change(shape_change)
    return model


def test_a_lone_lookup_that_changes_the_batchs_shape_does_not_pay() -> None:
    model = _costs(shape_change=STEP)
    lone = [AdaptiveDraft(tokens=3, expected_tokens=1.8, from_model=False)]
    assert not drafts_pay(model, (8, 8), 8, 8, lone)
    # The same draft where a change of shape costs nothing: its gain pays for its tokens.
    assert drafts_pay(_costs(shape_change=0.0), (8, 8), 8, 8, lone)


def test_drafts_of_every_sequence_pay_for_the_change_they_make() -> None:
    model = _costs(shape_change=STEP)
    everyone = [AdaptiveDraft(tokens=2, expected_tokens=2.4, from_model=False)] * 8
    assert drafts_pay(model, (8, 8), 8, 8, everyone)


def test_drafts_within_the_padding_of_the_last_shape_cost_nothing() -> None:
    model = _costs(shape_change=STEP)
    lone = [AdaptiveDraft(tokens=3, expected_tokens=1.2, from_model=False)]
    # The last step ran 16 tokens: padding holds them, so 11 tokens cost as much as 8.
    assert step_seconds(model, (16, 8), 11, 8) == step_seconds(model, (16, 8), 8, 8)
    assert drafts_pay(model, (16, 8), 8, 8, lone)


def test_a_compute_bound_batch_that_drafted_once_does_not_draft_on_for_its_padding() -> None:
    # 16 sequences where each verified token costs as much as a sequence's one token (a CPU's full
    # batch): the step that drafted ran 32 tokens. Priced against plain steps padded to 32 tokens, any
    # draft looked free and the batch drafted on at any acceptance; plain steps shrink to 16 instead.
    model = CostModel()
    for tokens in range(1, 5):
        model.calibrate_target(16, tokens, STEP * tokens)
    model.calibrate_shape_change(STEP / 2)
    weak = [AdaptiveDraft(tokens=1, expected_tokens=1.6, from_model=False)] * 16
    assert not drafts_pay(model, (32, 16), 16, 16, weak)
    # Drafts nearly always accepted still pay there.
    assert drafts_pay(model, (32, 16), 16, 16, [AdaptiveDraft(1, 1.97, from_model=False)] * 16)


def test_a_draft_models_phase_counts_against_its_drafts() -> None:
    model = _costs(shape_change=0.0)
    model.record_drafting([(1, STEP)], STEP, 1)  # a one-token draft pass as costly as a target step
    draft = [AdaptiveDraft(tokens=1, expected_tokens=1.5, from_model=True)]
    assert not drafts_pay(model, (8, 8), 8, 8, draft)
    assert drafts_pay(model, (8, 8), 8, 8, [AdaptiveDraft(1, 1.5, from_model=False)])


def _repeating(request_id: str, repeats: bool) -> Sequence:
    """A decoding sequence whose tail repeats earlier text (a prompt lookup finds a long match), or not."""
    tokens = [5, 6, 7, 8, 9, 10] * 3 if repeats else list(range(20, 38))
    sequence = Sequence(request_id, tokens[:12], SamplingParams(max_tokens=64, temperature=0.0))
    sequence.append_tokens(tokens[12:])
    return sequence


def test_the_policy_drops_a_lone_lookup_of_a_batch_and_says_why() -> None:
    policy = SpeculationPolicy(max_draft_tokens=4, max_model_len=256, has_drafter=True, prompt_lookup=True)
    model = policy.cost_model
    for batch in (1, 8):
        for tokens in range(1, 6):
            model.calibrate_target(batch, tokens, STEP * (1.0 + 0.1 * (tokens - 1)))
    model.calibrate_shape_change(STEP)
    for _ in range(20):  # the draft model is slow, and lookups are accepted often
        model.record_drafting([(8, 5 * STEP)], 5 * STEP, 8)
    lookup = policy.prompt_lookup
    assert lookup is not None
    for _ in range(50):
        lookup.acceptance[True].pool.update(10, 9)
        policy.acceptance.pool.update(10, 1)
    policy.step_shape.last = (8, 8)
    lone = [_repeating("copying", True)] + [_repeating(f"free-{i}", False) for i in range(7)]
    lengths = policy.draft_lengths(lone, 8, set())
    assert lengths["copying"] == 0 and policy.lookups == {}
    assert policy.decisions["copying"] is DraftDecision.OFF_PREDICTED
    # The control: every sequence copying drafts, and so does the lone one with the check off.
    copying = [_repeating(f"copying-{i}", True) for i in range(8)]
    assert all(length > 0 for length in policy.draft_lengths(copying, 8, set()).values())
    policy.prices_batched_steps = False
    assert policy.draft_lengths(lone, 8, set())["copying"] > 0


def test_a_step_of_one_token_each_on_a_decode_lane_pays_no_change_or_padding() -> None:
    """With a decode lane, plain steps after a drafting step run at their own shape for nothing, so a
    lone lookup's change of the batch's shape is paid once, not twice (priced there and back)."""
    model = _costs(shape_change=STEP)
    model.decode_lane = True
    assert step_seconds(model, (16, 8), 8, 8) == model.target_cost(8, 8)
    assert step_seconds(model, (16, 8), 12, 8) == model.target_cost(16, 8)  # padded as before
    model.decode_lane = False
    assert step_seconds(model, (16, 8), 8, 8) == model.target_cost(16, 8)
