"""Choosing the speculation length γ from measured costs and acceptance (Leviathan et al. 2023, §3).

With per-token acceptance rate α, a step with γ drafts emits on average
``1 + α + ... + α^γ = (1 - α^(γ+1)) / (1 - α)`` tokens. It costs γ draft steps plus one target
step over the batch's tokens, which grow by γ per speculating sequence. γ is chosen to maximise
expected tokens per second; γ = 0 (plain decoding) when speculation is not predicted to pay, e.g.
when the batch is large enough that every verified token costs the target real compute.

Pieces:

- :mod:`xpuspec.spec_decode.policy.cost_model`: the measured step costs (:class:`CostModel`, fitted by
  :class:`LinearCostFit` lines and verification tables) and Leviathan et al.'s expected tokens;
- :mod:`xpuspec.spec_decode.policy.acceptance`: one sequence's acceptance rate (:class:`AcceptanceTracker`)
  and every sequence's, shrunk towards the pool's (:class:`AcceptanceRates`);
- :class:`SpeculationLengthPolicy` (here): picks γ.
"""

from __future__ import annotations

from xpuspec.spec_decode.policy.cost_model import (
    CostModel,
    expected_tokens_per_step,
)

# The cost model and the acceptance rates, named here too: the policy's callers import them from here.
__all__ = ["SpeculationLengthPolicy"]

#: The policy reuses its step costs until this many new measurements have come in.
COSTS_REFRESH_RECORDS = 16


class SpeculationLengthPolicy:
    """Chooses γ in [0, max_draft_tokens] maximising expected tokens per second.

    For a sequence with acceptance rate α in a step whose target pass would hold ``batch_tokens``
    tokens without drafts, and ``num_sequences`` sequences speculating (each assumed to use the
    same γ, as the engine's step does), the rate of γ is Leviathan et al.'s::

        expected_tokens_per_step(α, γ) / (γ·c_draft(num_sequences) + c_verify(γ + 1 tokens each))

    with both costs measured (:class:`CostModel`). γ > 0 is chosen only if its predicted rate beats
    plain decoding by ``min_speedup``. It is 1.0 by default, no margin: on the default model (SmolLM2
    135M and its draft, a low α) the best fixed γ (1) gains only a little over plain decoding, less
    than the former 5% margin, which left adaptive γ at 0 for most steps, below γ = 1 (measured and
    replayed: docs/experiments/2026-12-02-cost-model.md). The noise the margin guarded against is that
    of the acceptance estimate, which the pooled prior now damps (:data:`POOLED_PRIOR_WEIGHT`); the
    costs are measured every step.
    """

    def __init__(
        self, max_draft_tokens: int = 8, cost_model: CostModel | None = None, min_speedup: float = 1.0
    ) -> None:
        if not isinstance(max_draft_tokens, int) or max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be an integer >= 0, got {max_draft_tokens!r}")
        if min_speedup < 1.0:
            raise ValueError(f"min_speedup must be >= 1.0, got {min_speedup}")
        self.max_draft_tokens = max_draft_tokens
        self.cost_model = cost_model if cost_model is not None else CostModel()
        self.min_speedup = min_speedup
        # Step costs for every γ depend on the batch shape and the measurements, not on the
        # sequence: computed once per step shape, and again only after new measurements. One
        # cache for drafts a drafter makes and one for drafts that cost nothing (prompt lookup).
        self._costs_key: dict[bool, tuple[int, int, int | None, int, int]] = {}
        self._costs_version: dict[bool, int] = {}
        self._costs: dict[bool, list[float]] = {}

    def step_costs(
        self,
        batch_tokens: int,
        num_sequences: int,
        previous_tokens_per_sequence: int | None = None,
        drafting: bool = True,
    ) -> list[float]:
        """Predicted seconds of the step for γ = 0 .. max_draft_tokens.

        Every step records a measurement, and computing the costs of every γ took a noticeable share
        of a small model's step (docs/experiments/code-comment-figures.md): for the same step shape
        they are recomputed once :data:`COSTS_REFRESH_RECORDS` measurements have come in (each moves
        the decayed estimates by a few percent at most).
        """
        model = self.cost_model
        key = (batch_tokens, num_sequences, previous_tokens_per_sequence, id(model), model.calibrations)
        version = model.version + model.verify.version
        if key != self._costs_key.get(drafting) or not (
            0 <= version - self._costs_version.get(drafting, -COSTS_REFRESH_RECORDS) < COSTS_REFRESH_RECORDS
        ):
            self._costs[drafting] = [
                max(seconds, 1e-12)
                for seconds in model.step_costs(
                    self.max_draft_tokens, batch_tokens, num_sequences, previous_tokens_per_sequence, drafting
                )
            ]
            self._costs_key[drafting] = key
            self._costs_version[drafting] = version
        return self._costs[drafting]

    def tokens_per_second(
        self, acceptance_rate: float, gamma: int, batch_tokens: int, num_sequences: int
    ) -> float:
        """Predicted emitted tokens per second for one sequence if the step uses ``gamma``."""
        seconds = self.cost_model.step_cost(gamma, batch_tokens, num_sequences)
        return expected_tokens_per_step(acceptance_rate, gamma) / max(seconds, 1e-12)

    def choose(
        self,
        acceptance_rate: float,
        batch_tokens: int,
        num_sequences: int,
        previous_tokens_per_sequence: int | None = None,
    ) -> int:
        """γ for a sequence; ``previous_tokens_per_sequence``: what it verified last step in the same
        batch (a γ that keeps the step's shape is spared the cost of changing it)."""
        return self.best(acceptance_rate, batch_tokens, num_sequences, previous_tokens_per_sequence)[0]

    def best(
        self,
        acceptance_rate: float,
        batch_tokens: int,
        num_sequences: int,
        previous_tokens_per_sequence: int | None = None,
        *,
        drafting: bool = True,
        max_gamma: int | None = None,
    ) -> tuple[int, float]:
        """(γ, predicted tokens per second of the sequence) as :meth:`choose` picks them, with γ at
        most ``max_gamma``; ``drafting=False`` for drafts that cost nothing to make (prompt lookup)."""
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate must be in [0, 1], got {acceptance_rate}")
        num_sequences = max(num_sequences, 1)
        costs = self.step_costs(batch_tokens, num_sequences, previous_tokens_per_sequence, drafting)
        plain_rate = 1.0 / costs[0]
        best, best_rate = 0, plain_rate
        expected, power = 1.0, 1.0
        last = len(costs) - 1 if max_gamma is None else min(max_gamma, len(costs) - 1)
        for gamma in range(1, last + 1):
            power *= acceptance_rate
            expected += power  # 1 + α + ... + α^γ
            rate = expected / costs[gamma]
            if rate > best_rate:  # strictly: the smallest γ among equal rates
                best, best_rate = gamma, rate
        if best_rate >= self.min_speedup * plain_rate:
            return best, best_rate
        return 0, plain_rate

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
