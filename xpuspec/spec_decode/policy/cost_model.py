"""Measured step costs and Leviathan et al.'s arithmetic of what a speculative step yields (2023, §3).

- :func:`expected_tokens_per_step`, :func:`expected_speedup`: tokens a step with γ drafts emits at
  acceptance α, and the walltime improvement at a draft-to-target cost ratio;
- :class:`LinearCostFit`: online least squares of ``seconds ≈ a + b * size`` with a prior and
  exponential forgetting, so the fit follows the current operating point;
- :class:`CostModel`: the verification step's cost by tokens verified per sequence and batch shape
  (:mod:`xpuspec.spec_decode.policy.verify_costs`; a table, since verifying γ + 1 tokens costs neither
  γ + 1 single-token steps nor one), a line over the tokens of any step as its fallback, and a draft
  pass's cost (device plus the draft loop's Python).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xpuspec.spec_decode.policy.verify_costs import VerifyCostCurve


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
        # Decayed sums: [Σw, Σw·x, Σw·x², Σw·y, Σw·x·y] as Python floats (a numpy call costs more than
        # the arithmetic on 5 numbers, and the engine records up to 1 + γ times per step).
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


#: Verification steps hold at most 1 + 16 tokens per sequence (EngineConfig caps γ at 16).
MAX_TOKENS_PER_SEQUENCE = 17
#: A change of the target's step shape is paid once and then serves the steps that keep the new
#: shape; the choice of γ spreads its cost over this many steps (a shorter horizon would keep γ
#: where it is when a change pays within a few steps; a longer one would change γ on every wobble
#: of the acceptance estimate).
SHAPE_CHANGE_HORIZON_STEPS = 4


@dataclass
class CostModel:
    """Measured step costs: verification by tokens per sequence, drafting by passes.

    - ``verify``: a decode step's time (everything but the draft's passes) by batch shape and tokens
      verified per sequence (:class:`~xpuspec.spec_decode.policy.verify_costs.VerifyCostCurve`), calibrated
      at idle and refreshed from every pure decode step;
    - ``target``: a straight line over the tokens in any step (prefills included), the fallback for
      batch shapes the curve has not seen and the slope beyond its cells;
    - ``draft``: one drafting pass by the tokens it computed (one per sequence in a plain pass),
      plus ``draft_python``: the draft loop's own Python per pass (sampling the draft token, building
      the next pass), measured as the drafting wall time not spent in the passes;
    - ``drafting``: the whole drafting phase of a step by γ (catch-up pass, γ - 1 one-token passes,
      the loop's Python), per batch shape, calibrated and refreshed like ``verify``. It is what a γ
      really costs: the catch-up pass computes the tokens accepted last step and is dearer than a
      one-token pass, and the first pass after the target's runs colder. Counted per pass, drafting
      was predicted far below its cost on the 2-layer test pair, and adaptive γ drafted at a loss
      (docs/experiments/2026-12-02-cost-model.md);
    - ``shape_change``: what a target step costs beyond the curve when its shape (tokens in the
      step) differs from the previous step's. OpenVINO's CPU plugin re-prepares every node of the
      graph then (on a 30-layer model, most of a one-token step:
      docs/experiments/2026-12-02-cost-model.md), so a γ that changes from step to step pays it
      every step. Steps that changed shape go here, not into the
      curve, which describes steady steps. ``decode_lane``: the target runs steps of one token per
      sequence on a compiled copy of their own (``ExecutorCaps.decode_lane``), so those neither pay
      a change nor cause the next step's;
    - padding: where the target runs padding tokens (``SequenceChunk.padding``), the engine pads
      a decode step that needs fewer tokens than the last up to the last one's count, until a
      stretch of such steps makes shrinking pay (:meth:`shrink_pays`). γ is still priced as if
      every change of count were paid: priced as free, the padding's tokens drew lookups and
      drafts that kept the count high for good, and padding gained nothing over no padding at all
      (figures: docs/experiments/code-comment-figures.md and 2026-12-02-cost-model.md).

    The priors (before any measurement) describe a CPU-like regime: a target step of ~40 ms growing
    0.5 ms per token, a draft step ~15% of it. Real measurements replace them within a few steps.
    """

    target: LinearCostFit = field(default_factory=lambda: LinearCostFit(0.040, 0.0005))
    draft: LinearCostFit = field(default_factory=lambda: LinearCostFit(0.006, 0.0005))
    verify: VerifyCostCurve = field(default_factory=lambda: VerifyCostCurve(MAX_TOKENS_PER_SEQUENCE))
    # Plain drafting passes (one token per sequence), by batch shape: the catch-up pass that follows
    # a stretch of γ = 0 computes many tokens and goes to the line ``draft`` only.
    draft_passes: VerifyCostCurve = field(default_factory=lambda: VerifyCostCurve(1))
    drafting: VerifyCostCurve = field(default_factory=lambda: VerifyCostCurve(MAX_TOKENS_PER_SEQUENCE))
    draft_python: float = 0.0
    draft_python_decay: float = 0.9
    shape_change: float = 0.0
    shape_change_decay: float = 0.9
    decode_lane: bool = False
    version: int = 0  # bumped by every record, so derived costs can be cached
    calibrations: int = 0  # bumped by every calibration: derived costs are recomputed at once
    _calibrated_shape_changes: list[float] = field(default_factory=list)

    def record_target_step(
        self,
        num_tokens: int,
        seconds: float,
        num_sequences: int | None = None,
        shape_changed: bool = False,
    ) -> None:
        """A target step over ``num_tokens`` tokens; ``num_sequences`` is given for pure decode steps
        (every sequence verifying its own tokens, no prefill), which also refresh the curve unless
        ``shape_changed`` (the previous step held another number of tokens): those measure the cost
        of the change instead."""
        self.version += 1
        if num_sequences and shape_changed:
            steady = self.target_cost(num_tokens, num_sequences)
            decay = self.shape_change_decay
            self.shape_change = decay * self.shape_change + (1.0 - decay) * max(seconds - steady, 0.0)
            return
        self.target.record(num_tokens, seconds)
        if num_sequences:
            self.verify.record(num_sequences, round(num_tokens / num_sequences), seconds)

    def _calibrated(self) -> None:
        """A calibration changed the costs: derived costs are recomputed at once, not in a while."""
        self.version += 1
        self.calibrations += 1

    def calibrate_shape_change(self, seconds: float) -> None:
        """An idle timing of a target step's extra cost when its shape changed (the median of the
        calibration's samples is kept: one sample is a difference of two noisy timings)."""
        self._calibrated_shape_changes.append(seconds)
        self.shape_change = max(float(np.median(self._calibrated_shape_changes)), 0.0)
        self._calibrated()

    def calibrate_target(self, num_sequences: int, tokens_per_sequence: int, seconds: float) -> None:
        """An idle timing of the target alone over ``tokens_per_sequence`` tokens for each sequence."""
        self.target.record(num_sequences * tokens_per_sequence, seconds)
        self._calibrated()
        self.verify.calibrate(num_sequences, tokens_per_sequence, seconds)

    def calibrate_draft(self, seconds: float) -> None:
        """An idle timing of one single-token drafting pass."""
        self.draft.record(1, seconds)
        self._calibrated()
        self.draft_passes.calibrate(1, 1, seconds)

    def record_draft_step(self, num_tokens: int, seconds: float, num_sequences: int | None = None) -> None:
        """One drafting pass that computed ``num_tokens`` tokens for ``num_sequences`` sequences (one
        sequence if not given). A pass of one token per sequence is a plain drafting step; more is a
        pass that catches the draft's KV cache up."""
        self.draft.record(num_tokens, seconds)
        self.version += 1
        num_sequences = num_sequences or 1
        if num_tokens == num_sequences:
            self.draft_passes.record(num_sequences, 1, seconds)

    def calibrate_drafting(self, num_sequences: int, gamma: int, seconds: float) -> None:
        """An idle timing of a whole drafting phase of ``gamma`` drafts for each sequence."""
        self.drafting.calibrate(num_sequences, gamma, seconds)
        self._calibrated()

    def record_drafting(
        self,
        passes: list[tuple[int, float]],
        wall_seconds: float,
        num_sequences: int = 1,
        gamma: int | None = None,
    ) -> None:
        """One drafting phase for ``num_sequences`` sequences: its passes (tokens computed, seconds)
        and its whole wall time, of which the rest is the draft loop's Python. ``gamma``: the drafts
        every sequence asked for, when they all asked for as many (the phase then refreshes the
        ``drafting`` curve, unless its catch-up pass resumed drafting after a stretch without)."""
        if gamma and passes and passes[0][0] <= (gamma + 1) * num_sequences:
            self.drafting.record(num_sequences, gamma, wall_seconds)
        for index, (num_tokens, seconds) in enumerate(passes):
            # Later passes may hold fewer sequences (those still drafting): one token each.
            self.record_draft_step(num_tokens, seconds, num_sequences if index == 0 else num_tokens)
        if passes:
            python = max(wall_seconds - sum(seconds for _, seconds in passes), 0.0) / len(passes)
            decay = self.draft_python_decay
            self.draft_python = decay * self.draft_python + (1.0 - decay) * python
        self.version += 1

    def target_cost(self, num_tokens: int, num_sequences: int | None = None) -> float:
        """Seconds of a target step over ``num_tokens`` tokens; with ``num_sequences``, a decode step
        of ``num_tokens / num_sequences`` tokens per sequence read from the curve where it can.

        A count between two multiples of ``num_sequences`` (sequences verifying different numbers of
        tokens, or padding) is interpolated between them on the curve. The straight line ``target``
        is fitted over prefills too, and on the demo pair at batch 4 it priced one padding token above
        a change of shapes (docs/experiments/2026-12-02-cost-model.md), so adaptive steps shrank and
        grew back every few steps, each change costing about a whole step."""
        if num_sequences:
            per_sequence, remainder = divmod(num_tokens, num_sequences)
            slope = lambda: self.target.slope * num_sequences  # noqa: E731
            low = self.verify.estimate(num_sequences, per_sequence, slope) if per_sequence else None
            if remainder == 0 and low is not None:
                return low
            high = self.verify.estimate(num_sequences, per_sequence + 1, slope)
            if remainder and low is not None and high is not None:
                return low + (high - low) * remainder / num_sequences
        return self.target(num_tokens)

    def shrink_pays(self, padded_tokens: int, needed_tokens: int, num_sequences: int, steps: int) -> bool:
        """Whether decode steps padded to ``padded_tokens`` should shrink to ``needed_tokens`` (the most
        any of the last ``steps`` steps needed): when those steps' padding cost more than a change of
        shapes there and back. A stretch of smaller steps that has lasted ``steps`` is taken to last
        about as long again, so a short lull keeps the shape and a long one gives it up."""
        padded = self.target_cost(padded_tokens, num_sequences)
        padding = padded - self.target_cost(needed_tokens, num_sequences)
        return steps * padding > 2.0 * self.shape_change

    def draft_cost(self, num_sequences: int) -> float:
        """Seconds of one drafting step: one token for each of ``num_sequences`` sequences."""
        estimate = self.draft_passes.estimate(num_sequences, 1)
        return (estimate if estimate is not None else self.draft(num_sequences)) + self.draft_python

    def drafting_cost(self, gamma: int, num_sequences: int) -> float:
        """Seconds of a drafting phase of ``gamma`` drafts for each of ``num_sequences`` sequences:
        the ``drafting`` curve where it holds anything, else ``γ`` one-token passes."""
        if gamma <= 0:
            return 0.0
        estimate = self.drafting.estimate(num_sequences, gamma, lambda: self.draft_cost(num_sequences))
        return estimate if estimate is not None else gamma * self.draft_cost(num_sequences)

    def step_cost(self, gamma: int, batch_tokens: int, num_sequences: int, drafting: bool = True) -> float:
        """Seconds of a step in which ``num_sequences`` sequences each draft and verify ``gamma`` tokens:
        ``c_drafting(γ) + c_verify(batch_tokens + γ·num_sequences)``; without ``drafting`` (drafts
        that cost nothing to make, e.g. prompt lookup) the verification alone."""
        seconds = self.target_cost(batch_tokens + gamma * num_sequences, num_sequences)
        return seconds + (self.drafting_cost(gamma, num_sequences) if drafting else 0.0)

    def step_costs(
        self,
        max_gamma: int,
        batch_tokens: int,
        num_sequences: int,
        previous_tokens_per_sequence: int | None = None,
        drafting: bool = True,
    ) -> list[float]:
        """:meth:`step_cost` for γ = 0 .. ``max_gamma`` at once (one pass over the curve).

        With ``previous_tokens_per_sequence`` (the tokens each sequence verified last step, when the
        batch is the same; with a decode lane, the main copy's last step), a γ that changes it also
        bears a share of the shape change's cost (:data:`SHAPE_CHANGE_HORIZON_STEPS`), but γ = 0 on
        a decode lane.
        """
        if batch_tokens != num_sequences:  # a step with prefill work besides the decodes
            return [
                self.step_cost(gamma, batch_tokens, num_sequences, drafting) for gamma in range(max_gamma + 1)
            ]
        verify = self.verify.estimates(num_sequences, lambda: self.target.slope * num_sequences)
        draft = self.draft_cost(num_sequences)
        phases = self.drafting.estimates(num_sequences, draft)
        change = self.shape_change / SHAPE_CHANGE_HORIZON_STEPS if previous_tokens_per_sequence else 0.0
        costs = []
        for gamma in range(max_gamma + 1):
            tokens = 1 + gamma
            seconds = verify[tokens] if tokens < len(verify) else None
            if seconds is None:
                seconds = self.target(tokens * num_sequences)
            if tokens != previous_tokens_per_sequence and not (tokens == 1 and self.decode_lane):
                seconds += change
            if gamma and drafting:
                phase = phases[gamma] if gamma < len(phases) else None
                seconds += phase if phase is not None else gamma * draft
            costs.append(seconds)
        return costs

    def mean_step_cost(self, gamma: int, num_sequences: int = 1) -> float:
        """Like :meth:`step_cost` for a pure decode step, from the means of every measured step (not
        the recent estimates the policy reads): what a report compares a whole run with."""
        verify = self.verify.table(num_sequences).get(gamma + 1, {})
        verify_s = verify.get("mean") or self.target_cost((gamma + 1) * num_sequences, num_sequences)
        if gamma == 0:
            return verify_s
        drafting_mean = self.drafting.table(num_sequences).get(gamma, {}).get("mean")
        if drafting_mean:
            return verify_s + drafting_mean
        draft = self.draft_passes.table(num_sequences).get(1, {})
        draft_s = draft.get("mean") or self.draft_cost(num_sequences) - self.draft_python
        return verify_s + gamma * (draft_s + self.draft_python)

    def predicted_speedup(self, alpha: float, gamma: int, num_sequences: int = 1) -> float:
        """Leviathan et al.'s walltime improvement with the measured costs: tokens per second at ``gamma``
        over tokens per second without drafting (``num_sequences`` decoding, one token each)."""
        plain = self.step_cost(0, num_sequences, num_sequences)
        return (
            expected_tokens_per_step(alpha, gamma)
            * plain
            / self.step_cost(gamma, num_sequences, num_sequences)
        )
