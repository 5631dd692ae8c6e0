"""Text between two tokenizers: what a draft model with its own tokenizer reads, and what its drafts
become in the target's tokens (:class:`xpuspec.spec_decode.cross_tokenizer.CrossTokenizerDrafter`).

The target's tokens are the truth; text is the common ground. Two translations, each done on a short
window that starts at a safe boundary:

- **target text -> draft tokens** (:meth:`DraftText.sync`): the draft's cache holds token ids whose
  text it remembers, with *anchors*, token counts whose text ends at a known character. After a
  target step the longest common prefix of the cache's text and the target's text says how much of
  the cache still holds; the drafter keeps the tokens up to the anchor one before the last anchor
  inside that prefix (a token cut by a new character, " wor" of " world", would otherwise stay a
  token of its own) and encodes the text from there: only those tokens are run again.
- **drafted text -> target tokens** (:func:`target_tokens_for`): the last few target tokens are
  decoded, the drafted text appended and the whole window encoded with the target's tokenizer. The
  new tokens are those after the window's old ones, cut at the first whose text is not the drafted
  text's, and the last one is dropped: the drafted text ends wherever the draft stopped, so its
  last target token may be the start of a longer one (" wor" where the target will say " world").

Hugging Face's universal assisted generation translates the same way (decode a look-behind window,
re-encode, align the two encodings); vLLM's token-level intersection instead restricts the draft to
the tokens both vocabularies share. Neither translation can change the output: the target verifies
whatever is proposed (docs/exactness.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

REPLACEMENT = "\ufffd"  # what a decoder gives for a character cut between tokens
# Target tokens decoded before the drafted text when it is re-encoded: enough for the tokenizer's
# pre-tokenizer to see the word the drafted text continues.
TARGET_LOOKBEHIND = 4
# Draft tokens at the end of a newly encoded stretch whose text boundaries are found (anchors): the
# next sync keeps the cache up to one of them.
DRAFT_ANCHORS = 8


class TextCodec(Protocol):
    """A tokenizer (:class:`xpuspec.text.Tokenizer` is one): text to ids and back."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


def common_prefix_length(first: str, second: str) -> int:
    """The length of the longest common prefix of two strings (a binary search of C comparisons)."""
    low, high = 0, min(len(first), len(second))
    if first[:high] == second[:high]:
        return high
    while low < high:  # first[:low] == second[:low]; first[:high] differs
        middle = (low + high + 1) // 2
        if first[:middle] == second[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass
class DraftText:
    """One sequence's draft tokens in the draft's cache, and their text.

    ``ids``: the draft tokens whose keys and values the cache holds (positions 0 .. len - 1);
    ``text``: the text they stand for; ``anchors``: (token count, text length) pairs, increasing,
    where the first ``count`` tokens decode to ``text[:length]``.
    """

    ids: list[int] = field(default_factory=list)
    text: str = ""
    anchors: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])

    def sync(self, codec: TextCodec, target_text: str) -> int:
        """Bring the tokens in line with ``target_text``; return how many leading tokens the cache
        keeps (the tokens after them are new and must run through the draft)."""
        kept_tokens, kept_chars = self._safe_boundary(target_text)
        new_ids = codec.encode(target_text[kept_chars:], add_special_tokens=False)
        self.ids = self.ids[:kept_tokens] + new_ids
        self.text = target_text
        self.anchors = [anchor for anchor in self.anchors if anchor[0] <= kept_tokens]
        self._anchor_tail(codec, kept_tokens)
        return kept_tokens

    def _safe_boundary(self, target_text: str) -> tuple[int, int]:
        """The anchor to keep: one before the last anchor within the common prefix, and short of the
        whole target text (the last token must run again: its logits draft the next one)."""
        common = common_prefix_length(self.text, target_text)
        inside = [anchor for anchor in self.anchors if anchor[1] <= common and anchor[1] < len(target_text)]
        if len(inside) >= 2:
            return inside[-2]
        return 0, 0

    def _anchor_tail(self, codec: TextCodec, start: int) -> None:
        """Anchors at the ends of the last few tokens after ``start`` (their text read backwards
        from the end of ``self.text``); a token that ends inside a character gets none."""
        text, ids = self.text, self.ids
        found = []
        for count in range(len(ids) - 1, max(start, len(ids) - DRAFT_ANCHORS) - 1, -1):
            suffix = codec.decode(ids[count:], skip_special_tokens=False)
            if REPLACEMENT in suffix or not text.endswith(suffix):
                break
            found.append((count, len(text) - len(suffix)))
        self.anchors += sorted(anchor for anchor in found if anchor[0] > self.anchors[-1][0])
        if self.anchors[-1][0] < len(ids):
            self.anchors.append((len(ids), len(text)))

    def extend(self, codec: TextCodec, drafted: Sequence[int]) -> None:
        """The draft ran ``drafted`` (tokens it drafted) through its cache: append them with their text,
        and an anchor where each ends on a whole character."""
        if not drafted:
            return
        base_ids = self.ids[-TARGET_LOOKBEHIND:]
        base = codec.decode(base_ids, skip_special_tokens=False)
        full = codec.decode(base_ids + list(drafted), skip_special_tokens=False)
        if not full.startswith(base):
            self.ids = self.ids + list(drafted)  # no text to tell: the next sync runs them again
            return
        added = full[len(base) :]
        for index in range(1, len(drafted) + 1):
            window = codec.decode(base_ids + list(drafted[:index]), skip_special_tokens=False)
            spelled = window[len(base) :]
            if window.startswith(base) and not spelled.endswith(REPLACEMENT) and added.startswith(spelled):
                self.anchors.append((len(self.ids) + index, len(self.text) + len(spelled)))
        self.ids = self.ids + list(drafted)
        self.text += added


