"""Overlapped draft and verify: the draft proposes for one group of sequences while the target
verifies another.

When the draft and the target run on different devices (or on disjoint CPU cores), the sequential
step ``propose(all) -> verify(all)`` leaves one of them idle at any time. Here the running decodes
alternate between two phases, one per step:

* a sequence whose proposal is **pending** (made last step) is verified by the target this step;
* a sequence without one gets its drafts from the draft model this step, while the target runs.

One step therefore starts the target on the pending group (plus any prefill chunks), runs the
drafter synchronously on the other group, then waits for the target and accepts. Next step the
roles swap. Exactness does not suffer: the groups are disjoint sequences, so no draft ever depends
on an unverified result, and every sequence still sees propose -> verify -> accept in order with
its own random stream (a seeded one draws its noise by token position, so its output does not
depend on the grouping either).

Balancing: when everything is in one phase (e.g. a batch admitted together), only about half the
sequences are drafted for; the rest decode one token on the target without drafts, which splits
them into two groups of about equal size that then alternate.

The scheduler still plans every step for all running sequences (budget, γ, KV blocks). A
sequence that drafts this step is simply not computed by the target: its
``num_computed_tokens`` does not move, so the scheduler plans it again next step. The γ the engine
passes the scheduler for a pending sequence is its proposal's length
(:meth:`OverlappedSteps.pending_draft_lengths`); if the scheduler grants fewer, the proposal is cut
(a prefix of a draft is a valid draft).

Overlap is a step strategy (``xpuspec.engine.strategy``): ``LLMEngine(..., overlap=True)`` runs its
steps with :class:`OverlappedSteps`. Drafts verified a step later are chains: the engine drafts no
trees under it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpuspec.core.proposal import Proposal
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.engine import constraints as structured
from xpuspec.engine.bursts import Interrupt
from xpuspec.engine.drafting import Drafting
from xpuspec.engine.outputs import StepOutput
from xpuspec.engine.verification import Verifier

if TYPE_CHECKING:
    from xpuspec.engine.view import EngineView

logger = logging.getLogger(__name__)


@dataclass
class _PendingProposal:
    proposal: Proposal
    num_tokens: int  # the sequence's length when it was drafted: it must not change before verifying


class OverlappedSteps:
    """Steps that overlap the drafter with the target (same public API of the engine).

    The target executor runs asynchronously (``start(chunks)`` / ``wait()``); the drafter runs on its
    own executor and device.
    """

    allows_trees = False  # a draft verified a step later is a chain

    def __init__(self, engine: EngineView, drafting: Drafting, verifier: Verifier) -> None:
        if engine.proposer is None:
            raise ValueError("overlap needs a drafter: there is nothing to overlap the target with")
        if engine.proposer.caps.needs_every_target_state:
            raise ValueError(
                "overlap cannot run a drafter that reads the target's hidden states (EAGLE-3): it drafts "
                "from the states of the step the target verifies"
            )
        self.engine = engine
        self.drafting = drafting
        self.verifier = verifier
        self._pending: dict[str, _PendingProposal] = {}

    def pending_draft_lengths(self) -> dict[str, int]:
        return {request_id: len(pending.proposal.token_ids) for request_id, pending in self._pending.items()}

    def forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    # --------------------------------------------------------------------- step
    def run(
        self,
        chunks: list[ScheduledChunk],
        outputs: list[StepOutput],
        started: float,
        interrupt: Interrupt | None,
    ) -> None:
        """The target verifies the pending group (and runs the prefills) while the drafter drafts
        for the other group; the target alone is timed (``started`` and ``interrupt``: unused)."""
        engine = self.engine
        verify, draft, prefill = self._split(chunks)

        proposals: dict[str, Proposal] = {}
        for chunk in verify:
            proposal = self._take_pending(chunk)
            if proposal is not None:
                proposals[chunk.sequence.request_id] = proposal
        target_work = prefill + verify
        verifier = self.verifier
        runner_chunks = [
            verifier.target_chunk(chunk, proposals.get(chunk.sequence.request_id)) for chunk in target_work
        ]
        target_started = 0.0
        mask_failures: dict[str, str] = {}
        if runner_chunks:
            phase = target_started = engine.clock()
            engine.target.start(runner_chunks)
            guides = structured.guides_of(target_work, engine.states)
            mask_failures = verifier.prepare_masks(guides, proposals)  # while the target runs
            engine.phase_ended("verify", phase)
        if draft:
            outputs += self._draft(draft)
        if runner_chunks:
            phase = engine.phase_started()
            logits = engine.target.wait()  # [sum num_logits, vocab]
            engine.phase_ended("verify", phase)
            if not draft:
                # Only a step without concurrent drafting times the target alone.
                engine.policy.record_target_step(
                    sum(len(c.token_ids) for c in runner_chunks), engine.clock() - target_started
                )
            phase = engine.phase_started()
            verification = verifier.accept_all(target_work, runner_chunks, logits, proposals, mask_failures)
            outputs += verification.outputs
            engine.phase_ended("accept", phase)

    def _draft(self, draft: list[ScheduledChunk]) -> list[StepOutput]:
        """Propose for ``draft`` (while the target runs); the proposals wait for the next step.
        Returns the "error" outputs of the requests whose drafting failed."""
        engine = self.engine
        phase = engine.phase_started()
        drafted = self.drafting.propose(draft)
        engine.phase_ended("propose", phase)
        kept, failed = self.drafting.drop_failed(draft, drafted)
        for chunk in kept:
            sequence = chunk.sequence
            # A drafter may propose nothing; the sequence is then verified as a plain decode.
            proposal = drafted.get(sequence.request_id, Proposal([], None))
            self._pending[sequence.request_id] = _PendingProposal(proposal, sequence.num_tokens)
        return failed

    # ----------------------------------------------------------------- internals
    def _split(
        self, chunks: list[ScheduledChunk]
    ) -> tuple[list[ScheduledChunk], list[ScheduledChunk], list[ScheduledChunk]]:
        """Sort the step's chunks into (target decodes, decodes to draft for, prefills)."""
        target: list[ScheduledChunk] = []
        candidates: list[ScheduledChunk] = []
        prefill: list[ScheduledChunk] = []
        for chunk in chunks:
            if chunk.num_tokens > 1 or chunk.sequence.is_prefilling:
                prefill.append(chunk)
            elif chunk.sequence.request_id in self._pending or chunk.num_draft_tokens == 0:
                target.append(chunk)  # verify its pending drafts, or a decode without drafts (γ = 0)
            else:
                candidates.append(chunk)
        # Draft for about half of the decodes; the rest of the candidates decode one token on the
        # target without drafts, which puts them in the other phase from the next step on.
        num_decodes = len(target) + len(candidates)
        num_to_draft = min(len(candidates), max(1, -(-num_decodes // 2)))
        return target + candidates[num_to_draft:], candidates[:num_to_draft], prefill

    def _take_pending(self, chunk: ScheduledChunk) -> Proposal | None:
        pending = self._pending.pop(chunk.sequence.request_id, None)
        if pending is None:
            return None
        if pending.num_tokens != chunk.sequence.num_tokens:
            raise AssertionError(
                f"request {chunk.sequence.request_id!r} changed between drafting and verifying"
            )
        proposal = pending.proposal
        granted = chunk.num_draft_tokens
        if len(proposal.token_ids) > granted:
            # The scheduler cut γ (budget, blocks or length limits): verify a prefix of the draft.
            probs = proposal.probs[:granted] if proposal.probs is not None else None
            proposal = Proposal(proposal.token_ids[:granted], probs)
        return proposal


def overlap_wanted(requested: bool | None, target_device: str, draft_device: str | None) -> bool:
    """Whether to overlap: as ``requested``, or by default when a draft model has a device of its own.

    Two models on one device (e.g. both on ``CPU``) only overlap usefully when their compile
    properties give them disjoint cores; that is the caller's choice (``requested=True``).
    """
    if requested is not None:
        if requested and draft_device is None:
            raise ValueError(
                "overlap=True needs a draft model (drafter='draft'): nothing else runs on a device"
            )
        return requested
    return draft_device is not None and draft_device.upper() != target_device.upper()
