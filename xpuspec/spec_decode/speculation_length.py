"""Choosing the speculation length γ from measured costs and acceptance (Leviathan et al. 2023, §3).

With per-token acceptance rate α, a step with γ drafts emits on average
``1 + α + ... + α^γ = (1 - α^(γ+1)) / (1 - α)`` tokens. It costs γ draft steps plus one target
step over the batch's tokens, which grow by γ per speculating sequence. γ is chosen to maximise
expected tokens per second; γ = 0 (plain decoding) when speculation is not predicted to pay, e.g.
when the batch is large enough that every verified token costs the target real compute.

Pieces:

- :class:`LinearCostFit`: online least squares of ``seconds ≈ a + b * size`` with a prior and
  exponential forgetting, so the fit follows the current operating point;
- :class:`CostModel`: one fit for the target step (size = tokens in the step), one for a draft
  step (size = sequences drafting);
- :class:`AcceptanceTracker`: one sequence's acceptance rate;
- :class:`SpeculationLengthPolicy`: picks γ.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

logger = logging.getLogger(__name__)


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """``(1 - α^(γ+1)) / (1 - α)``, computed as the geometric sum so that α → 1 gives γ + 1."""
    return float(sum(alpha**power for power in range(gamma + 1)))


def expected_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Leviathan et al.'s walltime improvement ``(1 - α^(γ+1)) / ((1 - α)(γc + 1))``.

    ``cost_ratio`` c is the time of one draft step over the time of one target step, with the
    target step assumed not to slow down with γ extra tokens (small batches, memory bound).
    """
    return expected_tokens_per_step(alpha, gamma) / (gamma * cost_ratio + 1.0)


