"""Stateful model runner: one infer request per sequence, for devices without paged attention (the NPU).

The optimum-intel export is used as it is: a stateful model whose KV cache lives inside each infer
request as state variables ``[batch=1, kv_heads, seq, head_dim]``. The runner gives every sequence
its own request, so a "batch" of chunks is the sequences' requests running concurrently
(``start_async`` on each, then wait for all); the plugin's streams decide how much of that is truly
parallel.

The engine speaks in positions, not in rollbacks: a chunk's ``past_length`` says how much of the
sequence's KV is valid. When the request holds more (rejected drafts, or a preempted sequence that
starts again at 0), the runner cuts its state back first, in one of three ways (:class:`Rollback`):
slicing the state tensors (CPU, GPU), letting the plugin trim by position ids (NPUW_LLM on the NPU
does that itself), or resetting and running the kept tokens again (any device, costs compute).

The engine's block manager still bounds memory: the runner reports a notional ``block_size`` and a
``num_blocks`` that covers ``max_sequences`` sequences of ``max_context`` tokens.

Static shapes (NPU): the NPUW_LLM plugin compiles fixed prefill and generate shapes from its compile
properties (MAX_PROMPT_LEN, MIN_RESPONSE_LEN, NPUW_LLM_MAX_GENERATION_TOKEN_LEN) and pads itself; the
runner only feeds batch-1 inputs with contiguous positions and keeps to ``max_tokens_per_inference``
(so the engine's γ must stay below the generation length the plugin was compiled for).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import openvino as ov

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.interfaces import ExecutorCaps
from xpuspec.executor.paged_runner import MODEL_FILE

logger = logging.getLogger(__name__)

NOTIONAL_BLOCK_SIZE = 32
_SEQUENCE_AXIS = 2  # of the state tensors [batch, kv_heads, seq, head_dim] of optimum-intel exports
_SCRATCH = object()  # the slot of chunks without a sequence id (calibration, timing)


class Rollback(enum.Enum):
    """How a request's KV state is cut back to a shorter past."""

    SLICE = "slice"  # query_state -> slice the sequence axis -> set the state (CPU, GPU)
    POSITIONS = "positions"  # the plugin trims when position ids go back (NPUW_LLM on the NPU)
    REPREFILL = "reprefill"  # reset the state and run the kept tokens again (any device)

    @classmethod
    def for_device(cls, device: str) -> Rollback:
        return cls.POSITIONS if device.upper().startswith("NPU") else cls.SLICE


@dataclass
class _Slot:
    """One sequence's infer request and the tokens whose KV its state holds, in position order."""

    request: ov.InferRequest
    token_ids: list[int] = field(default_factory=list)
    # Inputs of the running inference: kept alive until it ends (the request shares their memory).
    pending_inputs: dict[str, np.ndarray] | None = None
    pending_num_logits: int = 0


