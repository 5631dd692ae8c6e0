"""The latency section says each reason a row cannot run once on stderr, however many rows it stops."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from xpuspec.bench.config import BenchConfig
from xpuspec.bench.latency import _say_not_run
from xpuspec.bench.latency_rows import configurations


def test_each_reason_a_row_cannot_run_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A bundle without a draft model: every speculative row of every group shares one reason.
    model = SimpleNamespace(path=Path("/nowhere"), facts={})
    bundle = SimpleNamespace(target=model, draft=None, eagle3=None)
    config = BenchConfig(out=tmp_path, draft_lengths=(2, 4))
    configs, _ = configurations(config, bundle, lambda *args: None, {}, (None, None))  # type: ignore[arg-type]
    skipped = [row for row in configs if row.engine_key is None]
    no_draft = [row.result.name for row in skipped if row.result.reason == "the bundle has no draft model"]
    assert len(no_draft) > 2
    with caplog.at_level(logging.INFO, logger="xpuspec.bench.latency"):
        _say_not_run(configs)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == len({row.result.reason for row in skipped})
    said = [line for line in lines if "the bundle has no draft model" in line]
    assert len(said) == 1 and said[0].startswith("not run: the bundle has no draft model (")
    assert all(name in said[0] for name in no_draft)
    assert all("\n" not in line for line in lines)
