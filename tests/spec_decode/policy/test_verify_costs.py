"""The verification cost table: calibrated shape, online load scale and corrections, robustness."""

from __future__ import annotations

import pytest

from xpuspec.spec_decode.policy.verify_costs import VerifyCostCurve, batch_bucket


def test_batch_buckets_are_powers_of_two() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 32]
    with pytest.raises(ValueError, match="num_sequences"):
        batch_bucket(0)


def test_an_empty_bucket_has_no_estimate() -> None:
    curve = VerifyCostCurve(9)
    assert curve.estimate(1, 3) is None
    curve.record(1, 3, 0.002)
    assert curve.estimate(2, 3) is None  # another batch shape
    assert curve.estimate(1, 10) is None  # beyond the table


def _calibrated(ms_by_size: dict[int, float]) -> VerifyCostCurve:
    curve = VerifyCostCurve(9)
    for n, ms in ms_by_size.items():
        curve.calibrate(1, n, ms / 1000)
    return curve


LINEAR = {n: 1.0 + 0.1 * n for n in range(1, 10)}


def test_the_calibrated_shape_is_non_decreasing_and_keeps_the_fastest_timing() -> None:
    curve = _calibrated({1: 1.0, 2: 1.5, 3: 1.2, 4: 1.6})
    curve.calibrate(1, 4, 0.5)  # a busy moment of the machine only slows a timing down: kept the min
    assert curve.estimates(1)[1:5] == pytest.approx([1e-3, 1.35e-3, 1.35e-3, 1.6e-3])
    assert curve.scale(1) is None  # no online step yet: the calibration itself


def test_the_online_load_scales_every_size_alike() -> None:
    """Steps at one size measure the machine's load and the engine's own work for all sizes: a cell
    measured a minute ago under another load is not comparable with one measured now."""
    curve = _calibrated(LINEAR)
    for _ in range(30):
        curve.record(1, 5, 2 * 1.5e-3)
    assert curve.scale(1) == pytest.approx(2.0, rel=0.01)
    assert curve.estimate(1, 1) == pytest.approx(2 * 1.1e-3, rel=0.01)
    assert curve.estimate(1, 9) == pytest.approx(2 * 1.9e-3, rel=0.01)
    # The load triples while the engine verifies 5 tokens: 1 token costs three times more too.
    for _ in range(60):
        curve.record(1, 5, 3 * 2 * 1.5e-3)
    assert curve.estimate(1, 1) > 2.5 * 2 * 1.1e-3
    assert curve.estimate(1, 1) / curve.estimate(1, 5) == pytest.approx(1.1 / 1.5, rel=0.25)


def test_a_size_that_costs_more_than_calibrated_learns_its_correction() -> None:
    curve = _calibrated(LINEAR)
    for _ in range(300):
        curve.record(1, 1, 1.1e-3)
        curve.record(1, 5, 1.5 * 1.5e-3)  # e.g. the real context makes 5 tokens dearer than at idle
    assert curve.estimate(1, 5) / curve.estimate(1, 1) == pytest.approx(1.5 * 1.5 / 1.1, rel=0.1)
    # A size never measured takes the correction interpolated between its measured neighbours.
    assert curve.estimate(1, 3) / curve.estimate(1, 1) == pytest.approx(1.3 * 1.25 / 1.1, rel=0.05)
    assert curve.estimate(1, 9) / curve.estimate(1, 5) == pytest.approx(1.9 / 1.5, rel=0.01)


def test_cells_neither_measured_nor_calibrated_are_interpolated_and_extrapolated() -> None:
    curve = VerifyCostCurve(9)
    curve.record(1, 2, 0.002)
    curve.record(1, 6, 0.004)
    assert curve.estimate(1, 4) == pytest.approx(0.003)
    assert curve.estimate(1, 8, slope=0.0005) == pytest.approx(0.005)
    assert curve.estimate(1, 8, slope=lambda: 0.001) == pytest.approx(0.006)
    assert curve.estimate(1, 1, slope=0.0005) == pytest.approx(0.0015)


def test_one_spike_is_clipped_but_a_lasting_slowdown_is_followed() -> None:
    curve = VerifyCostCurve(5, decay=0.9, outlier_factor=3.0)
    for _ in range(30):
        curve.record(1, 3, 0.001)
    curve.record(1, 3, 0.100)  # another process took the cores for one step
    assert curve.estimate(1, 3) < 0.0013
    for _ in range(40):
        curve.record(1, 3, 0.004)  # the machine got slower for good
    assert curve.estimate(1, 3) == pytest.approx(0.004, rel=0.05)
    table = curve.table(1)[3]
    assert table["steps"] == 71 and table["mean"] == pytest.approx((30 * 0.001 + 0.1 + 40 * 0.004) / 71)


def test_every_change_bumps_the_version_and_bad_input_is_refused() -> None:
    curve = VerifyCostCurve(4)
    before = curve.version
    curve.calibrate(1, 2, 0.001)
    curve.record(1, 2, 0.001)
    assert curve.version == before + 2
    with pytest.raises(ValueError, match="finite"):
        curve.record(1, 2, float("nan"))
    with pytest.raises(ValueError, match="decay"):
        VerifyCostCurve(4, decay=1.0)


def test_estimates_never_decrease_with_the_tokens_verified() -> None:
    curve = VerifyCostCurve(5)
    curve.record(1, 1, 0.003)
    curve.record(1, 2, 0.002)  # noise: two tokens measured cheaper than one
    curve.record(1, 4, 0.004)
    assert curve.estimates(1)[1:] == pytest.approx([0.003, 0.003, 0.003, 0.004, 0.004])
