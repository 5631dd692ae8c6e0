"""The threads comparison runs each configuration in its own process on the demo pair and reports ratios
to the plugin defaults of the same round and load."""

from __future__ import annotations

import json

import pytest

from research.bench.threads import main


def test_every_configuration_and_load_is_run_and_compared_with_the_defaults(tmp_path, capsys):
    out = tmp_path / "threads.json"
    argv = ["--bundle", "demo", "--rounds", "1", "--prompts", "1", "--max-tokens", "8"]
    assert main([*argv, "--configs", "default,both-1", "--loads", "quiet,busy", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {(run["config"], run["load"]) for run in report["runs"]} == {
        (config, load) for config in ("default", "both-1") for load in ("quiet", "busy")
    }
    assert all(run["target-only"] > 0 and run["speculative"] > 0 for run in report["runs"])
    assert report["ratios"]["default / quiet"]["speculative"]["vs_default"] == pytest.approx(1.0)
    assert report["ratios"]["both-1 / busy"]["target-only"]["vs_default_by_round"][0] > 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 4


def test_the_defaults_must_be_among_the_configurations():
    with pytest.raises(SystemExit):
        main(["--configs", "both-1"])
