"""llguidance's tokenizer for a model: its vocabulary's bytes, read from the bundle's ``tokenizer.json``.

A byte-level BPE vocabulary (GPT-2, Llama 3, Qwen, SmolLM2) is read entry by entry, each token's bytes
from the byte-level alphabet, with the model's OpenVINO tokenizer for encoding: a converted file's
decoder section may be wrong, the vocabulary itself is what the model saw. Any other vocabulary is
left to llguidance's own reading of the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from llguidance import LLTokenizer, TokenizerWrapper

if TYPE_CHECKING:
    from xpuspec.text.tokenizer import Tokenizer


def _byte_level_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte, inverted."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    )
    chars = {byte: byte for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = 256 + extra
            extra += 1
    return {chr(code): byte for byte, code in chars.items()}


def byte_level_vocabulary(tokenizer_json: Path) -> tuple[list[bytes], list[int]] | None:
    """The bytes of every token of a byte-level BPE ``tokenizer.json`` and its special ids, or None.

    Read from the vocabulary itself (``Ġ`` is a space, ``Ċ`` a newline), not from the file's decoder
    section, which conversions get wrong. None if some vocabulary entry is not byte-level text.
    """
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = data.get("model", {}).get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        return None
    alphabet = _byte_level_unicode()
    added = {entry["id"]: entry["content"] for entry in data.get("added_tokens", [])}
    size = max(max(vocab.values()), max(added, default=-1)) + 1
    tokens = [b""] * size
    for text, token_id in vocab.items():
        if token_id in added:
            continue
        if any(char not in alphabet for char in text):
            return None
        tokens[token_id] = bytes(alphabet[char] for char in text)
    special = [entry["id"] for entry in data.get("added_tokens", []) if entry.get("special")]
    for token_id, content in added.items():
        tokens[token_id] = content.encode("utf-8")
    return tokens, special


class _VocabularyTokenizer:
    """What llguidance's ``TokenizerWrapper`` reads: token bytes, special ids, and an encoder."""

    def __init__(
        self, tokens: list[bytes], special_ids: list[int], tokenizer: Tokenizer, eos_token_ids: list[int]
    ):
        self.tokens = tokens
        self.special_token_ids = special_ids
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else None
        self.bos_token_id = None
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text, add_special_tokens=False)


def load_tokenizer(path: Path, tokenizer: Tokenizer, eos_token_ids: list[int]) -> LLTokenizer:
    eos = list(eos_token_ids) or None
    vocabulary = byte_level_vocabulary(path)
    if vocabulary is None:
        return LLTokenizer(str(path), eos_token=eos)
    return LLTokenizer(
        TokenizerWrapper(_VocabularyTokenizer(*vocabulary, tokenizer, list(eos_token_ids))), eos_token=eos
    )
