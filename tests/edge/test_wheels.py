"""The xpuspec wheel an edge archive ships: the package without the model weights it carries."""

from __future__ import annotations

import zipfile
from pathlib import Path

from xpuspec.edge.wheels import build_xpuspec_wheel


def test_the_edge_wheel_carries_no_model_files(tmp_path: Path) -> None:
    """The archive's bundle/ holds the served model, the default draft and head included: the wheel
    must not carry them a second time (nor the demo pair)."""
    wheel = build_xpuspec_wheel(tmp_path / "dist")
    with zipfile.ZipFile(wheel) as opened:
        names = opened.namelist()
    for folder in ("xpuspec/default_draft/", "xpuspec/default_eagle3/", "xpuspec/demo/bundle/"):
        assert not [name for name in names if name.startswith(folder)], folder
    assert "xpuspec/default_model.py" in names and "xpuspec/edge/verify_edge.py" in names
    assert wheel.stat().st_size < 5_000_000  # code only: the model folders are tens of MB
