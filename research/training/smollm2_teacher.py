"""The target's next-token distributions over token sequences, kept as top-k, for distilling the draft.

Scoring a sequence is one prefill of the target: far cheaper per token than generating it, and it gives the
teacher's whole ranking at every position, not only its argmax. The target's OpenVINO IR (stateful, as
OpenVINO GenAI writes it) runs a few right-padded sequences at a time; right padding leaves every real
position's causal context unchanged. Shards of ``ScoredBatch`` are written as ``.npz`` files one at a time,
so a stopped run keeps what it scored and a restarted one resumes after the last shard.

f32 compute with the CPU's dynamic activation quantisation: exactness is not needed for soft targets (the
hard labels of the answers come from the exact greedy generation).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

SCORING_PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32"}


@dataclass(frozen=True)
class ScoredSequence:
    """One sequence and the teacher's top-k next-token distribution at each position from ``start``.

    Row ``i`` of ``top_ids``/``top_logprobs`` is the teacher's prediction for ``ids[start + i + 1]``.
    """

    ids: np.ndarray  # [length] int32
    start: int  # first position whose next token is trained on
    top_ids: np.ndarray  # [length - 1 - start, k] int32
    top_logprobs: np.ndarray  # [length - 1 - start, k] float16, log-probabilities over the full vocabulary

    def __post_init__(self) -> None:
        rows = len(self.ids) - 1 - self.start
        if self.start < 0 or rows < 1:
            raise ValueError(f"start {self.start} leaves no scored position in a sequence of {len(self.ids)}")
        if self.top_ids.shape[0] != rows or self.top_logprobs.shape != self.top_ids.shape:
            raise ValueError(
                f"top-k rows {self.top_ids.shape}/{self.top_logprobs.shape} do not match {rows} positions"
            )


class TeacherScorer:
    """Runs the target IR on batches of sequences and returns their top-k next-token log-probabilities."""

    def __init__(self, target_ir: Path, *, top_k: int = 32, threads: int | None = None) -> None:
        import openvino as ov

        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        core = ov.Core()
        properties: dict = dict(SCORING_PROPERTIES)
        if threads:
            properties["INFERENCE_NUM_THREADS"] = threads
        self._compiled = core.compile_model(str(Path(target_ir) / "openvino_model.xml"), "CPU", properties)
        self._request = self._compiled.create_infer_request()
        self.top_k = top_k

    def score(self, batch: Sequence[tuple[Sequence[int], int]]) -> list[ScoredSequence]:
        """Score ``(token ids, start)`` pairs in one right-padded inference."""
        import torch

        width = max(len(ids) for ids, _ in batch)
        input_ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, (ids, _) in enumerate(batch):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        positions = np.broadcast_to(np.arange(width, dtype=np.int64), (len(batch), width)).copy()
        self._request.reset_state()
        self._request.infer(
            {
                "input_ids": input_ids,
                "attention_mask": mask,
                "position_ids": positions,
                "beam_idx": np.arange(len(batch), dtype=np.int32),
            }
        )
        logits = torch.from_numpy(self._request.get_tensor("logits").data.copy())  # [batch, width, vocab]
        scored = []
        for row, (ids, start) in enumerate(batch):
            rows = logits[row, start : len(ids) - 1].float()
            logprobs = torch.log_softmax(rows, dim=-1)
            values, indices = torch.topk(logprobs, self.top_k, dim=-1)
            scored.append(
                ScoredSequence(
                    ids=np.asarray(ids, dtype=np.int32),
                    start=start,
                    top_ids=indices.numpy().astype(np.int32),
                    top_logprobs=values.numpy().astype(np.float16),
                )
            )
        return scored


def write_shard(path: Path, sequences: Sequence[ScoredSequence]) -> None:
    """One ``.npz`` of concatenated sequences, written beside ``path`` and renamed into place."""
    lengths = np.array([len(s.ids) for s in sequences], dtype=np.int32)
    scratch = path.with_name(path.name + ".tmp.npz")
    np.savez(
        scratch,
        lengths=lengths,
        starts=np.array([s.start for s in sequences], dtype=np.int32),
        ids=np.concatenate([s.ids for s in sequences]),
        top_ids=np.concatenate([s.top_ids for s in sequences]),
        top_logprobs=np.concatenate([s.top_logprobs for s in sequences]),
    )
    scratch.rename(path)


def read_shard(path: Path) -> list[ScoredSequence]:
    with np.load(path) as data:
        lengths, starts = data["lengths"], data["starts"]
        ids, top_ids, top_logprobs = data["ids"], data["top_ids"], data["top_logprobs"]
    sequences, offset, row = [], 0, 0
    for length, start in zip(lengths.tolist(), starts.tolist(), strict=True):
        rows = length - 1 - start
        sequences.append(
            ScoredSequence(
                ids=ids[offset : offset + length],
                start=start,
                top_ids=top_ids[row : row + rows],
                top_logprobs=top_logprobs[row : row + rows],
            )
        )
        offset += length
        row += rows
    return sequences


def read_shards(folder: Path, prefix: str) -> list[ScoredSequence]:
    return [s for path in sorted(folder.glob(f"{prefix}-*.npz")) for s in read_shard(path)]


def score_to_shards(
    scorer: TeacherScorer,
    items: Sequence[tuple[Sequence[int], int]],
    folder: Path,
    prefix: str,
    *,
    batch_size: int = 8,
    shard_size: int = 256,
    deadline: float | None = None,
) -> int:
    """Score ``items`` into ``folder/prefix-NNNNN.npz`` shards, resuming after the shards already there.

    Returns how many items are scored in all. Shard ``n`` always holds items ``[n * shard_size, ...)``, so
    the same item list must be given on a resumed run (append-only lists are fine).
    """
    folder.mkdir(parents=True, exist_ok=True)
    done_shards = len(list(folder.glob(f"{prefix}-*.npz")))
    first = done_shards * shard_size
    started = time.monotonic()
    tokens = 0
    for shard_start in range(first, len(items), shard_size):
        if deadline is not None and time.monotonic() > deadline:
            logger.info("%s: scoring deadline reached at %d items", prefix, shard_start)
            return shard_start
        chunk = items[shard_start : shard_start + shard_size]
        if len(chunk) < shard_size and deadline is not None:
            return shard_start  # a partial shard would shift the numbering of a later, longer list
        by_item: dict[int, ScoredSequence] = {}
        # Similar lengths in one inference waste less on padding; the shard keeps the items' own order.
        order = sorted(range(len(chunk)), key=lambda i: len(chunk[i][0]))
        for offset in range(0, len(order), batch_size):
            indices = order[offset : offset + batch_size]
            by_item.update(zip(indices, scorer.score([chunk[i] for i in indices]), strict=True))
        scored = [by_item[i] for i in range(len(chunk))]
        write_shard(folder / f"{prefix}-{shard_start // shard_size:05d}.npz", scored)
        tokens += sum(len(s.ids) for s in scored)
        logger.info(
            "%s: scored %d/%d (%.0f tokens/s)",
            prefix,
            shard_start + len(chunk),
            len(items),
            tokens / max(1e-9, time.monotonic() - started),
        )
    return len(items)
