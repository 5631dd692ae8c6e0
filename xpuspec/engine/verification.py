"""The verify and accept phases: the target's chunks, its pass, and the verification rule of each
sequence (greedy, coupled, sampled, or a tree's, whose accepted path's KV is then made consecutive).

Each returns what it produced: the target's logits with the requests whose output constraint failed
meanwhile, then a :class:`Verification` (an output per request, the accepted tree paths). A failure
while verifying one sequence (NaN rows, its sampling, its output constraint) ends that request
alone, as an output with finish_reason "error"; the rest of the batch goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.proposal import Proposal
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.core.sequence import Sequence, SequenceStatus
from xpuspec.engine import constraints as structured
from xpuspec.engine.outputs import FINISH_REASONS, RequestState, StepOutput
from xpuspec.sample.penalties import chain_prefixes, penalize, tree_prefixes
from xpuspec.sample.sampler import finite_argmax, position_exponentials, probabilities
from xpuspec.spec_decode.rejection_sampler import RejectionSampler, VerificationResult
from xpuspec.spec_decode.tree import DraftTree
from xpuspec.spec_decode.tree_acceptance import TreeAcceptance, TreeVerification
from xpuspec.structured.matcher import GuidedRequest

if TYPE_CHECKING:
    from xpuspec.engine.view import EngineView


@dataclass
class Verification:
    """What the accept phase produced: an output per verified request (an "error" one for a request
    that failed), and the accepted path (node indices) of each tree verified, which a drafter reading
    the target's states (EAGLE-3) keeps the rows of."""

    outputs: list[StepOutput] = field(default_factory=list)
    tree_paths: dict[str, list[int]] = field(default_factory=dict)


