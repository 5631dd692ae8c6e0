"""`python -m xpuspec.bench.parity`: one compile per engine, interleaved rounds, the ratios printed."""

from __future__ import annotations

import re

import pytest

from xpuspec.bench import parity

pytestmark = pytest.mark.slow


def _run(capsys, *arguments: str) -> list[str]:
    """Run the command on the 2-layer pair, 1 prompt x 4 tokens; return its printed lines."""
    assert parity.main(["--bundle", "demo", "--prompts", "1", "--max-tokens", "4", *arguments]) == 0
    return capsys.readouterr().out.strip().splitlines()


def test_parity_prints_both_engines_and_their_ratios_per_draft_length(capsys):
    lines = _run(capsys, "--draft-lengths", "0,2", "--rounds", "2")
    assert [line.split(":")[0] for line in lines] == ["target-only", "γ=2"]
    for line in lines:
        match = re.search(
            r"xpuspec ([\d.]+) tokens/s, GenAI ([\d.]+) \(best of 2\); "
            r"÷ GenAI best ([\d.]+), median round ([\d.]+)",
            line,
        )
        assert match and all(float(value) > 0 for value in match.groups()), line


def test_parity_default_compares_adaptive_with_genai_as_it_comes(capsys):
    lines = _run(capsys, "--default", "--draft-lengths", "2", "--rounds", "1")
    assert [line.split(":")[0] for line in lines] == [
        "xpuspec adaptive vs GenAI target-only",
        "xpuspec adaptive vs GenAI γ=2",
    ]


def test_parity_rejects_bad_counts():
    with pytest.raises(SystemExit):
        parity.main(["--rounds", "0"])
