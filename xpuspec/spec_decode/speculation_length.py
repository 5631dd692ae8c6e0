"""Choosing the speculation length γ from measured costs and acceptance (Leviathan et al. 2023, §3).

With per-token acceptance rate α, a step with γ drafts emits on average
``1 + α + ... + α^γ = (1 - α^(γ+1)) / (1 - α)`` tokens. It costs γ draft steps plus one target
step over the batch's tokens, which grow by γ per speculating sequence. γ is chosen to maximise
expected tokens per second; γ = 0 (plain decoding) when speculation is not predicted to pay, e.g.
when the batch is large enough that every verified token costs the target real compute.

Pieces:

- :class:`LinearCostFit`: online ridge-regularised least squares of ``seconds ≈ a + b * size``,
  with exponential forgetting so the fit follows the current operating point;
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

    Minimises ``Σ_i w_i (y_i - a - b x_i)^2 + prior_weight * ((a - a0)^2 + slope_scale^2 (b - b0)^2)``
    where the weights of older observations decay by ``decay`` per new one (memory of about
    ``1 / (1 - decay)`` steps). The prior is worth ``prior_weight`` observations (a fifth of
    one by default, so steady data moves the fit within a few steps): it gives the
    answer before any measurement, and keeps the slope at its prior when every measurement has
    the same size (e.g. a constant batch), where the data says nothing about it. ``slope_scale``
    is the size spread at which the data's evidence on the slope equals one prior observation.
    Intercept and slope are kept >= 0: a step never gets cheaper with more work.
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
        self.decay = decay
        self._prior_mean = np.array([prior_intercept, prior_slope])  # [2]
        self._prior_precision = prior_weight * np.diag([1.0, slope_scale**2])  # [2, 2]
        self._gram = np.zeros((2, 2))  # Σ w [1, x]^T [1, x]
        self._moment = np.zeros(2)  # Σ w [1, x] y
        self._coefficients = self._prior_mean.copy()  # [intercept, slope]

    def record(self, size: float, seconds: float) -> None:
        """Add one observation and refit (a 2x2 solve)."""
        if not (size >= 0 and seconds >= 0 and np.isfinite(seconds)):
            raise ValueError(f"need size >= 0 and finite seconds >= 0, got size {size}, seconds {seconds}")
        features = np.array([1.0, float(size)])  # [2]
        self._gram = self.decay * self._gram + np.outer(features, features)
        self._moment = self.decay * self._moment + features * seconds
        self._coefficients = self._solve(self._gram, self._moment)

    def _solve(self, gram: np.ndarray, moment: np.ndarray) -> np.ndarray:
        precision = gram + self._prior_precision
        coefficients = np.linalg.solve(precision, moment + self._prior_precision @ self._prior_mean)
        if coefficients[1] < 0:  # refit with the slope pinned at 0
            intercept = moment[0] + self._prior_precision[0, 0] * self._prior_mean[0]
            coefficients = np.array([intercept / precision[0, 0], 0.0])
        if coefficients[0] < 0:  # refit through the origin
            slope = moment[1] + self._prior_precision[1, 1] * self._prior_mean[1]
            coefficients = np.array([0.0, max(0.0, slope / precision[1, 1])])
        return coefficients

    @property
    def intercept(self) -> float:
        return float(self._coefficients[0])

    @property
    def slope(self) -> float:
        return float(self._coefficients[1])

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

    def record_draft_step(self, num_sequences: int, seconds: float) -> None:
        self.draft.record(num_sequences, seconds)

    def target_cost(self, num_tokens: int) -> float:
        return self.target(num_tokens)

    def draft_cost(self, num_sequences: int) -> float:
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