class Verifier:
    """The engine's verify and accept phases, with the verification rules of chains and trees."""

    def __init__(self, engine: EngineView) -> None:
        self.engine = engine
        self.rejection_sampler = RejectionSampler()
        self.tree_acceptance = TreeAcceptance()

    # ------------------------------------------------------------------ verify
    def target_chunk(self, chunk: ScheduledChunk, proposal: Proposal | None) -> SequenceChunk:
        """What the target runs for ``chunk``: its tokens, then the drafts (a chain, or a tree)."""
        sequence = chunk.sequence
        start = sequence.num_computed_tokens
        token_ids = sequence.token_ids[start : start + chunk.num_tokens]
        num_logits = 1 if chunk.samples else 0
        tree_parents = None
        if proposal is not None and proposal.token_ids:
            token_ids = token_ids + proposal.token_ids
            num_logits += len(proposal.token_ids)
            if proposal.tree_parents is not None:
                # The root (the last token) and every node; each node attends to its ancestors.
                tree_parents = [-1] + [parent + 1 for parent in proposal.tree_parents]
        return SequenceChunk(
            token_ids=token_ids,
            past_length=start,
            block_table=sequence.block_table,
            num_logits=num_logits,
            sequence_id=sequence.request_id,
            tree_parents=tree_parents,
            padding=self.engine.policy.fixed_padding(chunk, len(token_ids)),
        )

    def forward(
        self, chunks: list[ScheduledChunk], runner_chunks: list[SequenceChunk], proposals: dict[str, Proposal]
    ) -> tuple[np.ndarray, dict[str, str]]:
        """The target's logits of ``runner_chunks`` ([sum num_logits, vocab]), and the requests whose
        output constraint failed while their masks were computed meanwhile (``prepare_masks``)."""
        target = self.engine.target
        guides = structured.guides_of(chunks, self.engine.states)
        if not guides:
            return target.forward(runner_chunks), {}
        target.start(runner_chunks)
        failures = self.prepare_masks(guides, proposals)
        return target.wait(), failures

    def prepare_masks(
        self, guides: dict[str, GuidedRequest], proposals: dict[str, Proposal]
    ) -> dict[str, str]:
        """The verification masks, ahead; returns the requests whose grammar failed (by id, with the
        message), to be ended at acceptance."""
        return structured.prepare_masks(
            guides, {rid: proposals[rid].token_ids for rid in guides if rid in proposals}
        )

    # ------------------------------------------------------------------ accept
    def accept_all(
        self,
        chunks: list[ScheduledChunk],
        runner_chunks: list[SequenceChunk],
        logits: np.ndarray,  # [sum num_logits, vocab]
        proposals: dict[str, Proposal],
        mask_failures: dict[str, str],
    ) -> Verification:
        """Advance each chunk's sequence past the computed tokens and verify the ones that sample.

        A failure while verifying one sequence (NaN rows, its sampling, its constraint, among them
        ``mask_failures``: the messages of the requests whose masks failed) ends that request alone.
        """
        engine = self.engine
        verification = Verification()
        row = 0
        for chunk, runner_chunk in zip(chunks, runner_chunks, strict=True):
            sequence = chunk.sequence
            sequence.num_computed_tokens += chunk.num_tokens
            if runner_chunk.num_logits == 0:
                continue
            rows = logits[row : row + runner_chunk.num_logits]  # [1 + γ, vocab]
            row += runner_chunk.num_logits
            failure = mask_failures.get(sequence.request_id)
            if failure is not None:
                verification.outputs.append(engine.fail(sequence, failure, failed_constraint=True))
                continue
            try:
                output, tree_path = self.accept(sequence, rows, proposals.get(sequence.request_id))
            except structured.ConstraintFailure as error:
                verification.outputs.append(engine.fail(sequence, str(error), failed_constraint=True))
                continue
            except Exception as error:
                verification.outputs.append(engine.fail(sequence, f"sampling failed: {error}"))
                continue
            verification.outputs.append(output)
            if tree_path is not None:
                verification.tree_paths[sequence.request_id] = tree_path
        for chunk in chunks:
            if not chunk.sequence.is_finished:
                # Verified: blocks now full of accepted tokens become reusable prefixes.
                engine.block_manager.commit(chunk.sequence)
        return verification

    def accept(
        self, sequence: Sequence, rows: np.ndarray, proposal: Proposal | None
    ) -> tuple[StepOutput, list[int] | None]:
        """Verify one sequence's rows ([1 + γ, vocab]) against its proposal; emit what it keeps.
        Returns its output and, for a tree, the accepted path (node indices)."""
        engine = self.engine
        state = engine.states[sequence.request_id]
        params = sequence.params
        if params.penalized:
            # Each row penalised with the history before its position, the drafts before it included.
            rows = _penalized_rows(sequence, rows, proposal, state)
        if proposal is None and params.greedy and state.guide is None:
            # The commonest row (a greedy step without drafts, every pass of a decode burst) goes
            # straight to its token: right after an inference each extra call costs several µs.
            engine.policy.record_without_drafts(sequence.request_id)  # as below: decay toward the prior
            token_ids = finite_argmax(rows, "target's logits for this request")
            return self._emit(sequence, state, token_ids, 0), None
        draft_ids = proposal.token_ids if proposal is not None else []
        # Greedy verification (chain or tree) refuses NaN rows in its own argmax pass; a grammar's
        # mask would hide NaN in the tokens it forbids, so guided rows are checked before it.
        if (not params.greedy or state.guide is not None) and not np.all(
            np.isfinite(rows.max(axis=-1))  # max propagates NaN
        ):
            raise ValueError("the target's logits for this request hold NaN or infinity")
        if state.guide is not None:
            rows = structured.mask_target_rows(rows, state.guide, draft_ids)
        result, num_drafted = self._verify(sequence, rows, proposal, state)
        sequence.num_computed_tokens += result.num_accepted
        sequence.num_draft_computed_tokens = min(
            sequence.num_draft_computed_tokens, sequence.num_computed_tokens
        )
        if draft_ids:
            assert proposal is not None
            lookup = engine.policy.record_verified(
                sequence.request_id,
                num_drafted,
                result.num_accepted,
                proposal.lookup_ngram,
                proposal.lookup_shared,
            )
            if lookup:
                state.stats.record_lookup(num_drafted, result.num_accepted)
            state.stats.record_verification(num_drafted, result.num_accepted)
        else:
            # A step without drafts still decays the acceptance counts, so a sequence whose γ fell
            # to 0 drifts back to the prior and drafts again (deterministically for seeded ones).
            engine.policy.record_without_drafts(sequence.request_id)
        tree_path = result.accepted_nodes if isinstance(result, TreeVerification) else None
        return self._emit(sequence, state, result.token_ids, result.num_accepted), tree_path

    def _verify(
        self, sequence: Sequence, rows: np.ndarray, proposal: Proposal | None, state: RequestState
    ) -> tuple[VerificationResult | TreeVerification, int]:
        """The verification rule of this sequence's step; returns its result and how many drafts it
        counts as drafted (a tree's depth)."""
        sampler = self.rejection_sampler
        params = sequence.params
        draft_ids = proposal.token_ids if proposal is not None else []
        if proposal is not None and proposal.tree_parents is not None and draft_ids:
            return self._verify_tree(sequence, rows, proposal, state)
        if params.greedy:
            return sampler.verify_greedy(draft_ids, rows), len(draft_ids)
        if state.seed is not None:
            # Coupled verification: output independent of γ and of the batch (rejection_sampler).
            seed, first_position = state.seed, sequence.num_tokens
            vocab = rows.shape[1]
            result = sampler.verify_coupled(
                draft_ids,
                probabilities(rows, params),  # [1 + γ, vocab]
                lambda row: position_exponentials(seed, first_position + row, vocab),
            )
            return result, len(draft_ids)
        target_probs = probabilities(rows, params)  # [1 + γ, vocab]
        draft_probs = proposal.probs if proposal is not None else None
        return sampler.verify_sampled(draft_ids, draft_probs, target_probs, state.rng), len(draft_ids)

    def _verify_tree(
        self, sequence: Sequence, rows: np.ndarray, proposal: Proposal, state: RequestState
    ) -> tuple[TreeVerification, int]:
        """Verify a tree, move the accepted path's KV to consecutive positions; return the result
        and the tree's depth (what acceptance rates and stats count as drafted)."""
        assert proposal.tree_parents is not None  # _verify sends only trees here
        tree = DraftTree(proposal.token_ids, proposal.tree_parents, proposal.probs)
        if sequence.params.greedy:
            result = self.tree_acceptance.verify_greedy(tree, rows)
            self.engine.policy.record_tree_path(*result.path_ranks(tree))
        else:
            result = self.tree_acceptance.verify_sampled(
                tree, probabilities(rows, sequence.params), state.rng
            )
        # Node i's KV sits at num_computed_tokens + i (the root is computed); the path's goes to
        # num_computed_tokens + 0, 1, ... Rejected nodes stay beyond num_computed_tokens, unread.
        first = sequence.num_computed_tokens
        self.engine.target.move_kv(
            sequence.block_table,
            [first + node for node in result.accepted_nodes],
            [first + index for index in range(result.num_accepted)],
        )
        state.stats.record_tree(len(tree), result.num_accepted)
        return result, tree.depth

    def _emit(
        self, sequence: Sequence, state: RequestState, token_ids: list[int], num_accepted: int
    ) -> StepOutput:
        """Append the verified ``token_ids`` (cut at end-of-sequence or max_tokens) and report them;
        their first ``num_accepted`` are accepted drafts."""
        engine = self.engine
        new_tokens, status = _truncate(sequence, token_ids, state)
        if state.guide is not None:
            completed = structured.advance(state.guide, new_tokens)
            if completed is not None:
                # Complete, and nothing but end-of-sequence may follow: the output is whole, so the
                # request stops here (with ignore_eos it would repeat that token until max_tokens).
                new_tokens, status = new_tokens[:completed], SequenceStatus.FINISHED_STOPPED
            if status is not None:  # whether the output satisfies its constraint (a cut one does not)
                state.stats.constraint_complete = state.guide.is_accepting()
        sequence.append_tokens(new_tokens)
        state.stats.record_tokens(len(new_tokens), engine.clock())
        if status is not None:
            engine.finish(sequence, status)
        return StepOutput(
            request_id=sequence.request_id,
            new_token_ids=new_tokens,
            finished=status is not None,
            finish_reason=FINISH_REASONS.get(status) if status is not None else None,
            stats=state.stats,
            num_accepted_drafts=min(num_accepted, len(new_tokens)),
        )


