"""How each decoding sequence drafts in a step: a chain of γ draft tokens, an "auto" tree, a
prompt-lookup chain, or nothing; and when a stretch of γ = 0 is probed with one draft token.

The speculation policy (``xpuspec.spec_decode.policy.SpeculationPolicy``) asks
:meth:`DraftChoice.num_draft_tokens` for every decoding sequence before the scheduler plans a step,
and reads back the trees and lookups chosen for it (``trees``, ``lookups``) when the engine drafts.
Between the passes of a decode burst it asks :meth:`DraftChoice.would_draft`, which leaves the
step's choices alone. The number of running sequences and whether a sequence is constrained come
with each question: nothing here reads the engine.
"""

from __future__ import annotations

import logging
import math
from enum import Enum

from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.core.sequence import Sequence
from xpuspec.sample.draft_tree import TreeShape
from xpuspec.spec_decode.policy.acceptance import AcceptanceRates
from xpuspec.spec_decode.policy.batch_step import AdaptiveDraft
from xpuspec.spec_decode.policy.cost_model import expected_tokens_per_step
from xpuspec.spec_decode.policy.drafting_payoff import DraftingPayoff, WorkKind
from xpuspec.spec_decode.policy.prompt_lookup import LookupDraft, PromptLookup
from xpuspec.spec_decode.policy.speculation_length import SpeculationLengthPolicy
from xpuspec.spec_decode.policy.step_shape import StepShape
from xpuspec.spec_decode.policy.tree_policy import TreeShapePolicy

logger = logging.getLogger(__name__)


class DraftDecision(Enum):
    """What the policy chose for one sequence in one step (each request's stats count them)."""

    LOOKUP = "prompt lookup"
    MODEL = "draft model"
    TREE = "tree"
    OFF_MEASURED = "off: measured slower"  # whole steps with drafting were slower here (DraftingPayoff)
    OFF_PREDICTED = "off: predicted slower"  # the cost model's γ = 0
    OFF_SHORT = "off: short reply"  # max_tokens at most SHORT_REPLY_TOKENS, and no lookup


# An adaptive request allowed at most this many tokens never runs the draft model (or tree drafter): its
# first drafting pass catches the draft's cache up over the whole prompt, a set-up so short a reply
# cannot recover. Prompt lookups, which need none, still draft.
SHORT_REPLY_TOKENS = 16
# While adaptive γ is 0, every this many steps one step drafts a single token to re-measure.
PROBE_INTERVAL_STEPS = 64
MAX_PROBE_INTERVAL_STEPS = 1024
# A step is text being copied (WorkKind.COPY) where at least this share of its adaptive sequences have
# a long lookup match. One is not enough in a large batch: every sequence's step then grows for its
# few drafts, and a batch where most answer freely (question answering, with now and then a quoted
# name) was measured as copying, under the payoff of batches that copy throughout.
COPY_SHARE = 0.25


