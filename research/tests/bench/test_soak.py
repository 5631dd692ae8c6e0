"""The soak's pieces: its summary of samples and status counts, its report, and a short real run of
every kind of client against `xpuspec serve` on the demo pair."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from research.bench.soak import (
    KindCounts,
    Sample,
    main,
    markdown,
    rss_by_kind,
    rss_mb,
    sample_at,
    status_class,
    summarize,
)
from research.bench.soak_traffic import HOSTILE, KINDS


def samples(rss: list[float], step_s: float = 60.0) -> list[Sample]:
    return [Sample(index * step_s, value, 0, 0) for index, value in enumerate(rss)]


def test_status_classes() -> None:
    assert [status_class(code) for code in (200, 403, 415, 503, 0)] == ["2xx", "4xx", "4xx", "5xx", "none"]


def test_a_sample_is_read_at_or_before_its_minute_and_never_past_the_run() -> None:
    run = samples([100, 110, 120])  # at 0, 60 and 120 s
    assert sample_at(run, 60).rss_mb == 110  # type: ignore[union-attr]
    assert sample_at(run, 90).rss_mb == 110  # type: ignore[union-attr]
    assert sample_at(run, 600) is None  # the run ended at 2 minutes
    assert sample_at([], 0) is None


def test_the_summary_reads_rss_growth_errors_and_kv_after() -> None:
    run = samples([500, 700, *([800] * 9), *([820] * 20), 830])  # minute 10: 800, end (minute 31): 830
    counts = {name: KindCounts() for name in ("openai plain", "hostile", "health")}
    counts["openai plain"].record(200, 1.0)
    counts["openai plain"].record(503, 1.0)
    counts["hostile"].record(403, 0.1)
    counts["hostile"].record(0, 0.1)
    counts["health"].record(200, 0.02)
    counts["health"].transport_errors["ConnectError"] += 1
    summary = summarize(run, counts, 60.0, {"kv_blocks_used_after": 0})
    assert summary["rss_at_ready_mb"] == 500 and summary["rss_after_warmup_mb"] == 700
    assert summary["rss_at_minute_mb"] == {"1": 700, "5": 800, "10": 800, "20": 820, "30": 820}
    assert summary["rss_growth_minute_10_to_end_pct"] == pytest.approx(3.8)
    assert summary["responses_5xx"] == 1 and summary["hostile_accepted"] == 0
    assert summary["transport_errors"] == 1 and summary["requests"] == 5
    assert summary["kv_blocks_used_after"] == 0
    table = markdown(summary, counts, "python -m research.bench.soak")
    assert "| responses_5xx | 1 |" in table and "| openai plain | 2xx: 1, 5xx: 1 | 0 |" in table


def test_rss_by_kind_adds_up_to_the_processs_rss() -> None:
    kinds = rss_by_kind(os.getpid())
    assert {"files", "anon"} <= set(kinds)
    assert sum(kinds.values()) == pytest.approx(rss_mb(os.getpid()), rel=0.1)


def test_every_kind_of_client_is_in_the_mix() -> None:
    assert set(KINDS) == {"openai plain", "openai streamed", "early disconnect", "ollama", "structured",
                          "hostile", "health"}  # fmt: skip
    assert {"foreign host", "cross-origin text/plain", "half-open connection"} <= set(HOSTILE)
    assert len(HOSTILE) >= 16


@pytest.mark.slow
def test_a_short_soak_gets_no_5xx_and_leaves_the_kv_cache_idle(tmp_path: Path, capsys) -> None:
    main(["--bundle", "demo", "--minutes", "0.3", "--interval", "2", "--warmup-minutes", "0.1",
          "--out", str(tmp_path)])  # fmt: skip
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["responses_5xx"] == 0 and summary["hostile_accepted"] == 0
    assert summary["transport_errors"] == 0
    assert summary["kv_blocks_used_after"] == 0 and summary["in_flight_after"] == 0
    assert summary["exit_code"] == 0
    report = json.loads((tmp_path / "soak.json").read_text())
    statuses = {name: Counter(kind["statuses"]) for name, kind in report["kinds"].items()}
    for name in ("openai plain", "openai streamed", "ollama", "structured", "health"):
        assert statuses[name]["2xx"] > 0, (name, statuses[name])
    assert statuses["hostile"]["4xx"] > 0 and len(report["samples"]) >= 3
    assert len(report["memory_log"]) == 1 and "memory budget" in report["memory_log"][0]
    assert (tmp_path / "soak.md").read_text().startswith("# Soak of `xpuspec serve`")
