"""One pass of the EAGLE-3 head: a sequence's KV cache, an infer request's inputs, and filling them.

The KV cache lives here as numpy, per sequence (:class:`SequenceCache`), appended by every pass (each
sequence's rows may be of different lengths: passes are padded and masked). It is small: one layer,
``kv_heads * head_dim`` values per position.

A pass of one sequence (batch 1, every chain step of a lone request) is the latency that matters, and
its Python cost was once as large as the head's own nodes: it rebuilt seven arrays, copied the
sequence's past KV into them, handed them over by name, and each new past length changed the graph's
input shapes. Now the sequence's cache *is* the past input, at a capacity that grows in
:data:`CACHE_GRAIN` slots (masked beyond its length, so the shapes stay put for that many tokens), and
the other inputs are written into the request's own tensors (:class:`HeadRequest`, :func:`fill_pass`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import openvino as ov

from xpuspec.executor import eagle3_graph as graph
from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig
from xpuspec.spec_decode.eagle3.head import HeadStep

# Slots a sequence's head cache grows by: its capacity is the past width of a batch-1 pass, so the
# head's input shapes change once per this many tokens instead of every pass.
CACHE_GRAIN = 256


class SequenceCache:
    """One sequence's keys and values ``[1, kv_heads, capacity, head_dim]``, valid up to ``length``.

    The arrays are the head's ``past_key`` / ``past_value`` inputs of a pass of this sequence alone
    (``tensors``, sharing their memory): the slots past ``length`` are masked, and kept at zero so a
    masked slot's weight of exactly 0 never meets a NaN.
    """

    def __init__(self, kv_heads: int, head_dim: int):
        self.key = np.zeros((1, kv_heads, CACHE_GRAIN, head_dim), np.float32)
        self.value = np.zeros_like(self.key)
        self.length = 0
        self.tensors = self._share()

    def _share(self) -> tuple[ov.Tensor, ov.Tensor]:
        return ov.Tensor(self.key, shared_memory=True), ov.Tensor(self.value, shared_memory=True)

    @property
    def capacity(self) -> int:
        return self.key.shape[2]

    def append(self, key: np.ndarray, value: np.ndarray) -> None:
        """Add ``[kv_heads, n, head_dim]`` keys and values after the valid slots."""
        end = self.length + key.shape[1]
        if end > self.capacity:
            capacity = -(-end // CACHE_GRAIN) * CACHE_GRAIN
            for name in ("key", "value"):
                grown = np.zeros(self.key.shape[:2] + (capacity, self.key.shape[3]), np.float32)
                grown[:, :, : self.length] = getattr(self, name)[:, :, : self.length]
                setattr(self, name, grown)
            self.tensors = self._share()
        self.key[0, :, self.length : end] = key
        self.value[0, :, self.length : end] = value
        self.length = end

    def truncate(self, length: int) -> None:
        if length < self.length:
            self.key[:, :, length : self.length] = 0
            self.value[:, :, length : self.length] = 0
            self.length = length


class HeadRequest:
    """An infer request of a head graph with its input arrays (the request's own tensors) and the past
    KV tensors last set on it."""

    def __init__(self, request: ov.InferRequest):
        self.request = request
        self._inputs: dict[str, np.ndarray] = {}
        self._past: tuple[ov.Tensor, ov.Tensor] | None = None

    def input(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The request's own input tensor ``name`` at ``shape``, as a writable array (zero-filled).

        Writing into the request's tensors skips the per-call wrapping of a dict of arrays at every pass.
        The array is kept while the shape stays: asking the tensor for its shape and data has a cost of
        its own at every input.
        """
        held = self._inputs.get(name)
        if held is None or held.shape != shape:
            tensor = self.request.get_tensor(name)
            tensor.shape = list(shape)
            held = self._inputs[name] = tensor.data
        held.fill(0)
        return held

    def set_past(self, key: ov.Tensor, value: ov.Tensor) -> None:
        if self._past is None or self._past[0] is not key:  # a lone sequence's cache: set once
            self.request.set_tensor(graph.PAST_KEY, key)
            self.request.set_tensor(graph.PAST_VALUE, value)
            self._past = key, value

    def output(self, name: str) -> np.ndarray:
        return self.request.get_tensor(name).data


def fill_pass(
    config: Eagle3HeadConfig,
    request: HeadRequest,
    steps: Sequence[HeadStep],
    caches: list[SequenceCache],
    rows: int = 1,
) -> list[int]:
    """Write one pass of ``steps`` (each with its sequence's cache in ``caches``), padded to at least
    ``rows`` positions, into ``request``'s inputs; returns each step's length."""
    for step in steps:
        if step.hidden.shape[1] != config.hidden_size:
            raise ValueError(
                f"head step for {step.sequence_id}: hidden has {step.hidden.shape[1]} features, the head "
                f"{config.hidden_size} (fuse the target's states first)"
            )
    batch = len(steps)
    pasts = [cache.length for cache in caches]
    lengths = [len(step.token_ids) for step in steps]
    new = max(max(lengths), rows)
    if batch == 1:
        # The cache is the past input as it is: no copy, and its width changes once per CACHE_GRAIN.
        past = caches[0].capacity
        past_key, past_value = caches[0].tensors
    else:
        past = max(pasts)
        key = np.zeros((batch, config.num_key_value_heads, past, config.head_dim), np.float32)
        value = np.zeros_like(key)
        for i, (cache, cached) in enumerate(zip(caches, pasts, strict=True)):
            key[i, :, :cached] = cache.key[0, :, :cached]
            value[i, :, :cached] = cache.value[0, :, :cached]
        past_key, past_value = ov.Tensor(key, shared_memory=True), ov.Tensor(value, shared_memory=True)
    request.set_past(past_key, past_value)

    input_ids = request.input(graph.INPUT_IDS, (batch, new))
    hidden = request.input(graph.HIDDEN_IN, (batch, new, config.hidden_size))
    positions = request.input(graph.POSITION_IDS, (batch, new))
    mask = request.input(graph.ATTENTION_MASK, (batch, new, past + new))
    logits_indices = request.input(graph.LOGITS_INDICES, (batch, max(s.num_logits for s in steps)))
    # Padded query rows attend to themselves only, so no row is fully masked.
    mask[:, np.arange(new), past + np.arange(new)] = True
    for i, (step, length, cached) in enumerate(zip(steps, lengths, pasts, strict=True)):
        input_ids[i, :length] = step.token_ids
        hidden[i, :length] = step.hidden
        positions[i, :length] = cached + np.arange(length) if step.positions is None else step.positions
        if step.attention_mask is None:
            mask[i, :length, :cached] = True
            if length > 1:  # one new position: the diagonal set above
                mask[i, :length, past : past + length] = np.tri(length, dtype=np.bool_)
        else:
            given = np.asarray(step.attention_mask, dtype=np.bool_)
            if given.shape != (length, cached + length):
                raise ValueError(
                    f"head step for {step.sequence_id}: attention_mask must be "
                    f"[{length}, {cached + length}] ({cached} cached + {length} new positions), "
                    f"got {list(given.shape)}"
                )
            mask[i, :length, :cached] = given[:, :cached]
            mask[i, :length, past : past + length] = given[:, cached:]
        logits_indices[i, : step.num_logits] = step.logits_rows
    return lengths
