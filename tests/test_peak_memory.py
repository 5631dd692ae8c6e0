"""tests/support/peak_memory: a command's peak RSS is its own, not the test process's."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tests.support.peak_memory import run_with_peak_rss

ALLOCATE = "import numpy as np; a = np.ones(300 * 2**20 // 8); print(a.sum() > 0)"


def test_a_command_that_touches_300_mb_reports_at_least_that(tmp_path: Path) -> None:
    done, peak_kib = run_with_peak_rss(
        [sys.executable, "-c", ALLOCATE], tmp_path / "rss", capture_output=True
    )
    assert done.returncode == 0 and done.stdout.strip() == b"True"
    assert peak_kib > 300 * 1024


def test_a_small_command_under_a_large_test_process_reports_its_own_size(tmp_path: Path) -> None:
    held = np.ones(600 * 2**20 // 8)  # the test process holds 600 MB while the command runs
    done, peak_kib = run_with_peak_rss([sys.executable, "-c", "pass"], tmp_path / "rss")
    assert done.returncode == 0 and held.sum() > 0
    assert 0 < peak_kib < 200 * 1024
