"""`xpuspec generate`: streams the text, then the speculation figures."""

from __future__ import annotations

import json

from xpuspec.cli import main


def test_streams_text_then_figures(pair_bundle, capsys):
    code = main(
        [
            "generate",
            "--bundle",
            str(pair_bundle),
            "def add(a, b):",
            "--max-tokens",
            "12",
            "--num-draft-tokens",
            "3",
            "--property",
            "INFERENCE_PRECISION_HINT=f32",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert out.startswith("def add(a, b):") and len(out) > len("def add(a, b):")
    assert "[draft drafter]" in err and "acceptance rate" in err and "tokens/s" in err


def test_no_draft_runs_the_target_alone_with_the_same_text(pair_bundle, capsys):
    args = [
        "generate",
        "--bundle",
        str(pair_bundle),
        "import os",
        "--max-tokens",
        "12",
        "--json",
        "--property",
        "INFERENCE_PRECISION_HINT=f32",
    ]
    assert main(args) == 0
    speculative = json.loads(capsys.readouterr().out)
    assert main(args + ["--no-draft"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["token_ids"] == speculative["token_ids"]
    assert alone["stats"]["drafted"] == 0


def test_bad_parameters_are_a_usage_error(pair_bundle, capsys):
    assert main(["generate", "--bundle", str(pair_bundle), "x", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err


def test_a_missing_bundle_is_named(tmp_path, capsys):
    assert main(["generate", "--bundle", str(tmp_path / "nope"), "x"]) == 2
    assert "nope" in capsys.readouterr().err
