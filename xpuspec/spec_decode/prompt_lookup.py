"""Prompt lookup beside a draft model: drafts that cost nothing where a sequence repeats itself.

Code, summaries, retrieval answers and the greedy output of small models repeat spans of their own
context. Where the tail of a sequence (an n-gram of at least ``min_ngram`` tokens) occurred before,
the tokens that followed it are a draft that needs no draft-model pass. Measured offline on the
target's own greedy output (`python -m xpuspec.bench.lookup_acceptance`): with ``min_ngram`` 2,
SmolLM2-135M's answers to 12 held-out instructions have such a match at 41% of positions, and its
first token is accepted 81% of the time (2.7 tokens accepted of a 4-token lookup), against 31-36%
for the shipped draft model; the 2-layer demo target on code, 57% and 86%.

Each step, for a sequence whose γ is adaptive, :meth:`PromptLookup.choose` weighs the lookup's
continuation against the draft model's best chain with the same cost model
(:class:`~xpuspec.spec_decode.speculation_length.SpeculationLengthPolicy`):

    E(α_lookup, γ) / c_verify(γ + 1)   against   E(α_draft, γ') / (c_drafting(γ') + c_verify(γ' + 1))

and drafts with whichever predicts more tokens per second. ``α_lookup`` is tracked apart from the
draft model's (per sequence, shrunk towards the rate pooled over every sequence's lookups, as
:class:`~xpuspec.spec_decode.speculation_length.AcceptanceRates` does for the draft), since the two
are accepted at very different rates. The draft model's cache is not run for a lookup step: its
next pass catches up over the tokens it missed, as after a stretch of γ = 0.

Fixed γ (``num_draft_tokens``), seeded requests, trees and output constraints' forced tokens keep
the drafter alone, so a fixed-γ comparison with another engine's draft model stays like for like.
Lookup drafts are deterministic: verification treats q as one-hot, as for the n-gram drafter.
"""

from __future__ import annotations

from xpuspec.engine.sequence import Sequence
from xpuspec.spec_decode.ngram_proposer import NgramProposer
from xpuspec.spec_decode.speculation_length import AcceptanceRates, SpeculationLengthPolicy

# A 1-token match proposes something at most positions but is accepted about half as often as a
# longer one (first token 58% against 81% on SmolLM2's held-out answers).
MIN_NGRAM = 2
MAX_NGRAM = 4


class PromptLookup:
    """Chooses, per sequence and step, a lookup draft over the draft model's chain (module docstring)."""

    def __init__(self, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM) -> None:
        self.lookup = NgramProposer(max_ngram=max_ngram, min_ngram=min_ngram)
        self.acceptance = AcceptanceRates()

    def choose(
        self,
        sequence: Sequence,
        policy: SpeculationLengthPolicy,
        model_tokens_per_second: float,
        num_sequences: int,
        previous_tokens_per_sequence: int | None,
    ) -> list[int] | None:
        """The lookup draft for ``sequence`` this step, or None when the draft model's best choice
        (``model_tokens_per_second``, γ = 0 included) predicts as much."""
        tokens = self.lookup.propose(sequence.token_ids, policy.max_draft_tokens)
        if not tokens:
            return None
        gamma, tokens_per_second = policy.best(
            self.acceptance.rate(sequence.request_id, pooled_prior=True),
            num_sequences,
            num_sequences,
            previous_tokens_per_sequence,
            drafting=False,
            max_gamma=len(tokens),
        )
        if gamma == 0 or tokens_per_second <= model_tokens_per_second:
            return None
        return tokens[:gamma]

    def update(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        self.acceptance.update(request_id, num_drafted, num_accepted)

    def forget(self, request_id: str) -> None:
        self.acceptance.forget(request_id)
