"""The cost of a verification step as a function of the tokens verified per sequence, per batch shape.

A target pass over ``n`` tokens per sequence does not cost ``n`` times a single-token pass, nor the
same as one: on a CPU at batch 1 it is nearly flat for a large model (memory bound) and grows
steeply for a tiny one (the attention and the engine's per-token work dominate). A straight line
fitted mostly on single-token steps (and a prior) badly underestimated verifying γ + 1 tokens on the
demo pair, so adaptive γ drafted where it did not pay. This table keeps one estimate per (batch
shape, tokens per sequence) instead:

- ``calibrate`` fills its shape from timed target passes at idle (device and runner only; sizes
  interleaved, the fastest of the repeats kept, made non-decreasing in the tokens: verifying more
  never costs less);
- every pure decode step of the engine refreshes it online. A shared machine's load changes from
  one moment to the next and slows every size alike, so cells measured at different moments are
  not comparable; the online model is therefore ``scale · calibrated(n) · correction(n)``: one
  ``scale`` per batch shape, refreshed by every step whatever its size (the load and the engine's
  own work per step), and a ``correction(n)`` per size, learned over ~10 of its steps
  (:data:`CORRECTION_DECAY`), for what calibration missed
  (the real context length, the Python per verified token), each step judged against the current
  scale so that load changes do not leak into it;
- sizes never calibrated fall back to their measured mean, else are interpolated between the
  nearest known sizes (extrapolated beyond them with the caller's per-token slope).

Batch shapes are bucketed by the number of sequences (1, 2, 3-4, 5-8, ...): within a bucket the cost
is assumed to depend on the tokens per sequence only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

CORRECTION_DECAY = 0.9  # a size's correction to the calibrated shape: a memory of ~10 of its steps


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
    correction: float = 1.0  # measured over scale x calibrated shape (CORRECTION_DECAY)

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
        # Per bucket: decayed mean of measured / (calibrated shape x correction) over online steps.
        self._scale: dict[int, tuple[float, float]] = {}
        self._shapes: dict[int, tuple[int, list[float | None]]] = {}  # bucket -> (calibrations, shape)
        self._calibrations = 0
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
        self._calibrations += 1
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
        bucket = batch_bucket(num_sequences)
        shape = self._shape(bucket)[tokens_per_sequence]
        if shape is not None:
            scale = self.scale(num_sequences)
            ratio = seconds / (shape * cell.correction)
            if scale is not None and ratio > self.outlier_factor * scale:
                ratio = self.outlier_factor * scale
            weight, total = self._scale.get(bucket, (0.0, 0.0))
            self._scale[bucket] = (self.decay * weight + 1.0, self.decay * total + ratio)
            if scale is not None:  # the size's own deviation from the shape, judged at the current scale
                deviation = min(max(seconds / (scale * shape), 0.5), 2.0)
                cell.correction = CORRECTION_DECAY * cell.correction + (1 - CORRECTION_DECAY) * deviation
        self.version += 1

    def _shape(self, bucket: int) -> list[float | None]:
        """The calibrated seconds by size, made non-decreasing (pool adjacent violators)."""
        cached = self._shapes.get(bucket)
        if cached is not None and cached[0] == self._calibrations:
            return cached[1]
        entries = self._buckets.get(bucket)
        shape: list[float | None] = [None] * (self.max_tokens_per_sequence + 1)
        if entries is not None:
            calibrated = {n: entries[n].calibrated for n in range(1, len(entries))}
            sizes = [n for n, seconds in calibrated.items() if seconds is not None]
            blocks: list[list[float]] = []  # [sum, count] of pooled runs
            for seconds in calibrated.values():
                if seconds is None:
                    continue
                blocks.append([seconds, 1.0])
                while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                    total, count = blocks.pop()
                    blocks[-1][0] += total
                    blocks[-1][1] += count
            values = [total / count for total, count in blocks for _ in range(int(count))]
            for n, value in zip(sizes, values, strict=True):
                shape[n] = value
        self._shapes[bucket] = (self._calibrations, shape)
        return shape

    def scale(self, num_sequences: int) -> float | None:
        """Measured over calibrated seconds in this bucket, recently (None before any online step)."""
        weight, total = self._scale.get(batch_bucket(num_sequences), (0.0, 0.0))
        return total / weight if weight > 0 else None

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
        shape = self._shape(batch_bucket(num_sequences))
        scale = self.scale(num_sequences) or 1.0
        values: list[float | None] = [None] * width
        known: dict[int, float] = {}  # the sizes measured or calibrated, ascending
        corrections = _corrections(entries, shape)
        for n in range(1, width):
            cell = entries[n]
            calibrated = shape[n]
            if calibrated is not None:
                value = scale * calibrated * corrections[n]
            elif cell.weight > 0:
                value = cell.total / cell.weight
            else:
                continue
            values[n] = known[n] = value
        if not known:
            return values
        if len(known) == width - 1:
            return _non_decreasing(values)
        per_token = slope() if callable(slope) else slope
        first, last = min(known), max(known)
        for n in range(1, width):
            if n in known:
                continue
            if n < first:
                values[n] = max(known[first] + per_token * (n - first), 0.0)
            elif n > last:
                values[n] = max(known[last] + per_token * (n - last), 0.0)
            else:
                below = max(k for k in known if k < n)
                above = min(k for k in known if k > n)
                v0, v1 = known[below], known[above]
                values[n] = v0 + (v1 - v0) * (n - below) / (above - below)
        return _non_decreasing(values)

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


def _corrections(entries: list[_Entry], shape: list[float | None]) -> list[float]:
    """Each calibrated size's correction; a size never measured online takes the one interpolated
    between the nearest measured sizes (the nearest beyond them): scale and corrections are only
    known up to a common factor, which the measured sizes pin down for their neighbours."""
    measured = [n for n in range(1, len(entries)) if entries[n].steps and shape[n] is not None]
    corrections = [entries[n].correction for n in range(len(entries))]
    if not measured:
        return corrections
    for n in range(1, len(entries)):
        if entries[n].steps or shape[n] is None:
            continue
        below = [k for k in measured if k < n]
        above = [k for k in measured if k > n]
        if below and above:
            k0, k1 = below[-1], above[0]
            c0, c1 = corrections[k0], corrections[k1]
            corrections[n] = c0 + (c1 - c0) * (n - k0) / (k1 - k0)
        else:
            corrections[n] = corrections[below[-1] if below else above[0]]
    return corrections


def _non_decreasing(values: list[float | None]) -> list[float | None]:
    """Verifying more tokens never costs less: a size's estimate is at least every smaller one's (the
    per-size corrections are noisy, and a γ must not look cheaper than γ = 0 by noise)."""
    highest = 0.0
    for n, value in enumerate(values):
        if value is not None:
            highest = max(highest, value)
            values[n] = highest
    return values


def _check_seconds(seconds: float) -> None:
    if not seconds >= 0.0 or seconds == float("inf"):
        raise ValueError(f"seconds must be finite and >= 0, got {seconds}")
