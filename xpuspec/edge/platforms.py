"""Target platforms of a wheelhouse: wheel platform tags grouped into targets, and their marker values.

pip evaluates markers against the machine it runs on even with ``--platform``, so the marker
environment of each target is built here. One target may need several tags (a glibc 2.28 Linux
installs manylinux_2_28 and every older manylinux wheel), which pip takes as repeated ``--platform``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WINDOWS = {"sys_platform": "win32", "platform_system": "Windows", "os_name": "nt"}
_LINUX = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}
_MACOS = {"sys_platform": "darwin", "platform_system": "Darwin", "os_name": "posix"}
_WINDOWS_MACHINES = {"win_amd64": "AMD64", "win32": "x86", "win_arm64": "ARM64"}
_LINUX_MACHINES = ("x86_64", "aarch64", "i686", "ppc64le", "s390x", "armv7l")
# Legacy manylinux names and the glibc minor version each stands for.
_LEGACY_MANYLINUX = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
_EXAMPLES = (
    "manylinux_2_28_x86_64, manylinux2014_x86_64, manylinux_2_28_aarch64, win_amd64 or macosx_11_0_arm64"
)


@dataclass(frozen=True)
class TargetPlatform:
    """One device kind: its OS, machine and every wheel platform tag its installer accepts."""

    system: str  # "Linux" | "Windows" | "Darwin"
    machine: str
    tags: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.tags[0]


def _parse(tag: str) -> tuple[str, str, list[str]]:
    """(system, machine, compatible tags) of one wheel platform tag; raises ValueError if unknown."""
    if tag in _WINDOWS_MACHINES:
        return "Windows", _WINDOWS_MACHINES[tag], [tag]
    machines = "|".join(_LINUX_MACHINES)
    manylinux = re.fullmatch(rf"(manylinux_2_(\d+)|manylinux2014|manylinux2010|manylinux1)_({machines})", tag)
    if manylinux:
        machine = manylinux.group(3)
        glibc_minor = int(manylinux.group(2)) if manylinux.group(2) else _LEGACY_MANYLINUX[manylinux.group(1)]
        # An installer on glibc 2.N accepts every wheel built for an older glibc.
        tags = [f"manylinux_2_{minor}_{machine}" for minor in range(glibc_minor, 4, -1)]
        tags += [f"{legacy}_{machine}" for legacy, minor in _LEGACY_MANYLINUX.items() if minor <= glibc_minor]
        return "Linux", machine, [tag] + [t for t in tags if t != tag]
    if tag.startswith("linux_") and tag[len("linux_") :] in _LINUX_MACHINES:
        return "Linux", tag[len("linux_") :], [tag]
    macos = re.fullmatch(r"macosx_\d+_\d+_(\w+)", tag)
    if macos:
        return "Darwin", macos.group(1), [tag]
    raise ValueError(f"unknown --platform {tag!r}; use a wheel platform tag such as {_EXAMPLES}")


def group_targets(tags: list[str]) -> list[TargetPlatform]:
    """Tags grouped by (OS, machine): each group is one target and gets one pip download."""
    groups: dict[tuple[str, str], list[str]] = {}
    for tag in tags:
        system, machine, compatible = _parse(tag)
        group = groups.setdefault((system, machine), [])
        group.extend(t for t in compatible if t not in group)
    return [TargetPlatform(system, machine, tuple(group)) for (system, machine), group in groups.items()]


def target_environment(target: TargetPlatform | None, python_version: str | None) -> dict[str, str]:
    """The PEP 508 marker values of ``target`` (None: this machine) running ``python_version``."""
    from packaging.markers import default_environment

    environment = {key: str(value) for key, value in default_environment().items()}
    if python_version is not None:
        if not re.fullmatch(r"3\.\d+", python_version):
            raise ValueError(f"--python-version takes MAJOR.MINOR such as 3.11, got {python_version!r}")
        environment["python_version"] = python_version
        environment["python_full_version"] = f"{python_version}.0"
    if target is not None:
        environment.update({"Linux": _LINUX, "Windows": _WINDOWS, "Darwin": _MACOS}[target.system])
        environment["platform_machine"] = target.machine
    return environment
