"""The host inputs of a paged-attention step: the flat batch description of its chunks, written into
preallocated numpy arrays shared with the ``ov.Tensor`` objects bound once to an infer request.

A step writes into the arrays and only changes the tensors' shapes (see :class:`HostInput`); a lane
(:class:`Lane`) is one compiled model's infer request with its inputs. Tree chunks add a
query-to-query mask (:func:`tree_mask`) and positions by depth (:func:`tree_depths`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import openvino as ov

from xpuspec.core.chunks import SequenceChunk
from xpuspec.executor.graph_edits import SAMPLED_TOKEN_INDICES

INITIAL_CAPACITY = 256

# The flat batch description of the paged-attention transformation (OpenVINO 2026.4) plus our gather
# indices; each is a 1-D host array except max_context_len, a scalar.
BATCH_INPUTS: dict[str, type] = {
    "input_ids": np.int64,
    "position_ids": np.int64,
    "past_lens": np.int32,
    "subsequence_begins": np.int32,
    "block_indices": np.int32,
    "block_indices_begins": np.int32,
    SAMPLED_TOKEN_INDICES: np.int64,
}
MAX_CONTEXT_LEN = "max_context_len"
# Tree speculation's query-to-query mask (exposed by make_paged_model(allow_qq_bias=True)): per
# sequence a row-major n x n u8 mask over its n tokens of the step, and num_sequences + 1 prefix
# sums of the mask lengths (a sequence without a tree has an empty range). Both empty: causal.
QQ_BIAS = "qq_bias"
QQ_BIAS_BEGINS = "qq_bias_begins"
TREE_INPUTS: dict[str, type] = {QQ_BIAS: np.uint8, QQ_BIAS_BEGINS: np.int32}


class HostInput:
    """A growable host array shared with the ``ov.Tensor`` bound to one model input.

    A step resizes the tensor within the array's capacity (no allocation, no rebinding); only when
    a batch outgrows the capacity is a larger array allocated and bound.
    """

    def __init__(self, request: ov.InferRequest, name: str, dtype: type, capacity: int) -> None:
        self._request = request
        self._name = name
        self._dtype = dtype
        self.array: np.ndarray = np.zeros(0, dtype=dtype)  # [capacity]
        self._tensor: ov.Tensor | None = None
        self._bound_size = -1  # the tensor's current shape[0]
        self.reserve(capacity)

    def reserve(self, size: int) -> np.ndarray:
        """Make room for ``size`` elements and return the whole backing array (contents not kept)."""
        if size > self.array.shape[0]:
            self.array = np.zeros(max(size, 2 * self.array.shape[0]), dtype=self._dtype)
            self._tensor = ov.Tensor(self.array, shared_memory=True)
            self._request.set_tensor(self._name, self._tensor)
            self._bound_size = self.array.shape[0]
        return self.array

    def bind(self, size: int) -> None:
        """Expose the first ``size`` elements to the model."""
        # Setting a shape is a call into OpenVINO, not free; decode steps mostly repeat the last one.
        if size != self._bound_size:
            if self._tensor is None:
                raise ValueError(f"{self._name}: bound to {size} elements before any were reserved")
            self._tensor.shape = [size]
            self._bound_size = size


class Lane:
    """One compiled model with its infer request and the host inputs bound to it; the KV-cache
    tensors are the runner's, shared by its lanes."""

    def __init__(
        self, compiled: ov.CompiledModel, cache_tensors: dict[str, ov.Tensor], tree_masks: bool
    ) -> None:
        self.request = compiled.create_infer_request()
        for name, tensor in cache_tensors.items():
            self.request.set_tensor(name, tensor)
        self.inputs = {
            name: HostInput(self.request, name, dtype, INITIAL_CAPACITY)
            for name, dtype in BATCH_INPUTS.items()
        }
        self.max_context_len = np.zeros((), dtype=np.int32)
        self.request.set_tensor(MAX_CONTEXT_LEN, ov.Tensor(self.max_context_len, shared_memory=True))
        self.tree_inputs = (
            {
                name: HostInput(self.request, name, dtype, INITIAL_CAPACITY)
                for name, dtype in TREE_INPUTS.items()
            }
            if tree_masks
            else {}
        )
        for host in self.tree_inputs.values():
            host.bind(0)


