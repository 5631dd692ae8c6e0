"""One request's tokens and its progress through the target and draft KV caches."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from xpuspec.sample.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "finished_stopped"  # EOS or a stop string
    FINISHED_LENGTH = "finished_length"  # max_tokens, max_model_len, or a KV cache too small for it
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"  # a failure of this request (its sampling, text) or of the engine

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED_STATUSES


_FINISHED_STATUSES = frozenset(
    {
        SequenceStatus.FINISHED_STOPPED,
        SequenceStatus.FINISHED_LENGTH,
        SequenceStatus.FINISHED_ABORTED,
        SequenceStatus.FINISHED_ERROR,
    }
)


@dataclass(eq=False)
class Sequence:
    """A request being generated.

    Positions ``[0, num_computed_tokens)`` have their KV in the target cache and
    ``[0, num_draft_computed_tokens)`` in the draft cache; both caches use the same
    ``block_table``. In decode every token but the last is computed
    (``num_computed_tokens == num_tokens - 1``). Rejecting draft tokens is only a length change:
    their KV slots stay allocated and are overwritten by later steps.

    Change the output only through :meth:`append_tokens`, which keeps :attr:`token_ids` in step.
    Equality is identity (``eq=False``), so sequences can be dict keys.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_draft_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_preemptions: int = 0
    # prompt + output, extended in place so the hot path never rebuilds it.
    _token_ids: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r}: the prompt must hold at least one token")
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.output_token_ids = list(self.output_token_ids)
        self._token_ids = self.prompt_token_ids + self.output_token_ids

    @property
    def token_ids(self) -> list[int]:
        """Prompt then output tokens. The live list: read it, never mutate it."""
        return self._token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self._token_ids[-1]

    @property
    def is_prefilling(self) -> bool:
        """More than the last token still lacks target KV (a new prompt, or a preempted sequence)."""
        return self.num_computed_tokens < self.num_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_tokens(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self._token_ids.extend(token_ids)

    def drop_last_tokens(self, count: int) -> None:
        """Take back the last ``count`` output tokens (text ended before them: a stop string)."""
        if not 0 <= count <= len(self.output_token_ids):
            raise ValueError(f"cannot drop {count} of {len(self.output_token_ids)} output tokens")
        if count:
            del self.output_token_ids[-count:]
            del self._token_ids[-count:]
            self.num_computed_tokens = min(self.num_computed_tokens, len(self._token_ids))
            self.num_draft_computed_tokens = min(self.num_draft_computed_tokens, len(self._token_ids))

    def reset_for_recompute(self) -> None:
        """Forget all cached KV after a preemption; the generated tokens are kept and re-prefilled.

        The caller frees the blocks first (``BlockManager.free_sequence``).
        """
        self.num_computed_tokens = 0
        self.num_draft_computed_tokens = 0
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1