def drafted_text(codec: TextCodec, context_ids: Sequence[int], drafted: Sequence[int]) -> str:
    """The text ``drafted`` (draft tokens) adds after ``context_ids``, without a trailing cut
    character."""
    base_ids = list(context_ids[-TARGET_LOOKBEHIND:])
    base = codec.decode(base_ids, skip_special_tokens=False)
    full = codec.decode(base_ids + list(drafted), skip_special_tokens=False)
    if not full.startswith(base):
        return ""
    return full[len(base) :].rstrip(REPLACEMENT)


def target_tokens_for(codec: TextCodec, context_ids: Sequence[int], text: str, limit: int) -> list[int]:
    """At most ``limit`` target tokens for ``text`` drafted after ``context_ids`` (target tokens).

    The last target tokens are decoded and ``text`` appended; the window is encoded again. The new
    tokens start where the window's tokens have spelled the old text exactly; each must spell the next
    characters of ``text`` (tokens after one that does not are dropped), and the last is dropped: its
    text may be the start of a longer token.
    """
    if not text or limit <= 0:
        return []
    base_ids = list(context_ids[-TARGET_LOOKBEHIND:])
    base = codec.decode(base_ids, skip_special_tokens=False)
    window = base + text
    encoded = codec.encode(window, add_special_tokens=False)
    start = _old_token_count(codec, encoded, base_ids, base)
    if start is None:
        return []
    proposal: list[int] = []
    for token in encoded[start:-1][:limit]:
        spelled = codec.decode(base_ids + proposal + [token], skip_special_tokens=False)
        if spelled.endswith(REPLACEMENT) or not window.startswith(spelled) or len(spelled) <= len(base):
            break
        proposal.append(token)
    return proposal


def _old_token_count(codec: TextCodec, encoded: list[int], base_ids: list[int], base: str) -> int | None:
    """How many leading tokens of ``encoded`` spell ``base`` exactly; None when no prefix does."""
    if encoded[: len(base_ids)] == base_ids:
        return len(base_ids)
    for count in range(len(encoded) + 1):
        spelled = codec.decode(encoded[:count], skip_special_tokens=False)
        if spelled == base:
            return count
        if len(spelled) > len(base):
            return None
    return None
