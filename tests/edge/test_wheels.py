"""The xpuspec wheel an edge archive ships: the package without the model weights it carries."""

from __future__ import annotations

import zipfile
from pathlib import Path

from xpuspec.edge.wheels import build_xpuspec_wheel


def test_the_edge_wheel_carries_the_demo_pair_but_not_the_default_draft_and_head(tmp_path: Path) -> None:
    """The archive's bundle/ holds the served model, the default draft and head included: the wheel
    must not carry them a second time. The small demo pair stays, so `--bundle demo` works anywhere."""
    wheel = build_xpuspec_wheel(tmp_path / "dist")
    with zipfile.ZipFile(wheel) as opened:
        names = opened.namelist()
    for folder in ("xpuspec/models/default_draft/", "xpuspec/models/default_eagle3/"):
        assert not [name for name in names if name.startswith(folder)], folder
    assert "xpuspec/models/demo/bundle/xpuspec.json" in names
    assert "xpuspec/models/default_model.py" in names and "xpuspec/edge/verify_edge.py" in names
    assert wheel.stat().st_size < 20_000_000  # code and the demo pair; with the default draft and head 50 MB
