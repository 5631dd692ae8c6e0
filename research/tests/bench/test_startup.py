"""The start-up measurements run on the demo pair: the compiled-model cache per model, and a real
`xpuspec serve` started, timed and asked three chat requests."""

from __future__ import annotations

import json

import pytest

from research.bench.startup import REPOSITORY, main

pytestmark = pytest.mark.slow


def test_the_cache_rows_say_which_models_load_back(capsys):
    assert main(["cache", "--bundle", "demo"]) == 0
    rows = dict(line.split(": ", 1) for line in capsys.readouterr().out.strip().splitlines())
    assert list(rows) == [
        "tokenizer",
        "detokenizer",
        "draft, paged",
        "target, paged",
        "target, stateful (unpaged)",
    ]
    assert rows["tokenizer"].endswith("(loaded)") and rows["target, stateful (unpaged)"].endswith("(loaded)")
    assert rows["target, paged"].endswith("(not loaded)")  # the reason no CACHE_DIR is set


def test_a_serve_round_times_the_start_and_the_first_requests(capsys, tmp_path):
    argv = ["serve", "--bundle", "demo", "--rounds", "1", "--max-tokens", "8", "--log", str(tmp_path / "log")]
    assert main(argv) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["source"] == str(REPOSITORY)
    assert row["ready_s"] > 0 and row["cpu_at_ready_s"] > 0 and row["rss_at_ready_mb"] > 0
    assert len(row["ttft_ms"]) == len(row["chunks_per_s"]) == 3


def test_bad_arguments_are_usage_errors(tmp_path):
    for argv in (["serve", "--rounds", "0"], ["serve", "--source", str(tmp_path)], ["warm"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