class DraftChoice:
    """The drafting choices of an engine with a drafter; one per engine. ``step_shape``: the target
    steps' shape (a γ that keeps the last step's shape is spared the cost of changing it)."""

    def __init__(
        self,
        *,
        max_draft_tokens: int,
        acceptance: AcceptanceRates,
        length_policy: SpeculationLengthPolicy,
        tree_policy: TreeShapePolicy,
        prompt_lookup: PromptLookup | None,
        drafts_trees: bool,
        step_shape: StepShape,
    ) -> None:
        self.max_draft_tokens = max_draft_tokens
        self.acceptance = acceptance
        self.length_policy = length_policy
        self.tree_policy = tree_policy
        self.prompt_lookup = prompt_lookup
        self.drafts_trees = drafts_trees  # the engine has a drafter of trees (LLMEngine._make_tree_drafter)
        self._step_shape = step_shape
        self.trees: dict[str, TreeShape] = {}  # the tree shape of each sequence this step
        self.lookups: dict[str, LookupDraft] = {}  # the prompt-lookup draft of each sequence this step
        self.decisions: dict[str, DraftDecision] = {}  # what each sequence drafts this step
        # The adaptive chains chosen this step (not fixed, seeded, trees or probes), with what each is
        # predicted to give: a batched step checks they pay for the step as a whole (batch_step).
        self.adaptive: dict[str, AdaptiveDraft] = {}
        self.steps_without_drafting = 0
        self.probe_interval = PROBE_INTERVAL_STEPS  # doubles after each probe that finds no gain
        self._probed = self._policy_drafted = False  # this step's choices of γ (reset by record_step)
        # Whole steps' tokens per second with drafts and without, per batch shape (recorded by the
        # engine): adaptive drafting stops where it has given less.
        self.payoff = DraftingPayoff()
        # Whether this step's adaptive requests were allowed to draft (None: none asked), and the
        # kind of work the step is measured as (``work_kind``).
        self.step_drafting_on: bool | None = None
        self.step_kind = WorkKind.FREE
        self._warned_no_trees = False

    def new_step(self, sequences: list[Sequence]) -> None:
        """Forget the last step's trees and lookups (before the scheduler plans the next, whose
        decoding ``sequences`` set the kind of work it is measured as)."""
        self.trees = {}
        self.lookups = {}
        self.decisions = {}
        self.adaptive = {}
        self.step_drafting_on = None
        self.step_kind = self.work_kind(sequences)

    def work_kind(self, sequences: list[Sequence]) -> WorkKind:
        """The step's kind of work, from the prompt lookups of its adaptive ``sequences`` (unseeded, γ
        not fixed): COPY where at least :data:`COPY_SHARE` of them have a long match, SHORT_MATCH where
        any has a match, FREE otherwise."""
        lookup = self.prompt_lookup
        if lookup is None:
            return WorkKind.FREE
        adaptive = long = matched = 0
        for sequence in sequences:
            if sequence.params.num_draft_tokens is not None or sequence.params.seeded:
                continue
            adaptive += 1
            match = lookup.has_long_match(sequence, self.max_draft_tokens)
            long += bool(match)
            matched += match is not None
        if long and long >= COPY_SHARE * adaptive:
            return WorkKind.COPY
        return WorkKind.SHORT_MATCH if matched else WorkKind.FREE

    def num_draft_tokens(self, sequence: Sequence, num_running: int, guided: bool) -> int:
        """Drafts wanted for ``sequence`` this step: a chain's γ, or a tree's node budget.
        ``num_running``: the sequences the step runs; ``guided``: ``sequence`` has an output constraint."""
        request_id = sequence.request_id
        shape, tree_rate = self._tree_choice(sequence, num_running, guided)
        if shape is None:
            gamma, probe, lookup = self._chain_length(sequence, num_running)
            adaptive = sequence.params.num_draft_tokens is None
            if adaptive and not sequence.params.seeded:
                self._probed |= probe
                self._policy_drafted |= gamma > 0 and not probe and lookup is None
                if gamma > 0 and not probe:
                    self.adaptive[request_id] = self._adaptive_draft(sequence, gamma, lookup)
            if lookup is not None:
                self.lookups[request_id] = lookup
            self.decisions[request_id] = self._chain_decision(sequence, gamma, lookup is not None)
            return gamma
        lookup = self._lookup_over_tree(sequence, tree_rate, num_running)
        if lookup is not None:
            self.lookups[request_id] = lookup
            self.decisions[request_id] = DraftDecision.LOOKUP
            return len(lookup.token_ids)
        self.trees[request_id] = shape
        self.decisions[request_id] = DraftDecision.TREE
        return shape.nodes

    def _adaptive_draft(self, sequence: Sequence, gamma: int, lookup: LookupDraft | None) -> AdaptiveDraft:
        """What an adaptive chain of ``gamma`` drafts is predicted to give ``sequence`` (for
        :meth:`drop_adaptive_drafts`' check of the step as a whole)."""
        if lookup is not None:
            return AdaptiveDraft(gamma, lookup.expected_tokens, from_model=False)
        expected = expected_tokens_per_step(self._acceptance_rate(sequence), gamma)
        return AdaptiveDraft(gamma, expected, from_model=True)

    def drop_adaptive_drafts(self, lengths: dict[str, int]) -> None:
        """The step drafts nothing adaptive after all (its drafts do not pay for the step as a whole:
        ``batch_step``): their lengths in ``lengths`` become 0, and they count as predicted slower."""
        for request_id in self.adaptive:
            lengths[request_id] = 0
            self.lookups.pop(request_id, None)
            self.decisions[request_id] = DraftDecision.OFF_PREDICTED
        self.adaptive = {}

    def _chain_decision(self, sequence: Sequence, gamma: int, looked_up: bool) -> DraftDecision:
        """What a chain step of ``gamma`` drafts for ``sequence`` is, and why nothing where it is 0."""
        if looked_up:
            return DraftDecision.LOOKUP
        if gamma > 0:
            return DraftDecision.MODEL
        if sequence.params.num_draft_tokens is None:
            if self.step_drafting_on is False:
                return DraftDecision.OFF_MEASURED
            if sequence.params.token_limit <= SHORT_REPLY_TOKENS:
                return DraftDecision.OFF_SHORT
        return DraftDecision.OFF_PREDICTED

    def would_draft(self, sequence: Sequence, num_running: int, kind: WorkKind) -> bool:
        """Whether a step of ``kind`` now would draft for ``sequence``, which has no output constraint
        (asked between the passes of a decode burst: unlike :meth:`num_draft_tokens` it leaves this
        step's choices alone)."""
        drafting_on, step_kind = self.step_drafting_on, self.step_kind
        self.step_kind = kind
        try:
            return (
                self._tree_choice(sequence, num_running, guided=False)[0] is not None
                or self._chain_length(sequence, num_running)[0] > 0
            )
        finally:
            self.step_drafting_on, self.step_kind = drafting_on, step_kind

    def record_step(self, wanted: list[ScheduledChunk]) -> None:
        """A step's drafting, ``wanted`` its chunks with drafts: count the steps since the draft
        model last drafted, and space the probes of γ = 0 out while they find no gain."""
        probed, policy_drafted = self._probed, self._policy_drafted
        self._probed = self._policy_drafted = False
        if not wanted or all(c.sequence.request_id in self.lookups for c in wanted):
            # Lookups alone say nothing new about the draft model: a stretch of them must not keep
            # its probe from coming (with the draft's rate once estimated low, it would never draft).
            self.steps_without_drafting += 1
            if not wanted:
                return
        else:
            self.steps_without_drafting = 0
        if policy_drafted:
            self.probe_interval = PROBE_INTERVAL_STEPS
        elif probed:
            self.probe_interval = min(2 * self.probe_interval, MAX_PROBE_INTERVAL_STEPS)

    def _tree_choice(self, sequence: Sequence, running: int, guided: bool) -> tuple[TreeShape | None, float]:
        """The tree this sequence drafts this step (None: a chain, or no drafting), and the tokens per
        second the cost model predicts for an "auto" tree (infinite for a shape the request fixed,
        which nothing replaces)."""
        wanted = sequence.params.draft_tree
        if wanted is None or sequence.params.seeded:
            return None, 0.0  # seeded requests keep coupled chain verification (tree_acceptance)
        if guided:
            return None, 0.0  # the grammar masks chains (xpuspec.engine.constraints), not trees
        if not self.drafts_trees:
            if not self._warned_no_trees:
                self._warned_no_trees = True
                logger.warning(
                    "draft_tree was asked for but this engine drafts chains only: trees need a draft "
                    "model or an EAGLE-3 head, paged runners with qq_bias inputs and a target KV cache "
                    "whose tokens can move (on CPU a u8 key cache needs KEY_CACHE_QUANT_MODE=BY_TOKEN)"
                )
            return None, 0.0
        if isinstance(wanted, TreeShape):
            return (wanted, math.inf) if not wanted.is_chain else (None, 0.0)
        if not self._may_draft(running):
            return None, 0.0  # the chain's γ is 0 then too (_chain_length)
        if sequence.params.token_limit <= SHORT_REPLY_TOKENS:
            return None, 0.0  # no drafter set-up for a short reply: a lookup chain at most (_chain_length)
        return self.tree_policy.choose_with_rate(self._acceptance_rate(sequence), running, running)

    def _lookup_over_tree(
        self, sequence: Sequence, tree_tokens_per_second: float, running: int
    ) -> LookupDraft | None:
        """A prompt-lookup chain to verify instead of this step's "auto" tree, when the cost model
        predicts more tokens per second for it (as :meth:`_chain_length` weighs it against a chain).
        Lookup and tree are not mixed in one step: each is verified as it is verified alone."""
        if self.prompt_lookup is None or math.isinf(tree_tokens_per_second):
            return None
        previous = self._previous_tokens_per_sequence(running)
        return self.prompt_lookup.choose(
            sequence, self.length_policy, tree_tokens_per_second, running, previous
        )

    def _acceptance_rate(self, sequence: Sequence) -> float:
        """The sequence's draft acceptance rate. Its first call fixes the tracker's prior, so the
        tree and chain choices must ask alike: unseeded requests start from the rate pooled over
        every sequence's drafts, not from the fixed prior."""
        return self.acceptance.rate(sequence.request_id, pooled_prior=not sequence.params.seeded)

    def _chain_length(self, sequence: Sequence, running: int) -> tuple[int, bool, LookupDraft | None]:
        """γ of a chain for ``sequence`` now, whether that γ is a probe (see below), and the
        prompt-lookup draft to verify instead of the drafter's, if one predicts more."""
        fixed = sequence.params.num_draft_tokens
        if fixed is not None:
            return min(fixed, self.max_draft_tokens), False, None
        rate = self._acceptance_rate(sequence)
        if sequence.params.seeded:
            # A seeded request's tokens do not depend on γ (position-keyed noise, coupled
            # verification); γ from the acceptance rate alone makes its drafting repeat as well.
            # γ = 0 steps decay the rate's counts (xpuspec.engine.verification), so it drafts again after a
            # bad stretch.
            return self.length_policy.choose_without_timing(rate), False, None
        if not self._may_draft(running):
            return 0, False, None
        previous = self._previous_tokens_per_sequence(running)
        short = sequence.params.token_limit <= SHORT_REPLY_TOKENS  # lookups only
        gamma, tokens_per_second = self.length_policy.best(
            rate, running, running, previous, max_gamma=0 if short else None
        )
        if gamma == 0 and not short and self.steps_without_drafting >= self.probe_interval:
            # γ = 0 measures nothing about the draft: probe now and then, so that a draft cost
            # measured on a busy machine, or an acceptance rate that has recovered, is seen again.
            # A probe costs two changes of the target's shape and a long draft catch-up: while
            # probes do not bring drafting back, they come ever more rarely (record_step). It goes
            # before a lookup: where lookups come every step, the draft model is otherwise never
            # measured again, and the pooled rate other sequences start from stays where it fell.
            return min(1, self.max_draft_tokens), True, None
        if self.prompt_lookup is not None:
            lookup = self.prompt_lookup.choose(
                sequence, self.length_policy, tokens_per_second, running, previous
            )
            if lookup is not None:
                return len(lookup.token_ids), False, lookup
        return gamma, False, None

    def _may_draft(self, running: int) -> bool:
        """Whether adaptive requests may draft at this batch shape and kind of work this step
        (:class:`~xpuspec.spec_decode.policy.drafting_payoff.DraftingPayoff`). Its steps without drafts also
        measure γ = 0 at that shape, the cost every γ is weighed against: at a shape never
        calibrated it otherwise came from one odd step, which could make verifying several tokens
        per sequence look as cheap as one (docs/experiments/code-comment-figures.md)."""
        allowed = self.payoff.pays(running, self.step_kind)
        self.step_drafting_on = allowed
        return allowed

    def _previous_tokens_per_sequence(self, running: int) -> int | None:
        """Tokens each sequence verified last step (with a decode lane: the main copy's last step), if
        that step decoded the same number of sequences with as many tokens each (only then does
        keeping γ keep the target's shape)."""
        shape = self._step_shape.last
        if shape is None:
            return None
        num_tokens, num_sequences = shape
        if num_sequences != running or num_tokens % running:
            return None
        return num_tokens // running
