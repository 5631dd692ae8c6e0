"""Whether a batched step's adaptive drafts pay for the step as a whole.

Each sequence's γ is chosen as if every sequence of the batch drafted as much
(:class:`~xpuspec.spec_decode.policy.speculation_length.SpeculationLengthPolicy`): the gain of
all of them then weighs against the cost of the longer step. In a real batch the sequences choose
apart, and one sequence's prompt lookup often drafts while the others do not. Its few extra
tokens then change the shape of the whole batch's step (OpenVINO's CPU plugin re-prepares every
node: ``CostModel.shape_change``), and the step after it changes back: a cost of the batch, for
one sequence's gain. On the default model with 8 requests in flight, such steps made adaptive
drafting slower than target-only even where it drafted in few steps (issue 53's profile:
docs/benchmarks.md, "Speculation per kind of task").

So, after the per-sequence choices, a step of several decoding sequences is priced whole:

    (N + Σ (E_i - 1)) / (c(T + Σ γ_i) + drafting)   against   N / c(T)

N sequences, T the step's tokens without the adaptive drafts, E_i the tokens sequence i is
predicted to emit with its γ_i drafts, c a target step's cost over that many tokens, with a change
of shape where the count differs from the last step's (and none where padding holds the last
step's larger shape: drafts then fill tokens the step runs anyway). The plain step is priced at the
cheaper of its padded shape and its own, smaller shape with the change back spread over the steps it
starts (:data:`SHRINK_HORIZON_STEPS`). Where plain decoding predicts more, the step drafts nothing
adaptive. Fixed γ, seeded requests, trees and the draft model's
probes are left as chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

from xpuspec.spec_decode.policy.cost_model import CostModel
from xpuspec.spec_decode.policy.step_shape import Shape

# Steps without drafts are priced as though they ran this many steps at their own shape, once they
# shrank to it: padded up to a drafting step's shape they cost nearly as much as that step, and
# priced so every step, a batch that drafted once drafts on for as long as padding holds its shape,
# at any acceptance (on 2 cores at batch 16 a target step's cost grows about linearly in its tokens).
SHRINK_HORIZON_STEPS = 8


@dataclass(frozen=True)
class AdaptiveDraft:
    """One sequence's adaptive draft in a step: its tokens, the tokens the sequence is predicted to
    emit with them (accepted and bonus), and whether the draft model makes them (a drafting phase)."""

    tokens: int
    expected_tokens: float
    from_model: bool


def step_seconds(cost_model: CostModel, last: Shape | None, num_tokens: int, num_sequences: int) -> float:
    """Predicted seconds of a decode step of ``num_tokens`` over ``num_sequences`` sequences after a
    step of shape ``last``: a smaller step is padded to the last shape (``StepShape.keep``), a larger or
    differently batched one pays a change of shape. One token a sequence on a decode lane pays
    neither (``CostModel.decode_lane``)."""
    if cost_model.decode_lane and num_tokens == num_sequences:
        return cost_model.target_cost(num_tokens, num_sequences)
    if last is not None and last[1] == num_sequences and num_tokens <= last[0]:
        return cost_model.target_cost(last[0], num_sequences)
    change = cost_model.shape_change if last is not None and last[0] != num_tokens else 0.0
    return cost_model.target_cost(num_tokens, num_sequences) + change


def shrunk_step_seconds(
    cost_model: CostModel, last: Shape | None, num_tokens: int, num_sequences: int
) -> float:
    """Predicted seconds of a decode step of exactly ``num_tokens``, its change of shape from ``last``
    spread over the :data:`SHRINK_HORIZON_STEPS` steps of the smaller shape it starts (none for one
    token a sequence on a decode lane)."""
    if cost_model.decode_lane and num_tokens == num_sequences:
        return cost_model.target_cost(num_tokens, num_sequences)
    change = cost_model.shape_change if last is not None and last[0] != num_tokens else 0.0
    return cost_model.target_cost(num_tokens, num_sequences) + change / SHRINK_HORIZON_STEPS


def drafts_pay(
    cost_model: CostModel,
    last: Shape | None,
    num_sequences: int,
    other_tokens: int,
    drafts: list[AdaptiveDraft],
) -> bool:
    """Whether the step's adaptive ``drafts`` predict more tokens per second for the whole step than
    the same step without them. ``other_tokens``: the step's tokens besides those drafts (one a
    sequence, and the drafts nothing here may drop)."""
    if not drafts:
        return True
    drafted = sum(draft.tokens for draft in drafts)
    gain = sum(draft.expected_tokens - 1.0 for draft in drafts)
    plain = min(
        step_seconds(cost_model, last, other_tokens, num_sequences),
        shrunk_step_seconds(cost_model, last, other_tokens, num_sequences),
    )
    speculative = step_seconds(cost_model, last, other_tokens + drafted, num_sequences)
    model_drafts = [draft.tokens for draft in drafts if draft.from_model]
    if model_drafts:
        speculative += cost_model.drafting_cost(max(model_drafts), len(model_drafts))
    return (num_sequences + gain) * plain >= num_sequences * speculative
