"""A reference executor on PyTorch with the paged runner's interface (``forward(chunks)``).

It keeps the *token ids* of every KV slot in the same block layout the paged runner uses, and each
step recomputes the whole context of every chunk without a KV cache. That is slow (quadratic in the
context) but has no cache to get wrong: writes through block tables, rollback by overwriting and
chunked prefill behave exactly as the engine expects, so it is the executor to compare against.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.interfaces import ExecutorCaps

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 32
DEFAULT_NUM_BLOCKS = 1024


class TorchModelRunner:
    """Runs a Hugging Face causal LM over mixed batches of :class:`SequenceChunk`."""

    # Chunks of tokens in the shared blocks, nothing more: no padding, no trees, no KV of its own.
    caps = ExecutorCaps()

    def __init__(
        self,
        checkpoint_dir: Path,
        dtype: str = "float32",
        num_blocks: int | None = None,
        block_size: int | None = None,
        use_ipex: bool = False,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        model = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=torch_dtype).eval()
        if use_ipex:
            import intel_extension_for_pytorch as ipex

            model = ipex.optimize(model, dtype=torch_dtype)
        self.model = model
        self.block_size: int = block_size or DEFAULT_BLOCK_SIZE
        self.num_blocks: int = num_blocks or DEFAULT_NUM_BLOCKS
        if self.block_size < 1 or self.num_blocks < 1:
            raise ValueError(
                f"block_size and num_blocks must be >= 1, got {self.block_size}, {self.num_blocks}"
            )
        self.vocab_size: int = int(model.get_output_embeddings().out_features)
        self._slots = np.zeros((self.num_blocks, self.block_size), dtype=np.int64)  # token id per KV slot
        self._pending: np.ndarray | None = None
        logger.info(
            "%s on TORCH (%s): %d blocks of %d tokens",
            checkpoint_dir,
            dtype,
            self.num_blocks,
            self.block_size,
        )

    def forward(self, chunks: list[SequenceChunk]) -> np.ndarray:
        """Logits rows the chunks asked for, in chunk order: ``[sum(num_logits), vocab]`` float32."""
        if not chunks:
            raise ValueError("forward needs at least one chunk")
        rows: list[np.ndarray] = []
        for chunk in chunks:
            context = self._write_and_gather(chunk)  # [past_length + n]
            if chunk.num_logits == 0:
                continue
            with self._torch.inference_mode():
                input_ids = self._torch.from_numpy(context).unsqueeze(0)  # [1, context]
                logits = self.model(input_ids=input_ids).logits[0, -chunk.num_logits :]  # [num_logits, vocab]
            rows.append(logits.float().numpy())
        if not rows:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        return np.concatenate(rows, axis=0)

    def start(self, chunks: list[SequenceChunk]) -> None:
        if self._pending is not None:
            raise RuntimeError("an inference is still running: call wait() before starting another")
        self._pending = self.forward(chunks)

    def wait(self) -> np.ndarray:
        if self._pending is None:
            raise RuntimeError("no inference was started")
        logits, self._pending = self._pending, None
        return logits

    def warm_up(self, max_model_len: int) -> None:
        """A no-op: nothing is compiled."""

    def release(self, sequence_id: str) -> None:
        """A no-op: the tokens of a sequence live in the shared blocks."""

    def move_kv(self, block_table: list[int], sources: list[int], destinations: list[int]) -> None:
        raise NotImplementedError("the reference executor runs no trees (caps.kv_moves is False)")

    def _write_and_gather(self, chunk: SequenceChunk) -> np.ndarray:
        """Store the chunk's tokens in their slots; return the sequence's tokens [0, past + n)."""
        length = len(chunk.token_ids)
        context = chunk.past_length + length
        num_blocks = -(-context // self.block_size)
        if length == 0 or chunk.past_length < 0 or not 0 <= chunk.num_logits <= length:
            raise ValueError(
                f"bad chunk: {length} tokens, past_length {chunk.past_length}, num_logits {chunk.num_logits}"
            )
        table = np.asarray(chunk.block_table[:num_blocks], dtype=np.int64)
        if table.shape[0] < num_blocks:
            raise ValueError(f"block table of {table.shape[0]} blocks cannot hold {context} positions")
        if table.min() < 0 or table.max() >= self.num_blocks:
            raise ValueError(f"block ids must be in [0, {self.num_blocks}), got {table.tolist()}")
        positions = np.arange(chunk.past_length, context)
        self._slots[table[positions // self.block_size], positions % self.block_size] = chunk.token_ids
        return self._slots[table].reshape(-1)[:context].copy()
