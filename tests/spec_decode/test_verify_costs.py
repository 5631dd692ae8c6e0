"""The verification cost table: calibration, online refresh, the overhead over calibration, robustness."""

from __future__ import annotations

import pytest

from xpuspec.spec_decode.verify_costs import VerifyCostCurve, batch_bucket


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


def test_measured_cells_win_and_calibrated_cells_carry_the_measured_overhead() -> None:
    curve = VerifyCostCurve(9)
    for n in range(1, 10):
        curve.calibrate(1, n, 0.001 + 0.0001 * n)
    assert curve.estimate(1, 5) == pytest.approx(0.0015)
    # Online steps at 1 and 2 tokens cost 0.3 ms more than calibration (the engine's own work).
    for _ in range(20):
        curve.record(1, 1, 0.0011 + 0.0003)
        curve.record(1, 2, 0.0012 + 0.0003)
    assert curve.overhead(1) == pytest.approx(0.0003)
    assert curve.estimate(1, 1) == pytest.approx(0.0014)
    assert curve.estimate(1, 9) == pytest.approx(0.0019 + 0.0003)  # never measured online
    # The calibration keeps its fastest timing (a busy moment of the machine only slows one down).
    curve.calibrate(1, 9, 0.5)
    assert curve.estimate(1, 9) == pytest.approx(0.0022)


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
