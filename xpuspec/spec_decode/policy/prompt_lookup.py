"""Prompt lookup beside a draft model: drafts that cost nothing where a sequence repeats itself.

Code, summaries, retrieval answers and the greedy output of small models repeat spans of their own
context. Where the tail of a sequence (an n-gram of at least ``min_ngram`` tokens) occurred before,
the tokens that followed it are a draft that needs no draft-model pass. On the target's own greedy
output such matches are frequent and their first token is accepted more often than the shipped draft
model's (`python -m research.bench.lookup_acceptance`; figures in
docs/experiments/code-comment-figures.md).

Each step, for a sequence whose γ is adaptive, :meth:`PromptLookup.choose` weighs the lookup's
continuation against the draft model's best chain with the same cost model
(:class:`~xpuspec.spec_decode.policy.speculation_length.SpeculationLengthPolicy`):

    E(α_lookup, γ) / c_verify(γ + 1)   against   E(α_draft, γ') / (c_drafting(γ') + c_verify(γ' + 1))

and drafts with whichever predicts more tokens per second. ``α_lookup`` is tracked apart from the
draft model's (per sequence, shrunk towards the rate pooled over every sequence's lookups, as
:class:`~xpuspec.spec_decode.policy.acceptance.AcceptanceRates` does for the draft), and apart for
matches of one token and of more (:data:`LONG_MATCH`), since all are accepted at very different
rates. The draft model's cache is not run for a lookup step: its next pass catches up over the tokens
it missed, as after a stretch of γ = 0.

Given a :class:`~xpuspec.spec_decode.suffix_index.SharedSuffixIndex`, the lookup also reads the
recent finished requests' tokens of the same tenant (``admit`` says a request's tenant; ``retire``
adds its tokens to the index). Its continuation is weighed by the same rule, with its own acceptance
rates (:data:`SHARED_LONG_MATCH` splits them by match length), and the candidate that predicts the
most tokens per second, of the sequence's own lookup, the shared one and the draft model, wins.
Where the shared drafts are rarely accepted (fresh chat), their pooled rate falls and the cost model
stops choosing them: their own rates keep them from dragging the sequence's own lookups down.

Fixed γ (``num_draft_tokens``), seeded requests, trees and output constraints' forced tokens keep
the drafter alone, so a fixed-γ comparison with another engine's draft model stays like for like.
Lookup drafts are deterministic: verification treats q as one-hot, as for the n-gram drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

from xpuspec.core.sequence import Sequence
from xpuspec.spec_decode.ngram_proposer import NgramIndexes, NgramProposer
from xpuspec.spec_decode.policy.acceptance import AcceptanceRates
from xpuspec.spec_decode.policy.cost_model import expected_tokens_per_step
from xpuspec.spec_decode.policy.speculation_length import SpeculationLengthPolicy
from xpuspec.spec_decode.suffix_index import SharedSuffixIndex

MIN_NGRAM = 1
MAX_NGRAM = 4
# Matches of one token and of more are tracked apart: on chat a 1-token match is accepted far less
# often than a longer one, on code often enough to pay. Pooled together, a chat request's many weak
# 1-token matches pulled down the rate of its strong ones (docs/experiments/code-comment-figures.md).
LONG_MATCH = 2
# A match of this many tokens or more is text being copied: on the default model's chat, summaries and
# code edits the first draft token of such matches was accepted most of the time, of shorter ones
# seldom (docs/benchmarks.md, "Speculation per kind of task", has the counts).
COPY_MATCH = 3
# Shared matches start at the index's key length; the chat template's tail alone matches several
# tokens in every earlier request, while a verbatim repeat (a re-sent tool result) soon matches many.
SHARED_LONG_MATCH = 12


# A lookup's continuation: its tokens, the match length, whether it is shared, its acceptance rates.
_Candidate = tuple[list[int], int, bool, AcceptanceRates]


@dataclass(frozen=True)
class LookupDraft:
    """A lookup's draft tokens and the length of the n-gram whose earlier occurrence gave them."""

    token_ids: list[int]
    ngram: int
    shared: bool = False  # from the cross-request index, not the sequence's own tokens
    expected_tokens: float = 1.0  # tokens the step is predicted to emit with it (accepted and bonus)


