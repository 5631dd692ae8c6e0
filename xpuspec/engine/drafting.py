"""The propose phase: the drafts of a step's decoding sequences, by whichever drafts each.

A sequence's drafts come from one of: the tokens its output constraint alone allows (forced), a
prompt-lookup draft the speculation policy chose with the step's draft lengths
(``SpeculationPolicy.lookups``), the drafter's chains, or the tree drafter's trees
(``SpeculationPolicy.trees``). A constraint-aware drafter masks its own rows by the request's
grammar (the mask is this module's :meth:`Drafting.constrain_draft_logits`); the other drafts are
cut at the first token the grammar forbids. A drafting failure of one sequence comes back as a
proposal with ``error``; :meth:`Drafting.drop_failed` ends that request alone and returns its
"error" output.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, cast

import numpy as np

from xpuspec.core.interfaces import ConstraintAwareDrafter, TreeDrafting
from xpuspec.core.proposal import Proposal
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.core.sequence import Sequence
from xpuspec.engine import constraints as structured
from xpuspec.engine.outputs import StepOutput
from xpuspec.sample.penalties import penalize
from xpuspec.sample.sampler import position_exponentials, race, sample

if TYPE_CHECKING:
    from xpuspec.engine.view import EngineView


class Drafting:
    """The engine's propose phase, and the per-step drafting state it keeps. ``tree_drafter``: the
    drafter of trees, if the engine drafts any."""

    def __init__(self, engine: EngineView, tree_drafter: TreeDrafting | None) -> None:
        self.engine = engine
        self.tree_drafter = tree_drafter
        self.seconds = 0.0  # wall time of the last drafting phase
        self.timings: list[tuple[int, float]] = []  # the drafting passes of this step
        # Requests whose grammar failed while the drafter masked their rows (this step's drafting).
        self._mask_failures: set[str] = set()
        # The sequences drafting this step, by request id: whose rows the draft-row hook penalises.
        self._drafting: dict[str, Sequence] = {}
        proposer = engine.proposer
        if proposer is not None and proposer.caps.constraint_aware:
            cast(ConstraintAwareDrafter, proposer).set_draft_mask(self.constrain_draft_logits)

    def propose(self, chunks: list[ScheduledChunk]) -> dict[str, Proposal]:
        """The proposals of the chunks that want drafts, by request id."""
        engine = self.engine
        if engine.proposer is None:
            return {}
        policy = engine.policy
        wanted = [c for c in chunks if c.num_draft_tokens > 0]
        policy.record_drafting_step(wanted)
        if not wanted:
            return {}
        guides = structured.guides_of(wanted, engine.states)
        forced = structured.forced_proposals(
            guides, {c.sequence.request_id: c.num_draft_tokens for c in wanted}
        )
        proposals = self._lookups(wanted)
        taken = forced.keys() | proposals.keys()
        drafting = [c for c in wanted if c.sequence.request_id not in taken]
        # Constrained requests never draft trees (the policy's choice), so the grammar masks only chains.
        trees = [c for c in drafting if c.sequence.request_id in policy.trees]
        chains = [c for c in drafting if c.sequence.request_id not in policy.trees]
        failed_rollbacks: dict[str, Proposal] = {}
        try:
            self._draft(chains, trees, proposals)
        finally:
            # Back to the committed state, whatever the draft did.
            structured.end_drafting(guides, failed_rollbacks)
        for request_id in self._mask_failures & proposals.keys():
            # The drafter ended it over its grammar's mask (constrain_draft_logits).
            proposals[request_id] = dataclasses.replace(proposals[request_id], failed_constraint=True)
        if guides:
            structured.constrain_proposals(proposals, guides)  # n-gram drafts the grammar forbids
            proposals.update(forced)
            proposals.update(failed_rollbacks)
        if drafting:  # lookups (or forced tokens) alone have no drafting phase to time
            self._record_cost(chains, trees)
        return proposals

    def _lookups(self, wanted: list[ScheduledChunk]) -> dict[str, Proposal]:
        """Prompt-lookup drafts chosen with the draft lengths (the policy's), cut to the γ the
        scheduler left room for; for guided requests too (cut at the first token the grammar
        forbids, later)."""
        lookups = self.engine.policy.lookups
        return {
            c.sequence.request_id: Proposal(
                lookups[c.sequence.request_id].token_ids[: c.num_draft_tokens],
                None,
                lookup_ngram=lookups[c.sequence.request_id].ngram,
                lookup_shared=lookups[c.sequence.request_id].shared,
            )
            for c in wanted
            if c.sequence.request_id in lookups
        }

    def _draft(
        self, chains: list[ScheduledChunk], trees: list[ScheduledChunk], proposals: dict[str, Proposal]
    ) -> None:
        """Run the drafter on ``chains`` and the tree drafter on ``trees``; time them."""
        engine = self.engine
        proposer = engine.proposer
        assert proposer is not None
        self.timings = []
        self._mask_failures = set()
        self._drafting = {c.sequence.request_id: c.sequence for c in chains + trees}
        started = engine.clock()
        try:
            if chains:
                proposer.step_timings = []
                proposals.update(proposer.propose(chains, self.draw))
                self.timings += proposer.step_timings
            if trees:
                tree_drafter = self.tree_drafter
                assert tree_drafter is not None  # the policy chooses trees only with one
                rngs = {
                    c.sequence.request_id: engine.states[c.sequence.request_id].rng
                    for c in trees
                    if not c.sequence.params.greedy
                }
                requests = [(c, engine.policy.trees[c.sequence.request_id]) for c in trees]
                proposals.update(tree_drafter.propose(requests, rngs))
                self.timings += tree_drafter.step_timings
        finally:
            self.seconds = engine.clock() - started if chains or trees else 0.0

    def _record_cost(self, chains: list[ScheduledChunk], trees: list[ScheduledChunk]) -> None:
        """Per pass and by tokens computed: a catch-up pass after a stretch of γ = 0 computes many
        tokens and must not read as an expensive single-token draft step. The wall time beyond
        the passes is the draft loop's Python, which each drafted token also costs."""
        lengths = {c.num_draft_tokens for c in chains}
        self.engine.policy.record_drafting(
            self.timings,
            self.seconds,
            len(chains) + len(trees),
            gamma=lengths.pop() if len(lengths) == 1 and not trees else None,
        )

    def constrain_draft_logits(self, request_id: str, drafted: list[int], logits: np.ndarray) -> np.ndarray:
        """A draft row ([1, draft vocab]) after ``drafted`` drafts, penalised as the target's row at that
        position will be (its repetition controls: a draft proposed from unpenalised rows is rejected
        wherever the penalty moves the target's choice) and masked by the request's grammar."""
        state = self.engine.states.get(request_id)
        sequence = self._drafting.get(request_id)
        if state is None or sequence is None:
            return logits
        if sequence.params.penalized:
            outputs = len(sequence.output_token_ids)
            logits = penalize(
                logits,
                sequence.token_ids,
                outputs,
                [drafted],
                sequence.params,
                state.eos_token_ids,
                state.breaker_ids,
            )
        if state.guide is None:
            return logits
        try:
            return state.guide.mask_draft_logits(drafted, logits)
        except Exception as error:  # the drafter ends this request alone, with this message
            self._mask_failures.add(request_id)
            raise structured.ConstraintFailure(structured.constraint_failure(error)) from error

    def draw(self, request_id: str, position: int, probs_row: np.ndarray) -> int:
        """Sample a draft token at a sequence position: seeded requests race their position's noise."""
        state = self.engine.states[request_id]
        if state.seed is None:
            return sample(probs_row, state.rng)
        return race(probs_row, position_exponentials(state.seed, position, probs_row.shape[0]))

    def drop_failed(
        self, chunks: list[ScheduledChunk], proposals: dict[str, Proposal]
    ) -> tuple[list[ScheduledChunk], list[StepOutput]]:
        """End the requests whose drafting failed; return the chunks that remain for the target and
        the "error" outputs of the requests ended."""
        failed = {rid: p for rid, p in proposals.items() if p.error is not None}
        if not failed:
            return chunks, []
        kept, outputs = [], []
        for chunk in chunks:
            proposal = failed.get(chunk.sequence.request_id)
            if proposal is None or proposal.error is None:
                kept.append(chunk)
            else:
                del proposals[chunk.sequence.request_id]
                outputs.append(self.engine.fail(chunk.sequence, proposal.error, proposal.failed_constraint))
        return kept, outputs