def _penalized_rows(
    sequence: Sequence, rows: np.ndarray, proposal: Proposal | None, state: RequestState
) -> np.ndarray:
    """``rows`` ([1 + γ or 1 + nodes, vocab]) after the request's repetition penalties (the
    end-of-sequence tokens exempt, unless the request ignores them; DRY's breakers the request's)."""
    drafts = proposal.token_ids if proposal is not None else []
    if proposal is not None and proposal.tree_parents is not None and drafts:
        prefixes = tree_prefixes(drafts, proposal.tree_parents)
    else:
        prefixes = chain_prefixes(drafts)
    num_outputs = len(sequence.output_token_ids)
    return penalize(
        rows,
        sequence.token_ids,
        num_outputs,
        prefixes,
        sequence.params,
        state.eos_token_ids,
        state.breaker_ids,
    )


def _truncate(
    sequence: Sequence, token_ids: list[int], state: RequestState
) -> tuple[list[int], SequenceStatus | None]:
    """Cut the verified tokens at end-of-sequence or at max_tokens."""
    room = sequence.params.token_limit - len(sequence.output_token_ids)
    kept: list[int] = []
    for token in token_ids[:room]:
        kept.append(token)
        if token in state.eos_token_ids:
            return kept, SequenceStatus.FINISHED_STOPPED
    if len(kept) >= room:
        return kept, SequenceStatus.FINISHED_LENGTH
    return kept, None
