"""Drafters: what proposes the γ tokens that the target verifies.

Drafters (each a :class:`xpuspec.core.interfaces.Drafter` declaring its ``caps``): a draft model
with its own paged KV cache (it shares the target's block tables, so both caches must have the same
block size and block count), n-gram prompt lookup, and an EAGLE-3 head
(:mod:`xpuspec.spec_decode.eagle3.proposer`), which also observes the target
(:class:`xpuspec.core.interfaces.TargetObserver`): the engine calls it after accepting each target
step, so it can keep the target's hidden states of the tokens now computed.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.interfaces import DrafterCaps, DraftMask, TargetExecutor
from xpuspec.core.proposal import Proposal, TokenDraw
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.sample.sampler import finite_argmax, probabilities
from xpuspec.spec_decode.catch_up import catch_up_chunk
from xpuspec.spec_decode.ngram_proposer import NgramIndex, NgramIndexes, NgramProposer
from xpuspec.spec_decode.tree_proposer import TreeDrafter

logger = logging.getLogger(__name__)


__all__ = ["DraftModelProposer", "NgramDraftProposer"]


class NgramDraftProposer:
    """Prompt lookup: propose the tokens that followed the latest earlier match of the sequence's tail."""

    caps = DrafterCaps()  # a chain drafter without a model: the engine offers it nothing more

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.lookup = NgramProposer(max_ngram=max_ngram, min_ngram=min_ngram)
        self._indexes = NgramIndexes(self.lookup)  # each sequence's n-grams so far
        self.step_timings: list[tuple[int, float]] = []

    def release(self, sequence_id: str) -> None:
        self._indexes.forget(sequence_id)

    def recover(self) -> None:
        pass  # an index only reads tokens the sequence keeps; a changed sequence is re-indexed

    def warm_up(self, max_model_len: int) -> None:
        pass  # nothing to compile

    def measure_step_seconds(self, context: int = 1, tokens: int = 1) -> float:
        history = list(range(256)) * 2
        index = NgramIndex(self.lookup)
        index.propose_with_match(history[:-4], 4)  # indexed up to the last step, as in the engine
        started = time.perf_counter()
        index.propose_with_match(history, 4)
        return (time.perf_counter() - started) / 4

    def propose(self, chunks: list[ScheduledChunk], draw: TokenDraw) -> dict[str, Proposal]:
        started = time.perf_counter()
        proposals = {}
        for chunk in chunks:
            if chunk.num_draft_tokens == 0:
                continue
            request_id = chunk.sequence.request_id
            try:
                token_ids, _ = self._indexes.propose_with_match(
                    request_id, chunk.sequence.token_ids, chunk.num_draft_tokens
                )
            except Exception as error:  # this sequence's lookup alone
                logger.exception("n-gram drafting failed for %s", request_id)
                proposals[request_id] = Proposal([], None, error=f"drafting failed: {error}")
                continue
            if token_ids:
                proposals[request_id] = Proposal(list(token_ids), None)
        # One lookup yields all γ tokens; charge it as one pass over the sequences.
        self.step_timings = [(len(chunks), time.perf_counter() - started)]
        return proposals


