"""Prompt lookup beside a draft model: drafts that cost nothing where a sequence repeats itself.

Code, summaries, retrieval answers and the greedy output of small models repeat spans of their own
context. Where the tail of a sequence (an n-gram of at least ``min_ngram`` tokens) occurred before,
the tokens that followed it are a draft that needs no draft-model pass. On the target's own greedy
output such matches are frequent and their first token is accepted more often than the shipped draft
model's (`python -m research.bench.lookup_acceptance`; figures in
docs/experiments/code-comment-figures.md).

Each step, for a sequence whose γ is adaptive, :meth:`PromptLookup.choose` weighs the lookup's
continuation against the draft model's best chain with the same cost model
(:class:`~xpuspec.spec_decode.speculation_length.SpeculationLengthPolicy`):

    E(α_lookup, γ) / c_verify(γ + 1)   against   E(α_draft, γ') / (c_drafting(γ') + c_verify(γ' + 1))

and drafts with whichever predicts more tokens per second. ``α_lookup`` is tracked apart from the
draft model's (per sequence, shrunk towards the rate pooled over every sequence's lookups, as
:class:`~xpuspec.spec_decode.speculation_length.AcceptanceRates` does for the draft), and apart for
matches of one token and of more (:data:`LONG_MATCH`), since all are accepted at very different
rates. The draft model's cache is not run for a lookup step: its next pass catches up over the tokens
it missed, as after a stretch of γ = 0.

Fixed γ (``num_draft_tokens``), seeded requests, trees and output constraints' forced tokens keep
the drafter alone, so a fixed-γ comparison with another engine's draft model stays like for like.
Lookup drafts are deterministic: verification treats q as one-hot, as for the n-gram drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

from xpuspec.core.sequence import Sequence
from xpuspec.spec_decode.acceptance import AcceptanceRates
from xpuspec.spec_decode.ngram_proposer import NgramIndexes, NgramProposer
from xpuspec.spec_decode.speculation_length import SpeculationLengthPolicy

MIN_NGRAM = 1
MAX_NGRAM = 4
# Matches of one token and of more are tracked apart: on chat a 1-token match is accepted far less
# often than a longer one, on code often enough to pay. Pooled together, a chat request's many weak
# 1-token matches pulled down the rate of its strong ones (docs/experiments/code-comment-figures.md).
LONG_MATCH = 2


@dataclass(frozen=True)
class LookupDraft:
    """A lookup's draft tokens and the length of the n-gram whose earlier occurrence gave them."""

    token_ids: list[int]
    ngram: int


class PromptLookup:
    """Chooses, per sequence and step, a lookup draft over the draft model's chain (module docstring)."""

    def __init__(self, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM) -> None:
        self.lookup = NgramProposer(max_ngram=max_ngram, min_ngram=min_ngram)
        self._indexes = NgramIndexes(self.lookup)  # each sequence's n-grams so far
        # Acceptance of lookups by match length: short (1 token) and long (LONG_MATCH or more).
        self.acceptance = {False: AcceptanceRates(), True: AcceptanceRates()}

    def choose(
        self,
        sequence: Sequence,
        policy: SpeculationLengthPolicy,
        model_tokens_per_second: float,
        num_sequences: int,
        previous_tokens_per_sequence: int | None,
    ) -> LookupDraft | None:
        """The lookup draft for ``sequence`` this step, or None when the draft model's best choice
        (``model_tokens_per_second``, γ = 0 included) predicts as much."""
        tokens, ngram = self._indexes.propose_with_match(
            sequence.request_id, sequence.token_ids, policy.max_draft_tokens
        )
        if not tokens:
            return None
        rates = self.acceptance[ngram >= LONG_MATCH]
        gamma, tokens_per_second = policy.best(
            rates.rate(sequence.request_id, pooled_prior=True),
            num_sequences,
            num_sequences,
            previous_tokens_per_sequence,
            drafting=False,
            max_gamma=len(tokens),
        )
        if gamma == 0 or tokens_per_second <= model_tokens_per_second:
            return None
        return LookupDraft(tokens[:gamma], ngram)

    def update(self, request_id: str, ngram: int, num_drafted: int, num_accepted: int) -> None:
        """A verified lookup of an ``ngram``-token match (0: a step without drafts, which decays both)."""
        if ngram:
            self.acceptance[ngram >= LONG_MATCH].update(request_id, num_drafted, num_accepted)
        else:
            for rates in self.acceptance.values():
                rates.update(request_id, 0, 0)

    def forget(self, request_id: str) -> None:
        self._indexes.forget(request_id)
        for rates in self.acceptance.values():
            rates.forget(request_id)
