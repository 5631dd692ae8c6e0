"""The shape-change timer runs on the demo pair's target and prints its patterns and the change."""

from __future__ import annotations

import pytest

from research.bench.shape_change import main


def test_prints_each_pattern_and_the_cost_of_a_change(capsys):
    assert main(["--bundle", "demo", "--tokens", "1,3", "--steps", "2", "--rounds", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = [line.split(":")[0].strip() for line in lines]
    assert names == [
        "1 steady",
        "3 steady",
        "1/3 alternating",
        "1 padded to 3",
        "1/3 alternating, decode lane",
        "a change of count",
        "with a decode lane",
    ]
    assert all(len(line.split("per round")[1].split()) == 2 for line in lines[:5])
    assert all(float(line.split(":")[1].split()[0]) > 0 for line in lines[:5])


def test_without_one_token_passes_there_is_no_decode_lane_pattern(capsys):
    assert main(["--bundle", "demo", "--tokens", "2,3", "--steps", "2", "--rounds", "1"]) == 0
    assert "decode lane" not in capsys.readouterr().out


def test_bad_arguments_are_usage_errors(tmp_path):
    bad = (["--tokens", "x"], ["--tokens", "5,1"], ["--steps", "1"], ["--bundle", str(tmp_path / "none")])
    for argv in bad:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
