"""`xpuspec bench --quick`: the rows of a quick look, engines compiled a pair at a time, and the peak
resident memory of the whole run (measured on the demo pair: the default model takes minutes on CI)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.peak_memory import run_with_peak_rss
from xpuspec.bench.config import QUICK, BenchConfig
from xpuspec.bench.latency_labels import GENAI, XPUSPEC
from xpuspec.bench.latency_rows import configurations
from xpuspec.bench.quick import engine_groups, quick_rows
from xpuspec.models.resolve import resolve_bundle

QUICK_LATENCY_NAMES = [
    "xpuspec target-only",
    "xpuspec speculative (γ=2)",
    "xpuspec speculative (γ=4)",
    "xpuspec speculative (adaptive γ)",
    "xpuspec exact target-only",
    "OpenVINO GenAI target-only",
    "OpenVINO GenAI speculative (γ=2)",
    "OpenVINO GenAI speculative (γ=4)",
]
QUICK_LOAD_NAMES = [
    "xpuspec server speculative (adaptive γ)",
    "xpuspec server speculative (γ=4)",
    "OpenVINO GenAI CB speculative (γ=4)",
]
# Peak resident memory of any one process of `bench --quick --bundle demo` (the bench, its server).
# Every engine of a round held at once took the bench past 900 MB on the demo pair; a pair at a time
# stays far below (figures: docs/bench-cost.md).
PEAK_RSS_BOUND_MB = 512


def test_a_quick_look_keeps_the_same_properties_rows_and_pairs_each_engine_with_its_peer(
    tmp_path: Path,
) -> None:
    bundle = resolve_bundle("demo")
    config = BenchConfig(out=tmp_path, bundle=Path(bundle.root), quick=True, **QUICK)
    configs, engines = configurations(config, bundle, lambda *args: None, {}, (None, None))
    rows, kept = quick_rows(configs, engines)
    names = [row.result.name for row in rows]
    assert sorted(names) == sorted(QUICK_LATENCY_NAMES), names
    assert len(kept) < len(engines)
    for round_index in (0, 1):
        groups = engine_groups(kept, round_index)
        assert sorted(e.key for group in groups for e in group) == sorted(kept)
        pairs = [sorted(e.family for e in group) for group in groups if len(group) == 2]
        # target-only and the draft engine each beside GenAI's; adaptive and exact alone
        assert pairs == [sorted([XPUSPEC, GENAI])] * 2 and len(groups) == 4
        first = [group[0].family for group in groups if len(group) == 2]
        assert first == [XPUSPEC, XPUSPEC] if round_index == 0 else first == [GENAI, GENAI]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    out = tmp_path_factory.mktemp("quick")
    command = [sys.executable, "-m", "xpuspec.cli", "bench", "--bundle", "demo", "--quick", "--out", str(out)]
    done, maxrss_kib = run_with_peak_rss(
        command, out.parent / "peak-rss", capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out, maxrss_kib, done.stderr


@pytest.mark.slow
def test_quick_bench_stays_within_its_memory_bound(quick_run: tuple[Path, int, str]) -> None:
    _, maxrss_kib, stderr = quick_run
    assert maxrss_kib / 1024 <= PEAK_RSS_BOUND_MB, maxrss_kib
    # It said its estimate before it started.
    assert "xpuspec bench: this run takes about" in stderr.splitlines()[0]


@pytest.mark.slow
def test_quick_bench_reports_the_quick_rows(quick_run: tuple[Path, int, str]) -> None:
    out, _, _ = quick_run
    report: dict[str, Any] = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["settings"]["quick"] is True
    latency = {row["name"]: row for row in report["latency"]["configurations"]}
    assert sorted(latency) == sorted(QUICK_LATENCY_NAMES)
    for name in QUICK_LATENCY_NAMES[:5]:
        assert latency[name]["status"] == "ok", latency[name].get("reason")
    assert sorted(row["name"] for row in report["load"]["configurations"]) == sorted(QUICK_LOAD_NAMES)
    assert "structured" not in report
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "--quick: a quick look" in markdown
