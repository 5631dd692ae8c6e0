"""`xpuspec bundle`: one tar.gz holding everything an edge device needs to serve a model bundle.

Layout under the archive's single top-level folder::

    edge.json          format, versions, placement, wheelhouse targets, SHA-256 of every other file
    verify_edge.py     the standalone verifier (xpuspec/edge/verify_edge.py, byte for byte)
    run.sh, run.ps1    launchers; xpuspec-edge.service an example systemd unit; README.md
    requirements.txt   runtime requirements pinned to the versions installed here
    dist/xpuspec-*.whl xpuspec itself
    wheels/            (with --wheels) every runtime requirement, for an offline install
    bundle/            the model bundle, manifest included
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from xpuspec.edge import templates
from xpuspec.edge.platforms import group_targets, target_environment
from xpuspec.edge.requirements import (
    current_python_version,
    pin_runtime_requirements,
    requirements_text,
    wheel_requirements,
)
from xpuspec.edge.verify_edge import (
    EDGE_FORMAT,
    EDGE_FORMAT_VERSION,
    EDGE_MANIFEST_NAME,
    LOCAL_STATE_NAMES,
    verify_archive,
)
from xpuspec.models.bundle import MANIFEST_NAME, sha256_file
from xpuspec.models.resolve import model_names, resolve_bundle
from xpuspec.prepare.progress import ProgressSink, StepProgress

logger = logging.getLogger(__name__)

DEFAULT_ROOT_NAME = "xpuspec-edge"
# Files a shell runs directly get the executable bit; the rest are read-only data.
_EXECUTABLE = frozenset({"run.sh", "verify_edge.py"})
_GZIP_LEVEL = 6  # wheels are compressed already: higher levels cost time for nothing


@dataclass(frozen=True)
class EdgeConfig:
    """What `xpuspec bundle` packs; checked on construction."""

    output: Path
    bundle: Path | None = None  # None: the default model; "demo": the embedded demo pair
    include_wheels: bool = False
    platforms: list[str] = field(default_factory=list)
    python_version: str | None = None
    root_name: str = DEFAULT_ROOT_NAME
    xpuspec_wheel: Path | None = None  # a prebuilt wheel instead of building one from the checkout
    overwrite: bool = False  # replace an existing archive (like `xpuspec prepare --overwrite`)

    def __post_init__(self) -> None:
        if not str(self.output).endswith((".tar.gz", ".tgz")):
            raise ValueError(f"the output must end in .tar.gz or .tgz, got {self.output}")
        if Path(self.output).exists() and not self.overwrite:
            raise ValueError(f"{self.output} already exists; pass --overwrite to replace it")
        if (self.platforms or self.python_version) and not self.include_wheels:
            raise ValueError("--platform and --python-version choose the wheelhouse: add --wheels")
        group_targets(self.platforms)  # raises on an unknown tag
        target_environment(None, self.python_version)  # raises on a malformed version
        if (
            not self.root_name
            or "/" in self.root_name
            or self.root_name in (".", "..")
            or any(self.root_name == name for name in LOCAL_STATE_NAMES)
        ):
            raise ValueError(f"the archive's folder name must be a plain name, got {self.root_name!r}")
        if self.xpuspec_wheel is not None and not Path(self.xpuspec_wheel).is_file():
            raise ValueError(f"--xpuspec-wheel {self.xpuspec_wheel}: no such file")


# An archive member: its bytes in memory or a file to copy.
Content = bytes | Path


def _sha256(content: Content) -> str:
    if isinstance(content, Path):
        return sha256_file(content)
    import hashlib

    return hashlib.sha256(content).hexdigest()


def write_edge_archive(
    output: Path, contents: dict[str, Content], facts: dict[str, Any], root_name: str = DEFAULT_ROOT_NAME
) -> dict[str, Any]:
    """Write ``contents`` (relative POSIX path -> bytes or file) and their edge.json as a tar.gz.

    ``facts`` go into edge.json beside the format fields and the hashes. The archive is written to
    a temporary file beside ``output``, verified, then renamed over it: a reader never sees half an
    archive. Returns the manifest.
    """
    if EDGE_MANIFEST_NAME in contents:
        raise ValueError(f"{EDGE_MANIFEST_NAME} is written by this function, not passed in")
    manifest = {
        "format": EDGE_FORMAT,
        "format_version": EDGE_FORMAT_VERSION,
        **facts,
        "files": {name: _sha256(contents[name]) for name in sorted(contents)},
    }
    manifest_bytes = (json.dumps(manifest, indent=2, sort_keys=False) + "\n").encode("utf-8")
    members: list[tuple[str, Content]] = [(EDGE_MANIFEST_NAME, manifest_bytes)]
    # Top-level files (launchers, verifier, README) first: a cut download still holds them, and its
    # launcher then names what is missing instead of failing to start.
    members += [(name, contents[name]) for name in sorted(contents, key=lambda n: ("/" in n, n))]
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary_name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".partial", dir=output.parent)
    os.close(handle)
    temporary = Path(temporary_name)
    try:
        _write_tar(temporary, members, root_name, mtime=int(time.time()))
        report = verify_archive(temporary)
        if not report.ok:  # a bundle file changed while it was being packed
            raise RuntimeError(f"the archive just written does not verify:\n{report.describe()}")
        # mkstemp makes the file private; the archive gets the usual permissions instead.
        umask = os.umask(0)
        os.umask(umask)
        temporary.chmod(0o666 & ~umask)
        os.replace(temporary, output)
    finally:
        temporary.unlink(missing_ok=True)
    return manifest


def _write_tar(path: Path, members: list[tuple[str, Content]], root_name: str, mtime: int) -> None:
    folders: set[str] = set()
    with tarfile.open(path, "w:gz", compresslevel=_GZIP_LEVEL, format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(_tar_info(root_name, mtime, folder=True))
        for name, content in members:
            parts = name.split("/")
            for depth in range(1, len(parts)):
                folder = "/".join(parts[:depth])
                if folder not in folders:
                    folders.add(folder)
                    archive.addfile(_tar_info(f"{root_name}/{folder}", mtime, folder=True))
            info = _tar_info(f"{root_name}/{name}", mtime, executable=name in _EXECUTABLE)
            if isinstance(content, Path):
                info.size = content.stat().st_size
                with open(content, "rb") as source:
                    archive.addfile(info, source)
            else:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))


def _tar_info(name: str, mtime: int, *, folder: bool = False, executable: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if folder:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.mode = 0o755 if executable else 0o644
    return info


def build_edge_archive(config: EdgeConfig, progress: ProgressSink | None = None) -> dict[str, Any]:
    """Collect the bundle, the xpuspec wheel, pinned requirements (and wheelhouse) and write the archive.

    ``progress`` gets numbered, timed lines as `xpuspec prepare`'s (``[2/4] pinning ... 3.1s``): the
    wheelhouse download and the compression take a minute or more. Returns the archive's manifest
    (edge.json).
    """
    from xpuspec.edge.wheels import build_xpuspec_wheel

    steps = StepProgress(total_steps=4 if config.include_wheels else 3, sink=progress)
    bundle = resolve_bundle(config.bundle, verify=True)
    # The names `xpuspec serve` would answer for the same bundle: the plain name, then aliases.
    served_name, *aliases = model_names(config.bundle)
    created_at = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    contents: dict[str, Content] = {
        f"bundle/{name}": bundle.root / name for name in [*bundle.manifest.get("files", {}), MANIFEST_NAME]
    }
    with tempfile.TemporaryDirectory(prefix="xpuspec-edge-") as scratch:
        scratch_path = Path(scratch)
        with steps.step(
            "using the given xpuspec wheel" if config.xpuspec_wheel else "building the xpuspec wheel"
        ):
            wheel = (
                Path(config.xpuspec_wheel)
                if config.xpuspec_wheel
                else build_xpuspec_wheel(scratch_path / "dist")
            )
        python_version = config.python_version or current_python_version()
        targets = group_targets(config.platforms)
        with steps.step("pinning the runtime requirements"):
            name, version, roots = wheel_requirements(wheel)
            environments = [target_environment(None, None)] + [
                target_environment(target, python_version) for target in targets
            ]
            pins = pin_runtime_requirements(roots, environments)
        contents["dist/" + wheel.name] = wheel
        contents["requirements.txt"] = requirements_text(
            pins,
            f"Runtime requirements of {name} {version}, pinned to the versions it was tested with.\n"
            "No torch, transformers, optimum or nncf: an edge device never converts models.",
        ).encode("utf-8")
        wheelhouse: dict[str, Any] | None = None
        if config.include_wheels:
            where = ", ".join(target.name for target in targets) or "this machine"
            with steps.step(f"downloading {len(pins)} requirements' wheels for {where} (pip)"):
                wheelhouse = _wheelhouse(
                    pins, scratch_path / "wheels", targets, python_version, config, contents
                )
        placement = bundle.placement
        values = {
            "bundle": served_name,
            "aliases": f" (older names: {', '.join(f'`{a}`' for a in aliases)})" if aliases else "",
            "version": version,
            "created_at": created_at,
            "wheel": wheel.name,
            "root": config.root_name,
            "python": f"{python_version} ({', '.join(wheelhouse['platforms'])})" if wheelhouse else ">= 3.10",
            "wheelhouse": (
                f"{wheelhouse['wheels']} wheels for {', '.join(wheelhouse['platforms'])}, Python "
                f"{python_version}: the launcher installs offline"
                if wheelhouse
                else "absent: the launcher installs from the package index"
            ),
            "placement": json.dumps(placement, sort_keys=True) if placement else "none recorded (CPU)",
        }
        contents.update(_launchers(values, wheel.name))
        facts = {
            "created_at": created_at,
            "xpuspec_version": version,
            "bundle": {"path": "bundle", "name": served_name, "aliases": aliases},
            "placement": placement,
            "wheel": f"dist/{wheel.name}",
            "requirements": [pin.line() for pin in pins],
            "wheelhouse": wheelhouse,
        }
        with steps.step(f"writing and verifying {config.output}"):
            manifest = write_edge_archive(Path(config.output), contents, facts, config.root_name)
    logger.debug("wrote %s (%d files)", config.output, len(manifest["files"]))  # the command says more
    return manifest


def _launchers(values: dict[str, str], wheel_name: str) -> dict[str, Content]:
    """The verifier, the launchers, the systemd unit and the README, filled in."""
    return {
        "verify_edge.py": Path(__file__).with_name("verify_edge.py"),
        "run.sh": templates.render(templates.RUN_SH, wheel=wheel_name).encode("utf-8"),
        "run.ps1": templates.render(templates.RUN_PS1, wheel=wheel_name).encode("utf-8"),
        "xpuspec-edge.service": templates.render(templates.SYSTEMD_UNIT, **values).encode("utf-8"),
        "README.md": templates.render(templates.README, **values).encode("utf-8"),
    }


def _wheelhouse(
    pins: list[Any],
    folder: Path,
    targets: list[Any],
    python_version: str,
    config: EdgeConfig,
    contents: dict[str, Content],
) -> dict[str, Any]:
    """Download the wheelhouse into ``folder``, add its wheels to ``contents``; return its edge.json facts."""
    from xpuspec.edge.wheels import download_wheelhouse

    names = download_wheelhouse(pins, folder, targets, config.python_version)
    contents.update({f"wheels/{n}": folder / n for n in names})
    return {
        "platforms": [target.name for target in targets] or [_this_platform()],
        "platform_tags": [list(target.tags) for target in targets],
        "python_version": python_version,
        "wheels": len(names),
    }


def _this_platform() -> str:
    import sysconfig

    return sysconfig.get_platform().replace("-", "_").replace(".", "_")
