"""`xpuspec bench --mode multiturn` on the tiny pair: the report's structure, never its timings."""

from __future__ import annotations

import json
from pathlib import Path

from xpuspec.bench.multiturn import ENGINES
from xpuspec.cli import main


def test_multiturn_reports_every_turn_and_user_for_each_engine(pair_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "mt"
    argv = ["bench", "--mode", "multiturn", "--bundle", str(pair_bundle), "--rounds", "1", "--turns", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    result = json.loads((out / "multiturn.json").read_text(encoding="utf-8"))
    settings = result["settings"]
    turns = settings["turn_prompt_tokens"]
    assert len(turns) == 2 and turns[0] < turns[1]
    assert len(settings["user_prompt_tokens"]) == 16
    assert all(n > settings["system_tokens"] for n in settings["user_prompt_tokens"])
    assert set(result["engines"]) <= set(ENGINES) and set(ENGINES[:2]) <= set(result["engines"])
    for figures in result["engines"].values():
        assert len(figures["turn_ttft_ms"]) == 2 and all(ms > 0 for ms in figures["turn_ttft_ms"])
        assert figures["users_total_ttft_ms"] > 0
    assert result["users_ttft_drop"] > 0
    markdown = (out / "multiturn.md").read_text(encoding="utf-8")
    assert all(name in markdown for name in result["engines"])
