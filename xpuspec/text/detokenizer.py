"""Streaming detokenization: turn a growing list of token ids into text deltas.

Decoding the whole output on every step costs O(length) per token. Instead, as vLLM does, we
keep a short window: the tokens of the last emitted chunk as context, then the tokens not yet
emitted. Each push decodes the window with and without the new tokens and emits the difference.
The context matters: tokenizers that strip a leading space or merge bytes across tokens decode
the same tokens differently at a sequence start, and decoding both sides with the same start
cancels that out.

Byte-level BPE may split one UTF-8 character over several tokens; the partial character decodes
to U+FFFD, so the tokens from the one where it starts are held back until it completes. A
detokenizer that drops invalid UTF-8 instead (GenAI's GGUF reader writes one) shows no U+FFFD, so a
decoder that can read the bytes says so itself (``ends_mid_character``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

logger = logging.getLogger(__name__)

REPLACEMENT_CHARACTER = "\ufffd"
# Context tokens decoded before the first new token when starting after a prompt (vLLM uses 5).
PROMPT_CONTEXT_TOKENS = 5
# A UTF-8 character has at most 4 bytes, so its start lies in one of the last 4 tokens (bar
# special tokens decoded to nothing in between).
MAX_CHARACTER_TOKENS = 4
# The most tokens kept as context while the tokens after them give no text.
MAX_CONTEXT_TOKENS = 32
# Held tokens with no character start among them are invalid bytes, not an unfinished character:
# release them rather than let the window grow (only where the decoder cannot read bytes and a
# trailing U+FFFD is all there is to go by).
MAX_HELD_TOKENS = 8


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def ends_mid_character(
        self, token_ids: Sequence[int], skip_special_tokens: bool = True
    ) -> bool | None: ...  # None: cannot tell


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
        # token_ids[:read_offset] is already out (kept as context), token_ids[read_offset:] is held.
        self._token_ids: list[int] = context
        self._read_offset = len(context)
        # Text of token_ids[:read_offset], decoded at most once per window.
        self._prefix_text: str | None = None
        self._num_generated = 0
        # A decoder that reads the tokens' bytes tells cut characters from invalid bytes.
        self._reads_bytes = tokenizer.ends_mid_character([]) is not None

    @property
    def num_generated_tokens(self) -> int:
        return self._num_generated

    def push(self, token_ids: Sequence[int]) -> str:
        """Add generated tokens; return the text they complete (may be empty)."""
        self._token_ids.extend(token_ids)
        self._num_generated += len(token_ids)
        if not token_ids:
            return ""
        end = len(self._token_ids)
        delta = self._delta_up_to(end)
        if not self._unfinished(end, delta):
            self._advance_to(end, delta)
            return delta
        # The text ends in an unfinished character (or a truly invalid byte). Emit up to the
        # token where it starts, so that a run of pushes each ending mid-character (byte tokens
        # of CJK or emoji text) still moves on and the window stays short.
        for split in range(end - 1, max(self._read_offset, end - MAX_CHARACTER_TOKENS - 1), -1):
            partial = self._delta_up_to(split)
            if not self._unfinished(split, partial):
                self._advance_to(split, partial)
                return partial
        if end - self._read_offset > MAX_HELD_TOKENS and not self._reads_bytes:
            self._advance_to(end, delta)
            return delta
        return ""

    def flush(self) -> str:
        """Release held-back text (an unfinished character at the very end, as U+FFFD)."""
        end = len(self._token_ids)
        if self._read_offset == end:
            return ""
        delta = self._delta_up_to(end)
        self._advance_to(end, delta)
        return delta

    def _unfinished(self, end: int, delta: str) -> bool:
        """Whether the new tokens token_ids[read_offset:end] (text ``delta``) end inside a character.

        A decoder that reads bytes tells exactly (a character that starts in the context was cut
        there, not by the new tokens); otherwise a trailing U+FFFD is taken for a cut, which also
        holds back a truly invalid byte until MAX_HELD_TOKENS lets it go.
        """
        cut = self._tokenizer.ends_mid_character(
            self._token_ids[self._read_offset : end], skip_special_tokens=self._skip_special_tokens
        )
        return delta.endswith(REPLACEMENT_CHARACTER) if cut is None else cut

    def _delta_up_to(self, end: int) -> str:
        """Text of token_ids[read_offset:end], decoded in the context of the window before it."""
        if self._prefix_text is None:
            context = self._token_ids[: self._read_offset]
            self._prefix_text = self._decode(context) if context else ""
        text = self._decode(self._token_ids[:end])
        if not text.startswith(self._prefix_text):
            # Text normalisation (e.g. clean_up_tokenization_spaces) rewrote emitted text; the
            # emitted part cannot be taken back, so continue from the same length.
            logger.debug("detokenized window changed its prefix: %r -> %r", self._prefix_text, text)
        return text[len(self._prefix_text) :]

    def _advance_to(self, end: int, released: str) -> None:
        # Tokens up to `end` are out; those from the old read offset on become the context of the
        # next push, and older ones are no longer needed. Tokens that gave no text (skipped special
        # tokens, ids past the vocabulary) are no context on their own: a SentencePiece decoder
        # would take the next token for the text's start and strip its space. The context before
        # them stays then, up to MAX_CONTEXT_TOKENS.
        if released or end > MAX_CONTEXT_TOKENS:
            del self._token_ids[: self._read_offset]
            end -= self._read_offset
        self._read_offset = end
        self._prefix_text = None

    def _decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)
