"""EAGLE-3 drafting for the engine: a chain of γ tokens per sequence from the target's own hidden states.

The hand-off. After every target step the engine calls :meth:`Eagle3Proposer.observe_target` with the
step's chunks; the proposer reads the target's tapped states (``target.hidden_states()``, one row per
scheduled token in chunk order) and keeps, per sequence, the rows that are valid after acceptance: the
tokens the target now counts as computed (``num_computed_tokens`` after acceptance). For a prefill chunk
that is every row; for a verification chunk the row of the last context token and of each accepted
draft, never a rejected draft's row. Those rows are fused at once (the head's ``fc``) and wait as
*pending* states until the sequence next drafts.

Positions. The head's KV slot ``j`` pairs the target's state at position ``j`` with the token at ``j + 1``
and predicts the token at ``j + 2`` (:mod:`xpuspec.executor.eagle3_graph`). A decoding sequence of
``n`` tokens has ``n - 1`` computed ones, so its pending states are those of positions up to ``n - 2``,
whose next tokens are all known: one catch-up pass over every pending slot (after a prefill: the whole
prompt; after steps of γ = 0: every token since) yields the first draft from its last row. Each further
draft is one rollout pass at the next slot, feeding the head's previous ``hidden_out`` and the token just
drafted. Rollout slots hold the head's own states, not the target's, so the head's KV is cut back to
the target-backed slots at the end of every ``propose``; the verified tokens' target states replace them
at the next catch-up, as in the EAGLE reference and vLLM. A lone greedy, unconstrained sequence (the
latency case) gets the catch-up and the rollout in one call instead (:meth:`Eagle3Head.draft_greedy_chain`:
the same drafts, without a call and a loop iteration per token) once that chain's graph is compiled.

A verified tree's computed tokens are its root and accepted path, not a prefix of the chunk's rows: the
engine names the path (``tree_paths``), and only those rows' states are kept.

Preemption releases a sequence (its recomputed prefill brings every state again); a gap in the states
(a prefill that starts past the head's slots, e.g. a cached prefix) restarts the sequence's head at the
first state it has, with the true positions: drafting stays exact, only its context is shorter. The
engine turns prefix caching off for this drafter (``needs_every_target_state``) so that does not happen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.executor.eagle3_head import Eagle3Head, HeadStep, HeadStepResult
from xpuspec.sample.sampler import probabilities
from xpuspec.spec_decode.proposal import Proposal, TokenDraw

if TYPE_CHECKING:
    from xpuspec.spec_decode.eagle3.tree import Eagle3TreeDrafter

logger = logging.getLogger(__name__)

# The head's KV of the calibration passes (measure_step_seconds); no request id starts with NUL.
_MEASURE_ID = "\x00eagle3-measure"


@dataclass
class _SequenceStates:
    """What the proposer keeps for one sequence beside the head's KV cache.

    Head slot ``k`` of the cache is position ``start + k``. ``pending`` holds fused target states
    ``[m_i, hidden]`` of the positions after the cache, in order, not yet run through the head.
    """

    start: int
    pending: list[np.ndarray] = field(default_factory=list)
    num_pending: int = 0

    def add(self, fused: np.ndarray) -> None:
        self.pending.append(fused)
        self.num_pending += fused.shape[0]

    def take(self) -> np.ndarray:
        """All pending states ``[num_pending, hidden]`` (at least one), now consumed."""
        states = self.pending[0] if len(self.pending) == 1 else np.concatenate(self.pending)
        self.pending, self.num_pending = [], 0
        return states

    def keep(self, count: int) -> None:
        """Keep the first ``count`` pending states: those after are superseded."""
        if count < self.num_pending:
            kept = self.take()[:count]
            if count:
                self.add(kept)


class Eagle3Proposer:
    """A :class:`xpuspec.spec_decode.proposal.DraftProposer` drafting chains with an EAGLE-3 head (trees:
    :meth:`tree_drafter`, :mod:`xpuspec.spec_decode.eagle3.tree`, on the same per-sequence states).

    ``target_states`` returns the last target step's tapped states ``[num_tokens, 3 * hidden]``, or
    ``[num_tokens, hidden]`` already fused when the target's taps carry the head's ``fc``
    (``PagedModelRunner.hidden_states``); ``target_vocab_size`` is the width of the target's logits.
    """

    # The engine keeps prefix caching off: a cached prefix has no target states for the head.
    needs_every_target_state = True

    def __init__(
        self, head: Eagle3Head, target_states: Callable[[], np.ndarray], target_vocab_size: int
    ) -> None:
        if head.config.vocab_size != target_vocab_size:
            raise ValueError(
                f"the EAGLE-3 head maps into a vocabulary of {head.config.vocab_size}, the target's logits "
                f"have {target_vocab_size}: it is not this target's head"
            )
        self.head = head
        self.target_states = target_states
        self.target_vocab_size = target_vocab_size
        self.step_timings: list[tuple[int, float]] = []
        # (request_id, tokens drafted so far this step, logits [1, vocab]) -> logits with the tokens the
        # request's output constraint forbids at -inf; set by the engine.
        self.constrain_logits: Callable[[str, list[int], np.ndarray], np.ndarray] | None = None
        self._states: dict[str, _SequenceStates] = {}

    # --- the engine's hand-off -------------------------------------------------------------------

    def observe_target(
        self,
        chunks: list[ScheduledChunk],
        runner_chunks: list[SequenceChunk],
        tree_paths: Mapping[str, list[int]] | None = None,
    ) -> None:
        """Keep the target states of the step's tokens that are computed after acceptance.

        Called after the engine accepted the step (``num_computed_tokens`` moved past the accepted
        tokens), before anything runs the target again. ``tree_paths`` holds, per sequence that
        verified a tree, the accepted path's node indices (``TreeVerification.accepted_nodes``): its
        computed tokens are the root (row 0) and those nodes (rows ``1 + node``), not a prefix.
        """
        states = self.target_states()  # [num_tokens, 3 * hidden or hidden], rows in chunk order
        kept: list[np.ndarray] = []
        owners: list[tuple[str, int, int]] = []  # (request_id, first position, rows)
        offset = 0
        for chunk, runner_chunk in zip(chunks, runner_chunks, strict=True):
            rows = len(runner_chunk.token_ids)
            sequence = chunk.sequence
            # Rows past num_computed_tokens are rejected drafts: their states must never reach the head.
            valid = min(rows, sequence.num_computed_tokens - runner_chunk.past_length)
            if valid > 0 and not sequence.is_finished:  # a finished sequence was released already
                if runner_chunk.tree_parents is None:
                    kept.append(states[offset : offset + valid])
                else:
                    kept.append(states[offset + self._tree_rows(sequence.request_id, tree_paths, valid)])
                owners.append((sequence.request_id, runner_chunk.past_length, valid))
            offset += rows
        if offset != states.shape[0]:
            raise RuntimeError(
                f"the target returned {states.shape[0]} hidden-state rows for {offset} scheduled tokens"
            )
        if not kept:
            return
        rows = np.concatenate(kept)
        # A target whose taps carry the head's fc (the engine's) gives fused rows already.
        fused = rows if rows.shape[1] == self.head.config.hidden_size else self.head.fuse(rows)
        row = 0
        for request_id, first, count in owners:
            self._sequence_at(request_id, first).add(fused[row : row + count])
            row += count

    @staticmethod
    def _tree_rows(request_id: str, tree_paths: Mapping[str, list[int]] | None, valid: int) -> np.ndarray:
        """Rows ``[valid]`` of a verified tree chunk (root first) that hold the accepted path's states."""
        path = (tree_paths or {}).get(request_id, [])
        rows = np.array([0] + [1 + node for node in path], np.int64)[:valid]
        if rows.shape[0] < valid:
            raise RuntimeError(
                f"{request_id} verified a tree and computed {valid} tokens, but the accepted path has "
                f"{len(path)} nodes: its target states cannot be told apart from rejected nodes'"
            )
        return rows

    def _sequence_at(self, request_id: str, position: int) -> _SequenceStates:
        """The sequence's states, ready to take the state of ``position`` next."""
        state = self._states.get(request_id)
        if state is not None:
            cached = self.head.kv_length(request_id)
            end = state.start + cached + state.num_pending
            if position == end:
                return state
            if state.start <= position < end:
                # The target recomputed from `position`: what the head holds from there is superseded.
                state.keep(max(0, position - state.start - cached))
                self.head.truncate(request_id, min(cached, position - state.start))
                return state
        if position:
            # Nothing of positions [0, position) will come (a cached prefix): draft from what will.
            logger.info(
                "EAGLE-3 head for %s starts at position %d: no target states before", request_id, position
            )
        self.head.release(request_id)
        state = self._states[request_id] = _SequenceStates(start=position)
        return state

    # --- DraftProposer ---------------------------------------------------------------------------

    def tree_drafter(self) -> Eagle3TreeDrafter:
        """The drafter of trees with this head (the engine's ``draft_tree`` requests)."""
        from xpuspec.spec_decode.eagle3.tree import Eagle3TreeDrafter

        return Eagle3TreeDrafter(self)

    def release(self, sequence_id: str) -> None:
        self._states.pop(sequence_id, None)
        self.head.release(sequence_id)

    def recover(self) -> None:
        # A failed step ends every request in flight; the head's passes are synchronous, so only the
        # per-sequence state (perhaps half-updated by the failed pass) needs dropping.
        for sequence_id in list(self._states):
            self.release(sequence_id)

    def measure_step_seconds(self, context: int = 1, tokens: int = 1) -> float:
        hidden = self.head.config.hidden_size
        past = max(context - tokens, 0)
        if self.head.kv_length(_MEASURE_ID) < past:  # a cache of `past` slots, built once, untimed
            self.head.release(_MEASURE_ID)
            self.head.run([HeadStep(_MEASURE_ID, [0] * past, np.zeros((past, hidden), np.float32))])
        self.head.truncate(_MEASURE_ID, past)
        step = HeadStep(_MEASURE_ID, [0] * tokens, np.zeros((tokens, hidden), np.float32))
        started = time.perf_counter()
        self.head.run([step])
        seconds = time.perf_counter() - started
        self.head.truncate(_MEASURE_ID, past)
        return seconds

    def propose(self, chunks: list[ScheduledChunk], draw: TokenDraw) -> dict[str, Proposal]:
        self.step_timings = []
        drafting: list[ScheduledChunk] = []
        steps: list[HeadStep] = []
        for chunk in chunks:
            if chunk.num_draft_tokens == 0:
                continue
            step = self._catch_up_step(chunk)
            if step is not None:
                drafting.append(chunk)
                steps.append(step)
        if not steps:
            return {}
        try:
            if self._drafts_greedy_chain(drafting):
                proposals = self._draft_greedy_chain(drafting[0], steps[0])
                if proposals is not None:  # None: that chain's graph is not compiled yet
                    return proposals
            return self._draft(drafting, self._timed_run(steps), draw)
        finally:
            # Rollout slots hold the head's own states: cut back to the target-backed ones.
            for chunk in drafting:
                sequence = chunk.sequence
                state = self._states.get(sequence.request_id)
                if state is not None:
                    self.head.truncate(sequence.request_id, sequence.num_computed_tokens - state.start)

    def _catch_up_step(self, chunk: ScheduledChunk) -> HeadStep | None:
        """The head pass over the sequence's pending slots, or None when it cannot draft this step."""
        sequence = chunk.sequence
        request_id = sequence.request_id
        state = self._states.get(request_id)
        first = -1 if state is None else state.start + self.head.kv_length(request_id)
        if (
            state is None
            or state.num_pending == 0
            or first + state.num_pending != sequence.num_computed_tokens
        ):
            # Not expected in the engine's flow (every computed token's state is observed): drafting is
            # skipped, which costs speed, never exactness.
            logger.warning(
                "EAGLE-3: no target states up to position %d of %s; not drafting this step",
                sequence.num_computed_tokens - 1,
                request_id,
            )
            return None
        end = sequence.num_computed_tokens
        # Slot j reads the state at j and the token at j + 1 (known: the last one is the newest token).
        return HeadStep(
            request_id,
            sequence.token_ids[first + 1 : end + 1],
            state.take(),
            positions=np.arange(first, end),
        )

    def _drafts_greedy_chain(self, drafting: list[ScheduledChunk]) -> bool:
        """A lone greedy, unconstrained sequence drafting two or more tokens: the latency case, drafted in
        one call (:meth:`Eagle3Head.draft_greedy_chain`) instead of a call and a Python loop a token."""
        if len(drafting) != 1 or drafting[0].num_draft_tokens < 2:
            return False
        params = drafting[0].sequence.params
        return params.greedy and not params.constrained

    def _draft_greedy_chain(self, chunk: ScheduledChunk, step: HeadStep) -> dict[str, Proposal] | None:
        request_id, count = chunk.sequence.request_id, chunk.num_draft_tokens
        started = time.perf_counter()
        drafted = self.head.draft_greedy_chain(step, count)
        if drafted is None:
            return None
        token_ids, logit_sums = drafted
        share = (time.perf_counter() - started) / count
        # The cost model times passes: the call's time shared among them (the first one catches up).
        self.step_timings += [(len(step.token_ids), share)] + [(1, share)] * (count - 1)
        if not np.isfinite(logit_sums).all():
            error = "drafting failed: the EAGLE-3 head's logits hold NaN or infinity"
            logger.warning("EAGLE-3 %s for %s", error, request_id)
            return {request_id: Proposal([], None, error=error)}
        return {request_id: Proposal(token_ids.tolist(), None)}

    def _timed_run(self, steps: list[HeadStep]) -> list[HeadStepResult]:
        started = time.perf_counter()
        results = self.head.run(steps)
        self.step_timings.append((sum(len(step.token_ids) for step in steps), time.perf_counter() - started))
        return results

    def _draft(
        self, drafting: list[ScheduledChunk], results: list[HeadStepResult], draw: TokenDraw
    ) -> dict[str, Proposal]:
        """γ tokens per sequence: the catch-up's ``results`` give the first, rollout passes the rest."""
        token_ids: dict[str, list[int]] = {c.sequence.request_id: [] for c in drafting}
        probs: dict[str, list[np.ndarray]] = {c.sequence.request_id: [] for c in drafting}
        errors: dict[str, str] = {}
        stopped: set[str] = set()  # the output constraint left nothing the head can draft
        active = drafting
        for step in range(max(c.num_draft_tokens for c in drafting)):
            if step > 0:
                carried = {id(c): r.hidden[-1:] for c, r in zip(active, results, strict=True)}
                active = [
                    c
                    for c in active
                    if c.num_draft_tokens > step
                    and c.sequence.request_id not in errors
                    and c.sequence.request_id not in stopped
                ]
                if not active:
                    break
                results = self._timed_run(
                    [
                        HeadStep(
                            c.sequence.request_id,
                            token_ids[c.sequence.request_id][-1:],
                            carried[id(c)],  # [1, hidden]: the previous pass's state, before the norm
                            # The catch-up's last slot was num_computed_tokens - 1.
                            positions=[c.sequence.num_computed_tokens - 1 + step],
                        )
                        for c in active
                    ]
                )
            for chunk, result in zip(active, results, strict=True):
                request_id = chunk.sequence.request_id
                try:
                    drafted = self._draft_token(chunk, step, result.logits, token_ids[request_id], draw)
                except Exception as error:  # this sequence's row alone (e.g. NaN in its logits)
                    logger.warning("EAGLE-3 drafting failed for %s: %s", request_id, error)
                    errors[request_id] = f"drafting failed: {error}"
                    continue
                if drafted is None:
                    stopped.add(request_id)
                    continue
                token, row_probs = drafted
                token_ids[request_id].append(token)
                if row_probs is not None:
                    probs[request_id].append(row_probs)
        proposals = {}
        for request_id, ids in token_ids.items():
            if request_id in errors:
                proposals[request_id] = Proposal([], None, error=errors[request_id])
            elif ids:
                proposals[request_id] = Proposal(
                    ids, np.stack(probs[request_id]) if probs[request_id] else None
                )
        return proposals

    def _draft_token(
        self, chunk: ScheduledChunk, step: int, logits: np.ndarray, drafted: list[int], draw: TokenDraw
    ) -> tuple[int, np.ndarray | None] | None:
        """The target id drafted at ``step`` from the head's logits ``[1, draft vocab]``, with its q row
        over the target vocabulary when sampled; None when the output constraint allows no draft id."""
        params = chunk.sequence.params
        if not np.isfinite(logits.max()):
            raise ValueError("the EAGLE-3 head's logits hold NaN or infinity")
        if self.constrain_logits is not None and params.constrained:
            # The grammar masks target ids: scatter, mask, and read the draft columns back (0.06 ms a
            # draft at SmolLM2's 49k ids, so only for constrained requests).
            masked = self.constrain_logits(
                chunk.sequence.request_id, drafted, self.head.target_logits(logits)
            )
            logits = masked[:, self.head.target_ids]  # [1, draft vocab]
            if not np.isfinite(logits.max()):
                return None
        if params.greedy:
            return int(self.head.target_ids[int(np.argmax(logits[0]))]), None
        # Zero probability outside the draft vocabulary: the rejection sampler then recovers those
        # ids from the target's residual, which keeps the output the target's distribution.
        row_probs = np.zeros(self.target_vocab_size, np.float64)  # [vocab]
        row_probs[self.head.target_ids] = probabilities(logits, params)[0]
        position = chunk.sequence.num_tokens + step
        return draw(chunk.sequence.request_id, position, row_probs), row_probs