class PromptLookup:
    """Chooses, per sequence and step, a lookup draft over the draft model's chain (module docstring)."""

    def __init__(
        self, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM, shared: SharedSuffixIndex | None = None
    ) -> None:
        self.lookup = NgramProposer(max_ngram=max_ngram, min_ngram=min_ngram)
        self._indexes = NgramIndexes(self.lookup)  # each sequence's n-grams so far
        # Acceptance of lookups by match length: short (1 token) and long (LONG_MATCH or more).
        self.acceptance = {False: AcceptanceRates(), True: AcceptanceRates()}
        self.shared = shared  # recent finished requests' tokens, per tenant (None: own tokens only)
        # Acceptance of shared lookups: matches shorter than SHARED_LONG_MATCH, and longer.
        self.shared_acceptance = {False: AcceptanceRates(), True: AcceptanceRates()}
        self._tenants: dict[str, str | None] = {}  # each request's tenant, from admit to retire
        self.shared_drafted = self.shared_accepted = 0  # shared draft tokens verified, accepted
        # Each request's candidates at its last length asked (``_candidates``).
        self._last_candidates: dict[str, tuple[tuple[int, int], list[_Candidate]]] = {}

    def admit(self, request_id: str, tenant: str | None) -> None:
        """``request_id``'s lookups read, and its tokens go to, ``tenant``'s documents."""
        self._tenants[request_id] = tenant

    def has_long_match(self, sequence: Sequence, max_tokens: int) -> bool | None:
        """Whether a lookup finds a continuation for ``sequence`` now (its own tokens or, with a shared
        index, its tenant's earlier requests), and if so whether its match is long (:data:`COPY_MATCH`
        tokens of its own, :data:`SHARED_LONG_MATCH` shared); None: no continuation. Long matches are
        text being copied, and their drafts are accepted far more often than short ones' (whole steps
        measure the kinds apart: :class:`~xpuspec.spec_decode.policy.drafting_payoff.DraftingPayoff`)."""
        candidates = self._candidates(sequence, max_tokens)
        if not candidates:
            return None
        return any(
            ngram >= (SHARED_LONG_MATCH if shared else COPY_MATCH) for _, ngram, shared, _ in candidates
        )

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
        best: LookupDraft | None = None
        best_rate = model_tokens_per_second
        for tokens, ngram, shared, rates in self._candidates(sequence, policy.max_draft_tokens):
            rate = rates.rate(sequence.request_id, pooled_prior=True)
            gamma, tokens_per_second = policy.best(
                rate,
                num_sequences,
                num_sequences,
                previous_tokens_per_sequence,
                drafting=False,
                max_gamma=len(tokens),
            )
            if gamma > 0 and tokens_per_second > best_rate:
                expected = expected_tokens_per_step(rate, gamma)
                best, best_rate = LookupDraft(tokens[:gamma], ngram, shared, expected), tokens_per_second
        return best

    def _candidates(self, sequence: Sequence, max_tokens: int) -> list[_Candidate]:
        """The lookups' continuations for ``sequence`` at its current length, each with its match length,
        whether it is shared, and its acceptance rates; computed once per length (a step asks for the
        kind of work, then for the draft)."""
        request_id, length = sequence.request_id, len(sequence.token_ids)
        cached = self._last_candidates.get(request_id)
        if cached is not None and cached[0] == (length, max_tokens):
            return cached[1]
        candidates: list[_Candidate] = []
        tokens, ngram = self._indexes.propose_with_match(request_id, sequence.token_ids, max_tokens)
        if tokens:
            candidates.append((tokens, ngram, False, self.acceptance[ngram >= LONG_MATCH]))
        if self.shared is not None and request_id in self._tenants:  # never another tenant's by default
            match = self.shared.lookup(self._tenants[request_id], sequence.token_ids, max_tokens)
            if match is not None and match.token_ids:
                long = match.match_length >= SHARED_LONG_MATCH
                candidates.append((match.token_ids, match.match_length, True, self.shared_acceptance[long]))
        self._last_candidates[request_id] = ((length, max_tokens), candidates)
        return candidates

    def update(
        self, request_id: str, ngram: int, num_drafted: int, num_accepted: int, shared: bool = False
    ) -> None:
        """A verified lookup of an ``ngram``-token match (0: a step without drafts, which decays all)."""
        if ngram and shared:
            self.shared_acceptance[ngram >= SHARED_LONG_MATCH].update(request_id, num_drafted, num_accepted)
            self.shared_drafted += num_drafted
            self.shared_accepted += num_accepted
        elif ngram:
            self.acceptance[ngram >= LONG_MATCH].update(request_id, num_drafted, num_accepted)
        else:
            for rates in (*self.acceptance.values(), *self.shared_acceptance.values()):
                rates.update(request_id, 0, 0)

    def retire(self, request_id: str, token_ids: list[int]) -> None:
        """The request ended with ``token_ids`` (prompt and output): they join its tenant's documents."""
        if self.shared is not None and request_id in self._tenants:
            self.shared.add(self._tenants[request_id], token_ids)
        self.forget(request_id)

    def forget(self, request_id: str) -> None:
        self._indexes.forget(request_id)
        self._last_candidates.pop(request_id, None)
        self._tenants.pop(request_id, None)
        for rates in (*self.acceptance.values(), *self.shared_acceptance.values()):
            rates.forget(request_id)
