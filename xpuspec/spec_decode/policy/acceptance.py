"""Acceptance rates of speculative drafts: one sequence's, and every sequence's shrunk towards the pool's."""

from __future__ import annotations

#: How many tested drafts the pool's acceptance rate is worth in a sequence's estimate: the
#: per-sequence α is shrunk towards the pool's. A sequence's own evidence is a few decayed steps
#: (decay 0.9: ~10 steps, ~13 tested drafts at γ = 1), so its α wanders by ±0.13 around the truth
#: on a 0.3 draft, while the sequences' true rates differ far less (held-out chat, SmolLM2's draft).
#: Maximising the predicted rate over a noisy α picks γ too large when α is high by chance, and
#: γ = 0 when it is low, where it then stays, learning nothing: a winner's curse. Replayed with
#: ``python -m xpuspec.bench.policy_replay``, a smaller weight left adaptive γ below the best fixed
#: γ, 4 came close to it on both drafts and every cost curve tried, and much larger weights lost on
#: the demo pair, whose requests' rates really differ (figures: docs/experiments/2026-12-02-cost-model.md
#: and code-comment-figures.md).
POOLED_PRIOR_WEIGHT = 4.0


class AcceptanceTracker:
    """One sequence's per-token acceptance rate α, as an exponentially weighted estimate.

    Acceptance stops at the first rejection, so a step with ``num_accepted < num_drafted`` tested
    ``num_accepted + 1`` tokens (one of them rejected) and a fully accepted step tested
    ``num_drafted``; drafts after a rejection say nothing. Counting them as rejections
    (accepted / drafted) would underestimate α badly at large γ.

    The estimate is ``(accepted + prior * prior_weight) / (tested + prior_weight)`` over decayed
    counts, where the prior is fixed or, given a ``pool`` (the tracker of every sequence's drafts),
    that pool's current rate. Steps without drafts (``update(0, 0)``) decay the counts by the slower
    ``idle_decay``, so a sequence that stopped speculating drifts back towards the prior and is
    retried later, but not every few steps: each retry changes the target's step shape twice and
    catches the draft up, which on the demo pair cost a few steps' time per retry (with ``decay`` for
    idle steps too and a fixed prior, retries came often and adaptive γ ran below target-only:
    docs/experiments/2026-12-02-cost-model.md; a pooled prior is low when the draft does not pay, see
    :class:`AcceptanceRates`).
    """

    def __init__(
        self,
        prior: float = 0.6,
        prior_weight: float = 2.0,
        decay: float = 0.9,
        idle_decay: float = 0.99,
        pool: AcceptanceTracker | None = None,
    ) -> None:
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"prior must be in [0, 1], got {prior}")
        if prior_weight <= 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight}")
        if not 0.0 < decay <= 1.0 or not 0.0 < idle_decay <= 1.0:
            raise ValueError(f"decay and idle_decay must be in (0, 1], got {decay}, {idle_decay}")
        self.prior = prior
        self.prior_weight = prior_weight
        self.decay = decay
        self.idle_decay = idle_decay
        self.pool = pool  # when given, its current rate is the prior (``prior`` is ignored)
        self._accepted = 0.0
        self._tested = 0.0

    def update(self, num_drafted: int, num_accepted: int) -> None:
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"need 0 <= num_accepted <= num_drafted, got {num_accepted}, {num_drafted}")
        tested = num_accepted + (1 if num_accepted < num_drafted else 0)
        decay = self.decay if num_drafted else self.idle_decay
        self._accepted = decay * self._accepted + num_accepted
        self._tested = decay * self._tested + tested

    @property
    def rate(self) -> float:
        prior = self.prior if self.pool is None else self.pool.rate
        return (self._accepted + prior * self.prior_weight) / (self._tested + self.prior_weight)


class AcceptanceRates:
    """One :class:`AcceptanceTracker` per sequence, keyed by request id (created on first use).

    A pool of every sequence's drafts (decaying slowly) gives new sequences their starting point on
    request (``pooled_prior``): with a draft that is rarely accepted, each new request would otherwise
    start from the optimistic fixed prior and draft for its first steps, a loss repeated for every
    request. The pool's current rate stays in such a sequence's estimate with ``pooled_prior_weight``
    (:data:`POOLED_PRIOR_WEIGHT`), shrinking a few steps' noisy evidence towards it. Its current rate,
    not its rate when the sequence began: the first request on a fresh engine would keep the fixed
    prior 0.6 as its anchor, and with a draft that is never accepted its estimate could not fall
    below 0.6·4 / (4 + 10) ≈ 0.17 (10: the most decayed tested drafts), and would take many steps to
    cross γ = 1's break-even on the default model. Steps without drafts decay such a sequence's counts
    by ``pooled_idle_decay`` (0.95), so an estimate that fell below the pool by chance, and took γ to
    0 where it learns nothing, drifts back to the pool in ~20 steps rather than ~70; a draft that
    never pays is not retried for it, as the pool is low too (replayed, 0.95 instead of 0.99 cut the
    loss on a curve without shape-change costs, and changed nothing elsewhere:
    docs/experiments/2026-12-02-cost-model.md). Seeded requests keep the fixed prior, so their
    drafting repeats run for run; as the engine does not probe for them (their γ ignores timings),
    steps without drafts decay their counts at the drafting rate ``decay``, which alone retries them
    after a bad stretch.
    """

    def __init__(
        self,
        prior: float = 0.6,
        prior_weight: float = 2.0,
        decay: float = 0.9,
        pool_decay: float = 0.99,
        pooled_prior_weight: float = POOLED_PRIOR_WEIGHT,
        pooled_idle_decay: float = 0.95,
    ) -> None:
        AcceptanceTracker(prior, prior_weight, decay)  # validates the settings once, up front
        AcceptanceTracker(prior, pooled_prior_weight, decay, pooled_idle_decay)
        self._settings = (prior, prior_weight, decay)
        self.pooled_prior_weight = pooled_prior_weight
        self.pooled_idle_decay = pooled_idle_decay
        self._trackers: dict[str, AcceptanceTracker] = {}
        self.pool = AcceptanceTracker(prior, prior_weight, pool_decay)

    def tracker(self, request_id: str, pooled_prior: bool = False) -> AcceptanceTracker:
        tracker = self._trackers.get(request_id)
        if tracker is None:
            prior, prior_weight, decay = self._settings
            if pooled_prior:
                tracker = AcceptanceTracker(
                    prior, self.pooled_prior_weight, decay, self.pooled_idle_decay, pool=self.pool
                )
            else:
                tracker = AcceptanceTracker(prior, prior_weight, decay, idle_decay=decay)
            self._trackers[request_id] = tracker
        return tracker

    def rate(self, request_id: str, pooled_prior: bool = False) -> float:
        return self.tracker(request_id, pooled_prior).rate

    def update(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        if not num_drafted and request_id not in self._trackers:
            # A step without drafts before the sequence ever chose γ (its prefill): nothing to
            # decay, and creating the tracker here would fix its prior before the choice does.
            return
        self.tracker(request_id).update(num_drafted, num_accepted)
        if num_drafted:  # steps without drafts say nothing about the draft
            self.pool.update(num_drafted, num_accepted)

    def forget(self, request_id: str) -> None:
        self._trackers.pop(request_id, None)
