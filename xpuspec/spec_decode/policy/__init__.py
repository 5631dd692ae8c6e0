"""The speculation policy: how much each sequence drafts, from measured costs and acceptance.

:class:`SpeculationPolicy` is its one entry point. The engine builds one, asks it each step for the
draft lengths of the decoding sequences (before the scheduler plans the step) and for the trees and
prompt-lookup drafts it chose, and tells it what the step measured: the target's passes, the
drafting, each verification, and whether drafting paid at that batch. The modules behind it:

- ``cost_model`` and ``verify_costs``: the measured costs of target and draft steps;
- ``acceptance``: each sequence's draft acceptance rate, shrunk towards the pooled one;
- ``speculation_length``: γ of a chain (Leviathan et al.'s expected tokens per second);
- ``tree_policy``: the shape of an "auto" tree;
- ``prompt_lookup``: drafts that cost nothing where a sequence repeats itself, and their rates;
- ``drafting_payoff``: whether adaptive drafting pays at a batch shape and kind of work, from whole
  steps;
- ``batch_step``: whether a batched step's adaptive drafts, chosen per sequence, pay for the step as a
  whole;
- ``draft_choice``: per sequence and step, a chain, a tree, a lookup or nothing, and the probes;
- ``step_shape``: the target steps' shape, and the padding that keeps it.

Nothing outside this package imports them (a contract of ``.importlinter`` says so): the values
callers need are named here.
"""

from __future__ import annotations

from collections.abc import Collection

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.core.sequence import Sequence
from xpuspec.sample.draft_tree import TreeShape
from xpuspec.spec_decode.policy.acceptance import AcceptanceRates, AcceptanceTracker
from xpuspec.spec_decode.policy.batch_step import drafts_pay
from xpuspec.spec_decode.policy.cost_model import CostModel, expected_tokens_per_step
from xpuspec.spec_decode.policy.draft_choice import SHORT_REPLY_TOKENS, DraftChoice, DraftDecision
from xpuspec.spec_decode.policy.prompt_lookup import MAX_NGRAM, LookupDraft, PromptLookup
from xpuspec.spec_decode.policy.speculation_length import SpeculationLengthPolicy
from xpuspec.spec_decode.policy.step_shape import StepShape, decode_sequences, step_tokens
from xpuspec.spec_decode.policy.tree_policy import MAX_RANK, TreeShapePolicy
from xpuspec.spec_decode.suffix_index import SharedSuffixIndex

__all__ = [
    "MAX_NGRAM",
    "MAX_RANK",
    "SHORT_REPLY_TOKENS",
    "AcceptanceTracker",
    "CostModel",
    "DraftDecision",
    "LookupDraft",
    "PromptLookup",
    "SpeculationLengthPolicy",
    "SpeculationPolicy",
    "TreeShapePolicy",
    "expected_tokens_per_step",
    "step_tokens",
]


