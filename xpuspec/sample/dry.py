"""llama.cpp's DRY ("Don't Repeat Yourself") penalty: a token that would extend a repeat of the
sequence's own text has its logit lowered, by more the longer the repeat.

The history is the last ``dry_penalty_last_n`` tokens of the sequence, prompt included (-1: the whole
sequence; 0: off), as llama-server feeds its sampler the prompt before the reply. With
``dry_include_prompt`` False (an xpuspec field; llama.cpp has none) it is the reply's tokens alone: a
reply that quotes its prompt (a summary, an answer from a document, an edit of code) is then not
penalised for it, and speculation keeps the prompt lookups such quotes are drafted from.

The history's end is a suffix; wherever that suffix, ``n`` tokens long, also ends earlier in the
history, the token that came next there would repeat the text once more, and gets ``dry_multiplier *
dry_base ** (n - dry_allowed_length)`` subtracted from its logit when ``n >= dry_allowed_length``
(the longest such ``n`` for each token; the exponent is capped where the power would overflow a
float32, as in llama.cpp). ``dry_multiplier`` 0 is off (llama.cpp's default).

Sequence breakers end a match: a repeat never reaches back across the latest breaker token of the
history, and a breaker token is never penalised. llama.cpp maps each breaker string to the tokens
whose text contains it, and also to token sequences that spell it across several tokens; xpuspec
keeps the first rule only (:class:`SequenceBreakers`): a token whose text contains a breaker string
is a breaker. For single characters, llama.cpp's default breakers ``\\n``, ``:``, ``"`` and ``*``,
the two rules are the same; a longer breaker split over several tokens does not break here.

Exact under speculation like the other penalties (:mod:`xpuspec.sample.penalties`): each row's
history is the sequence before its position, the drafted tokens before it included.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

# llama.cpp's defaults (common/common.h, common_params_sampling).
DEFAULT_DRY_MULTIPLIER = 0.0
DEFAULT_DRY_BASE = 1.75
DEFAULT_DRY_ALLOWED_LENGTH = 2
DEFAULT_DRY_PENALTY_LAST_N = -1
DEFAULT_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")
# DRY's base at most (llama.cpp takes any; at this one a repeat's second extra token already costs 100
# times the multiplier).
MAX_DRY_BASE = 100.0
# The natural log of float32's largest value: llama.cpp caps the exponent so that the power stays finite.
FLOAT32_MAX_LOG = 88.7228391


def members(values: np.ndarray, sorted_ids: np.ndarray) -> np.ndarray:
    """Which of ``values`` lie in ``sorted_ids`` (sorted): a binary search, cheaper than ``np.isin``
    for the few hundred tokens of a history against a few thousand breakers, row after row."""
    if not sorted_ids.size:
        return np.zeros(values.shape, dtype=bool)
    positions = np.minimum(np.searchsorted(sorted_ids, values), sorted_ids.size - 1)
    return sorted_ids[positions] == values


def repeat_lengths(history: np.ndarray, allowed_length: int, breaker_ids: np.ndarray) -> dict[int, int]:
    """Token id -> the length of the longest repeat (at least ``allowed_length`` >= 1) that token would
    extend after ``history`` ([num_tokens] int64), breakers (``breaker_ids``, sorted) ending every match."""
    num_tokens = history.shape[0]
    if num_tokens <= allowed_length:
        return {}
    reverse = history[::-1]  # reverse[j]: the token j places before the last
    breaks = np.flatnonzero(members(reverse, breaker_ids))
    # The longest a match may be: the tokens after the latest breaker.
    limit = int(breaks[0]) if breaks.size else num_tokens
    if limit < allowed_length:
        return {}
    # Offsets k at which the suffix recurs: reverse[j] == reverse[j + k] for j < length, extended one
    # token at a time while any offset still matches.
    offsets = np.flatnonzero(reverse[1:] == reverse[0]) + 1
    lengths: dict[int, int] = {}
    length = 1
    while offsets.size:
        ended = np.zeros(offsets.shape[0], dtype=bool)
        if length < limit:
            inside = offsets + length < num_tokens
            ended = ~inside
            ended[inside] = reverse[offsets[inside] + length] != reverse[length]
        else:
            ended[:] = True
        if length >= allowed_length:
            for offset in offsets[ended]:
                # The token that followed this earlier occurrence of the suffix.
                token = int(reverse[offset - 1])
                lengths[token] = max(lengths.get(token, 0), length)
        offsets = offsets[~ended]
        length += 1
    return lengths


def dry_penalties(
    history: np.ndarray,
    multiplier: float,
    base: float,
    allowed_length: int,
    breaker_ids: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The token ids DRY penalises after ``history`` and the amount subtracted from each logit
    (``breaker_ids`` sorted; a breaker is never penalised)."""
    lengths = repeat_lengths(history, allowed_length, breaker_ids)
    tokens = np.fromiter(lengths, dtype=np.int64, count=len(lengths))
    exponents = np.fromiter(lengths.values(), dtype=np.int64, count=len(lengths)) - allowed_length
    kept = ~members(tokens, breaker_ids)
    tokens, exponents = tokens[kept], exponents[kept]
    if base > 1.000001:
        exponents = np.minimum(exponents, int(FLOAT32_MAX_LOG / math.log(base)))
    return tokens, multiplier * np.power(base, exponents.astype(np.float64))


class SequenceBreakers:
    """The breaker token ids of each list of breaker strings: every token whose text contains one.

    ``token_texts`` gives each token's text (its id is its index, special tokens written out); it is
    called once, on the first list asked for, and each list's ids are kept.
    """

    def __init__(self, token_texts: Callable[[], Sequence[str]]) -> None:
        self._token_texts = token_texts
        self._texts: Sequence[str] | None = None
        self._ids: dict[tuple[str, ...], np.ndarray] = {}

    def token_ids(self, breakers: Sequence[str]) -> np.ndarray:
        """The sorted ids ([num_breakers] int64) of the tokens that hold any of ``breakers``."""
        key = tuple(breakers)
        if key not in self._ids:
            if not key:
                self._ids[key] = np.empty(0, dtype=np.int64)
            else:
                if self._texts is None:
                    self._texts = self._token_texts()
                ids = [i for i, text in enumerate(self._texts) if any(b in text for b in key)]
                self._ids[key] = np.asarray(ids, dtype=np.int64)
        return self._ids[key]
