"""The drafting-pass timer runs on the demo pair, whole and cut vocabularies, and says what it timed."""

from __future__ import annotations

import pytest

from research.bench.draft_pass import main


def test_prints_one_line_per_vocabulary(capsys):
    assert main(["--bundle", "demo", "--vocab", "0,1000", "--steps", "2", "--rounds", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].strip().startswith("whole vocabulary") and "ids below 1000" in lines[1]
    assert all("ms median; rounds" in line and len(line.split("rounds")[1].split()) == 2 for line in lines)


def test_bad_arguments_are_usage_errors(tmp_path):
    for argv in (
        ["--vocab", "x"],
        ["--steps", "0"],
        ["--bundle", str(tmp_path / "none")],
        ["--bundle", "demo", "--property", "KV_CACHE_PRECISION=i64"],  # OpenVINO refuses to compile
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
