"""Streaming detokenization: turn a growing list of token ids into text deltas.

Decoding the whole output on every step costs O(length) per token. Instead we keep two offsets,
as vLLM and HF's TextStreamer do: ``read_offset`` marks the tokens whose text is already out, and
``prefix_offset`` starts a short window of context before it. Each push decodes the window with
and without the new tokens and emits the difference. The context matters: tokenizers that strip
a leading space or merge bytes across tokens decode the same tokens differently at a sequence
start, and decoding both sides with the same start cancels that out.

Byte-level BPE may split one UTF-8 character over several tokens; the partial character decodes
to U+FFFD, so a delta ending in U+FFFD is held back until the character completes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

logger = logging.getLogger(__name__)

REPLACEMENT_CHARACTER = "\ufffd"
# Context tokens decoded before the first new token when starting after a prompt (vLLM uses 5).
PROMPT_CONTEXT_TOKENS = 5
# A UTF-8 character has at most 4 bytes, so at most 3 tokens can end in an unfinished one; beyond
# this many held tokens the U+FFFD is a real invalid byte and holding on would only grow the window.
MAX_HELD_TOKENS = 8


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Text deltas for one sequence; feed generated tokens with ``push``, end with ``flush``.

    ``prompt_token_ids`` gives the tail of the prompt as context for the first generated tokens
    (their text is not emitted). Not thread-safe: one instance per sequence.
    """

    def __init__(
        self,
        tokenizer: Decoder,
        prompt_token_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        context = list(prompt_token_ids or [])[-PROMPT_CONTEXT_TOKENS:]
        self._token_ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        # Text of token_ids[prefix_offset:read_offset], computed at most once per window.
        self._prefix_text: str | None = None
        self._num_generated = 0

    @property
    def num_generated_tokens(self) -> int:
        return self._num_generated

    def push(self, token_ids: Sequence[int]) -> str:
        """Add generated tokens; return the text they complete (may be empty)."""
        held_before = len(self._token_ids) - self._read_offset
        self._token_ids.extend(token_ids)
        self._num_generated += len(token_ids)
        if not token_ids:
            return ""
        delta = self._pending_delta()
        if delta.endswith(REPLACEMENT_CHARACTER) and held_before < MAX_HELD_TOKENS:
            return ""
        self._advance()
        return delta

    def flush(self) -> str:
        """Release held-back text (an unfinished character at the very end, as U+FFFD)."""
        if self._read_offset == len(self._token_ids):
            return ""
        delta = self._pending_delta()
        self._advance()
        return delta

    def _pending_delta(self) -> str:
        if self._prefix_text is None:
            window = self._token_ids[self._prefix_offset : self._read_offset]
            self._prefix_text = self._decode(window) if window else ""
        full_text = self._decode(self._token_ids[self._prefix_offset :])
        if not full_text.startswith(self._prefix_text):
            # Text normalisation (e.g. clean_up_tokenization_spaces) rewrote emitted text; the
            # emitted part cannot be taken back, so continue from the same length.
            logger.debug("detokenized window changed its prefix: %r -> %r", self._prefix_text, full_text)
        return full_text[len(self._prefix_text) :]

    def _advance(self) -> None:
        # The window that was just emitted becomes the context of the next push; older tokens
        # are no longer needed.
        del self._token_ids[: self._read_offset]
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)
        self._prefix_text = None

    def _decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)
