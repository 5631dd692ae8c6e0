"""Continuous batching: which sequences compute which tokens in the next engine step.

Each step has a budget of ``max_num_batched_tokens`` target tokens. The policy, in order:

1. Running decodes, oldest first. A decode computes its last token plus γ draft tokens, so it
   costs ``1 + γ``. γ is the engine's, decided before the step is planned and passed in (a
   mapping of request ids to the γ wanted; the scheduler asks nothing back), and is cut so that
   every later decode still gets one token, the step never produces more than ``max_model_len``
   or ``max_tokens`` allow, and the KV blocks fit (speculation shrinks before anything is preempted).
2. Running sequences still prefilling, chunked to the remaining budget.
3. Waiting sequences, strictly first come first served (no skipping, so no starvation), while the
   budget, ``max_num_seqs`` and free blocks allow. Admission allocates blocks for all known tokens at
   once, so an admitted prefill never has to preempt to continue. Nothing is admitted in a step
   that preempted: memory is short. With prefix caching (``PrefixCachingBlockManager``) admission
   shares the longest cached prefix and the prefill starts at the first uncached token.

When a running sequence needs a block and none is free, the most recently arrived running
sequence is preempted by recomputation: its blocks are freed, its KV counters reset and it goes to
the front of the waiting queue keeping its generated tokens (re-prefilled with the prompt).
Running sequences are always older than waiting ones, so the oldest sequence always progresses.

Lengths: a sequence holds at most ``max_model_len`` tokens (prompt + output), so ``add()``
rejects a prompt of ``max_model_len`` tokens or more, and a prompt that does not fit in the whole
KV cache. A sequence that grows until it cannot fit in the whole cache even alone is finished
with FINISHED_LENGTH and reported in ``SchedulerOutput.finished`` (as is a running sequence the
engine left at its ``max_model_len`` / ``max_tokens`` limit).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from xpuspec.core.block_manager import BlockManager
from xpuspec.core.prefix_cache import PrefixCachingBlockManager
from xpuspec.core.sequence import Sequence, SequenceStatus

logger = logging.getLogger(__name__)


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(kw_only=True)
class SchedulerConfig:
    max_model_len: int  # most tokens (prompt + output) one sequence may hold
    max_num_batched_tokens: int = 256  # target tokens computed per step, draft positions included
    max_num_seqs: int = 16  # running sequences at once
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_num_batched_tokens", "max_num_seqs"):
            if not _is_positive_int(getattr(self, name)):
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.max_model_len < 2:
            raise ValueError(
                f"max_model_len must be >= 2 (one prompt token and one generated), got {self.max_model_len}"
            )
        if self.max_num_seqs > self.max_num_batched_tokens:
            raise ValueError(
                f"max_num_seqs ({self.max_num_seqs}) must be <= max_num_batched_tokens "
                f"({self.max_num_batched_tokens}): every running decode needs one token of the step budget"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill a whole prompt is computed in one step, so max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len}); "
                "raise it or enable chunked prefill"
            )


@dataclass(frozen=True)
class ScheduledChunk:
    """Target work for one sequence in one step, starting at ``sequence.num_computed_tokens``.

    ``num_tokens`` known tokens are computed (1 for a decode), followed in the same pass by
    ``num_draft_tokens`` draft proposals (γ, 0 for a prefill). ``samples`` is true when the chunk
    reaches the last known token, so logits are needed. Blocks cover every computed position.
    """

    sequence: Sequence
    num_tokens: int
    num_draft_tokens: int
    samples: bool

    @property
    def num_scheduled_tokens(self) -> int:
        """What this chunk costs in the step's token budget."""
        return self.num_tokens + self.num_draft_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    # Sent back to waiting this step: drop any per-sequence engine state tied to their KV.
    preempted: list[Sequence] = field(default_factory=list)
    # Finished by the scheduler itself (FINISHED_LENGTH): the engine still reports them.
    finished: list[Sequence] = field(default_factory=list)
    # Admitted this step; num_computed_tokens is their cached prefix until the step runs.
    admitted: list[Sequence] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(chunk.num_scheduled_tokens for chunk in self.chunks)


