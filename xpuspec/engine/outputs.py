"""The engine's plain types: its configuration, what a step reports per request, and the state it
keeps per request beside the request's ``Sequence``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xpuspec.core.request_stats import RequestStats
from xpuspec.core.sequence import SequenceStatus
from xpuspec.sample.defaults import SamplingDefaults
from xpuspec.spec_decode.suffix_index import DEFAULT_CAPACITY
from xpuspec.structured.matcher import GuidedRequest

FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_ERROR: "error",
}
STATUS_OF_REASON = {reason: status for status, reason in FINISH_REASONS.items()}


@dataclass
class EngineConfig:
    """Batching and speculation limits of one engine."""

    max_num_batched_tokens: int = 256
    max_num_seqs: int = 16
    max_model_len: int = 2048
    max_draft_tokens: int = 8
    # Reuse the KV of full blocks of earlier requests (xpuspec.core.prefix_cache); paged targets only.
    enable_prefix_caching: bool = True
    # Target-only decode bursts (xpuspec.engine.bursts): up to this many decode passes per step()
    # while they fit in decode_burst_seconds. 1 turns bursts off.
    decode_burst_steps: int = 16
    decode_burst_seconds: float = 0.02
    # Beside a draft model, adaptive γ also drafts by prompt lookup where the sequence repeats
    # itself and that predicts more tokens per second (xpuspec.spec_decode.policy.prompt_lookup).
    prompt_lookup: bool = True
    # With prompt lookup, its cross-request index (xpuspec.spec_decode.suffix_index) holds the tokens
    # of recent finished requests, up to this many tokens over all tenants; 0: none. On by default: on
    # fresh chat the cost model seldom picks its drafts and it did not lose (docs/suffix-drafter.md).
    shared_lookup_tokens: int = DEFAULT_CAPACITY
    # What a request's unset sampling fields and reply cap become (Pipeline: its bundle's model's).
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    # Use at most this many of the target's KV blocks (None: all): the blocks beyond are never
    # written, so their pages never become resident (a memory budget, xpuspec.api.memory_budget).
    max_kv_blocks: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 + self.max_draft_tokens:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must leave room for one decoding "
                f"sequence with max_draft_tokens ({self.max_draft_tokens}) drafts"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if not 0 <= self.max_draft_tokens <= 16:
            raise ValueError(f"max_draft_tokens must be in [0, 16], got {self.max_draft_tokens}")
        if self.shared_lookup_tokens < 0:
            raise ValueError(f"shared_lookup_tokens must be >= 0 (0: none), got {self.shared_lookup_tokens}")
        if self.max_kv_blocks is not None and self.max_kv_blocks < 1:
            raise ValueError(f"max_kv_blocks must be >= 1 (None: all), got {self.max_kv_blocks}")
        if self.decode_burst_steps < 1:
            raise ValueError(f"decode_burst_steps must be >= 1 (1: no bursts), got {self.decode_burst_steps}")
        if not self.decode_burst_seconds >= 0:
            raise ValueError(f"decode_burst_seconds must be >= 0, got {self.decode_burst_seconds}")


@dataclass
class StepOutput:
    """What one step did to one request: the tokens it appended and whether it finished.

    ``finish_reason`` "error" comes with ``error``, the message of what ended the request, and
    ``failed_constraint`` says whether that was the request's own output constraint (a client's
    mistake, such as a grammar that can never be completed, rather than a failure of the engine).
    The first ``num_accepted_drafts`` of ``new_token_ids`` are drafts the target accepted; the rest
    the target chose itself (a step emits its accepted drafts first, then its own token).
    """

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    stats: RequestStats
    error: str | None = None
    failed_constraint: bool = False
    num_accepted_drafts: int = 0


@dataclass
class RequestState:
    """Engine-side state of a request beside its ``Sequence``."""

    rng: np.random.Generator
    stats: RequestStats
    eos_token_ids: frozenset[int]
    seed: int | None
    guide: GuidedRequest | None = None  # the output constraint's matcher (xpuspec.structured)
    # DRY's sequence breakers as token ids (xpuspec.sample.dry); empty where DRY is off.
    breaker_ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
