"""The two interfaces the engine is composed with, and the capabilities each declares.

The engine reads what an executor or a drafter can do from its ``caps``, a frozen dataclass set
when the object is built; it never probes an object for attributes. A new drafter implements
:class:`Drafter`, declares :class:`DrafterCaps` and is registered where drafters are built; the
engine needs no change.

What only some drafters do is declared here too, as Protocols of their own (:class:`TargetObserver`,
:class:`TreeDrafterSource`, :class:`ConstraintAwareDrafter`); the engine calls them only where the
drafter's caps say it offers them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.proposal import Proposal, TokenDraw
from xpuspec.core.scheduler import ScheduledChunk


@dataclass(frozen=True)
class ExecutorCaps:
    """What a target executor can do beyond running chunks of tokens."""

    # Runs SequenceChunk.padding (dummy tokens that keep a step's shape).
    padding: bool = False
    # Runs tree chunks (SequenceChunk.tree_parents).
    trees: bool = False
    # Moves KV between positions of a block table (move_kv): an accepted tree path made consecutive.
    kv_moves: bool = False
    # Holds state for at most this many sequences (a stateful executor); None: bounded by KV blocks.
    max_sequences: int | None = None
    # Keeps each sequence's KV to itself rather than in the shared blocks: it must be told when a
    # sequence's KV is no longer needed (release), and prefixes cannot be shared between requests.
    owns_sequence_kv: bool = False
    # Exposes the hidden states of tapped layers after each pass (hidden_states), for EAGLE-3.
    hidden_state_taps: bool = False
    # Runs steps of one token per sequence (core.chunks.one_token_each) on a second compiled copy
    # that shares the KV cache: a step between such steps and larger ones changes neither copy's
    # shape, so the plugin's re-preparation after a change of token count is not paid there.
    decode_lane: bool = False


class TargetExecutor(Protocol):
    """What the engine needs of the target's executor (paged or stateful, on any device)."""

    caps: ExecutorCaps
    block_size: int
    num_blocks: int
    vocab_size: int

    def forward(self, chunks: list[SequenceChunk]) -> np.ndarray:
        """The logits of every chunk's last ``num_logits`` tokens, [sum num_logits, vocab]."""
        ...

    def start(self, chunks: list[SequenceChunk]) -> None:
        """Begin ``forward`` asynchronously; ``wait`` returns its logits."""
        ...

    def wait(self) -> np.ndarray:
        """The logits of the inference ``start`` began; returns at once when none is pending."""
        ...

    def warm_up(self, max_model_len: int) -> None:
        """Compile and size what the first real steps would otherwise pay for."""
        ...

    def release(self, sequence_id: str) -> None:
        """The sequence finished or was preempted (a no-op for an executor without own KV)."""
        ...

    def move_kv(
        self, block_table: Sequence[int], sources: Sequence[int], destinations: Sequence[int]
    ) -> None:
        """Copy the KV at positions ``sources`` to ``destinations`` (only with ``caps.kv_moves``)."""
        ...


@dataclass(frozen=True)
class DrafterCaps:
    """What a drafter needs from the engine, and what it offers beyond chains of drafts."""

    # Reads the target's states of every token it computes (observe_target after each step), in
    # order: no padding tokens, no cached prefixes, no target-only decode bursts (EAGLE-3).
    needs_every_target_state: bool = False
    # Drafts trees (tree_drafter() returns one) as well as chains.
    drafts_trees: bool = False
    # Masks its draft rows by a request's output constraint (set_draft_mask).
    constraint_aware: bool = False
    # Runs on an executor of its own, so its drafting can overlap the target's pass.
    overlappable: bool = False
    # Is a draft model: prompt lookup may draft beside it, where lookup predicts more per second.
    is_draft_model: bool = False
    # Keeps its KV in blocks that mirror the target's: a cached prefix covers its KV too.
    shares_block_tables: bool = False


class Drafter(Protocol):
    """Proposes draft tokens for the decoding sequences of a step (draft model, n-gram, EAGLE-3)."""

    caps: DrafterCaps
    # (tokens computed, seconds) of each drafting pass of the last `propose`, for the cost model.
    step_timings: list[tuple[int, float]]

    def propose(self, chunks: list[ScheduledChunk], draw: TokenDraw) -> dict[str, Proposal]: ...

    def measure_step_seconds(self, context: int = 1, tokens: int = 1) -> float:
        """Seconds of one drafting pass for one sequence over ``tokens`` tokens at ``context`` tokens
        of context (the cost model's calibration)."""
        ...

    def warm_up(self, max_model_len: int) -> None:
        """Compile and size ahead of the first steps (a no-op for a drafter without a model)."""
        ...

    def release(self, sequence_id: str) -> None:
        """The sequence finished or was preempted: drop whatever state the drafter keeps for it."""
        ...

    def recover(self) -> None:
        """A step failed: leave the drafter ready for the next one (no inference left pending)."""
        ...


class TreeShapeLike(Protocol):
    """The bounds of one drafted tree (``xpuspec.spec_decode.tree.TreeShape`` is one)."""

    @property
    def depth(self) -> int: ...

    @property
    def width(self) -> int: ...

    @property
    def nodes(self) -> int: ...


class TreeDrafting(Protocol):
    """Drafts trees (the draft model's, or the EAGLE-3 head's); what ``tree_drafter()`` returns."""

    # (tokens computed, seconds) of each drafting pass of the last `propose`, for the cost model.
    step_timings: list[tuple[int, float]]

    def propose(
        self,
        requests: Sequence[tuple[ScheduledChunk, TreeShapeLike]],
        rngs: dict[str, np.random.Generator] | None = None,
    ) -> dict[str, Proposal]:
        """One tree per (chunk, shape); ``chunk.num_draft_tokens`` is its node budget. ``rngs`` holds
        the random stream of each sampled request (greedy ones draft deterministically)."""
        ...


class TargetObserver(Protocol):
    """A drafter that reads the target's states of every token it computes
    (``caps.needs_every_target_state``)."""

    def observe_target(
        self,
        chunks: list[ScheduledChunk],
        runner_chunks: list[SequenceChunk],
        tree_paths: dict[str, list[int]],
    ) -> None:
        """After each accepted target step: ``runner_chunks`` are what the target ran for ``chunks``;
        ``tree_paths`` the accepted path (node indices) of each tree verified in it."""
        ...


class TreeDrafterSource(Protocol):
    """A drafter that drafts trees as well as chains (``caps.drafts_trees``)."""

    def tree_drafter(self) -> TreeDrafting: ...


# mask(request_id, drafted token ids so far, draft logits row [1, vocab]) -> the masked row; may raise.
DraftMask = Callable[[str, list[int], np.ndarray], np.ndarray]


class ConstraintAwareDrafter(Protocol):
    """A drafter that masks its draft rows by each request's output constraint (``caps.constraint_aware``)."""

    def set_draft_mask(self, mask: DraftMask) -> None: ...
