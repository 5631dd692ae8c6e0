"""Text between two tokenizers (xpuspec/spec_decode/text_bridge.py), with the real OpenVINO tokenizers of
a pair whose tokenizers differ."""

from __future__ import annotations

from pathlib import Path

import pytest

from xpuspec.spec_decode.text_bridge import (
    REPLACEMENT,
    DraftText,
    common_prefix_length,
    drafted_text,
    target_tokens_for,
)
from xpuspec.text import Tokenizer

TEXT = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n"


@pytest.fixture(scope="module")
def codecs(translating_bundle: Path) -> tuple[Tokenizer, Tokenizer]:
    return Tokenizer(translating_bundle / "target"), Tokenizer(translating_bundle / "draft")


def test_common_prefix_length() -> None:
    assert common_prefix_length("hello world", "hello there") == 6
    assert common_prefix_length("abc", "abcdef") == 3
    assert common_prefix_length("", "abc") == 0
    assert common_prefix_length("xbc", "abc") == 0
    assert common_prefix_length("same", "same") == 4


def test_the_tokenizers_split_the_text_differently(codecs) -> None:
    target, draft = codecs
    assert target.encode(TEXT, add_special_tokens=False) != draft.encode(TEXT, add_special_tokens=False)


def test_sync_keeps_the_draft_tokens_before_a_safe_boundary_and_reads_the_whole_text(codecs) -> None:
    target, draft = codecs
    target_ids = target.encode(TEXT, add_special_tokens=False)
    text = DraftText()
    assert text.sync(draft, target.decode(target_ids[:10], skip_special_tokens=False)) == 0
    for length in range(12, len(target_ids) + 1, 3):
        before = list(text.ids)
        target_text = target.decode(target_ids[:length], skip_special_tokens=False)
        kept = text.sync(draft, target_text)
        # Only the tail runs again: every token but the one before the last boundary is kept.
        assert 0 < kept < len(before)
        assert text.ids[:kept] == before[:kept]
        assert draft.decode(text.ids, skip_special_tokens=False) == target_text == text.text
        for count, length_chars in text.anchors:
            assert draft.decode(text.ids[:count], skip_special_tokens=False) == target_text[:length_chars]


def test_sync_after_a_rejected_draft_rolls_back_to_the_common_text(codecs) -> None:
    target, draft = codecs
    text = DraftText()
    text.sync(draft, "def add(a, b):\n    return")
    drafted = draft.encode(" a - b\n", add_special_tokens=False)
    text.extend(draft, drafted)
    assert text.text == "def add(a, b):\n    return a - b\n"
    text.sync(draft, "def add(a, b):\n    return a + b")  # the target said "+"
    assert text.text == "def add(a, b):\n    return a + b"
    assert draft.decode(text.ids, skip_special_tokens=False) == text.text


def test_target_tokens_spell_the_drafted_text_and_drop_the_last(codecs) -> None:
    target, _ = codecs
    target_ids = target.encode(TEXT, add_special_tokens=False)
    for start in range(4, len(target_ids) - 6, 5):
        following = target_ids[start : start + 6]
        piece = target.decode(following, skip_special_tokens=False)
        proposal = target_tokens_for(target, target_ids[:start], piece, limit=8)
        assert proposal == following[:-1]
        assert target_tokens_for(target, target_ids[:start], piece, limit=2) == following[:2]


def test_a_drafted_text_that_ends_inside_a_character_proposes_only_whole_characters(codecs) -> None:
    target, draft = codecs
    context = target.encode("print('", add_special_tokens=False)
    cut = draft.encode("é", add_special_tokens=False)
    assert len(cut) == 2  # two bytes, one token each in the tiny byte-level tokenizers
    assert drafted_text(draft, draft.encode("print('", add_special_tokens=False), cut[:1]) == ""
    assert REPLACEMENT not in target.decode(target_tokens_for(target, context, "é') x", limit=4))
