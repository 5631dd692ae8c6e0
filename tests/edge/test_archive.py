"""`xpuspec bundle`: one progress line per stage, and the names `xpuspec serve` answers in edge.json."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xpuspec.cli import main
from xpuspec.edge import verify_archive


def test_bundle_says_each_stage_once_and_names_the_model_as_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "edge.tar.gz"
    assert main(["bundle", "demo", "-o", str(archive)]) == 0
    out, err = capsys.readouterr()
    stages = err.splitlines()
    assert len(stages) == 3, err  # not a tty: each stage once, when it ends
    for number, (line, what) in enumerate(
        zip(
            stages,
            ["building the xpuspec wheel", "pinning the runtime requirements", "writing and verifying"],
            strict=True,
        ),
        start=1,
    ):
        assert re.fullmatch(rf"\[{number}/3\] {what}.* \.\.\. \d+\.\ds", line), line
    assert out.startswith(f"wrote {archive}: ") and "no wheelhouse" in out
    assert verify_archive(archive).manifest["bundle"] == {
        "path": "bundle",
        "name": "xpuspec-demo",
        "aliases": ["demo"],
    }
