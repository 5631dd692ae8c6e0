"""Pinned runtime requirements and target platforms."""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement

from xpuspec.edge.archive import EdgeConfig
from xpuspec.edge.platforms import group_targets, target_environment
from xpuspec.edge.requirements import CONVERSION_ONLY, pin_runtime_requirements

LOCAL = [target_environment(None, None)]


def test_closure_is_pinned_to_installed_versions() -> None:
    from importlib import metadata

    pins = {pin.name: pin for pin in pin_runtime_requirements([Requirement("flask>=3.0")], LOCAL)}
    assert pins["flask"].specifier == f"=={metadata.version('flask')}"
    assert {"werkzeug", "jinja2", "markupsafe", "click"} <= set(pins)  # reached through flask


def test_extras_and_foreign_markers_are_left_out_here() -> None:
    roots = [
        Requirement("flask"),
        Requirement("torch; extra == 'convert'"),
        Requirement("pywin32; os_name == 'nt'"),
    ]
    names = {pin.name for pin in pin_runtime_requirements(roots, LOCAL)}
    assert "torch" not in names and "pywin32" not in names and "flask" in names


def test_a_windows_only_requirement_keeps_its_marker_for_a_windows_target() -> None:
    windows = target_environment(group_targets(["win_amd64"])[0], "3.11")
    pins = pin_runtime_requirements([Requirement("pywin32>=300; os_name == 'nt'")], LOCAL + [windows])
    assert [pin.line() for pin in pins] == ['pywin32>=300; os_name == "nt"']
    assert pins[0].applies_to(windows) and not pins[0].applies_to(LOCAL[0])


@pytest.mark.parametrize("name", sorted(CONVERSION_ONLY))
def test_the_conversion_stack_never_reaches_the_runtime(name: str) -> None:
    with pytest.raises(ValueError, match="convert"):
        pin_runtime_requirements([Requirement(name)], LOCAL)


def test_linux_tags_expand_to_older_glibc_and_group_per_target() -> None:
    targets = group_targets(["manylinux_2_28_x86_64", "manylinux2014_x86_64", "win_amd64"])
    assert [t.name for t in targets] == ["manylinux_2_28_x86_64", "win_amd64"]
    linux = targets[0].tags
    assert (
        "manylinux_2_17_x86_64" in linux and "manylinux2014_x86_64" in linux and "manylinux1_x86_64" in linux
    )
    assert target_environment(targets[1], "3.12")["platform_system"] == "Windows"
    assert target_environment(targets[0], "3.12")["python_version"] == "3.12"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"platforms": ["amiga_68k"], "include_wheels": True}, "unknown --platform"),
        ({"python_version": "3", "include_wheels": True}, "MAJOR.MINOR"),
        ({"platforms": ["win_amd64"]}, "add --wheels"),
        ({"root_name": "../up"}, "plain name"),
    ],
)
def test_config_errors_are_actionable(kwargs: dict, message: str, tmp_path) -> None:
    with pytest.raises(ValueError, match=message):
        EdgeConfig(output=tmp_path / "edge.tar.gz", **kwargs)


def test_output_must_be_a_tar_gz(tmp_path) -> None:
    with pytest.raises(ValueError, match="tar.gz"):
        EdgeConfig(output=tmp_path / "edge.zip")