@dataclass
class _Step:
    budget: int
    chunks: dict[Sequence, ScheduledChunk] = field(default_factory=dict)
    preempted: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    # Decodes not scheduled yet; each keeps one token of the budget in reserve.
    pending_decodes: dict[Sequence, None] = field(default_factory=dict)

    def emit(self, chunk: ScheduledChunk) -> None:
        self.chunks[chunk.sequence] = chunk
        self.budget -= chunk.num_scheduled_tokens


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, block_manager: BlockManager | PrefixCachingBlockManager
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # oldest first; the last one is the preemption victim
        self._unfinished: dict[str, Sequence] = {}

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def has_unfinished(self) -> bool:
        return bool(self._unfinished)

    @property
    def kv_blocks_in_use(self) -> int:
        return self.block_manager.num_used_blocks

    @property
    def running(self) -> tuple[Sequence, ...]:
        """Running sequences, oldest first (a snapshot)."""
        return tuple(self._running)

    @property
    def waiting(self) -> tuple[Sequence, ...]:
        """Waiting sequences in admission order (a snapshot)."""
        return tuple(self._waiting)

    def will_run(self) -> list[Sequence]:
        """The running sequences the next :meth:`schedule` keeps, oldest first: those at their
        length limit (``max_model_len`` or ``max_tokens``) it finishes first."""
        return [seq for seq in self._running if not self._at_length_limit(seq)]

    def will_decode(self) -> list[Sequence]:
        """The sequences the next :meth:`schedule` plans as decodes, in its order (oldest first):
        running, not prefilling, not at their length limit. Their γ is the caller's to choose."""
        return [seq for seq in self.will_run() if not seq.is_prefilling]

    def get(self, request_id: str) -> Sequence | None:
        """The unfinished sequence with this id, if any."""
        return self._unfinished.get(request_id)

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence; raise ValueError if it can never run."""
        if seq.request_id in self._unfinished:
            raise ValueError(f"request id {seq.request_id!r} is already queued or running")
        if seq.status is not SequenceStatus.WAITING or seq.block_table or seq.num_computed_tokens:
            raise ValueError(f"request {seq.request_id!r}: add() takes a new, waiting sequence with no KV")
        if seq.num_tokens >= self.config.max_model_len:
            raise ValueError(
                f"request {seq.request_id!r}: the prompt has {seq.num_tokens} tokens, which leaves no room "
                f"to generate within max_model_len={self.config.max_model_len}"
            )
        if self.block_manager.blocks_needed(seq.num_tokens) > self.block_manager.num_blocks:
            raise ValueError(
                f"request {seq.request_id!r}: the prompt has {seq.num_tokens} tokens but the whole KV cache "
                f"holds {self.block_manager.num_token_slots}; allocate more KV cache blocks"
            )
        self._waiting.append(seq)
        self._unfinished[seq.request_id] = seq

    def abort(self, request_id: str) -> bool:
        """Finish a waiting or running request as aborted; False if it is unknown or already finished."""
        seq = self._unfinished.get(request_id)
        if seq is None:
            return False
        self._finish(seq, SequenceStatus.FINISHED_ABORTED)
        return True

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """Mark ``seq`` finished and free its blocks. A no-op if it is already finished (e.g. aborted)."""
        if not status.is_finished:
            raise ValueError(f"finish() needs a FINISHED_* status, got {status}")
        if self._unfinished.get(seq.request_id) is not seq:
            if seq.is_finished:
                return
            raise ValueError(f"request {seq.request_id!r} was never added to this scheduler")
        self._finish(seq, status)

    def schedule(self, draft_lengths: Mapping[str, int]) -> SchedulerOutput:
        """Plan the next step. ``draft_lengths[request_id]`` is the γ wanted for a decoding sequence
        (missing: 0), decided before planning (:meth:`will_decode` names the decoding sequences)."""
        if not isinstance(draft_lengths, Mapping):
            raise TypeError(
                f"schedule() takes the draft lengths as a mapping of request ids to γ, got "
                f"{type(draft_lengths).__name__}"
            )
        step = _Step(budget=self.config.max_num_batched_tokens)
        for seq in list(self._running):
            if seq.num_computed_tokens >= seq.num_tokens:
                raise RuntimeError(
                    f"request {seq.request_id!r}: all {seq.num_tokens} tokens are computed; the engine must "
                    "append the sampled tokens after a step that samples"
                )
            if self._at_length_limit(seq):
                self._finish_by_length(seq, step)

        decodes = [seq for seq in self._running if not seq.is_prefilling]
        prefills = [seq for seq in self._running if seq.is_prefilling]
        step.pending_decodes = dict.fromkeys(decodes)
        for seq in decodes:
            if seq not in step.pending_decodes:
                continue  # preempted while an older sequence was being scheduled
            del step.pending_decodes[seq]
            self._schedule_decode(seq, draft_lengths.get(seq.request_id, 0), step)
        for seq in prefills:
            if step.budget < 1:
                break
            if seq.status is SequenceStatus.RUNNING:
                self._schedule_running_prefill(seq, step)
        if not step.preempted:
            self._admit_waiting(step)
        return SchedulerOutput(
            chunks=list(step.chunks.values()),
            preempted=step.preempted,
            finished=step.finished,
            admitted=step.admitted,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError if the queues, the sequences or the block manager disagree (for tests)."""
        self.block_manager.check_invariants()
        queued = list(self._waiting) + self._running
        if len(set(map(id, queued))) != len(queued):
            raise AssertionError("a sequence is queued twice")
        if {id(seq) for seq in queued} != {id(seq) for seq in self._unfinished.values()}:
            raise AssertionError("waiting + running differ from the unfinished requests")
        for seq in self._waiting:
            if seq.status is not SequenceStatus.WAITING or seq.block_table or seq.num_computed_tokens:
                raise AssertionError(f"waiting sequence {seq.request_id!r} is not a clean WAITING sequence")
            if seq.num_draft_computed_tokens:
                raise AssertionError(f"waiting sequence {seq.request_id!r} claims draft KV")
        for seq in self._running:
            if seq.status is not SequenceStatus.RUNNING:
                raise AssertionError(f"running sequence {seq.request_id!r} has status {seq.status}")
        if len(self._running) > self.config.max_num_seqs:
            raise AssertionError(f"{len(self._running)} running sequences > max_num_seqs")

    # --- policy ------------------------------------------------------------------------------------

    def _schedule_decode(self, seq: Sequence, wanted: int, step: _Step) -> None:
        room = step.budget - len(step.pending_decodes)  # one token stays reserved per later decode
        if room < 1:
            return
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 0:
            raise ValueError(f"the draft length of {seq.request_id!r} is {wanted!r}; need an int >= 0")
        num_drafts = min(
            wanted,
            room - 1,
            self.config.max_model_len - seq.num_tokens - 1,
            seq.params.token_limit - seq.num_output_tokens - 1,
        )
        num_drafts = max(num_drafts, 0)
        first = seq.num_computed_tokens  # == num_tokens - 1
        covered = self._reserve_blocks(seq, first + 1, first + 1 + num_drafts, step)
        if covered is not None:
            step.emit(ScheduledChunk(seq, 1, covered - first - 1, samples=True))

    def _schedule_running_prefill(self, seq: Sequence, step: _Step) -> None:
        first = seq.num_computed_tokens
        remaining = seq.num_tokens - first
        if not self.config.enable_chunked_prefill and remaining > step.budget:
            return
        wanted = min(remaining, step.budget)
        # A chunked prefill can shrink to the blocks it gets; an unchunked one is all or nothing.
        minimum = 1 if self.config.enable_chunked_prefill else wanted
        covered = self._reserve_blocks(seq, first + minimum, first + wanted, step)
        if covered is not None:
            step.emit(ScheduledChunk(seq, covered - first, 0, samples=covered == seq.num_tokens))

    def _admit_waiting(self, step: _Step) -> None:
        while self._waiting and step.budget >= 1 and len(self._running) < self.config.max_num_seqs:
            seq = self._waiting[0]
            if self._at_length_limit(seq) or (
                self.block_manager.blocks_needed(seq.num_tokens) > self.block_manager.num_blocks
            ):
                # Only a preempted sequence can get here: it grew past what it may ever hold.
                self._finish_by_length(seq, step)
                continue
            if not self.config.enable_chunked_prefill and seq.num_tokens > step.budget:
                return
            # With prefix caching, admit() shares the longest cached prefix and sets
            # num_computed_tokens past it (always leaving at least the last token to compute).
            if not self.block_manager.admit(seq):
                return  # FCFS: later arrivals wait too, so the front one cannot starve
            self._waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self._running.append(seq)
            step.admitted.append(seq)
            first = seq.num_computed_tokens
            num_tokens = min(seq.num_tokens - first, step.budget)
            step.emit(ScheduledChunk(seq, num_tokens, 0, samples=first + num_tokens == seq.num_tokens))

    def _reserve_blocks(self, seq: Sequence, min_tokens: int, max_tokens: int, step: _Step) -> int | None:
        """Cover positions ``[0, n)`` for the largest ``n <= max_tokens`` that fits, at least ``min_tokens``.

        Preempts the newest running sequences until ``min_tokens`` fit. Returns ``n``, or None when
        ``seq`` itself was preempted or, alone in a cache too small for it, finished.
        """
        while True:
            usable = min(max_tokens, self.block_manager.num_coverable_tokens(seq))
            if usable >= min_tokens:
                if not self.block_manager.ensure_capacity(seq, usable):
                    raise AssertionError("coverable positions could not be allocated")
                return usable
            if len(self._running) == 1:
                logger.warning(
                    "request %r needs %d KV positions but the whole cache holds %d; finishing it",
                    seq.request_id,
                    min_tokens,
                    self.block_manager.num_token_slots,
                )
                self._finish_by_length(seq, step)
                return None
            victim = self._running[-1]
            self._preempt(victim, step)
            if victim is seq:
                return None

    def _preempt(self, seq: Sequence, step: _Step) -> None:
        logger.debug("preempting %r (%d tokens) to free KV blocks", seq.request_id, seq.num_tokens)
        self.block_manager.free_sequence(seq)
        self._running.remove(seq)
        seq.reset_for_recompute()
        # The victim is newer than every running sequence and older than every waiting one.
        self._waiting.appendleft(seq)
        step.preempted.append(seq)
        step.pending_decodes.pop(seq, None)
        # Only a prefill can preempt an already scheduled (newer) decode, and admission allocates a
        # whole prefill up front, so this is defensive: keep the budget honest if that ever changes.
        dropped = step.chunks.pop(seq, None)
        if dropped is not None:
            step.budget += dropped.num_scheduled_tokens

    def _at_length_limit(self, seq: Sequence) -> bool:
        return seq.num_tokens >= self.config.max_model_len or seq.num_output_tokens >= seq.params.token_limit

    def _finish_by_length(self, seq: Sequence, step: _Step) -> None:
        self._finish(seq, SequenceStatus.FINISHED_LENGTH)
        step.finished.append(seq)

    def _finish(self, seq: Sequence, status: SequenceStatus) -> None:
        # A failed request's KV may hold NaN: nothing of it stays cached for others.
        self.block_manager.free_sequence(seq, reusable=status is not SequenceStatus.FINISHED_ERROR)
        if seq.status is SequenceStatus.RUNNING:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        seq.status = status
        del self._unfinished[seq.request_id]
