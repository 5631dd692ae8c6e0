"""The HTTP-vs-in-process bench runs both sides on the same prompts and reports a ratio per round."""

from __future__ import annotations

import re

import pytest

from research.bench import http_parity


def test_http_parity_interleaves_rounds_at_each_concurrency(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--draft-lengths",
        "0",
        "--clients",
        "1,2",
        "--rounds",
        "3",
        "--requests",
        "1",
        "--max-tokens",
        "8",
    ]
    assert http_parity.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [re.search(r"(\d+) client", line).group(1) for line in lines] == ["1", "2"]  # type: ignore[union-attr]
    for line in lines:
        ratios = re.search(r"per round ([\d. ]+), median", line).group(1).split()  # type: ignore[union-attr]
        assert len(ratios) == 3 and all(float(ratio) > 0 for ratio in ratios), line
        assert "CPU ms/token in-process" in line
        # Prefix caching is off on both sides by default, though the rounds repeat their prompts.
        assert "prompt tokens from the prefix cache in-process 0, HTTP 0" in line, line


def test_prefix_caching_is_on_in_both_engines_or_in_neither(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--draft-lengths", "0", "--clients", "1", "--rounds", "3", "--requests", "1", "--max-tokens", "4"]
    assert http_parity.main([*argv, "--prefix-caching"]) == 0
    line = capsys.readouterr().out.strip()
    cached = re.search(r"prefix cache in-process (\d+), HTTP (\d+)", line)
    assert cached is not None, line
    # Every round repeats the warm-up's prompt, so both engines find it cached.
    assert int(cached.group(1)) > 0 and int(cached.group(2)) > 0, line


def test_fewer_than_three_rounds_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        http_parity.main(["--rounds", "2"])
