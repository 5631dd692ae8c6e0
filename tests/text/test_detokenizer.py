"""Streaming detokenization: the deltas add up to the full decode, in bounded work per push."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from xpuspec.text import IncrementalDetokenizer, Tokenizer
from xpuspec.text.detokenizer import MAX_CHARACTER_TOKENS, MAX_HELD_TOKENS

STREAM_TEXT = "Résumé: naïve 😀 code 👍🏽 — 日本語\ndef f(x):\n    return x  # ok 🚀 done"


def _stream(detokenizer: IncrementalDetokenizer, token_ids: list[int], rng: random.Random) -> list[str]:
    deltas = []
    position = 0
    while position < len(token_ids):
        size = rng.randint(1, 4)
        deltas.append(detokenizer.push(token_ids[position : position + size]))
        position += size
    deltas.append(detokenizer.flush())
    return deltas


def test_emoji_split_over_tokens_is_held_until_complete(tokenizer: Tokenizer) -> None:
    token_ids = tokenizer.encode("a😀", add_special_tokens=False)
    emoji_ids = token_ids[1:]
    assert len(emoji_ids) > 1, "the tiny tokenizer should split the emoji's 4 bytes over tokens"
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer.push(token_ids[:1]) == "a"
    for token_id in emoji_ids[:-1]:
        assert detokenizer.push([token_id]) == ""
    assert detokenizer.push(emoji_ids[-1:]) == "😀"
    assert detokenizer.flush() == ""


@pytest.mark.parametrize("seed", range(4))
def test_deltas_of_real_text_add_up(tokenizer: Tokenizer, seed: int) -> None:
    token_ids = tokenizer.encode(STREAM_TEXT, add_special_tokens=False)
    deltas = _stream(IncrementalDetokenizer(tokenizer), token_ids, random.Random(seed))
    assert "".join(deltas) == STREAM_TEXT
    assert not any(delta.endswith("\ufffd") for delta in deltas)


@pytest.mark.parametrize("seed", range(6))
def test_deltas_of_random_tokens_add_up(tokenizer: Tokenizer, hf_tokenizer, seed: int) -> None:
    # Random ids include lone UTF-8 lead and continuation bytes and special tokens.
    rng = random.Random(seed)
    token_ids = [rng.randrange(len(hf_tokenizer)) for _ in range(80)]
    for skip_special_tokens in (True, False):
        detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        deltas = _stream(detokenizer, token_ids, rng)
        assert "".join(deltas) == tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def test_prompt_gives_context_but_no_text(tokenizer: Tokenizer) -> None:
    prompt_ids = tokenizer.encode("User: say hi\nAssistant:")
    generated_ids = tokenizer.encode(" hi there 😀!", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids=prompt_ids)
    deltas = _stream(detokenizer, generated_ids, random.Random(0))
    full_text = tokenizer.decode(prompt_ids + generated_ids)
    assert "".join(deltas) == full_text[len(tokenizer.decode(prompt_ids)) :]
    assert detokenizer.num_generated_tokens == len(generated_ids)


class _RecordingDecoder:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.longest_call = 0

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.longest_call = max(self.longest_call, len(token_ids))
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def ends_mid_character(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> bool:
        return self.tokenizer.ends_mid_character(token_ids, skip_special_tokens=skip_special_tokens)


def test_work_per_push_does_not_grow_with_the_output(tokenizer: Tokenizer, hf_tokenizer) -> None:
    rng = random.Random(7)
    token_ids = tokenizer.encode(STREAM_TEXT * 6, add_special_tokens=False)
    token_ids += [rng.randrange(len(hf_tokenizer)) for _ in range(200)]
    recorder = _RecordingDecoder(tokenizer)
    deltas = _stream(IncrementalDetokenizer(recorder), token_ids, rng)
    assert "".join(deltas) == tokenizer.decode(token_ids)
    # A window is at most the previous chunk, the held tokens and the new chunk (pushes are <= 4).
    assert recorder.longest_call <= 4 + MAX_HELD_TOKENS + 4
    assert len(token_ids) > 10 * recorder.longest_call


def test_pushes_that_keep_ending_mid_character_still_move_on(tokenizer: Tokenizer) -> None:
    # 3-byte characters as single-byte tokens pushed 2 at a time: most pushes end mid-character.
    text = "日本語のテキスト" * 8
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    recorder = _RecordingDecoder(tokenizer)
    detokenizer = IncrementalDetokenizer(recorder)
    deltas = [detokenizer.push(token_ids[start : start + 2]) for start in range(0, len(token_ids), 2)]
    deltas.append(detokenizer.flush())
    assert "".join(deltas) == text
    assert sum(1 for delta in deltas if delta) > len(text) // 2
    assert recorder.longest_call <= 2 + MAX_CHARACTER_TOKENS + 2


def test_unfinished_character_is_released_by_flush(tokenizer: Tokenizer) -> None:
    emoji_ids = tokenizer.encode("😀", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer.push(emoji_ids[:-1]) == ""
    assert detokenizer.flush() == tokenizer.decode(emoji_ids[:-1])
    assert detokenizer.flush() == ""
