"""What EAGLE-3 drafting asks of the head's executor: one pass's inputs and outputs, and the Protocol.

The drafters (:mod:`~xpuspec.spec_decode.eagle3.proposer`, :mod:`~xpuspec.spec_decode.eagle3.tree`) are
given a :class:`HeadExecutor`; the OpenVINO one is :class:`xpuspec.executor.eagle3_head.Eagle3Head`.
The types here are plain numpy, so drafting logic needs no OpenVINO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig


@dataclass
class HeadStep:
    """One sequence's ``n`` new positions in a head pass.

    ``token_ids`` ``[n]``: the target ids whose embeddings the positions read (position ``j`` pairs the
    state at ``j`` with the token at ``j + 1``). ``hidden`` ``[n, hidden]``: fused target states
    (:meth:`HeadExecutor.fuse`) or a previous pass's ``hidden``. ``positions`` ``[n]``: default the next
    ``n`` slots of the sequence's cache. ``attention_mask`` ``[n, past + n]`` bool over the cached
    positions and the new ones: default all of the past and causal among the new (give a tree's mask
    here). ``logits_rows``: which of the ``n`` positions get logits; default the last only.
    """

    sequence_id: str
    token_ids: Sequence[int] | np.ndarray
    hidden: np.ndarray
    positions: Sequence[int] | np.ndarray | None = None
    attention_mask: np.ndarray | None = None
    logits_rows: Sequence[int] | None = None

    def __post_init__(self) -> None:
        self.token_ids = np.asarray(self.token_ids, dtype=np.int64).reshape(-1)
        self.hidden = np.asarray(self.hidden, dtype=np.float32)
        n = self.token_ids.shape[0]
        if n == 0:
            raise ValueError(f"head step for {self.sequence_id}: no positions")
        if self.hidden.ndim != 2 or self.hidden.shape[0] != n:
            raise ValueError(
                f"head step for {self.sequence_id}: hidden must be [{n}, hidden] for {n} token ids, "
                f"got {list(self.hidden.shape)}"
            )
        if self.positions is not None:
            self.positions = np.asarray(self.positions, dtype=np.int64).reshape(-1)
            if self.positions.shape[0] != n:
                raise ValueError(
                    f"head step for {self.sequence_id}: {self.positions.shape[0]} positions for {n} ids"
                )
        rows = [n - 1] if self.logits_rows is None else [int(row) for row in self.logits_rows]
        if not rows or any(not 0 <= row < n for row in rows):
            raise ValueError(
                f"head step for {self.sequence_id}: logits_rows must be in 0..{n - 1}, got {rows}"
            )
        self.logits_rows = rows

    @property
    def num_logits(self) -> int:
        """How many of the positions get logits (``logits_rows``; None: the last only)."""
        return 1 if self.logits_rows is None else len(self.logits_rows)


@dataclass
class HeadStepResult:
    logits: np.ndarray  # [len(logits_rows), draft_vocab]
    hidden: np.ndarray  # [n, hidden]: the next rollout step's input state (before the final norm)


class HeadExecutor(Protocol):
    """An EAGLE-3 head that runs passes and keeps each sequence's KV (one layer's keys and values)."""

    config: Eagle3HeadConfig
    # The target id of every draft id [draft_vocab] int64.
    target_ids: np.ndarray

    def kv_length(self, sequence_id: str) -> int:
        """Cached positions of the sequence (0 when it has none)."""
        ...

    def truncate(self, sequence_id: str, length: int) -> None:
        """Keep the first ``length`` cached positions."""
        ...

    def release(self, sequence_id: str) -> None: ...

    def fuse(self, target_hidden: np.ndarray) -> np.ndarray:
        """``[m, 3 * hidden]`` tapped target states -> ``[m, hidden]`` (the head's ``fc``)."""
        ...

    def run(self, steps: Sequence[HeadStep]) -> list[HeadStepResult]:
        """One pass over every step's positions; appends each sequence's new KV to its cache."""
        ...

    def draft_greedy_chain(self, step: HeadStep, count: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``count`` greedy drafts of one sequence in one call: the target ids ``[count]`` and each
        pass's sum of logits ``[count]``; None while that chain cannot run in one call yet."""
        ...

    def target_logits(self, draft_logits: np.ndarray, fill: float = -np.inf) -> np.ndarray:
        """``[..., draft_vocab]`` -> ``[..., vocab]``: each draft column at its target id."""
        ...
