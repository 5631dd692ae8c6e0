"""Repetition penalties on logits: llama.cpp's ``repeat_penalty`` and OpenAI's presence and frequency
penalties, applied before temperature, top-k, top-p and min-p (:func:`xpuspec.sample.sampler.probabilities`).

- ``repeat_penalty`` (llama.cpp, and Ollama's option of that name): each token among the last
  ``repeat_last_n`` tokens of the sequence, prompt included (-1: the whole sequence; 0: off), has its
  logit divided by the penalty if positive and multiplied by it otherwise;
- ``frequency_penalty`` and ``presence_penalty`` (OpenAI): each token the output holds ``c > 0`` times
  has ``c * frequency_penalty + presence_penalty`` subtracted from its logit;
- DRY (llama.cpp's ``dry_*`` fields, :mod:`xpuspec.sample.dry`): a token that would extend a repeat of
  the sequence's text (or with ``dry_include_prompt`` False, of the reply's) has an amount growing with
  the repeat's length subtracted, after the others (the order of llama.cpp's sampler chain).

End-of-sequence tokens are never penalised: a chat prompt ends each turn with one, and a penalised
end keeps a small model's reply from ending at all.

Exact under speculation: the row a target pass gives for a token position is penalised with the
history that precedes that position, the drafted tokens before it included (``prefixes``), so each row
is the distribution the target alone would sample from at that position. The verification rules then
compare the drafts with these rows as with any other transform (docs/exactness.md).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from xpuspec.sample.dry import dry_penalties, members
from xpuspec.sample.sampling_params import SamplingParams


def penalize(
    logits: np.ndarray,
    token_ids: Sequence[int],
    num_output_tokens: int,
    prefixes: Sequence[Sequence[int]],
    params: SamplingParams,
    exempt: Collection[int] = (),
    breaker_ids: np.ndarray | None = None,
) -> np.ndarray:
    """``logits`` ([num_rows, vocab]) penalised row by row: row i follows ``token_ids`` (the sequence
    so far: prompt, then its last ``num_output_tokens`` output tokens) and then ``prefixes[i]`` (the
    drafted tokens before row i's position; they count as output). ``exempt`` tokens keep their
    logits (the end-of-sequence tokens: a chat prompt holds them, and penalising them would keep a
    reply from ending). ``breaker_ids``: DRY's sequence breakers (the sorted ids of
    ``params.dry_sequence_breakers``; None: none). Returns a new array."""
    if len(prefixes) != logits.shape[0]:
        raise ValueError(f"one prefix per row: {logits.shape[0]} rows, {len(prefixes)} prefixes")
    penalized = np.array(logits, copy=True)  # [num_rows, vocab]
    repeat = params.repeat_penalty if params.repeat_penalty is not None else 1.0
    last_n = params.repeat_last_n if params.repeat_last_n is not None else 0
    presence = params.presence_penalty or 0.0
    frequency = params.frequency_penalty or 0.0
    output = list(token_ids[len(token_ids) - num_output_tokens :]) if num_output_tokens else []
    exempt_ids = np.sort(np.fromiter(exempt, dtype=np.int64))  # sorted: members() binary-searches it
    for row, prefix in enumerate(prefixes):
        if repeat != 1.0 and last_n != 0:
            history = list(token_ids) + list(prefix)
            window = np.unique(np.asarray(history if last_n < 0 else history[-last_n:], dtype=np.int64))
            # A draft's row may be narrower than the vocabulary (a cut draft vocabulary).
            window = window[~members(window, exempt_ids) & (window < penalized.shape[1])]
            values = penalized[row, window]
            penalized[row, window] = np.where(values > 0, values / repeat, values * repeat)
        if presence or frequency:
            tokens, counts = np.unique(np.asarray(output + list(prefix), dtype=np.int64), return_counts=True)
            kept = ~members(tokens, exempt_ids) & (tokens < penalized.shape[1])
            tokens, counts = tokens[kept], counts[kept]
            if tokens.size:
                penalized[row, tokens] -= counts * frequency + presence
    if params.dry:
        # DRY over the reply alone: the sequence's output, the drafts after it.
        dry_history: Sequence[int] = token_ids if params.dry_include_prompt is not False else output
        _penalize_dry(penalized, dry_history, prefixes, params, exempt_ids, breaker_ids)
    return penalized


def _penalize_dry(
    penalized: np.ndarray,
    token_ids: Sequence[int],
    prefixes: Sequence[Sequence[int]],
    params: SamplingParams,
    exempt_ids: np.ndarray,  # sorted
    breaker_ids: np.ndarray | None,
) -> None:
    """DRY on each row of ``penalized`` in place, its history ``token_ids`` (the sequence, or its reply
    alone) and the row's prefix."""
    last_n = params.dry_penalty_last_n if params.dry_penalty_last_n is not None else -1
    # The longest prefix is as long as the rows are many: the sequence's tail that any row can see.
    tail = token_ids if last_n < 0 else token_ids[max(0, len(token_ids) - last_n) :]
    sequence = np.asarray(tail, dtype=np.int64)
    breakers = breaker_ids if breaker_ids is not None else np.empty(0, dtype=np.int64)
    for row, prefix in enumerate(prefixes):
        history = np.concatenate([sequence, np.asarray(prefix, dtype=np.int64)]) if prefix else sequence
        if last_n > 0:
            history = history[-last_n:]
        tokens, amounts = dry_penalties(
            history,
            params.dry_multiplier or 0.0,
            params.dry_base if params.dry_base is not None else 1.0,
            params.dry_allowed_length if params.dry_allowed_length is not None else 1,
            breakers,
        )
        kept = ~members(tokens, exempt_ids) & (tokens < penalized.shape[1])
        penalized[row, tokens[kept]] -= amounts[kept]


def chain_prefixes(draft_token_ids: Sequence[int]) -> list[list[int]]:
    """The drafted tokens before each row of a chain's verification: [], [d0], [d0, d1], ..."""
    return [list(draft_token_ids[:row]) for row in range(len(draft_token_ids) + 1)]


def tree_prefixes(draft_token_ids: Sequence[int], parents: Sequence[int]) -> list[list[int]]:
    """The same for a tree: the root's row follows nothing drafted; node k's row follows the path from
    the root to node k (``parents[k]``: its parent's node index, -1 for a child of the root)."""
    paths: list[list[int]] = []
    for node, parent in enumerate(parents):
        paths.append((paths[parent] if parent >= 0 else []) + [int(draft_token_ids[node])])
    return [[], *paths]