class LinearCostFit:
    """Online fit of ``seconds = intercept + slope * size`` from (size, seconds) observations.

    Weighted least squares in the centred form ``seconds = level + slope * (size - mean_size)``
    with a ridge prior on each coefficient (worth ``prior_weight`` observations for the level and
    ``prior_weight * slope_scale**2`` for the slope). Centring decouples the two: the level (the
    cost at the sizes actually seen) follows the data at once, and the slope keeps its prior until
    sizes vary, e.g. a constant batch says nothing about the per-token cost. ``slope_scale`` is
    the spread of sizes at which the data's evidence on the slope equals the prior's. Older
    observations decay by ``decay`` per new one (memory of about ``1 / (1 - decay)`` steps), so
    the fit follows the current operating point. Intercept and slope are kept >= 0: a step never
    gets cheaper with more work.
    """

    def __init__(
        self,
        prior_intercept: float,
        prior_slope: float,
        prior_weight: float = 0.2,
        slope_scale: float = 16.0,
        decay: float = 0.98,
    ) -> None:
        if prior_intercept < 0 or prior_slope < 0:
            raise ValueError(
                f"prior costs must be >= 0, got intercept {prior_intercept}, slope {prior_slope}"
            )
        if prior_weight <= 0 or slope_scale <= 0:
            raise ValueError(f"prior_weight and slope_scale must be > 0, got {prior_weight}, {slope_scale}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.prior_intercept = prior_intercept
        self.prior_slope = prior_slope
        self.prior_weight = prior_weight
        self.slope_prior_weight = prior_weight * slope_scale**2
        self.decay = decay
        # Decayed sums: [Σw, Σw·x, Σw·x², Σw·y, Σw·x·y] as Python floats (numpy costs ~10 us per
        # record on 5 numbers, and the engine records up to 1 + γ times per step).
        self._sums = (0.0, 0.0, 0.0, 0.0, 0.0)
        self.intercept = prior_intercept
        self.slope = prior_slope

    def record(self, size: float, seconds: float) -> None:
        """Add one observation and refit (closed form, a few flops)."""
        if not (size >= 0 and seconds >= 0 and np.isfinite(seconds)):
            raise ValueError(f"need size >= 0 and finite seconds >= 0, got size {size}, seconds {seconds}")
        size, seconds = float(size), float(seconds)
        weight, sum_x, sum_xx, sum_y, sum_xy = self._sums
        decay = self.decay
        self._sums = (
            decay * weight + 1.0,
            decay * sum_x + size,
            decay * sum_xx + size * size,
            decay * sum_y + seconds,
            decay * sum_xy + size * seconds,
        )
        self._refit()

    def _refit(self) -> None:
        weight, sum_x, sum_xx, sum_y, sum_xy = self._sums
        mean_size = sum_x / weight
        prior_level = self.prior_intercept + self.prior_slope * mean_size
        level = (sum_y + self.prior_weight * prior_level) / (weight + self.prior_weight)
        centred_xx = max(sum_xx - sum_x * mean_size, 0.0)  # Σw (x - mean)^2
        centred_xy = sum_xy - mean_size * sum_y  # Σw (x - mean) y
        slope = (centred_xy + self.slope_prior_weight * self.prior_slope) / (
            centred_xx + self.slope_prior_weight
        )
        slope = max(slope, 0.0)
        intercept = level - slope * mean_size
        if intercept < 0.0:  # the line would cross zero before size 0: fit through the origin instead
            intercept = 0.0
            slope = max(
                0.0,
                (sum_xy + self.slope_prior_weight * self.prior_slope) / (sum_xx + self.slope_prior_weight),
            )
        self.intercept, self.slope = float(intercept), float(slope)

    def __call__(self, size: float) -> float:
        """Predicted seconds for a step of ``size``."""
        return self.intercept + self.slope * size


@dataclass
class CostModel:
    """Measured step costs: target step vs tokens in it, draft step vs sequences drafting.

    The priors (before any measurement) describe a CPU-like regime: a target step of ~40 ms
    growing 0.5 ms per token, a draft step ~15% of it. Real measurements replace them within a
    few dozen steps.
    """

    target: LinearCostFit = field(default_factory=lambda: LinearCostFit(0.040, 0.0005))
    draft: LinearCostFit = field(default_factory=lambda: LinearCostFit(0.006, 0.0005))

    def record_target_step(self, num_tokens: int, seconds: float) -> None:
        self.target.record(num_tokens, seconds)

    def record_draft_step(self, num_tokens: int, seconds: float) -> None:
        """One drafting pass that computed ``num_tokens`` tokens (one per sequence in a plain
        drafting step; more in a pass that catches the draft's KV cache up)."""
        self.draft.record(num_tokens, seconds)

    def target_cost(self, num_tokens: int) -> float:
        return self.target(num_tokens)

    def draft_cost(self, num_sequences: int) -> float:
        """Seconds of one drafting step: one token for each of ``num_sequences`` sequences."""
        return self.draft(num_sequences)


class AcceptanceTracker:
    """One sequence's per-token acceptance rate α, as an exponentially weighted estimate.

    Acceptance stops at the first rejection, so a step with ``num_accepted < num_drafted`` tested
    ``num_accepted + 1`` tokens (one of them rejected) and a fully accepted step tested
    ``num_drafted``; drafts after a rejection say nothing. Counting them as rejections
    (accepted / drafted) would underestimate α badly at large γ.

    The estimate is ``(accepted + prior * prior_weight) / (tested + prior_weight)`` over decayed
    counts. Steps without drafts (``update(0, 0)``) still decay the counts, so a sequence that
    stopped speculating drifts back towards the prior and is retried later.
    """

    def __init__(self, prior: float = 0.6, prior_weight: float = 2.0, decay: float = 0.9) -> None:
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"prior must be in [0, 1], got {prior}")
        if prior_weight <= 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.prior = prior
        self.prior_weight = prior_weight
        self.decay = decay
        self._accepted = 0.0
        self._tested = 0.0

    def update(self, num_drafted: int, num_accepted: int) -> None:
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"need 0 <= num_accepted <= num_drafted, got {num_accepted}, {num_drafted}")
        tested = num_accepted + (1 if num_accepted < num_drafted else 0)
        self._accepted = self.decay * self._accepted + num_accepted
        self._tested = self.decay * self._tested + tested

    @property
    def rate(self) -> float:
        return (self._accepted + self.prior * self.prior_weight) / (self._tested + self.prior_weight)


