"""Paged-attention model runner: one OpenVINO model, driven directly with a flat batch of token chunks.

The runner loads a stateful optimum-intel export, turns it into a paged-attention model (see
:mod:`xpuspec.executor.graph_edits`), compiles it, allocates the KV-cache blocks and runs mixed batches:
prefill chunks, single-token decodes and multi-token verification chunks of different sequences in one
inference. Block allocation belongs to the caller (the engine's block manager): each chunk brings the
physical block table of its sequence.

Speed matters because the per-step Python time adds directly to every generated token: all inputs are
preallocated numpy arrays shared with ``ov.Tensor`` objects bound once to the infer request; a step
writes into them and only changes the tensors' shapes (:mod:`xpuspec.executor.paged_inputs`), and the
logits come back as a view of the request's output tensor.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import openvino as ov

from xpuspec.core.chunks import SequenceChunk, one_token_each
from xpuspec.core.interfaces import ExecutorCaps
from xpuspec.executor.hidden_taps import Projection
from xpuspec.executor.paged_compile import MODEL_FILE as MODEL_FILE  # the runner's input file, named here too
from xpuspec.executor.paged_compile import PagedCompile, compile_paged
from xpuspec.executor.paged_inputs import (
    BATCH_INPUTS,
    INITIAL_CAPACITY,
    MAX_CONTEXT_LEN,
    QQ_BIAS,
    QQ_BIAS_BEGINS,
    TREE_INPUTS,
    Lane,
    batch_size,
    write_batch,
)

logger = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 512 * 1024 * 1024
_CACHE_INPUT = re.compile(r"^(key|value)_cache\.(\d+)$")


def _compiled_input_names(compiled: ov.CompiledModel) -> dict[str, ov.ConstOutput]:
    return {name: port for port in compiled.inputs for name in port.get_names()}


class PagedModelRunner:
    """Runs one paged-attention model over mixed batches of :class:`SequenceChunk`.

    A step's token count is part of its input shapes. When it changes, the CPU plugin re-prepares
    every node of the graph: alternating two step shapes costs more per step than the few tokens
    between them (measured: docs/experiments/code-comment-figures.md). ``SequenceChunk.padding`` lets
    the engine keep a count instead.

    Attributes: ``block_size`` (tokens per KV block, chosen by the plugin: 32 on CPU), ``num_blocks``
    (physical blocks allocated per layer), ``cache_bytes`` (the blocks' size, resident once
    written; the tensors hold one scratch block more), ``vocab_size`` (logits width),
    ``hidden_state_layers`` (the tapped layer boundaries, or None) and ``hidden_state_width`` (width
    of a tapped row, 0 untapped).

    ``hidden_state_layers`` (an EAGLE-3 target): the compiled graph gets one more output, the residual
    stream entering each of these layers for every scheduled token (:mod:`xpuspec.executor.hidden_taps`),
    read with :meth:`hidden_states` after a step. Without it the graph is the plain paged model.
    ``hidden_state_projection`` maps those rows inside the graph (an EAGLE-3 head's ``fc``).

    ``logits_vocab`` (a draft): keep the LM head's first ``logits_vocab`` rows
    (:func:`~xpuspec.executor.graph_edits.cut_logits_vocab`), so ``vocab_size`` is that.
    """

    supports_padding = True  # SequenceChunk.padding

    def __init__(
        self,
        model_dir: Path,
        device: str = "CPU",
        properties: dict | None = None,
        num_blocks: int | None = None,
        cache_bytes: int | None = None,
        core: ov.Core | None = None,
        capacity_tokens: int | None = None,
        decode_lane: bool = False,
        hidden_state_layers: Sequence[int] | None = None,
        logits_vocab: int | None = None,
        hidden_state_projection: Projection | None = None,
        compiled: PagedCompile | None = None,
    ) -> None:
        """``compiled``: the models :func:`~xpuspec.executor.paged_compile.compile_paged` compiled for
        this runner ahead (in a thread, while another model compiled); the arguments that shape the
        graph (``decode_lane``, the taps, ``logits_vocab``) are then those it was compiled with.
        Without it, the runner compiles ``model_dir`` itself."""
        if num_blocks is not None and cache_bytes is not None:
            raise ValueError("give num_blocks or cache_bytes, not both")
        if num_blocks is not None and num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if compiled is None:
            compiled = compile_paged(
                model_dir,
                device,
                properties,
                core,
                decode_lane,
                hidden_state_layers,
                logits_vocab,
                hidden_state_projection,
            )
        self.hidden_state_layers: tuple[int, ...] | None = compiled.hidden_state_layers
        tapped_name = compiled.tapped_name
        self.compiled_model = compiled.main
        ports = _compiled_input_names(self.compiled_model)
        cache_ports = self._check_inputs(ports)
        self._allocate_cache(
            cache_ports, num_blocks, cache_bytes, capacity_tokens, f"{model_dir} on {device}"
        )
        self._read_outputs(tapped_name)

        # Positions and sampled-row indices are slices of one arange, so a step builds no ranges.
        self._arange = np.arange(INITIAL_CAPACITY, dtype=np.int64)
        self._pending: Lane | None = None  # the lane whose inference is running
        self._finished: Lane | None = None  # the lane whose outputs are those of the last wait()
        # Tree masks need the qq_bias inputs; a model compiled without them runs chains only.
        self._token_axes = {
            name: _token_axis(tensor, self.block_size) for name, tensor in self.cache_tensors.items()
        }
        # Tree chunks need the qq_bias inputs; verifying trees also needs caches whose tokens can be
        # moved one by one (move_kv): not a key cache quantised per channel over a block (the CPU's
        # default u8 key cache; KEY_CACHE_QUANT_MODE=BY_TOKEN gives per-token scales).
        self.supports_tree_masks: bool = QQ_BIAS in ports and QQ_BIAS_BEGINS in ports
        self.supports_trees: bool = self.supports_tree_masks and None not in self._token_axes.values()
        self.caps = ExecutorCaps(
            padding=self.supports_padding,
            trees=self.supports_tree_masks,
            kv_moves=self.supports_trees,
            hidden_state_taps=self._hidden_states_index is not None,
            decode_lane=compiled.decode_lane is not None,
        )
        self._lane = Lane(self.compiled_model, self.cache_tensors, self.supports_tree_masks)
        # The CPU plugin re-prepares every node of the graph when an input's shape changes (a cost that
        # grows with the layers, on a 30-layer target more than a whole 1-token step of its small draft;
        # measured: docs/experiments/2026-12-02-cost-model.md), and one compiled model holds one graph
        # whatever its infer requests. A draft alternates a multi-token catch-up pass with one-token
        # passes every step, and a speculating target alternates verifications with one-token steps
        # wherever drafting pauses: a second compiled copy, sharing the KV-cache tensors, runs the
        # steps of one token per sequence, so neither copy changes shape between the two. It costs a
        # second copy of the weights.
        self._decode_lane = (
            Lane(compiled.decode_lane, self.cache_tensors, self.supports_tree_masks)
            if compiled.decode_lane is not None
            else None
        )

    def _allocate_cache(
        self,
        cache_ports: dict[str, ov.ConstOutput],
        num_blocks: int | None,
        cache_bytes: int | None,
        capacity_tokens: int | None,
        where: str,
    ) -> None:
        """Set the block size the plugin chose and allocate the KV-cache tensors: ``num_blocks``, or as
        many as ``cache_bytes`` (the default budget) hold, no more than ``capacity_tokens`` need."""
        value_cache_shape = cache_ports["value_cache.0"].get_partial_shape()
        # Value caches are [num_blocks, kv_heads, block_size, head_size (+ scale bytes)] on every
        # plugin; key caches may be transposed or carry per-channel scale rows on the block axis.
        self.block_size: int = value_cache_shape[2].get_length()
        bytes_per_block = (
            sum(
                _per_block_bits(port.get_partial_shape(), port.get_element_type())
                for port in cache_ports.values()
            )
            // 8
        )
        if num_blocks is None:
            budget = DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes
            num_blocks = budget // bytes_per_block
            if num_blocks < 1:
                raise ValueError(
                    f"cache_bytes={budget} is below one KV block of this model ({bytes_per_block} bytes)"
                )
            if capacity_tokens is not None:
                # No more memory than the engine can ever fill: every sequence slot at full context.
                num_blocks = min(num_blocks, -(-capacity_tokens // self.block_size))
        self.num_blocks: int = num_blocks
        # One block more than the block tables may name: padding tokens past a sequence's last
        # block write there, and nothing reads it.
        self.scratch_block: int = num_blocks
        self.cache_tensors: dict[str, ov.Tensor] = {}
        for name, port in cache_ports.items():
            shape = [num_blocks + 1] + [dim.get_length() for dim in list(port.get_partial_shape())[1:]]
            self.cache_tensors[name] = _zeroed_tensor(port.get_element_type(), shape)
        allocated = sum(tensor.byte_size for tensor in self.cache_tensors.values())
        self.cache_bytes: int = allocated * num_blocks // (num_blocks + 1)  # the scratch block aside
        logger.debug(
            "%s: KV cache %s, block %d tokens, %d blocks (%.1f MiB)",
            where,
            cache_ports["value_cache.0"].get_element_type().get_type_name(),
            self.block_size,
            num_blocks,
            num_blocks * bytes_per_block / 2**20,
        )

    def _read_outputs(self, tapped_name: str | None) -> None:
        """The logits' width and type, and which output holds the tapped hidden states (if any)."""
        logits_port = self.compiled_model.output(0)
        self.vocab_size: int = logits_port.get_partial_shape()[-1].get_length()
        self._logits_need_cast = logits_port.get_element_type() != ov.Type.f32
        # Both lanes compile the same model, so the taps are the same output index in each.
        self._hidden_states_index: int | None = None
        self.hidden_state_width: int = 0
        if tapped_name is not None:
            self._hidden_states_index = next(
                index
                for index, port in enumerate(self.compiled_model.outputs)
                if tapped_name in port.get_names()
            )
            tapped_port = self.compiled_model.output(self._hidden_states_index)
            self.hidden_state_width = tapped_port.get_partial_shape()[-1].get_length()

    @staticmethod
    def _check_inputs(ports: dict[str, ov.ConstOutput]) -> dict[str, ov.ConstOutput]:
        """Check the compiled inputs are the ones this runner fills; return the KV-cache ports by name."""
        known = set(BATCH_INPUTS) | {MAX_CONTEXT_LEN}
        cache_ports = {name: port for name, port in ports.items() if _CACHE_INPUT.match(name)}
        unknown = sorted(set(ports) - known - set(cache_ports) - set(TREE_INPUTS))
        missing = sorted(known - set(ports))
        if unknown or missing or "value_cache.0" not in cache_ports:
            raise ValueError(
                f"unexpected inputs after the paged-attention transformation: unknown {unknown}, "
                f"missing {missing}, cache inputs {sorted(cache_ports)}; this OpenVINO version or "
                f"model architecture is not supported by the runner"
            )
        for name, port in cache_ports.items():
            shape = port.get_partial_shape()
            if shape.rank.is_dynamic or any(dim.is_dynamic for dim in list(shape)[1:]):
                raise ValueError(f"the plugin left {name} with a dynamic shape {shape}; cannot allocate it")
        return cache_ports

    def forward(self, chunks: list[SequenceChunk]) -> np.ndarray:
        """Run ``chunks`` in one inference; return the logits rows they asked for, in chunk order.

        Returns ``[sum(num_logits), vocab]`` float32. The array is a view of the request's output
        and is valid until the next ``forward``/``start`` of this runner: copy it to keep it.
        """
        self.start(chunks)
        return self.wait()

    @property
    def request(self) -> ov.InferRequest:
        """The infer request of the main compiled model (its profiling counters, for instance)."""
        return self._lane.request

    @property
    def has_decode_lane(self) -> bool:
        return self._decode_lane is not None

    def warm_up(self, max_context: int) -> None:
        """One pass per lane at a context of ``max_context`` tokens, so that buffers sized by the
        context grow now rather than during requests. (At f32 compute on CPU, the first step past each
        new longest context, every block of tokens, cost several ordinary steps of a small model, once
        per process: docs/experiments/2026-12-02-cost-model.md.) The pass reads and writes block 0
        only: callers run it before any sequence holds KV there."""
        blocks = [0] * -(-max_context // self.block_size)
        self._finished = None
        for lane in (self._lane, self._decode_lane):
            if lane is None:
                continue
            tokens = 1 if lane is self._decode_lane else 2  # the main lane alone sees chunks of 2
            chunk = SequenceChunk([0] * tokens, max_context - tokens, blocks, num_logits=1)
            self._fill_inputs([chunk], lane)
            lane.request.infer()

    def release(self, sequence_id: str) -> None:
        """A no-op: a sequence's KV lives in the shared blocks, freed with its block table."""

    def start(self, chunks: list[SequenceChunk]) -> None:
        """Fill the inputs for ``chunks`` and start the inference without waiting for it."""
        if self._pending is not None:
            raise RuntimeError("an inference is still running: call wait() before starting another")
        lane = self._lane
        if self._decode_lane is not None and one_token_each(chunks):
            lane = self._decode_lane
        self._fill_inputs(chunks, lane)
        self._pending = lane
        self._finished = None
        lane.request.start_async()

    def wait(self) -> np.ndarray:
        """Wait for the inference started by :meth:`start`; return its logits as :meth:`forward` does."""
        lane = self._pending
        if lane is None:
            raise RuntimeError("no inference was started")
        self._pending = None
        lane.request.wait()
        self._finished = lane
        logits = lane.request.get_output_tensor(0).data  # [num_sampled, 1, vocab]
        logits = logits.reshape(logits.shape[0], self.vocab_size)  # [num_sampled, vocab]
        return logits.astype(np.float32) if self._logits_need_cast else logits

    def hidden_states(self) -> np.ndarray:
        """The tapped hidden states of the last :meth:`forward` / :meth:`wait`.

        Returns ``[num_tokens, hidden_state_width]`` float32: one row for every token of the step's
        chunks (not only their ``num_logits`` rows), in chunk order, each row the states at
        ``hidden_state_layers`` concatenated. Like the logits, a view valid until the next step.
        """
        if self._hidden_states_index is None:
            raise RuntimeError(
                "this runner has no hidden-state taps: construct it with hidden_state_layers=[...]"
            )
        if self._finished is None:
            raise RuntimeError("no finished inference: call forward(), or start() then wait(), first")
        states = self._finished.request.get_output_tensor(self._hidden_states_index).data
        return states if states.dtype == np.float32 else states.astype(np.float32)

    def _fill_inputs(self, chunks: list[SequenceChunk], lane: Lane | None = None) -> int:
        """Write the flat batch description of ``chunks`` into ``lane``'s inputs (the main lane by
        default); return the logits rows."""
        size = batch_size(chunks, self.block_size, self.num_blocks)
        if self._arange.shape[0] < max(size.max_context, size.num_tokens):
            self._arange = np.arange(2 * max(size.max_context, size.num_tokens), dtype=np.int64)
        return write_batch(
            lane or self._lane, chunks, size, self._arange, self.block_size, self.scratch_block
        )

    def move_kv(
        self, block_table: Sequence[int], sources: Sequence[int], destinations: Sequence[int]
    ) -> None:
        """Copy the keys and values of positions ``sources`` to ``destinations`` in every layer.

        Tree acceptance compacts the accepted path to consecutive positions with it. Positions are
        the sequence's own (mapped through ``block_table``); a destination must not be a source of a
        later pair unless it is that pair's own (ascending compaction, destination <= source, is safe).
        """
        if not self.supports_trees:
            raise ValueError("this runner's KV cache layout does not allow moving single tokens")
        if len(sources) != len(destinations):
            raise ValueError(f"{len(sources)} sources but {len(destinations)} destinations")
        pairs = [(s, d) for s, d in zip(sources, destinations, strict=True) if s != d]
        if not pairs:
            return
        size = self.block_size
        table = np.asarray(block_table, dtype=np.int64)
        src = np.array([s for s, _ in pairs], dtype=np.int64)
        dst = np.array([d for _, d in pairs], dtype=np.int64)
        if (
            src.max() >= table.shape[0] * size
            or dst.max() >= table.shape[0] * size
            or min(src.min(), dst.min()) < 0
        ):
            raise ValueError(f"positions {list(src)} -> {list(dst)} lie outside the block table")
        src_blocks, src_slots = table[src // size], src % size
        dst_blocks, dst_slots = table[dst // size], dst % size
        for name, tensor in self.cache_tensors.items():
            data = tensor.data
            if self._token_axes[name] == 2:  # [blocks, heads, tokens, head_size]
                data[dst_blocks, :, dst_slots, :] = data[src_blocks, :, src_slots, :]
            else:  # [blocks, heads, head_size, tokens]
                data[dst_blocks, :, :, dst_slots] = data[src_blocks, :, :, src_slots]


def _token_axis(tensor: ov.Tensor, block_size: int) -> int | None:
    """Which axis of a cache tensor ``[blocks, heads, ., .]`` runs over a block's tokens.

    Value caches and the usual key caches are ``[blocks, heads, block_size, head_size]``; a
    transposed key cache is ``[blocks, heads, head_size, block_size]``. A cache with per-block
    quantisation scales along the token axis cannot be compacted token by token: None then.
    """
    shape = list(tensor.shape)
    if len(shape) == 4 and shape[2] == block_size:
        return 2
    if len(shape) == 4 and shape[3] == block_size:
        return 3
    return None


def warm_up_compiled(compiled: PagedCompile, max_context: int) -> None:
    """:meth:`PagedModelRunner.warm_up` through a throwaway runner on ``compiled``, with a KV cache of
    one block (the pass reads and writes block 0 only). What makes a compiled graph's first passes slow,
    its buffers and the kernels of these shapes, stays with the compiled model: a runner built on it
    later starts warm. For a model compiled in a thread while another compiles."""
    PagedModelRunner(compiled.model_dir, compiled.device, num_blocks=1, compiled=compiled).warm_up(
        max_context
    )


PAGE_BYTES = 4096  # cache tensors start on a page boundary, as the plugin's own allocations do


def _per_block_bits(shape: ov.PartialShape, element_type: ov.Type) -> int:
    """Bits of one block of a cache input ``[num_blocks, ...]``."""
    return int(np.prod([dim.get_length() for dim in list(shape)[1:]])) * element_type.bitwidth


def _zeroed_tensor(element_type: ov.Type, shape: list[int]) -> ov.Tensor:
    """An ``ov.Tensor`` of zeros; the kernel may read unwritten slots of a partly filled block, and
    uninitialised memory could hold NaN bit patterns that survive a zero attention weight.

    The zeros come from ``np.zeros``, whose large allocations are fresh pages the kernel zeroes on
    first touch: the cache costs neither start-up time nor resident memory until blocks are written.
    The tensor wraps the array (shared memory, page-aligned) and keeps it alive."""
    num_bytes = int(np.prod(shape)) * element_type.bitwidth // 8
    buffer = np.zeros(num_bytes + PAGE_BYTES, dtype=np.uint8)
    offset = -buffer.ctypes.data % PAGE_BYTES
    return ov.Tensor(buffer[offset : offset + num_bytes], shape, element_type)
