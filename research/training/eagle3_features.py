"""EAGLE-3 training data: the target's tapped hidden states and next-token labels, and the draft vocabulary.

Features come from the OpenVINO target itself (:class:`xpuspec.executor.paged_runner.PagedModelRunner` with
hidden-state taps), so the head trains on the states the engine will hand it, at the engine's precision.
One prefill per answer record (prompt + answer ids, cut to ``max_len``) gives, for every position ``t``:

- ``features[t]`` ``[3 * hidden]`` f16: the residual stream at the tapped boundaries (low, middle, high);
- ``argmax[t]``: the target's greedy token after ``ids[: t + 1]`` (logits of every row are requested), the
  label the head is trained on. On answer positions it should equal ``ids[t + 1]`` (the answers are the
  target's greedy tokens); :class:`FeatureStats` reports how often it does, which checks the alignment
  and shows how far the data's compile properties are from the features'. Prompt positions get labels too.

Records are written in shards (``shard-NNNNN.npz``, each swapped in atomically) under the features folder,
so an interrupted extraction resumes after the last shard's record; ``token_budget`` stops it early.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from research.training.smollm2_data import EXACT_PROPERTIES, FAST_PROPERTIES
from xpuspec.core.chunks import SequenceChunk
from xpuspec.executor.eagle3_embedding import EMBEDDINGS, INPUT_IDS, target_embedding_model
from xpuspec.executor.paged_runner import MODEL_FILE, PagedModelRunner

logger = logging.getLogger(__name__)

# "exact": f32 compute and KV cache, no activation quantisation (the target's true states); "fast": the
# CPU's default KV cache and activation quantisation at f32 compute, what the engine runs by default.
FEATURE_PROPERTIES: dict[str, dict[str, Any]] = {"exact": EXACT_PROPERTIES, "fast": FAST_PROPERTIES}
SHARD_PREFIX = "shard-"
_MAX_CHUNKS_PER_PASS = 64
_MIN_BLOCK_SIZE = 16  # the smallest KV block a plugin picks (CPU: 32): sizes the block pool safely


@dataclass
class FeatureSequence:
    """One record's features. ``ids`` / ``argmax`` ``[L]`` int32, ``features`` ``[L, 3*hidden]`` f16."""

    ids: np.ndarray
    argmax: np.ndarray
    features: np.ndarray
    prompt_length: int
    record: int  # line of the record in its answers file

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def label_mask(self, with_prompt: bool = False) -> np.ndarray:
        """``[L]`` bool: positions whose label ``argmax[t]`` is trained on and scored.

        Answer positions: ``t`` from ``prompt_length - 1`` (whose label is the first answer token) to
        ``L - 2`` (the last with a known next token). ``with_prompt`` adds the prompt's positions from 1.
        """
        mask = np.zeros(len(self), np.bool_)
        first = 1 if with_prompt else max(1, self.prompt_length - 1)
        mask[first : len(self) - 1] = True
        return mask


@dataclass
class FeatureStats:
    records: int
    tokens: int
    seconds: float  # extraction time over every run that built these shards
    answer_positions: int
    answer_label_agreement: float  # share of answer positions where argmax[t] == ids[t + 1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 1),
            "tokens_per_second": round(self.tokens / max(self.seconds, 1e-9), 1),
            "answer_positions": self.answer_positions,
            "answer_label_agreement": round(self.answer_label_agreement, 5),
        }


# --- the target ----------------------------------------------------------------------------------


def count_ir_layers(ir_dir: Path, core: ov.Core | None = None) -> int:
    """Decoder layers of a stateful IR: it holds a key and a value state per layer."""
    model = (core or ov.Core()).read_model(Path(ir_dir) / MODEL_FILE)
    states = len(model.get_variables())
    if states == 0 or states % 2:
        raise ValueError(f"{ir_dir}: {states} states; expected a key and a value state per decoder layer")
    return states // 2


