"""llama.cpp's DRY penalty (xpuspec.sample.dry), checked against values worked out by hand, and through
``penalize`` row by row with the drafted tokens before each row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xpuspec.sample.dry import SequenceBreakers, dry_penalties, repeat_lengths
from xpuspec.sample.penalties import chain_prefixes, penalize
from xpuspec.sample.sampling_params import SamplingParams

A, B, C, D, E, Y = 0, 1, 2, 3, 4, 5
NO_BREAKERS = np.empty(0, dtype=np.int64)
DRY = dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=-1)


def _history(*tokens: int) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)


def test_llama_cpps_worked_example():
    # llama.cpp's comment: "a b c c b c y a b c" ends in "a b c", which came before followed by "c"
    # (a repeat of 3), and ends in "b c", which came before followed by "y" (2) and "c"... (1: "c").
    history = _history(A, B, C, C, B, C, Y, A, B, C)
    assert repeat_lengths(history, 1, NO_BREAKERS) == {C: 3, B: 1, Y: 2}
    tokens, amounts = dry_penalties(history, 0.8, 1.75, 2, NO_BREAKERS)
    assert dict(zip(tokens.tolist(), amounts.tolist(), strict=True)) == pytest.approx({C: 0.8 * 1.75, Y: 0.8})


def test_a_breaker_caps_the_repeat_and_is_never_penalised():
    history = _history(A, B, C, D, A, B, C)
    # "a b c" came before, followed by "d": a repeat of 3.
    assert dry_penalties(history, 0.8, 1.75, 2, NO_BREAKERS)[1].tolist() == pytest.approx([0.8 * 1.75])
    # With "a" a breaker, no repeat reaches back across the last "a": only "b c" counts.
    tokens, amounts = dry_penalties(history, 0.8, 1.75, 2, _history(A))
    assert (tokens.tolist(), amounts.tolist()) == ([D], pytest.approx([0.8]))
    # With "d" a breaker, the repeat stands, but "d" itself is not penalised.
    assert dry_penalties(history, 0.8, 1.75, 2, _history(D))[0].size == 0
    # A history ending in a breaker has no repeat to extend.
    assert repeat_lengths(_history(A, B, A, B), 1, _history(B)) == {}


def test_repeats_shorter_than_the_allowed_length_are_free():
    assert dry_penalties(_history(A, B, C, D, A, B, C), 0.8, 1.75, 4, NO_BREAKERS)[0].size == 0


def _llama_cpp_repeat_lengths(tokens: list[int], allowed: int, breakers: set[int]) -> dict[int, int]:
    """llama.cpp's own steps, single-token breakers: the latest breaker limits a repeat, a reversed
    Z-algorithm measures every earlier end of the suffix, and each token keeps its longest."""
    size = len(tokens)
    if size <= allowed:
        return {}

    def back(i: int) -> int:  # the token i places before the last
        return tokens[size - 1 - i]

    limit = next((i for i in range(size) if back(i) in breakers), size)
    if limit < allowed:
        return {}
    counts, last, left, right = [0] * size, size - 1, 0, 0
    for k in range(1, size):
        if k > right:
            n = 0
            while n + k < size and back(n) == back(n + k):
                n += 1
            counts[last - k] = min(n, limit)
            if n > 0:
                left, right = k, k + n - 1
        elif counts[last - (k - left)] < right - k + 1:
            counts[last - k] = min(counts[last - (k - left)], limit)
        else:
            i = right + 1
            while i < size and back(i) == back(i - k):
                i += 1
            counts[last - k] = min(i - k, limit)
            left, right = k, i - 1
    lengths: dict[int, int] = {}
    for i in range(size - 1):
        if counts[i] >= allowed:
            token = back(size - 2 - i)
            lengths[token] = max(lengths.get(token, 0), counts[i])
    return lengths


def test_repeat_lengths_agree_with_llama_cpps_algorithm_on_random_sequences():
    rng = np.random.default_rng(7)
    for _ in range(300):
        tokens = rng.integers(0, int(rng.integers(2, 5)), size=int(rng.integers(1, 40))).tolist()
        allowed = int(rng.integers(1, 4))
        breakers = {int(b) for b in rng.integers(0, 6, size=int(rng.integers(0, 2)))}
        ids = np.asarray(sorted(breakers), dtype=np.int64)
        expected = _llama_cpp_repeat_lengths(tokens, allowed, breakers)
        assert repeat_lengths(_history(*tokens), allowed, ids) == expected, (tokens, allowed, breakers)


def test_the_exponent_is_capped_where_float32_would_overflow():
    history = _history(*([A, B] * 40))
    tokens, amounts = dry_penalties(history, 1.0, 100.0, 2, NO_BREAKERS)
    assert tokens.tolist() == [A]
    assert amounts[0] == pytest.approx(100.0 ** int(88.7228391 / math.log(100.0)))
    assert np.isfinite(np.float32(amounts[0]))


def _logits(num_rows: int) -> np.ndarray:
    return np.tile(np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype=np.float32), (num_rows, 1))


def test_penalize_applies_dry_per_row_with_the_drafts_before_it():
    params = SamplingParams(**DRY)
    out = penalize(_logits(2), [A, B, C, D, A, B], 6, chain_prefixes([C]), params, breaker_ids=NO_BREAKERS)
    expected = _logits(2)
    expected[0, C] -= 0.8  # "a b" came before, followed by "c"
    expected[1, D] -= 0.8 * 1.75  # the drafted "c" makes it "a b c", followed by "d"
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_dry_over_the_reply_alone_lets_the_reply_quote_its_prompt():
    whole, reply_only = SamplingParams(**DRY), SamplingParams(**DRY, dry_include_prompt=False)
    quoting = [A, B, C, D, A, B]  # the prompt "a b c d", the reply "a b"
    out = penalize(_logits(1), quoting, 2, [[]], whole, breaker_ids=NO_BREAKERS)
    assert out[0, C] == pytest.approx(_logits(1)[0, C] - 0.8)
    out = penalize(_logits(1), quoting, 2, [[]], reply_only, breaker_ids=NO_BREAKERS)
    np.testing.assert_array_equal(out, _logits(1))
    # A repeat inside the reply is penalised as before, row by row with the drafts before each row.
    looping = [E, A, B, C, D, A, B]  # the prompt "e", the reply "a b c d a b"
    out = penalize(_logits(2), looping, 6, chain_prefixes([C]), reply_only, breaker_ids=NO_BREAKERS)
    expected = _logits(2)
    expected[0, C] -= 0.8
    expected[1, D] -= 0.8 * 1.75
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_end_of_sequence_tokens_are_exempt():
    params = SamplingParams(**DRY)
    out = penalize(_logits(1), [A, B, C, D, A, B, C], 7, [[]], params, exempt=[D], breaker_ids=NO_BREAKERS)
    np.testing.assert_array_equal(out, _logits(1))


def test_the_window_and_the_switches():
    history = [A, B, C, D, E, E, A, B, C]
    window = penalize(_logits(1), history, 9, [[]], SamplingParams(**{**DRY, "dry_penalty_last_n": 5}))
    np.testing.assert_array_equal(window, _logits(1))  # the earlier "a b c" lies outside the last 5
    for off in ({"dry_multiplier": 0.0}, {"dry_penalty_last_n": 0}):
        assert not SamplingParams(**{**DRY, **off}).penalized
    assert SamplingParams(**DRY).penalized


def test_breaker_tokens_are_those_whose_text_holds_a_breaker():
    calls = []

    def texts() -> list[str]:
        calls.append(1)
        return ["a", "b\n", " x:", "*", '"q', "plain", "<|im_end|>"]

    breakers = SequenceBreakers(texts)
    assert breakers.token_ids(["\n", ":", '"', "*"]).tolist() == [1, 2, 3, 4]
    assert breakers.token_ids(["plain"]).tolist() == [5]
    assert breakers.token_ids([]).tolist() == []
    assert len(calls) == 1  # the texts are read once


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dry_multiplier", -0.1),
        ("dry_multiplier", float("inf")),
        ("dry_base", 0.9),
        ("dry_base", 1000.0),
        ("dry_allowed_length", 0),
        ("dry_allowed_length", 2.5),
        ("dry_penalty_last_n", -2),
        ("dry_sequence_breakers", ["\n", ""]),
        ("dry_sequence_breakers", "\n"),
        ("dry_include_prompt", 0),
    ],
)
def test_bad_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