class AcceptanceRates:
    """One :class:`AcceptanceTracker` per sequence, keyed by request id (created on first use)."""

    def __init__(self, prior: float = 0.6, prior_weight: float = 2.0, decay: float = 0.9) -> None:
        AcceptanceTracker(prior, prior_weight, decay)  # validates the settings once, up front
        self._settings = (prior, prior_weight, decay)
        self._trackers: dict[str, AcceptanceTracker] = {}

    def tracker(self, request_id: str) -> AcceptanceTracker:
        if request_id not in self._trackers:
            self._trackers[request_id] = AcceptanceTracker(*self._settings)
        return self._trackers[request_id]

    def rate(self, request_id: str) -> float:
        return self.tracker(request_id).rate

    def update(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        self.tracker(request_id).update(num_drafted, num_accepted)

    def forget(self, request_id: str) -> None:
        self._trackers.pop(request_id, None)


class SpeculationLengthPolicy:
    """Chooses γ in [0, max_draft_tokens] maximising expected tokens per second.

    For a sequence with acceptance rate α in a step whose target pass would hold ``batch_tokens``
    tokens without drafts, and ``num_sequences`` sequences speculating (each assumed to use the
    same γ, as the engine's step does), the rate of γ is::

        expected_tokens_per_step(α, γ)
        / (target_cost(batch_tokens + γ·num_sequences) + γ·draft_cost(num_sequences))

    γ > 0 is chosen only if its predicted rate beats plain decoding by ``min_speedup`` (the costs
    are estimates; a marginal predicted gain is not worth the draft's KV memory).
    """

    def __init__(
        self, max_draft_tokens: int = 8, cost_model: CostModel | None = None, min_speedup: float = 1.05
    ) -> None:
        if not isinstance(max_draft_tokens, int) or max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be an integer >= 0, got {max_draft_tokens!r}")
        if min_speedup < 1.0:
            raise ValueError(f"min_speedup must be >= 1.0, got {min_speedup}")
        self.max_draft_tokens = max_draft_tokens
        self.cost_model = cost_model if cost_model is not None else CostModel()
        self.min_speedup = min_speedup

    def tokens_per_second(
        self, acceptance_rate: float, gamma: int, batch_tokens: int, num_sequences: int
    ) -> float:
        """Predicted emitted tokens per second for one sequence if the step uses ``gamma``."""
        seconds = self.cost_model.target_cost(batch_tokens + gamma * num_sequences)
        if gamma > 0:
            seconds += gamma * self.cost_model.draft_cost(num_sequences)
        return expected_tokens_per_step(acceptance_rate, gamma) / max(seconds, 1e-12)

    def choose(self, acceptance_rate: float, batch_tokens: int, num_sequences: int) -> int:
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate must be in [0, 1], got {acceptance_rate}")
        num_sequences = max(num_sequences, 1)
        rates = [
            self.tokens_per_second(acceptance_rate, gamma, batch_tokens, num_sequences)
            for gamma in range(self.max_draft_tokens + 1)
        ]
        best = int(np.argmax(rates))  # the smallest γ among equal rates
        return best if rates[best] >= self.min_speedup * rates[0] else 0

    def choose_without_timing(self, acceptance_rate: float) -> int:
        """γ for a single sequence from the prior costs only: a pure function of the acceptance rate.

        For seeded requests: their tokens do not depend on γ (coupled verification), but a γ from
        measured wall-clock times would make their drafting statistics unrepeatable.
        """
        timed_costs, self.cost_model = self.cost_model, _PRIOR_COSTS
        try:
            return self.choose(acceptance_rate, batch_tokens=1, num_sequences=1)
        finally:
            self.cost_model = timed_costs


_PRIOR_COSTS = CostModel()  # never recorded into: the fixed costs of choose_without_timing
