"""The pinned runtime requirements of an xpuspec wheel, and the marker environment of a target platform.

The pins are the versions installed here (where xpuspec's tests pass): the closure of the wheel's
``Requires-Dist`` without extras, walked through the installed distributions' metadata.
"""

from __future__ import annotations

import logging
import sys
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

logger = logging.getLogger(__name__)

# The conversion stack: an edge device never installs it. Finding one in the closure is a packaging bug.
CONVERSION_ONLY = frozenset({"torch", "transformers", "optimum", "optimum-intel", "nncf", "torchvision"})


@dataclass(frozen=True)
class PinnedRequirement:
    """One line of requirements.txt: ``name==version`` (or the parent's specifier when not installed here)."""

    name: str
    specifier: str
    marker: str | None = None

    def line(self) -> str:
        return f"{self.name}{self.specifier}" + (f"; {self.marker}" if self.marker else "")

    def applies_to(self, environment: dict[str, str]) -> bool:
        return self.marker is None or Marker(self.marker).evaluate(environment)


def wheel_requirements(wheel: Path) -> tuple[str, str, list[Requirement]]:
    """(name, version, Requires-Dist) read from a built wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise ValueError(f"{wheel}: not a wheel (found {len(names)} METADATA files)")
        headers = HeaderParser().parsestr(archive.read(names[0]).decode("utf-8"))
    requirements = [Requirement(text) for text in headers.get_all("Requires-Dist") or []]
    return headers["Name"], headers["Version"], requirements


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _installed_requirements(name: str) -> list[Requirement]:
    return [Requirement(text) for text in metadata.requires(name) or []]


def _needed_somewhere(requirement: Requirement, environments: list[dict[str, str]]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**env, "extra": ""}) for env in environments)


def pin_runtime_requirements(
    roots: list[Requirement], environments: list[dict[str, str]]
) -> list[PinnedRequirement]:
    """The closure of ``roots`` (extras left out) needed on any of ``environments``, pinned.

    A package installed here is pinned to its version here; one the local machine does not need
    (e.g. colorama on Windows) keeps its parent's specifier. A package reached only through a
    marker keeps that marker, so one requirements.txt serves every target.
    """
    pinned: dict[str, PinnedRequirement] = {}
    queue: list[tuple[Requirement, str | None]] = [(r, None) for r in roots]
    while queue:
        requirement, inherited_marker = queue.pop(0)
        if not _needed_somewhere(requirement, environments):
            continue
        name = canonicalize_name(requirement.name)
        if name in CONVERSION_ONLY:
            raise ValueError(
                f"{requirement} reached the runtime requirements; the conversion stack must stay in the "
                "'convert' extra of pyproject.toml"
            )
        marker = str(requirement.marker) if requirement.marker is not None else inherited_marker
        if name in pinned:
            if pinned[name].marker is not None and marker is None:
                pinned[name] = PinnedRequirement(pinned[name].name, pinned[name].specifier, None)
            continue
        version = _installed_version(requirement.name)
        if version is None:
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                raise ValueError(
                    f"{requirement.name} is required but not installed here; install xpuspec's runtime "
                    "requirements into this environment first (pip install -e .)"
                )
            logger.info("%s is not installed here; listed with its specifier for the other targets", name)
            pinned[name] = PinnedRequirement(name, str(requirement.specifier), marker)
            continue
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            raise ValueError(
                f"installed {requirement.name} {version} does not satisfy {requirement}; "
                "fix this environment before packaging it"
            )
        pinned[name] = PinnedRequirement(name, f"=={version}", marker)
        for child in _installed_requirements(requirement.name):
            queue.append((child, marker))
    return sorted(pinned.values(), key=lambda p: p.name)


def requirements_text(pins: list[PinnedRequirement], header: str) -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    return "\n".join(lines + [pin.line() for pin in pins]) + "\n"


def current_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"
