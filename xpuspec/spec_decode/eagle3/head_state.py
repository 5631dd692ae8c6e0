"""What the EAGLE-3 head has seen of each sequence: the chain proposer's and the tree drafter's shared state.

The hand-off. After every target step the engine hands the step's chunks to :meth:`HeadStates.observe`
(through ``Eagle3Proposer.observe_target``) with the target's tapped states (one row per scheduled token
in chunk order); per sequence, the rows kept are those valid after acceptance: the tokens the target
now counts as computed (``num_computed_tokens`` after acceptance). For a prefill chunk that is every
row; for a verification chunk the row of the last context token and of each accepted draft, never a
rejected draft's row. Those rows are fused at once (the head's ``fc``) and wait as *pending* states until
the sequence next drafts.

Positions. The head's KV slot ``j`` pairs the target's state at position ``j`` with the token at
``j + 1`` and predicts the token at ``j + 2`` (:mod:`xpuspec.executor.eagle3_graph`). A decoding
sequence of ``n`` tokens has ``n - 1`` computed ones, so its pending states are those of positions up to
``n - 2``, whose next tokens are all known: one catch-up pass over every pending slot
(:meth:`HeadStates.catch_up_step`; after a prefill: the whole prompt; after steps of γ = 0: every token
since) yields the first draft from its last row. Drafting then adds slots of the head's own states, not
the target's, so the head's KV is cut back to the target-backed slots after every drafting step
(:meth:`HeadStates.cut_back`); the verified tokens' target states replace them at the next catch-up, as
in the EAGLE reference and vLLM.

A verified tree's computed tokens are its root and accepted path, not a prefix of the chunk's rows: the
engine names the path (``tree_paths``), and only those rows' states are kept.

Preemption releases a sequence (its recomputed prefill brings every state again); a gap in the states
(a prefill that starts past the head's slots, e.g. a cached prefix) restarts the sequence's head at the
first state it has, with the true positions: drafting stays exact, only its context is shorter. The
engine turns prefix caching off for this drafter (``needs_every_target_state``) so that does not happen.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.core.sequence import Sequence
from xpuspec.spec_decode.eagle3.head import HeadExecutor, HeadStep

logger = logging.getLogger(__name__)


@dataclass
class SequenceStates:
    """What is kept for one sequence beside the head's KV cache.

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


class HeadStates:
    """Every sequence's :class:`SequenceStates` with the head whose KV they pair with."""

    def __init__(self, head: HeadExecutor) -> None:
        self.head = head
        self._sequences: dict[str, SequenceStates] = {}

    def __len__(self) -> int:
        return len(self._sequences)

    def __contains__(self, sequence_id: object) -> bool:
        return sequence_id in self._sequences

    def get(self, sequence_id: str) -> SequenceStates | None:
        return self._sequences.get(sequence_id)

    def sequence_ids(self) -> list[str]:
        return list(self._sequences)

    # --- the target's states -----------------------------------------------------------------------

    def observe(
        self,
        states: np.ndarray,
        chunks: list[ScheduledChunk],
        runner_chunks: list[SequenceChunk],
        tree_paths: Mapping[str, list[int]] | None = None,
    ) -> None:
        """Keep the rows of ``states`` (``[num_tokens, 3 * hidden or hidden]``, the target step's taps in
        chunk order) of the tokens computed after acceptance.

        Called after the engine accepted the step (``num_computed_tokens`` moved past the accepted
        tokens), before anything runs the target again. ``tree_paths`` holds, per sequence that
        verified a tree, the accepted path's node indices (``TreeVerification.accepted_nodes``): its
        computed tokens are the root (row 0) and those nodes (rows ``1 + node``), not a prefix.
        """
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
                    kept.append(states[offset + _tree_rows(sequence.request_id, tree_paths, valid)])
                owners.append((sequence.request_id, runner_chunk.past_length, valid))
            offset += rows
        if offset != states.shape[0]:
            raise RuntimeError(
                f"the target returned {states.shape[0]} hidden-state rows for {offset} scheduled tokens"
            )
        if not kept:
            return
        kept_rows = np.concatenate(kept)
        # A target whose taps carry the head's fc (the engine's) gives fused rows already.
        hidden_size = self.head.config.hidden_size
        fused = kept_rows if kept_rows.shape[1] == hidden_size else self.head.fuse(kept_rows)
        row = 0
        for request_id, first, count in owners:
            self.sequence_at(request_id, first).add(fused[row : row + count])
            row += count

    def sequence_at(self, request_id: str, position: int) -> SequenceStates:
        """The sequence's states, ready to take the state of ``position`` next."""
        state = self._sequences.get(request_id)
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
        state = self._sequences[request_id] = SequenceStates(start=position)
        return state

    # --- drafting ----------------------------------------------------------------------------------

    def catch_up_step(self, sequence: Sequence) -> HeadStep | None:
        """The head pass over the sequence's pending slots (consumed), or None when it cannot draft."""
        request_id = sequence.request_id
        state = self._sequences.get(request_id)
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

    def cut_back(self, sequences: Iterable[Sequence]) -> None:
        """Drop the head's own slots of a drafting step (rollout or tree nodes): keep the target-backed."""
        for sequence in sequences:
            state = self._sequences.get(sequence.request_id)
            if state is not None:
                self.head.truncate(sequence.request_id, sequence.num_computed_tokens - state.start)

    def release(self, sequence_id: str) -> None:
        self._sequences.pop(sequence_id, None)
        self.head.release(sequence_id)

    def release_all(self) -> None:
        for sequence_id in list(self._sequences):
            self.release(sequence_id)


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