class DraftModelProposer:
    """A small model on its own KV cache proposes γ tokens by γ batched single-token steps.

    Step 0 catches the draft cache up with every token the draft has not seen (the whole prompt
    the first time, then the tokens accepted last step) and drafts the first token; steps 1..γ-1
    feed one token each. The draft runs only for sequences that speculate this step: while γ is 0
    it costs nothing, and the catch-up is one prefill-like pass when speculation resumes. After
    verification the engine sets ``num_draft_computed_tokens`` back to at most
    ``num_computed_tokens``: the draft's KV of rejected tokens is simply overwritten later.
    """

    def __init__(self, runner: TargetExecutor, target_vocab_size: int):
        if runner.vocab_size > target_vocab_size:
            raise ValueError(
                f"the draft's vocabulary ({runner.vocab_size}) is larger than the target's "
                f"({target_vocab_size})"
            )
        self.runner = runner
        # Draft distributions are padded with zeros up to the target's vocabulary (ids the draft
        # cannot produce), so the rejection sampler compares rows of one size.
        self.target_vocab_size = target_vocab_size
        self.step_timings: list[tuple[int, float]] = []
        runner_caps = runner.caps
        self.caps = DrafterCaps(
            drafts_trees=runner_caps.trees,  # tree chunks in the draft: it drafts trees itself
            constraint_aware=True,
            overlappable=True,
            is_draft_model=True,
            # A paged draft cache lives in the target's block tables; a stateful one keeps its own.
            shares_block_tables=not runner_caps.owns_sequence_kv,
        )
        # (request_id, tokens drafted so far this step, logits [1, draft vocab]) -> logits with the
        # tokens the request's output constraint forbids at -inf, and penalised by its repetition controls;
        # set by the engine (set_draft_mask).
        self._draft_mask: DraftMask | None = None

    def set_draft_mask(self, mask: DraftMask) -> None:
        self._draft_mask = mask

    def tree_drafter(self) -> TreeDrafter:
        """Trees drafted on this proposer's runner (only where ``caps.drafts_trees``)."""
        return TreeDrafter(self.runner, self.target_vocab_size)

    def warm_up(self, max_model_len: int) -> None:
        self.runner.warm_up(max_model_len)

    def release(self, sequence_id: str) -> None:
        # A paged draft cache is freed with the shared block table (a no-op); a stateful one holds a request.
        self.runner.release(sequence_id)

    def recover(self) -> None:
        # A pass that failed between start and wait leaves the runner "busy"; wait() clears it.
        try:
            self.runner.wait()
        except Exception:
            logger.debug("no draft inference was pending", exc_info=True)

    def measure_step_seconds(self, context: int = 1, tokens: int = 1) -> float:
        # Every position maps to block 0 (garbage KV, a true cost): callers time before requests.
        context = max(context, tokens)
        blocks = -(-context // self.runner.block_size)
        chunk = SequenceChunk(
            token_ids=[0] * tokens, past_length=context - tokens, block_table=[0] * blocks, num_logits=1
        )
        started = time.perf_counter()
        self.runner.forward([chunk])
        return time.perf_counter() - started

    def _timed_forward(self, chunks: list[SequenceChunk]) -> np.ndarray:
        started = time.perf_counter()
        logits = self.runner.forward(chunks)
        self.step_timings.append((sum(len(c.token_ids) for c in chunks), time.perf_counter() - started))
        return logits

    def propose(self, chunks: list[ScheduledChunk], draw: TokenDraw) -> dict[str, Proposal]:
        runner_chunks: list[SequenceChunk] = []
        drafting: list[ScheduledChunk] = []
        for chunk in chunks:
            if chunk.num_draft_tokens == 0:
                continue
            runner_chunks.append(catch_up_chunk(chunk.sequence))
            drafting.append(chunk)
        if not runner_chunks:
            return {}
        self.step_timings = []
        logits = self._timed_forward(runner_chunks)  # [len(drafting), vocab]

        token_ids: dict[str, list[int]] = {c.sequence.request_id: [] for c in drafting}
        probs: dict[str, list[np.ndarray]] = {c.sequence.request_id: [] for c in drafting}
        errors: dict[str, str] = {}
        stopped: set[str] = set()  # the output constraint left nothing the draft can propose
        active = drafting
        for step in range(max((c.num_draft_tokens for c in drafting), default=0)):
            if step > 0:
                active = [
                    c
                    for c in active
                    if c.num_draft_tokens > step
                    and c.sequence.request_id not in errors
                    and c.sequence.request_id not in stopped
                ]
                if not active:
                    break
                logits = self._timed_forward(
                    [
                        SequenceChunk(
                            token_ids=[token_ids[c.sequence.request_id][-1]],
                            past_length=c.sequence.num_draft_computed_tokens,
                            block_table=c.sequence.block_table,
                            num_logits=1,
                            sequence_id=c.sequence.request_id,
                        )
                        for c in active
                    ]
                )
                for c in active:
                    c.sequence.num_draft_computed_tokens += 1
            for row, chunk in enumerate(active):
                request_id = chunk.sequence.request_id
                try:
                    row_logits = logits[row : row + 1]  # [1, draft vocab]
                    params = chunk.sequence.params
                    if self._draft_mask is not None and (params.constrained or params.penalized):
                        row_logits = self._draft_mask(request_id, token_ids[request_id], row_logits)
                        if np.all(np.isneginf(row_logits)):
                            # Every id the grammar allows here lies outside the draft's vocabulary (a
                            # cut one): the chain ends, and the target alone decides this position.
                            stopped.add(request_id)
                            continue
                    token, row_probs = self._draft_token(chunk, step, row_logits, draw)
                except Exception as error:  # this sequence's row alone (e.g. NaN in its logits)
                    logger.warning("drafting failed for %s: %s", request_id, error)
                    errors[request_id] = f"drafting failed: {error}"
                    continue
                token_ids[request_id].append(token)
                if row_probs is not None:
                    probs[request_id].append(row_probs)
        return {
            request_id: Proposal(ids, np.stack(probs[request_id]) if probs[request_id] else None)
            if request_id not in errors
            else Proposal([], None, error=errors[request_id])
            for request_id, ids in token_ids.items()
        }

    def _draft_token(
        self, chunk: ScheduledChunk, step: int, logits: np.ndarray, draw: TokenDraw
    ) -> tuple[int, np.ndarray | None]:
        """The draft token at ``step`` from its logits ([1, draft vocab]), with its q row if sampled."""
        params = chunk.sequence.params
        if params.greedy:
            return finite_argmax(logits, "draft's logits")[0], None
        if not np.isfinite(logits.max()):
            raise ValueError("the draft's logits hold NaN or infinity")
        row_probs = probabilities(logits, params)[0]  # [draft vocab]
        if row_probs.shape[0] < self.target_vocab_size:
            row_probs = np.pad(row_probs, (0, self.target_vocab_size - row_probs.shape[0]))
        position = chunk.sequence.num_tokens + step
        return draw(chunk.sequence.request_id, position, row_probs), row_probs
