"""The cost of a verification step as a function of the tokens verified per sequence, per batch shape.

A target pass over ``n`` tokens per sequence does not cost ``n`` times a single-token pass, nor the
same as one: on a CPU at batch 1 it is nearly flat for a large model (memory bound) and grows
steeply for a tiny one (the attention and the engine's per-token work dominate). A straight line
fitted mostly on single-token steps (and a prior) badly underestimated verifying γ + 1 tokens on the
demo pair, so adaptive γ drafted where it did not pay. This table keeps one estimate per (batch
shape, tokens per sequence) instead:

- ``calibrate`` fills it from timed target passes at idle (device and runner only);
- every pure decode step of the engine refreshes its entry online with the step's measured time
  (everything but the draft's passes: the engine's Python per step included);
- an entry never measured online is its calibrated time plus the batch shape's measured overhead over
  calibration (the engine's own work per step), or, when not calibrated either, interpolated between
  the nearest measured entries (extrapolated beyond them with the caller's per-token slope).

Batch shapes are bucketed by the number of sequences (1, 2, 3-4, 5-8, ...): within a bucket the cost
is assumed to depend on the tokens per sequence only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def batch_bucket(num_sequences: int) -> int:
    """The smallest power of two >= ``num_sequences``: 1, 2, 4, 8, ..."""
    if num_sequences < 1:
        raise ValueError(f"num_sequences must be >= 1, got {num_sequences}")
    return 1 << (num_sequences - 1).bit_length()


@dataclass
class _Entry:
    """Online (decayed mean of measured steps) and calibrated estimates of one table cell."""

    weight: float = 0.0
    total: float = 0.0  # decayed Σ weight·seconds
    calibrated: float | None = None
    steps: int = 0  # every measured step, undecayed and unclipped: for reports
    all_seconds: float = 0.0

    @property
    def measured(self) -> float | None:
        return self.total / self.weight if self.weight > 0 else None


class VerifyCostCurve:
    """Seconds of a verification step by (batch bucket, tokens per sequence), refreshed online.

    ``decay`` is the weight an entry's older measurements keep per new one (a memory of about
    ``1 / (1 - decay)`` steps of that shape). A measurement above ``outlier_factor`` times the
    entry's current estimate is clipped to it: on a shared machine one step now and then takes many
    times longer (another process got the cores), and one such step must not switch γ by itself,
    while a lasting slowdown still moves the estimate within a few steps.
    """

    def __init__(self, max_tokens_per_sequence: int, decay: float = 0.9, outlier_factor: float = 3.0) -> None:
        if max_tokens_per_sequence < 1:
            raise ValueError(f"max_tokens_per_sequence must be >= 1, got {max_tokens_per_sequence}")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        if outlier_factor <= 1.0:
            raise ValueError(f"outlier_factor must be > 1, got {outlier_factor}")
        self.max_tokens_per_sequence = max_tokens_per_sequence
        self.decay = decay
        self.outlier_factor = outlier_factor
        self._buckets: dict[int, list[_Entry]] = {}
        # Per bucket: decayed mean of (measured - calibrated) over online steps at calibrated cells.
        self._overhead: dict[int, tuple[float, float]] = {}
        self.version = 0  # bumped on every change, so callers can cache what they derive from it

    def _entries(self, bucket: int) -> list[_Entry]:
        entries = self._buckets.get(bucket)
        if entries is None:
            entries = self._buckets[bucket] = [_Entry() for _ in range(self.max_tokens_per_sequence + 1)]
        return entries

    def _cell(self, num_sequences: int, tokens_per_sequence: int) -> _Entry | None:
        if not 1 <= tokens_per_sequence <= self.max_tokens_per_sequence:
            return None
        return self._entries(batch_bucket(num_sequences))[tokens_per_sequence]

    def calibrate(self, num_sequences: int, tokens_per_sequence: int, seconds: float) -> None:
        """An idle timing of the target alone (kept apart from the online measurements)."""
        _check_seconds(seconds)
        cell = self._cell(num_sequences, tokens_per_sequence)
        if cell is None:
            return
        cell.calibrated = seconds if cell.calibrated is None else min(cell.calibrated, seconds)
        self.version += 1

    def record(self, num_sequences: int, tokens_per_sequence: int, seconds: float) -> None:
        """One measured step: ``num_sequences`` sequences, each verifying ``tokens_per_sequence`` tokens."""
        _check_seconds(seconds)
        cell = self._cell(num_sequences, tokens_per_sequence)
        if cell is None:
            return
        cell.steps += 1
        cell.all_seconds += seconds
        current = cell.measured
        if current is not None and seconds > self.outlier_factor * current:
            seconds = self.outlier_factor * current
        cell.weight = self.decay * cell.weight + 1.0
        cell.total = self.decay * cell.total + seconds
        if cell.calibrated is not None:
            bucket = batch_bucket(num_sequences)
            weight, total = self._overhead.get(bucket, (0.0, 0.0))
            self._overhead[bucket] = (
                self.decay * weight + 1.0,
                self.decay * total + seconds - cell.calibrated,
            )
        self.version += 1

    def overhead(self, num_sequences: int) -> float:
        """Measured online minus calibrated seconds per step in this bucket (0 before any)."""
        weight, total = self._overhead.get(batch_bucket(num_sequences), (0.0, 0.0))
        return total / weight if weight > 0 else 0.0

    def estimate(
        self, num_sequences: int, tokens_per_sequence: int, slope: Callable[[], float] | float = 0.0
    ) -> float | None:
        """Predicted seconds, or None when the bucket holds nothing to go on.

        ``slope`` (seconds per extra token per sequence) extends the table beyond its measured cells.
        """
        if not 1 <= tokens_per_sequence <= self.max_tokens_per_sequence:
            return None
        return self.estimates(num_sequences, slope)[tokens_per_sequence]

    def estimates(self, num_sequences: int, slope: Callable[[], float] | float = 0.0) -> list[float | None]:
        """:meth:`estimate` for every number of tokens per sequence at once (index 0 unused), in one
        pass over the bucket: what the policy reads for every γ of a step."""
        width = self.max_tokens_per_sequence + 1
        entries = self._buckets.get(batch_bucket(num_sequences))
        if entries is None:
            return [None] * width
        overhead = self.overhead(num_sequences)
        values: list[float | None] = [None] * width
        known: list[int] = []
        for n in range(1, width):
            cell = entries[n]
            if cell.weight > 0:
                values[n] = cell.total / cell.weight
            elif cell.calibrated is not None:
                values[n] = max(cell.calibrated + overhead, 0.0)
            else:
                continue
            known.append(n)
        if not known or len(known) == width - 1:
            return values
        per_token = slope() if callable(slope) else slope
        first, last = known[0], known[-1]
        for n in range(1, width):
            if values[n] is not None:
                continue
            if n < first:
                values[n] = max(values[first] + per_token * (n - first), 0.0)  # type: ignore[operator]
            elif n > last:
                values[n] = max(values[last] + per_token * (n - last), 0.0)  # type: ignore[operator]
            else:
                below = max(k for k in known if k < n)
                above = min(k for k in known if k > n)
                v0, v1 = values[below], values[above]
                values[n] = v0 + (v1 - v0) * (n - below) / (above - below)  # type: ignore[operator]
        return values

    def table(self, num_sequences: int = 1) -> dict[int, dict[str, float | None]]:
        """Tokens per sequence -> seconds for reports: "measured" (the recent, decayed mean the policy
        reads), "mean" (of every measured step, with "steps" their number), "calibrated", "estimate"."""
        entries = self._buckets.get(batch_bucket(num_sequences))
        if entries is None:
            return {}
        return {
            n: {
                "measured": entries[n].measured,
                "mean": entries[n].all_seconds / entries[n].steps if entries[n].steps else None,
                "steps": entries[n].steps,
                "calibrated": entries[n].calibrated,
                "estimate": self.estimate(num_sequences, n),
            }
            for n in range(1, self.max_tokens_per_sequence + 1)
        }


def _check_seconds(seconds: float) -> None:
    if not seconds >= 0.0 or seconds == float("inf"):
        raise ValueError(f"seconds must be finite and >= 0, got {seconds}")
