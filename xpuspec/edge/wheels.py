"""Building the xpuspec wheel from the source tree and downloading a wheelhouse with pip."""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from xpuspec.edge.platforms import TargetPlatform, target_environment
from xpuspec.edge.requirements import PinnedRequirement

logger = logging.getLogger(__name__)

# What a wheel build needs from the checkout; copied aside so the build leaves the tree untouched
# (setuptools writes build/ and *.egg-info next to pyproject.toml).
SOURCE_ENTRIES = ("pyproject.toml", "README.md", "LICENSE", "xpuspec", "plugins")
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache", ".ruff_cache")


class PackagingError(Exception):
    """pip failed, or the source tree needed for the wheel is not there."""


def source_root() -> Path:
    """The checkout this xpuspec was imported from (the folder holding pyproject.toml)."""
    import xpuspec

    root = Path(xpuspec.__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file():
        raise PackagingError(
            f"xpuspec is imported from {root}, which is not a source checkout (no pyproject.toml); "
            "pass --xpuspec-wheel with a built wheel instead"
        )
    return root


def _run_pip(arguments: list[str], what: str) -> None:
    command = [sys.executable, "-m", "pip", *arguments]
    logger.debug("running %s", " ".join(command))
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
        raise PackagingError(f"{what} failed (pip exit {result.returncode}):\n{tail}")


def _setuptools_is_recent() -> bool:
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    major = int(version.split(".", 1)[0])
    return major >= 77


# Model weights the package carries that an archive's bundle holds again, by folder under the
# checkout: the default model's draft and EAGLE-3 head (its cached bundle holds both). The demo pair
# (a few MB) stays: `--bundle demo` works on every edge box and image, as the package promises.
MODEL_DATA = (("xpuspec", "models", "default_draft"), ("xpuspec", "models", "default_eagle3"))


def build_xpuspec_wheel(
    output_dir: Path, root: Path | None = None, *, include_model_data: bool = False
) -> Path:
    """``pip wheel --no-deps`` of a copy of the source tree into ``output_dir``; returns the wheel.

    The model weights the package carries (:data:`MODEL_DATA`) are left out unless asked for: an edge
    archive ships the bundle it serves, draft and head included, under bundle/, and the launcher
    always names it, so a second copy inside the wheel would only double the archive's model files.
    """
    root = root or source_root()
    left_out = {(root.joinpath(*parts[:-1]).resolve(), parts[-1]) for parts in MODEL_DATA}

    def ignore(folder: str, names: list[str]) -> set[str]:
        ignored = set(_IGNORED(folder, names))
        if not include_model_data:
            here = Path(folder).resolve()
            ignored |= {name for parent, name in left_out if parent == here and name in names}
        return ignored

    output_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xpuspec-src-") as scratch:
        copy = Path(scratch) / "src"
        copy.mkdir()
        for entry in SOURCE_ENTRIES:
            source = root / entry
            if source.is_dir():
                shutil.copytree(source, copy / entry, ignore=ignore)
            elif source.is_file():
                shutil.copy2(source, copy / entry)
        # The build backend is in this environment already: no index needed for it.
        isolation = ["--no-build-isolation"] if _setuptools_is_recent() else []
        _run_pip(
            ["wheel", "--no-deps", *isolation, "-q", "-w", str(output_dir), str(copy)], "building the wheel"
        )
    wheels = sorted(output_dir.glob("xpuspec-*.whl"))
    if len(wheels) != 1:
        raise PackagingError(f"expected one xpuspec wheel in {output_dir}, found {[w.name for w in wheels]}")
    return wheels[0]


def download_wheelhouse(
    pins: list[PinnedRequirement],
    wheelhouse: Path,
    targets: list[TargetPlatform],
    python_version: str | None,
) -> list[str]:
    """Download a binary wheel of every pin that applies to each target into ``wheelhouse``.

    No targets: this machine. Markers are evaluated here for each target and pip runs with
    ``--no-deps`` on the complete pinned list, because pip would evaluate them for this machine.
    Returns the wheel file names.
    """
    wheelhouse.mkdir(parents=True, exist_ok=True)
    machines: list[TargetPlatform | None] = [*targets] or [None]  # None: this machine
    for target in machines:
        environment = target_environment(target, python_version)
        lines = [pin.line().split(";", 1)[0].strip() for pin in pins if pin.applies_to(environment)]
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
            handle.write("\n".join(lines) + "\n")
            requirement_file = handle.name
        arguments = ["download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheelhouse)]
        for tag in target.tags if target is not None else ():
            arguments += ["--platform", tag]
        if python_version is not None:
            arguments += ["--python-version", python_version]
        where = target.name if target is not None else "this machine"
        try:
            _run_pip([*arguments, "-r", requirement_file], f"downloading wheels for {where}")
        finally:
            Path(requirement_file).unlink(missing_ok=True)
        logger.info("wheelhouse: %d requirements for %s", len(lines), where)
    return sorted(path.name for path in wheelhouse.glob("*.whl"))