class BatchSize(NamedTuple):
    """The extent of a step's inputs, padding included (a tuple: built every step, cheaply)."""

    num_tokens: int
    num_block_entries: int
    num_mask_entries: int  # of the tree chunks' masks
    max_context: int


def batch_size(chunks: list[SequenceChunk], block_size: int, num_blocks: int) -> BatchSize:
    """Check ``chunks`` against a cache of ``num_blocks`` blocks of ``block_size`` tokens and measure
    the inputs they fill."""
    if not chunks:
        raise ValueError("forward needs at least one chunk")
    num_tokens = 0
    num_block_entries = 0
    num_mask_entries = 0
    max_context = 0
    for chunk in chunks:
        length = len(chunk.token_ids)
        context = chunk.past_length + length
        chunk_blocks = -(-context // block_size)
        if length == 0 or chunk.past_length < 0 or not 0 <= chunk.num_logits <= length:
            raise ValueError(
                f"bad chunk: {length} tokens, past_length {chunk.past_length}, num_logits "
                f"{chunk.num_logits} (need >= 1 token, past_length >= 0, 0 <= num_logits <= tokens)"
            )
        if chunk.padding:
            if chunk.padding < 0:
                raise ValueError(f"padding must be >= 0, got {chunk.padding}")
            length += chunk.padding
            context += chunk.padding
        if len(chunk.block_table) < chunk_blocks:
            raise ValueError(
                f"block table of {len(chunk.block_table)} blocks cannot hold {context} positions "
                f"(block size {block_size})"
            )
        # An out-of-range block id would make the kernel read or write outside the cache tensors
        # (checked on the Python list: a numpy min/max costs more on a few ids).
        used_blocks = chunk.block_table[:chunk_blocks]
        if min(used_blocks) < 0 or max(used_blocks) >= num_blocks:
            raise ValueError(f"block ids must be in [0, {num_blocks}), got {list(used_blocks)}")
        if chunk.tree_parents is not None:
            check_tree(chunk.tree_parents, len(chunk.token_ids))
            num_mask_entries += length * length  # padding included
        num_tokens += length
        num_block_entries += -(-context // block_size)  # padding may reach the scratch block
        max_context = max(max_context, context)
    return BatchSize(num_tokens, num_block_entries, num_mask_entries, max_context)


def write_batch(
    lane: Lane,
    chunks: list[SequenceChunk],
    size: BatchSize,
    arange: np.ndarray,
    block_size: int,
    scratch_block: int,
) -> int:
    """Write the flat batch description of ``chunks`` into ``lane``'s inputs; return the logits rows.

    ``arange`` covers ``max(size.max_context, size.num_tokens)``: positions and sampled-row indices are
    slices of it, so a step builds no ranges. Padding writes past a sequence's blocks to
    ``scratch_block``.
    """
    num_sequences = len(chunks)
    num_tokens, num_block_entries = size.num_tokens, size.num_block_entries
    inputs = lane.inputs
    input_ids = inputs["input_ids"].reserve(num_tokens)
    position_ids = inputs["position_ids"].reserve(num_tokens)
    sampled = inputs[SAMPLED_TOKEN_INDICES].reserve(num_tokens)
    past_lens = inputs["past_lens"].reserve(num_sequences)
    subsequence_begins = inputs["subsequence_begins"].reserve(num_sequences + 1)
    block_indices = inputs["block_indices"].reserve(num_block_entries)
    block_indices_begins = inputs["block_indices_begins"].reserve(num_sequences + 1)

    token_start = 0
    block_start = 0
    num_sampled = 0
    for index, chunk in enumerate(chunks):
        length = len(chunk.token_ids)
        past = chunk.past_length
        token_end = token_start + length
        num_blocks = -(-(past + length) // block_size)
        input_ids[token_start:token_end] = chunk.token_ids
        if chunk.tree_parents is None:
            position_ids[token_start:token_end] = arange[past : past + length]
        else:
            position_ids[token_start:token_end] = past + tree_depths(chunk.tree_parents)
        past_lens[index] = past
        subsequence_begins[index] = token_start
        block_indices_begins[index] = block_start
        block_indices[block_start : block_start + num_blocks] = chunk.block_table[:num_blocks]
        if chunk.num_logits:
            sampled[num_sampled : num_sampled + chunk.num_logits] = arange[
                token_end - chunk.num_logits : token_end
            ]
            num_sampled += chunk.num_logits
        if chunk.padding:
            # Past the last real block only the scratch block, even where the table names more
            # of the sequence's blocks: those may be shared, and the scratch is nobody's.
            padded_end = token_end + chunk.padding
            input_ids[token_end:padded_end] = chunk.token_ids[-1]
            position_ids[token_end:padded_end] = arange[past + length : past + length + chunk.padding]
            padded_blocks = -(-(past + length + chunk.padding) // block_size)
            block_indices[block_start + num_blocks : block_start + padded_blocks] = scratch_block
            num_blocks = padded_blocks
            token_end = padded_end
        token_start = token_end
        block_start += num_blocks
    subsequence_begins[num_sequences] = num_tokens
    block_indices_begins[num_sequences] = num_block_entries

    lane.max_context_len[...] = size.max_context
    if lane.tree_inputs:
        write_tree_inputs(chunks, size.num_mask_entries, lane.tree_inputs)

    inputs["input_ids"].bind(num_tokens)
    inputs["position_ids"].bind(num_tokens)
    inputs[SAMPLED_TOKEN_INDICES].bind(num_sampled)
    inputs["past_lens"].bind(num_sequences)
    inputs["subsequence_begins"].bind(num_sequences + 1)
    inputs["block_indices"].bind(num_block_entries)
    inputs["block_indices_begins"].bind(num_sequences + 1)
    return num_sampled


def check_tree(parents: Sequence[int], length: int) -> None:
    """Check the parents of a tree chunk of ``length`` tokens (the kernel checks none of it)."""
    if len(parents) != length:
        raise ValueError(f"tree_parents has {len(parents)} entries for {length} tokens")
    for index, parent in enumerate(parents):
        if not -1 <= parent < index:
            raise ValueError(
                f"tree_parents[{index}] = {parent}: a parent is -1 or an earlier token of the chunk"
            )


def write_tree_inputs(
    chunks: list[SequenceChunk], num_mask_entries: int, tree_inputs: dict[str, HostInput]
) -> None:
    """Write the qq_bias masks of the tree chunks (empty inputs when the batch holds no tree)."""
    bias_host, begins_host = tree_inputs[QQ_BIAS], tree_inputs[QQ_BIAS_BEGINS]
    if num_mask_entries == 0:
        bias_host.bind(0)
        begins_host.bind(0)
        return
    bias = bias_host.reserve(num_mask_entries)
    begins = begins_host.reserve(len(chunks) + 1)
    start = 0
    for index, chunk in enumerate(chunks):
        begins[index] = start
        if chunk.tree_parents is None:
            continue
        # Padding tokens are roots of their own: they see the past and themselves, and no
        # node sees them.
        parents = list(chunk.tree_parents) + [-1] * chunk.padding
        length = len(parents)
        bias[start : start + length * length] = tree_mask(parents).reshape(-1)
        start += length * length
    begins[len(chunks)] = start
    bias_host.bind(num_mask_entries)
    begins_host.bind(len(chunks) + 1)


def tree_depths(parents: Sequence[int]) -> np.ndarray:
    """Depth of each tree token ([n] int64): 0 without a parent in the chunk, else parent's + 1."""
    depths = np.zeros(len(parents), dtype=np.int64)
    for index, parent in enumerate(parents):
        if parent >= 0:
            depths[index] = depths[parent] + 1
    return depths


def tree_mask(parents: Sequence[int]) -> np.ndarray:
    """The ``[n, n]`` u8 attention mask of a tree chunk: row = query, 1 on its ancestors and itself."""
    length = len(parents)
    mask = np.zeros((length, length), dtype=np.uint8)
    for index, parent in enumerate(parents):
        if parent >= 0:
            mask[index] = mask[parent]
        mask[index, index] = 1
    return mask