class StatefulModelRunner:
    """Runs a stateful (non-paged) model over :class:`SequenceChunk` batches; same interface as
    :class:`~xpuspec.executor.paged_runner.PagedModelRunner` plus :meth:`release`.

    Every chunk must carry ``sequence_id`` (a chunk without one runs on a scratch request and must
    start at position 0). At most ``max_sequences`` sequences hold a request at once; the engine
    calls :meth:`release` when a sequence finishes, is aborted or is preempted.
    """

    def __init__(
        self,
        model_dir: Path,
        device: str = "CPU",
        properties: dict | None = None,
        max_sequences: int = 16,
        max_context: int = 2048,
        rollback: Rollback | None = None,
        max_tokens_per_inference: int | None = None,
        core: ov.Core | None = None,
    ) -> None:
        model_path = Path(model_dir) / MODEL_FILE
        if not model_path.is_file():
            raise ValueError(f"no {MODEL_FILE} in {model_dir}: expected an optimum-intel stateful export")
        if max_sequences < 1:
            raise ValueError(f"max_sequences must be >= 1, got {max_sequences}")
        if max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {max_context}")
        if max_tokens_per_inference is not None and max_tokens_per_inference < 1:
            raise ValueError(f"max_tokens_per_inference must be >= 1, got {max_tokens_per_inference}")
        core = core or ov.Core()
        model = core.read_model(model_path)
        names = {name for port in model.inputs for name in port.get_names()}
        missing = {"input_ids", "attention_mask", "position_ids"} - names
        if missing or not model.get_sinks():
            raise ValueError(
                f"{model_path} is not a stateful decoder (missing inputs {sorted(missing)}, "
                f"{len(model.get_sinks())} state variables): export it with optimum-intel, stateful=True"
            )
        self._has_beam_idx = "beam_idx" in names
        self.compiled_model = core.compile_model(model, device, dict(properties or {}))
        self.device = device
        self.rollback = rollback or Rollback.for_device(device)
        self.max_sequences = max_sequences
        self.caps = ExecutorCaps(max_sequences=max_sequences, owns_sequence_kv=True)
        self.max_tokens_per_inference = max_tokens_per_inference
        self.block_size: int = NOTIONAL_BLOCK_SIZE
        self.num_blocks: int = max_sequences * -(-max_context // NOTIONAL_BLOCK_SIZE)
        logits_port = self.compiled_model.output(0)
        self.vocab_size: int = logits_port.get_partial_shape()[-1].get_length()
        self._slots: dict[object, _Slot] = {}
        self._free_requests: list[ov.InferRequest] = []
        self._pending: list[_Slot] | None = None
        logger.debug(
            "%s on %s: stateful, one request per sequence (up to %d), rollback by %s",
            model_dir,
            device,
            max_sequences,
            self.rollback.value,
        )

    @property
    def num_active_sequences(self) -> int:
        return sum(1 for key in self._slots if key is not _SCRATCH)

    def warm_up(self, max_context: int) -> None:
        """A no-op: each sequence's request grows its own state as it goes."""

    def release(self, sequence_id: str) -> None:
        """Forget a sequence's KV and return its request to the pool (a no-op for unknown ids)."""
        self._release_slot(sequence_id)

    def _release_slot(self, sequence_id: object) -> None:
        """:meth:`release` for any slot key, the scratch slot's included."""
        slot = self._slots.pop(sequence_id, None)
        if slot is None:
            return
        if slot.pending_inputs is not None:
            raise RuntimeError(f"sequence {sequence_id!r} is released while its inference runs")
        slot.request.reset_state()
        self._free_requests.append(slot.request)

    def forward(self, chunks: list[SequenceChunk]) -> np.ndarray:
        """Run ``chunks`` (each sequence's request concurrently); return their logits rows in chunk order.

        Returns ``[sum(num_logits), vocab]`` float32, a new array.
        """
        self.start(chunks)
        return self.wait()

    def start(self, chunks: list[SequenceChunk]) -> None:
        """Cut each sequence's state back to its ``past_length`` and start all inferences."""
        if self._pending is not None:
            raise RuntimeError("an inference is still running: call wait() before starting another")
        if not chunks:
            raise ValueError("forward needs at least one chunk")
        keys = [_SCRATCH if chunk.sequence_id is None else chunk.sequence_id for chunk in chunks]
        if len(set(keys)) != len(keys):
            raise ValueError("a sequence appears twice in one batch; give each chunk its own sequence_id")
        slots = [self._prepare(key, chunk) for key, chunk in zip(keys, chunks, strict=True)]
        for slot, chunk in zip(slots, chunks, strict=True):
            self._launch(slot, chunk)
        self._pending = slots

    def wait(self) -> np.ndarray:
        """Wait for every inference started by :meth:`start`; return the logits as :meth:`forward` does."""
        if self._pending is None:
            raise RuntimeError("no inference was started")
        slots, self._pending = self._pending, None
        rows: list[np.ndarray] = []
        for slot in slots:
            slot.request.wait()
            slot.pending_inputs = None
            if slot.pending_num_logits:
                logits = slot.request.get_output_tensor(0).data  # [1, n, vocab]
                rows.append(logits[0, logits.shape[1] - slot.pending_num_logits :])  # [num_logits, vocab]
        if not rows:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        return np.concatenate(rows).astype(np.float32, copy=False)  # [sum num_logits, vocab]

    # ----------------------------------------------------------------- internals
    def _prepare(self, key: object, chunk: SequenceChunk) -> _Slot:
        """The slot of ``key`` with its state cut back to ``chunk.past_length`` positions."""
        length = len(chunk.token_ids)
        if length == 0 or chunk.past_length < 0 or not 0 <= chunk.num_logits <= length:
            raise ValueError(
                f"bad chunk: {length} tokens, past_length {chunk.past_length}, num_logits "
                f"{chunk.num_logits} (need >= 1 token, past_length >= 0, 0 <= num_logits <= tokens)"
            )
        if key is _SCRATCH:
            if chunk.past_length:
                raise ValueError("a chunk without sequence_id has no history: its past_length must be 0")
            self._release_slot(_SCRATCH)
        slot = self._slots.get(key)
        if slot is None:
            if chunk.past_length:
                raise ValueError(
                    f"sequence {key!r} is new to this runner but its chunk starts at position "
                    f"{chunk.past_length}; a sequence starts at 0 (after release, too)"
                )
            slot = self._slots[key] = _Slot(self._new_request(key))
        held = len(slot.token_ids)
        if chunk.past_length > held:
            raise ValueError(
                f"sequence {key!r}: the chunk starts at position {chunk.past_length} but the state "
                f"holds only {held} positions"
            )
        if chunk.past_length < held:
            self._cut_back(slot, chunk.past_length)
        limit = self.max_tokens_per_inference
        if limit is not None and len(chunk.token_ids) > limit:
            raise ValueError(
                f"{len(chunk.token_ids)} tokens in one inference, more than max_tokens_per_inference={limit} "
                "this device was compiled for; lower the batch token budget or the speculation length"
            )
        return slot

    def _new_request(self, key: object) -> ov.InferRequest:
        if self._free_requests:
            return self._free_requests.pop()
        if key is not _SCRATCH and self.num_active_sequences >= self.max_sequences:
            raise RuntimeError(
                f"more than max_sequences={self.max_sequences} sequences hold KV state at once; "
                "release finished sequences or raise max_sequences"
            )
        return self.compiled_model.create_infer_request()

    def _cut_back(self, slot: _Slot, past_length: int) -> None:
        """Make the state hold only positions ``[0, past_length)``."""
        kept = slot.token_ids[:past_length]
        if past_length == 0:
            slot.request.reset_state()
        elif self.rollback is Rollback.SLICE:
            for state in slot.request.query_state():
                # Reading the state converts it to its logical type (a u8 KV cache is dequantized),
                # which is most of the cost; the region of interest is set without another copy.
                held = state.state  # [1, kv_heads, seq, head_dim]
                shape = list(held.shape)
                if shape[_SEQUENCE_AXIS] != len(slot.token_ids):
                    raise RuntimeError(
                        f"state {state.name} has shape {shape}, expected {len(slot.token_ids)} "
                        f"positions on axis {_SEQUENCE_AXIS}; use Rollback.REPREFILL for this model"
                    )
                shape[_SEQUENCE_AXIS] = past_length
                state.state = ov.Tensor(held, ov.Coordinate([0] * len(shape)), ov.Coordinate(shape))
        elif self.rollback is Rollback.REPREFILL:
            slot.request.reset_state()
            slot.token_ids = []
            self._launch(slot, SequenceChunk(token_ids=kept, past_length=0, block_table=(), num_logits=0))
            slot.request.wait()
            slot.pending_inputs = None
        # Rollback.POSITIONS: the plugin drops the positions at and past the new position ids itself.
        slot.token_ids = kept

    def _launch(self, slot: _Slot, chunk: SequenceChunk) -> None:
        past, length = chunk.past_length, len(chunk.token_ids)
        inputs: dict[str, np.ndarray] = {
            "input_ids": np.asarray(chunk.token_ids, dtype=np.int64).reshape(1, length),
            "attention_mask": np.ones((1, past + length), dtype=np.int64),
            "position_ids": np.arange(past, past + length, dtype=np.int64).reshape(1, length),
        }
        if self._has_beam_idx:
            inputs["beam_idx"] = np.zeros(1, dtype=np.int32)
        for name, array in inputs.items():
            slot.request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        slot.pending_inputs = inputs
        slot.pending_num_logits = chunk.num_logits
        slot.token_ids.extend(chunk.token_ids)
        slot.request.start_async()