class SpeculationPolicy:
    """How much each sequence drafts, and what the engine's steps teach about it; one per engine.

    ``has_drafter``: the engine has a drafter (without one nothing drafts, and nothing is recorded
    but the target's cost); ``drafts_trees``: it drafts trees as well; ``can_pad``: the target runs
    padding tokens (``StepShape``); ``decode_lane``: it runs steps of one token per sequence on a
    compiled copy of their own, which changes no shape (``ExecutorCaps.decode_lane``);
    ``prompt_lookup``: free prompt-lookup drafts beside the drafter,
    with a cross-request index of ``shared_lookup_tokens`` tokens (0: none).
    """

    def __init__(
        self,
        *,
        max_draft_tokens: int,
        max_model_len: int,
        has_drafter: bool,
        drafts_trees: bool = False,
        can_pad: bool = False,
        decode_lane: bool = False,
        prompt_lookup: bool = False,
        shared_lookup_tokens: int = 0,
    ) -> None:
        self.cost_model = CostModel(decode_lane=decode_lane)
        self.acceptance = AcceptanceRates()
        self.step_shape = StepShape(can_pad, max_model_len, decode_lane)
        self.length_policy = SpeculationLengthPolicy(max_draft_tokens, self.cost_model)
        self.tree_policy = TreeShapePolicy(self.cost_model, max_draft_tokens)
        self.draft_choice: DraftChoice | None = None  # None: no drafter, no drafts
        # A step of several decoding sequences drafts only where its adaptive drafts, chosen per
        # sequence, pay for the step as a whole (``batch_step``); tests of what drafting does turn
        # it off, as they pin the measured payoff.
        self.prices_batched_steps = True
        if has_drafter:
            shared = SharedSuffixIndex(shared_lookup_tokens) if shared_lookup_tokens else None
            self.draft_choice = DraftChoice(
                max_draft_tokens=max_draft_tokens,
                acceptance=self.acceptance,
                length_policy=self.length_policy,
                tree_policy=self.tree_policy,
                prompt_lookup=PromptLookup(shared=shared) if prompt_lookup else None,
                drafts_trees=drafts_trees,
                step_shape=self.step_shape,
            )

    @property
    def prompt_lookup(self) -> PromptLookup | None:
        """The prompt-lookup drafter beside the draft model, if any."""
        return self.draft_choice.prompt_lookup if self.draft_choice is not None else None

    # ------------------------------------------------------------ the step's choices
    def draft_lengths(
        self, sequences: list[Sequence], num_running: int, guided: Collection[str]
    ) -> dict[str, int]:
        """Forget the last step's choices and choose this step's: the drafts wanted for each of
        ``sequences`` (the step's decoding sequences, oldest first), a chain's γ or a tree's node
        budget. ``num_running``: the sequences the step runs; ``guided``: the ids of those with an
        output constraint. The order matters: a sequence's first question fixes its rate's prior."""
        choice = self.draft_choice
        if choice is None:
            return {}
        choice.new_step(sequences)
        lengths = {
            sequence.request_id: choice.num_draft_tokens(sequence, num_running, sequence.request_id in guided)
            for sequence in sequences
        }
        if self.prices_batched_steps and 1 < len(sequences) == num_running and choice.adaptive:
            other_tokens = num_running + sum(
                length for request_id, length in lengths.items() if request_id not in choice.adaptive
            )
            drafts = list(choice.adaptive.values())
            if not drafts_pay(self.cost_model, self.step_shape.last, num_running, other_tokens, drafts):
                choice.drop_adaptive_drafts(lengths)
        return lengths

    @property
    def trees(self) -> dict[str, TreeShape]:
        """The tree shape chosen for each sequence this step."""
        return self.draft_choice.trees if self.draft_choice is not None else {}

    @property
    def decisions(self) -> dict[str, DraftDecision]:
        """What each sequence asked about this step drafts, and why not where it does not."""
        return self.draft_choice.decisions if self.draft_choice is not None else {}

    @property
    def lookups(self) -> dict[str, LookupDraft]:
        """The prompt-lookup draft chosen for each sequence this step."""
        return self.draft_choice.lookups if self.draft_choice is not None else {}

    def burst_may_continue(self, sequences: list[Sequence]) -> bool:
        """Between the passes of a decode burst over ``sequences`` (all the running ones, none
        constrained): whether the next pass may run without drafts; if so it counts as a step
        without drafting (the probes of γ = 0 come after such steps)."""
        choice = self.draft_choice
        if choice is None:
            return True
        kind = choice.work_kind(sequences)
        if any(choice.would_draft(sequence, len(sequences), kind) for sequence in sequences):
            return False  # the next step drafts (or probes): a step of its own
        choice.steps_without_drafting += 1
        return True

    def reset_after_failure(self) -> None:
        """A step failed as a whole and every request in flight ended: the count of steps since the
        draft model last drafted starts again."""
        if self.draft_choice is not None:
            self.draft_choice.steps_without_drafting = 0

    # ------------------------------------------------------------ the target step's shape
    def fixed_padding(self, chunk: ScheduledChunk, num_tokens: int) -> int:
        """Padding that keeps a fixed-γ step's shape (``StepShape.fixed_padding``)."""
        return self.step_shape.fixed_padding(chunk, num_tokens)

    def keep_shape(self, runner_chunks: list[SequenceChunk]) -> None:
        """Pad a decode step up to the last step's shape while that pays (``StepShape.keep``); not
        while adaptive drafting is off at this batch, whose steps would otherwise carry the padding
        of the drafting steps before them for a while. Without a drafter every step has one shape."""
        choice = self.draft_choice
        if choice is not None:
            self.step_shape.keep(runner_chunks, self.cost_model, choice.step_drafting_on is not False)

    def record_shape(self, runner_chunks: list[SequenceChunk]) -> None:
        """A target pass ran ``runner_chunks`` (a decode burst's; its cost is recorded after the burst)."""
        if self.draft_choice is not None:
            self.step_shape.record(runner_chunks)

    def forget_shape(self) -> None:
        """The target ran passes outside the steps (calibration): no last step's shape to keep."""
        self.step_shape.forget()

    # ------------------------------------------------------------ what the steps measured
    def record_target_pass(self, runner_chunks: list[SequenceChunk], seconds: float) -> None:
        """A sequential step's ``seconds`` but its drafting, over the target's ``runner_chunks``: the
        engine's own work per step is paid once however many tokens the step emits, and speculation
        amortises it as it does the target's pass. Only the choice of γ reads it."""
        if self.draft_choice is None:
            return
        shape, changed = self.step_shape.record(runner_chunks)
        self.cost_model.record_target_step(shape[0], seconds, num_sequences=shape[1], shape_changed=changed)

    def record_target_step(self, num_tokens: int, seconds: float, num_sequences: int | None = None) -> None:
        """A target pass of ``num_tokens`` tokens took ``seconds`` (a burst's pass, an overlapped step's)."""
        self.cost_model.record_target_step(num_tokens, seconds, num_sequences=num_sequences)

    def record_drafting_step(self, wanted: list[ScheduledChunk]) -> None:
        """A step's drafting, ``wanted`` its chunks with drafts (``DraftChoice.record_step``)."""
        if self.draft_choice is not None:
            self.draft_choice.record_step(wanted)

    def record_drafting(
        self, timings: list[tuple[int, float]], seconds: float, num_sequences: int, gamma: int | None
    ) -> None:
        """A drafting phase: its passes (tokens, seconds) and its wall ``seconds``
        (``CostModel.record_drafting``)."""
        self.cost_model.record_drafting(timings, seconds, num_sequences, gamma=gamma)

    def record_verified(
        self, request_id: str, num_drafted: int, num_accepted: int, lookup_ngram: int, lookup_shared: bool
    ) -> bool:
        """``num_accepted`` of ``num_drafted`` drafts of ``request_id`` were accepted; returns whether
        they were a prompt lookup's (of an ``lookup_ngram``-token match), whose rates are its own."""
        prompt_lookup = self.prompt_lookup
        if lookup_ngram and prompt_lookup is not None:
            prompt_lookup.update(request_id, lookup_ngram, num_drafted, num_accepted, shared=lookup_shared)
            return True
        self.acceptance.update(request_id, num_drafted, num_accepted)
        return False

    def record_without_drafts(self, request_id: str) -> None:
        """A verified step without drafts for ``request_id``: its acceptance counts decay toward the
        prior, so a sequence whose γ fell to 0 drafts again (deterministically for seeded ones)."""
        if self.draft_choice is None:
            return
        self.acceptance.update(request_id, 0, 0)
        prompt_lookup = self.prompt_lookup
        if prompt_lookup is not None:
            prompt_lookup.update(request_id, 0, 0, 0)

    def record_tree_path(self, num_children_on_path: list[int], accepted_ranks: list[int]) -> None:
        """A greedy tree's accepted path, by sibling ranks (``TreeShapePolicy.record``)."""
        self.tree_policy.record(num_children_on_path, accepted_ranks)

    def record_payoff(
        self, num_sequences: int, runner_chunks: list[SequenceChunk], num_tokens: int, seconds: float
    ) -> None:
        """A whole decode step of ``num_sequences`` emitted ``num_tokens`` in ``seconds``: whether
        adaptive drafting pays at this batch (``DraftingPayoff``), for steps whose requests asked."""
        choice = self.draft_choice
        if choice is None or choice.step_drafting_on is None or not decode_sequences(runner_chunks):
            return
        plain_cost = self.cost_model.target_cost(num_sequences, num_sequences)
        plain_rate = num_sequences / plain_cost if plain_cost > 0.0 else 0.0  # 0: not measured yet
        choice.payoff.record(
            num_sequences, choice.step_kind, choice.step_drafting_on, num_tokens, seconds, plain_rate
        )

    # ------------------------------------------------------------ requests
    def admit(self, request_id: str, tenant: str | None) -> None:
        """A new request: its lookups read its ``tenant``'s earlier requests."""
        if self.prompt_lookup is not None:
            self.prompt_lookup.admit(request_id, tenant)

    def retire(self, request_id: str, token_ids: list[int]) -> None:
        """A request ended with ``token_ids``: forget its rates; its tokens join the lookup's index."""
        self.acceptance.forget(request_id)
        if self.prompt_lookup is not None:
            self.prompt_lookup.retire(request_id, token_ids)
