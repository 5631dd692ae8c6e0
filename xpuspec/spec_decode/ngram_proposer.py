"""Prompt-lookup drafting: propose the tokens that followed an earlier copy of the current suffix.

Code edits, summaries and retrieval answers repeat spans of their context, so the tokens after
the most recent earlier occurrence of the sequence's last n tokens are a free draft (no draft
model). The draft is deterministic, so verification treats q as one-hot
(``RejectionSampler.verify_sampled(..., draft_probs=None, ...)``).

Two implementations of one rule. :class:`NgramProposer` is stateless and vectorised: for each
candidate end position e the match ``tokens[e-n+1 .. e] == tokens[L-n .. L-1]`` is built up from
n = 1 to ``max_ngram`` by one array comparison per n (a match of length n is a match of length n-1
plus one more equal token), so one call is O(L * max_ngram) numpy work, growing with the sequence.
:class:`NgramIndex` keeps one sequence's n-grams in dictionaries and adds only the new tokens' each
call; the engine, which looks every sequence up at every step, keeps one per sequence (timings:
docs/experiments/code-comment-figures.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

logger = logging.getLogger(__name__)


class NgramProposer:
    """Drafts up to ``num_tokens`` tokens by n-gram lookup in the sequence's own tokens.

    The longest trailing n-gram (``max_ngram`` down to ``min_ngram``) with an earlier occurrence
    wins; among its occurrences the most recent one is used. With ``periodic_extension`` (the
    default) a proposal that runs into the end of the sequence continues by copying, as LZ77
    does: after "a b c a b" the match "a b" at 0 proposes "c a b c a ..." instead of stopping
    at "c a b", which is what a repetition loop will produce.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, periodic_extension: bool = True) -> None:
        if not isinstance(min_ngram, int) or min_ngram < 1:
            raise ValueError(f"min_ngram must be an integer >= 1, got {min_ngram!r}")
        if not isinstance(max_ngram, int) or max_ngram < min_ngram:
            raise ValueError(f"max_ngram must be an integer >= min_ngram ({min_ngram}), got {max_ngram!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.periodic_extension = periodic_extension

    def propose(self, token_ids: Sequence[int] | np.ndarray, num_tokens: int) -> list[int]:
        """Draft tokens for a sequence whose tokens so far are ``token_ids`` ([seq_len]).

        Returns at most ``num_tokens`` tokens; fewer or none when no n-gram of at least
        ``min_ngram`` tokens recurs (or, without periodic extension, when the sequence ends first).
        """
        return self.propose_with_match(token_ids, num_tokens)[0]

    def propose_with_match(
        self, token_ids: Sequence[int] | np.ndarray, num_tokens: int
    ) -> tuple[list[int], int]:
        """:meth:`propose`, and the length of the n-gram that matched (0 with no draft): a longer
        match is accepted more often."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        tokens = np.asarray(token_ids)  # [seq_len]
        seq_len = tokens.shape[0]
        if num_tokens == 0 or seq_len < self.min_ngram + 1:
            return [], 0

        # matches[e]: the n tokens ending at e equal the last n tokens. Only e <= seq_len - 2 are
        # candidates: an occurrence must be followed by at least one token, and must not be the
        # suffix itself.
        num_candidates = seq_len - 1
        matches = np.ones(num_candidates, dtype=bool)  # [seq_len - 1], indexed by end position e
        best_ngram, best_end = 0, -1
        for ngram in range(1, min(self.max_ngram, num_candidates) + 1):
            # Compare tokens[e - (ngram - 1)] with tokens[seq_len - ngram] for every e >= ngram - 1.
            matches[: ngram - 1] = False
            matches[ngram - 1 :] &= tokens[: num_candidates - (ngram - 1)] == tokens[seq_len - ngram]
            if not matches.any():
                break  # no longer n-gram can match either
            if ngram >= self.min_ngram:
                best_ngram = ngram
                best_end = num_candidates - 1 - int(np.argmax(matches[::-1]))  # most recent occurrence
        if best_ngram == 0:
            return [], 0

        first = best_end + 1  # the token that followed the occurrence
        if not self.periodic_extension:
            draft = tokens[first : first + num_tokens].tolist()
            return draft, best_ngram if draft else 0
        # The sequence after the occurrence is copied to after the suffix, shift = seq_len - first
        # positions later; copying past the end reuses the proposal itself, i.e. repeats with that period.
        period = seq_len - first
        return tokens[first + np.arange(num_tokens) % period].tolist(), best_ngram


class NgramIndex:
    """:meth:`NgramProposer.propose_with_match` for one growing sequence, in O(new tokens) a call.

    The engine looks a sequence up at every step and, in a decode burst, at every pass (to end the
    burst when a lookup would pay); the stateless lookup rescans the whole sequence each time, per
    sequence in flight, at a cost that grows with its length. This keeps, for each n, the most
    recent end position of every n-gram seen, adding the n-grams that end at the new tokens; a
    lookup is then ``max_ngram`` dictionary reads. The proposals equal the stateless ones (a test
    compares them on random sequences).

    The engine's sequences only grow while they run (stop strings take tokens back only as the
    request ends). A sequence seen shorter than before, or whose last indexed tokens changed, is
    indexed afresh.
    """

    def __init__(self, lookup: NgramProposer) -> None:
        self.lookup = lookup
        # by_length[n][ngram]: the end position of the most recent occurrence of that n-gram among
        # the indexed ends (every end < self._indexed_ends).
        self._by_length: list[dict[tuple[int, ...], int]] = [{} for _ in range(lookup.max_ngram + 1)]
        self._indexed_ends = 0
        self._tail: list[int] = []  # the last indexed tokens, to notice a sequence that changed

    def propose_with_match(self, token_ids: Sequence[int], num_tokens: int) -> tuple[list[int], int]:
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        lookup = self.lookup
        seq_len = len(token_ids)
        if num_tokens == 0 or seq_len < lookup.min_ngram + 1:
            return [], 0
        self._index(token_ids, seq_len - 1)  # the suffix itself (ending at seq_len - 1) is no match
        best_ngram = best_end = 0
        for ngram in range(min(lookup.max_ngram, seq_len - 1), lookup.min_ngram - 1, -1):
            end = self._by_length[ngram].get(tuple(token_ids[seq_len - ngram :]))
            if end is not None:
                best_ngram, best_end = ngram, end
                break
        if best_ngram == 0:
            return [], 0
        first = best_end + 1  # the token that followed the occurrence
        if not lookup.periodic_extension:
            draft = list(token_ids[first : first + num_tokens])
            return draft, best_ngram if draft else 0
        period = seq_len - first
        return [token_ids[first + offset % period] for offset in range(num_tokens)], best_ngram

    def _index(self, token_ids: Sequence[int], num_ends: int) -> None:
        """Add the n-grams ending at every position < ``num_ends`` not indexed yet."""
        start = self._indexed_ends
        tail = self._tail
        if num_ends < start or list(token_ids[start - len(tail) : start]) != tail:
            for table in self._by_length:
                table.clear()
            start = 0
        max_ngram = self.lookup.max_ngram
        tables = self._by_length
        for end in range(start, num_ends):
            for ngram in range(1, min(max_ngram, end + 1) + 1):
                tables[ngram][tuple(token_ids[end - ngram + 1 : end + 1])] = end
        self._indexed_ends = num_ends
        self._tail = list(token_ids[max(0, num_ends - max_ngram) : num_ends])


class NgramIndexes:
    """One :class:`NgramIndex` per request, made on its first lookup and dropped by :meth:`forget`."""

    def __init__(self, lookup: NgramProposer) -> None:
        self.lookup = lookup
        self._by_request: dict[str, NgramIndex] = {}

    def propose_with_match(
        self, request_id: str, token_ids: Sequence[int], num_tokens: int
    ) -> tuple[list[int], int]:
        index = self._by_request.get(request_id)
        if index is None:
            index = self._by_request[request_id] = NgramIndex(self.lookup)
        return index.propose_with_match(token_ids, num_tokens)

    def forget(self, request_id: str) -> None:
        self._by_request.pop(request_id, None)
