"""The bench's cost: KV sizing from the requests, the estimate it states, and its refusal to start."""

from __future__ import annotations

from pathlib import Path

import pytest

from xpuspec.api.errors import EXIT_FAILED, CommandError
from xpuspec.bench.budget import kv_blocks, kv_tokens, mem_available, peak_rss_bytes, rss_bytes
from xpuspec.bench.config import QUICK, BenchConfig
from xpuspec.bench.suite import check_budget, run_estimate
from xpuspec.models.resolve import resolve_bundle


def test_kv_is_sized_to_the_longest_request_within_the_context() -> None:
    assert kv_tokens([[1] * 50, [1] * 100], max_tokens=16, max_draft=8, max_context=512) == 128
    assert kv_tokens([[1] * 600], max_tokens=16, max_draft=8, max_context=512) == 512
    assert kv_blocks(128) >= 2 * 128 // 16


def test_memory_is_read_from_proc() -> None:
    rss, peak, available = rss_bytes(), peak_rss_bytes(), mem_available()
    assert rss is not None and peak is not None and available is not None
    assert 0 < rss <= peak and available > 0


def test_a_quick_look_costs_less_than_the_full_bench(tmp_path: Path) -> None:
    bundle = resolve_bundle("demo")
    full = run_estimate(BenchConfig(out=tmp_path, bundle=Path(bundle.root)), bundle)
    quick = run_estimate(BenchConfig(out=tmp_path, bundle=Path(bundle.root), quick=True, **QUICK), bundle)
    assert quick.engines < full.engines
    assert quick.peak_bytes < full.peak_bytes and quick.seconds < full.seconds
    assert "about" in full.describe() and "GB" in full.describe()


def test_the_bench_refuses_to_start_without_the_memory_it_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = resolve_bundle("demo")
    config = BenchConfig(out=tmp_path, bundle=Path(bundle.root))
    with pytest.raises(CommandError) as refused:
        check_budget(config, bundle, available=64 * 1024**2)
    assert refused.value.exit_code == EXIT_FAILED and "--ignore-memory" in str(refused.value)
    assert "this run takes about" in capsys.readouterr().err
    cost = check_budget(config, bundle, ignore_memory=True, available=64 * 1024**2)
    assert cost.peak_bytes > 64 * 1024**2
    assert check_budget(config, bundle, available=cost.peak_bytes) == cost