def target_config(ir_dir: Path, gguf_path: Path | None = None) -> dict[str, Any]:
    """The target's Hugging Face-style config: the IR folder's ``config.json``, else the GGUF's metadata.

    A GGUF converted by OpenVINO GenAI has no ``config.json``; its metadata holds the same fields.
    """
    path = Path(ir_dir) / "config.json"
    if path.is_file():
        config = json.loads(path.read_text())
        return dict(config.get("text_config") or config)
    if gguf_path is None:
        raise ValueError(f"no config.json in {ir_dir}: pass the target's GGUF (--gguf) to read its shape")
    import gguf

    fields = gguf.GGUFReader(str(gguf_path)).fields
    arch = str(fields["general.architecture"].contents())

    def value(key: str) -> Any:
        return fields[f"{arch}.{key}"].contents()

    heads = int(value("attention.head_count"))
    hidden = int(value("embedding_length"))
    return {
        "hidden_size": hidden,
        "num_hidden_layers": int(value("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(value("attention.head_count_kv")),
        "head_dim": int(value("rope.dimension_count")) if f"{arch}.rope.dimension_count" in fields else None,
        "intermediate_size": int(value("feed_forward_length")),
        "rms_norm_eps": float(value("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(value("rope.freq_base")),
        "vocab_size": int(value("vocab_size")),
        "max_position_embeddings": int(value("context_length")),
    }


def embedding_table(
    ir_dir: Path, core: ov.Core | None = None, chunk: int = 8192, properties: dict[str, Any] | None = None
) -> np.ndarray:
    """The target's token embedding ``[vocab, hidden]`` f32, as the IR computes it (dequantised).

    The head at inference embeds with this very graph (:func:`target_embedding_model`), so training
    reads the table from it too rather than from another copy of the weights.
    """
    core = core or ov.Core()
    model = target_embedding_model(ir_dir, core)
    vocab = _ir_vocab_size(ir_dir, core)
    compile_properties = {**EXACT_PROPERTIES, **(properties or {})}
    request = core.compile_model(model, "CPU", compile_properties).create_infer_request()
    rank = model.input(INPUT_IDS).get_partial_shape().rank.get_length()
    rows = []
    for first in range(0, vocab, chunk):
        ids = np.arange(first, min(vocab, first + chunk), dtype=np.int64)
        request.infer({INPUT_IDS: ids.reshape((1, -1) if rank == 2 else (-1,))})
        rows.append(request.get_tensor(EMBEDDINGS).data.reshape(ids.shape[0], -1).copy())
    return np.concatenate(rows)


def _ir_vocab_size(ir_dir: Path, core: ov.Core) -> int:
    logits = core.read_model(Path(ir_dir) / MODEL_FILE).output(0).get_partial_shape()
    if logits[-1].is_dynamic:
        raise ValueError(f"{ir_dir}: the logits have no static vocabulary size")
    return logits[-1].get_length()


# --- extraction ----------------------------------------------------------------------------------


def record_ids(record: dict, max_len: int) -> tuple[list[int], int]:
    """(prompt + answer ids cut to ``max_len``, prompt length)."""
    prompt = [int(t) for t in record["prompt_ids"]]
    return (prompt + [int(t) for t in record["answer_ids"]])[:max_len], len(prompt)


def shard_paths(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob(f"{SHARD_PREFIX}*.npz"))


def _write_shard(folder: Path, index: int, sequences: Sequence[FeatureSequence]) -> Path:
    lengths = [len(s) for s in sequences]
    path = folder / f"{SHARD_PREFIX}{index:05d}.npz"
    scratch = folder / f".{path.name}.tmp"
    with open(scratch, "wb") as handle:
        np.savez(
            handle,
            ids=np.concatenate([s.ids for s in sequences]).astype(np.int32),
            argmax=np.concatenate([s.argmax for s in sequences]).astype(np.int32),
            features=np.concatenate([s.features for s in sequences]).astype(np.float16),
            offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            prompt_lengths=np.array([s.prompt_length for s in sequences], np.int32),
            records=np.array([s.record for s in sequences], np.int64),
        )
    os.replace(scratch, path)  # a reader never sees half a shard
    return path


def read_features(folder: Path) -> list[FeatureSequence]:
    """Every sequence of the shards in ``folder``, in record order (views into each shard's arrays)."""
    sequences = []
    for path in shard_paths(folder):
        with np.load(path) as shard:
            ids, argmax, features = shard["ids"], shard["argmax"], shard["features"]
            offsets, prompts, records = shard["offsets"], shard["prompt_lengths"], shard["records"]
        for i in range(prompts.shape[0]):
            span = slice(int(offsets[i]), int(offsets[i + 1]))
            sequences.append(
                FeatureSequence(ids[span], argmax[span], features[span], int(prompts[i]), int(records[i]))
            )
    return sequences


def feature_stats(sequences: Sequence[FeatureSequence], seconds: float) -> FeatureStats:
    agree = total = 0
    for sequence in sequences:
        mask = sequence.label_mask()
        positions = np.flatnonzero(mask)
        agree += int((sequence.argmax[positions] == sequence.ids[positions + 1]).sum())
        total += positions.shape[0]
    return FeatureStats(
        records=len(sequences),
        tokens=sum(len(s) for s in sequences),
        seconds=seconds,
        answer_positions=total,
        answer_label_agreement=agree / max(1, total),
    )


def _to_f16(states: np.ndarray) -> np.ndarray:
    # A large outlier activation must not become inf in f16 (it would poison fc's input): saturate it.
    limit = float(np.finfo(np.float16).max)
    return np.clip(states, -limit, limit).astype(np.float16)


def _passes(todo: list[tuple[int, list[int], int]], tokens_per_pass: int) -> Iterator[list]:
    """Consecutive records grouped into prefill passes of about ``tokens_per_pass`` tokens."""
    batch: list = []
    size = 0
    for item in todo:
        if batch and (size + len(item[1]) > tokens_per_pass or len(batch) >= _MAX_CHUNKS_PER_PASS):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += len(item[1])
    if batch:
        yield batch


def extract_features(
    ir_dir: Path,
    records: Sequence[dict],
    folder: Path,
    layers: Sequence[int],
    *,
    max_len: int,
    token_budget: int | None = None,
    properties: dict[str, Any] | None = None,
    tokens_per_pass: int = 1024,
    shard_tokens: int = 32768,
) -> FeatureStats:
    """Run the target over ``records`` (those after the last stored one) and store their features.

    Stops when the stored tokens reach ``token_budget``. Returns the statistics of everything stored.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    progress_path = folder / "extraction.json"
    progress = json.loads(progress_path.read_text()) if progress_path.is_file() else {"seconds": 0.0}
    stored = read_features(folder)
    done_tokens = sum(len(s) for s in stored)
    next_record = max((s.record for s in stored), default=-1) + 1
    budget = token_budget if token_budget is not None else float("inf")
    todo = []
    planned = done_tokens
    for index in range(next_record, len(records)):
        if planned >= budget:
            break
        ids, prompt_length = record_ids(records[index], max_len)
        if len(ids) < 3:  # no slot with both an input token and a label
            continue
        todo.append((index, ids, prompt_length))
        planned += len(ids)
    if todo:
        passes_cap = max(tokens_per_pass, max_len)
        runner = PagedModelRunner(
            ir_dir,
            properties=dict(properties or EXACT_PROPERTIES),
            num_blocks=passes_cap // _MIN_BLOCK_SIZE + _MAX_CHUNKS_PER_PASS + 1,
            hidden_state_layers=list(layers),
        )
        shard_index = len(shard_paths(folder))
        pending: list[FeatureSequence] = []
        started = time.monotonic()
        new_tokens = 0
        for batch in _passes(todo, passes_cap):
            chunks, first_block = [], 0
            for _, ids, _ in batch:
                count = -(-len(ids) // runner.block_size)
                chunks.append(SequenceChunk(ids, 0, list(range(first_block, first_block + count)), len(ids)))
                first_block += count
            logits = runner.forward(chunks)  # [tokens, vocab]: every row asked for
            argmax = logits.argmax(-1).astype(np.int32)
            states = runner.hidden_states()  # [tokens, 3 * hidden] f32
            offset = 0
            for (index, ids, prompt_length), chunk in zip(batch, chunks, strict=True):
                rows = slice(offset, offset + len(ids))
                pending.append(
                    FeatureSequence(
                        np.asarray(ids, np.int32),
                        argmax[rows].copy(),
                        _to_f16(states[rows]),
                        prompt_length,
                        index,
                    )
                )
                offset += len(chunk.token_ids)
                new_tokens += len(ids)
            if sum(len(s) for s in pending) >= shard_tokens:
                _write_shard(folder, shard_index, pending)
                shard_index += 1
                stored += pending
                pending = []
                seconds = time.monotonic() - started
                progress_path.write_text(json.dumps({"seconds": progress["seconds"] + seconds}))
                logger.info(
                    "features: %d records, %d tokens, %.0f tokens/s",
                    len(stored),
                    done_tokens + new_tokens,
                    new_tokens / max(seconds, 1e-9),
                )
        if pending:
            _write_shard(folder, shard_index, pending)
            stored += pending
        progress["seconds"] += time.monotonic() - started
        progress_path.write_text(json.dumps(progress))
        logger.info(
            "features: %d new tokens at %.0f tokens/s",
            new_tokens,
            new_tokens / max(1e-9, progress["seconds"]),
        )
    return feature_stats(stored, progress["seconds"])


# --- the draft vocabulary ------------------------------------------------------------------------


def label_counts(
    sequences: Sequence[FeatureSequence], vocab_size: int, with_prompt: bool = False
) -> np.ndarray:
    """``[vocab]`` int64: how often each token is a trained label (the target's argmax)."""
    counts = np.zeros(vocab_size, np.int64)
    for sequence in sequences:
        np.add.at(counts, sequence.argmax[sequence.label_mask(with_prompt)], 1)
    return counts


def choose_draft_vocabulary(counts: np.ndarray, draft_vocab: int) -> np.ndarray:
    """The ``draft_vocab`` most frequent labels, increasing (EAGLE's layout): ``[draft_vocab]`` int64.

    Ties, and tokens never seen when the data has fewer than ``draft_vocab`` distinct labels, go to the
    lower ids (byte-level BPE numbers its earlier, more frequent merges lower).
    """
    if not 0 < draft_vocab <= counts.shape[0]:
        raise ValueError(f"draft vocabulary must be 1..{counts.shape[0]}, got {draft_vocab}")
    order = np.argsort(-counts, kind="stable")
    return np.sort(order[:draft_vocab]).astype(np.int64)


def vocabulary_maps(target_ids: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``d2t`` ``[draft_vocab]`` int64 (target id = draft id + d2t) and ``t2d`` ``[vocab]`` bool."""
    target_ids = np.asarray(target_ids, np.int64)
    d2t = target_ids - np.arange(target_ids.shape[0], dtype=np.int64)
    t2d = np.zeros(vocab_size, np.bool_)
    t2d[target_ids] = True
    return d2t, t2d
