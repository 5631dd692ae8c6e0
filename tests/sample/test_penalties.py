"""Repetition penalties: llama.cpp's repeat_penalty and OpenAI's presence/frequency, row by row with the
drafted tokens before each row counted (xpuspec.sample.penalties)."""

from __future__ import annotations

import numpy as np
import pytest

from xpuspec.sample.penalties import chain_prefixes, penalize, tree_prefixes
from xpuspec.sample.sampling_params import SamplingParams


def _logits(num_rows: int, vocab: int = 8) -> np.ndarray:
    row = np.array([2.0, -1.0, 0.5, 3.0, -2.0, 1.0, 0.0, 4.0][:vocab], dtype=np.float32)
    return np.tile(row, (num_rows, 1))


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits_in_the_window():
    params = SamplingParams(repeat_penalty=2.0, repeat_last_n=2)
    # Sequence [0, 1, 3]: the window of the last 2 holds tokens 1 and 3; token 0 is outside it.
    out = penalize(_logits(1), [0, 1, 3], 1, [[]], params)[0]
    assert out[0] == 2.0  # outside the window
    assert out[1] == -2.0  # negative: multiplied
    assert out[3] == 1.5  # positive: divided
    assert out[7] == 4.0  # never seen


def test_repeat_last_n_minus_one_is_the_whole_sequence_and_zero_is_off():
    whole = penalize(_logits(1), [0, 1, 3], 1, [[]], SamplingParams(repeat_penalty=2.0, repeat_last_n=-1))[0]
    assert whole[0] == 1.0
    off = penalize(_logits(1), [0, 1, 3], 1, [[]], SamplingParams(repeat_penalty=2.0, repeat_last_n=0))[0]
    np.testing.assert_array_equal(off, _logits(1)[0])


def test_presence_and_frequency_count_the_output_only():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    # Prompt [7, 7], output [3, 3, 5]: token 7 is in the prompt only, so it keeps its logit.
    out = penalize(_logits(1), [7, 7, 3, 3, 5], 3, [[]], params)[0]
    assert out[7] == 4.0
    assert out[3] == pytest.approx(3.0 - 0.5 - 2 * 0.25)
    assert out[5] == pytest.approx(1.0 - 0.5 - 0.25)


def test_each_row_counts_the_drafts_before_it():
    params = SamplingParams(presence_penalty=1.0, frequency_penalty=1.0)
    drafts = [7, 7]
    out = penalize(_logits(3), [0], 0, chain_prefixes(drafts), params)
    assert [row[7] for row in out] == [4.0, 2.0, 1.0]  # 0, 1 and 2 drafted 7s before the row
    assert chain_prefixes(drafts) == [[], [7], [7, 7]]


def test_tree_rows_count_their_own_path():
    # Nodes: 0 (token 5, child of the root), 1 (token 6, child of 0), 2 (token 5, child of the root).
    assert tree_prefixes([5, 6, 5], [-1, 0, -1]) == [[], [5], [5, 6], [5]]


def test_the_input_is_left_as_it_was():
    logits = _logits(2)
    before = logits.copy()
    penalize(
        logits, [3], 1, [[], [3]], SamplingParams(repeat_penalty=3.0, repeat_last_n=-1, presence_penalty=1)
    )
    np.testing.assert_array_equal(logits, before)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("repeat_penalty", 0.0),
        ("repeat_penalty", float("nan")),
        ("repeat_last_n", -2),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("min_p", 1.5),
    ],
)
def test_bad_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_penalized_says_whether_any_control_bites():
    assert not SamplingParams().penalized
    assert not SamplingParams(repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0).penalized
    assert not SamplingParams(repeat_penalty=1.3, repeat_last_n=0).penalized
    assert SamplingParams(repeat_penalty=1.3).penalized
    assert SamplingParams(frequency_penalty=-0.5).penalized


def test_exempt_tokens_keep_their_logits():
    params = SamplingParams(repeat_penalty=2.0, repeat_last_n=-1, presence_penalty=1.0)
    out = penalize(_logits(1), [3, 7, 7], 2, [[]], params, exempt={7})[0]
    assert out[7] == 4.0 and out[3] == 1.5


def test_every_exempt_token_keeps_its_logit_in_any_order():
    """Several end-of-sequence ids, given unsorted (a chat model's list): each keeps its logit under
    every penalty, DRY included."""
    params = SamplingParams(
        repeat_penalty=2.0,
        repeat_last_n=-1,
        frequency_penalty=1.0,
        dry_multiplier=1.0,
        dry_sequence_breakers=[],
    )
    out = penalize(_logits(1), [7, 2, 7, 2, 5], 5, [[]], params, exempt=[7, 2])[0]
    assert out[7] == 4.0 and out[2] == 0.5
    assert out[5] < 1.0  # a penalised token that is not exempt
