"""The demo pair's corpus: the running interpreter's standard library, its tokenizer and packed batches.

The corpus is chosen so the recipe needs nothing from the network: every Python install carries its
own source. A fixed, named list of ordinary modules is held out for evaluation and never trained on.
"""

from __future__ import annotations

import logging
import random
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from xpuspec.models.demo.heldout import HELDOUT_FILES

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|bos|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = [EOS_TOKEN, BOS_TOKEN, PAD_TOKEN]

# The same role-tagged shape as the test checkpoints' template: simple and jinja-only.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


# Directories that are test suites, vendored wheels, generated tables or build configuration.
_EXCLUDED_DIRECTORIES = frozenset(
    {"test", "tests", "idlelib", "site-packages", "encodings", "pydoc_data", "ensurepip", "__pycache__"}
)
# Generated files this large (e.g. _pydecimal's twin tables) teach little and skew the mix.
MAX_FILE_BYTES = 200_000


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_excluded(relative_path: Path) -> bool:
    directories = relative_path.parts[:-1]
    if any(part in _EXCLUDED_DIRECTORIES or part.startswith("config-") for part in directories):
        return True
    return relative_path.name.startswith("_sysconfigdata")


@dataclass(frozen=True)
class CorpusSplit:
    """Relative paths (POSIX style) under ``root``: what is trained on and what is held out."""

    root: Path
    train_files: tuple[str, ...]
    heldout_files: tuple[str, ...]

    def read(self, relative_path: str) -> str:
        return (self.root / relative_path).read_text(encoding="utf-8")


def split_corpus(root: Path | None = None, seed: int = 0, max_train_files: int | None = None) -> CorpusSplit:
    """List the usable ``*.py`` files under ``root`` and split them into training and held-out files.

    The training order is a seeded shuffle of the sorted list, so it does not depend on the file
    system's listing order. ``max_train_files`` keeps only the first files of that order (fast mode).
    """
    root = stdlib_root() if root is None else root
    if not root.is_dir():
        raise ValueError(f"corpus root {root} is not a directory")
    candidates: list[str] = []
    for path in sorted(root.rglob("*.py")):
        relative_path = path.relative_to(root)
        if _is_excluded(relative_path) or not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip():
            candidates.append(relative_path.as_posix())
    available = set(candidates)
    heldout = tuple(name for name in HELDOUT_FILES if name in available)
    missing = [name for name in HELDOUT_FILES if name not in available]
    if missing:
        logger.warning("held-out files missing from this interpreter, skipped: %s", ", ".join(missing))
    if not heldout:
        raise ValueError(f"none of the held-out files exist under {root}; is this a Python stdlib?")
    train = [name for name in candidates if name not in set(heldout)]
    random.Random(seed).shuffle(train)
    if max_train_files is not None:
        train = train[:max_train_files]
    logger.info("corpus %s: %d training files, %d held-out files", root, len(train), len(heldout))
    return CorpusSplit(root=root, train_files=tuple(train), heldout_files=heldout)


def train_tokenizer(texts: Sequence[str], vocab_size: int):
    """Train a byte-level BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    minimum = 256 + len(SPECIAL_TOKENS)  # every byte plus the specials
    if vocab_size <= minimum:
        raise ValueError(f"vocab_size must exceed {minimum} (bytes + special tokens), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def encode_files(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens."""
    return [encoding.ids for encoding in tokenizer.backend_tokenizer.encode_batch(list(texts))]


def pack_stream(token_lists: Sequence[Sequence[int]], eos_token_id: int) -> torch.Tensor:
    """One flat stream of all files, each followed by eos. # [num_tokens]"""
    stream: list[int] = []
    for ids in token_lists:
        stream.extend(ids)
        stream.append(eos_token_id)
    return torch.tensor(stream, dtype=torch.long)


class PackedBatches:
    """Fixed-length windows of a token stream, served in a seeded shuffled order, epoch after epoch."""

    def __init__(self, stream: torch.Tensor, sequence_length: int, batch_size: int, seed: int) -> None:
        # stream: [num_tokens]
        num_sequences = stream.numel() // sequence_length
        if num_sequences < batch_size:
            raise ValueError(
                f"the corpus gives {num_sequences} sequences of {sequence_length} tokens, fewer than one "
                f"batch of {batch_size}; use more files or a shorter sequence length"
            )
        self.sequences = stream[: num_sequences * sequence_length].view(num_sequences, sequence_length)
        self.batch_size = batch_size
        self.seed = seed

    @property
    def tokens_per_batch(self) -> int:
        return self.batch_size * self.sequences.shape[1]

    def __iter__(self) -> Iterator[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed)
        while True:
            order = torch.randperm(self.sequences.shape[0], generator=generator)
            for start in range(0, len(order) - self.batch_size + 1, self.batch_size):
                yield self.sequences[order[start : start + self.batch_size]]  # [batch, sequence_length]


def evaluation_windows(
    stream: torch.Tensor, sequence_length: int, max_tokens: int | None
) -> list[torch.Tensor]:
    """Consecutive windows covering ``stream`` (the last one may be shorter), capped at ``max_tokens``."""
    if max_tokens is not None:
        stream = stream[:max_tokens]
    windows = [stream[start : start + sequence_length] for start in range(0, stream.numel(), sequence_length)]
    return [window for window in windows if window.numel() >= 2]
