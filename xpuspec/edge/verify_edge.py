"""Verify an xpuspec edge archive (edge.tar.gz) or its unpacked folder against its edge.json.

This module is also shipped, unchanged, inside every archive as ``verify_edge.py``: the launcher
runs it before xpuspec is installed. It therefore imports nothing outside the standard library,
and ``xpuspec verify`` and the launcher share this one implementation.

    python3 verify_edge.py edge.tar.gz      # the packed archive
    python3 verify_edge.py xpuspec-edge/    # an unpacked archive (its .venv is ignored)

Exit status: 0 when every file is present with its recorded SHA-256 and nothing else is there,
1 otherwise (the message names each changed, missing or extra file).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

EDGE_MANIFEST_NAME = "edge.json"
EDGE_FORMAT = "xpuspec-edge"
EDGE_FORMAT_VERSION = 1
# Made by the launcher beside the unpacked files; never part of the archive.
LOCAL_STATE_NAMES = (".venv",)
_CHUNK = 1 << 20
# edge.json lists hashes and a few facts; anything larger is not one.
_MAX_MANIFEST_BYTES = 16 << 20


class EdgeArchiveError(Exception):
    """An archive that cannot be read at all: truncated, not a tar.gz, or without a usable edge.json."""


@dataclass(frozen=True)
class EdgeReport:
    """What verification found. ``ok`` only when nothing is changed, missing, extra or unsafe."""

    source: str
    manifest: dict[str, Any]
    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)
    total_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not (self.changed or self.missing or self.extra or self.unsafe)

    def describe(self) -> str:
        lines = [f"changed (sha256 differs): {name}" for name in self.changed]
        lines += [f"missing: {name}" for name in self.missing]
        lines += [f"extra (not in {EDGE_MANIFEST_NAME}): {name}" for name in self.extra]
        lines += [f"refused (not a plain file inside the archive): {name}" for name in self.unsafe]
        return "\n".join(lines)

    def summary(self) -> str:
        manifest = self.manifest
        placement = manifest.get("placement")
        wheelhouse = manifest.get("wheelhouse") or {}
        platforms = ", ".join(wheelhouse.get("platforms", [])) or "none (installs from the index)"
        return "\n".join(
            [
                f"{self.source}: OK, {len(manifest.get('files', {}))} files, "
                f"{self.total_bytes / 1e6:.1f} MB unpacked",
                f"  xpuspec {manifest.get('xpuspec_version')}, created {manifest.get('created_at')}",
                f"  bundle: {manifest.get('bundle', {}).get('name')}; placement: "
                + (json.dumps(placement, sort_keys=True) if placement else "none recorded (defaults)"),
                f"  wheelhouse: {platforms}",
            ]
        )


def _safe_relative(name: str) -> PurePosixPath | None:
    """``name`` as a relative path that stays inside the extraction folder, else None."""
    path = PurePosixPath(name)
    if path.is_absolute() or not path.parts or any(part in ("..", "") for part in path.parts):
        return None
    return path


def _hash_stream(handle: Any) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _parse_manifest(data: bytes, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise EdgeArchiveError(f"{where}: not valid JSON ({error})") from error
    if not isinstance(manifest, dict) or manifest.get("format") != EDGE_FORMAT:
        raise EdgeArchiveError(f"{where}: not an xpuspec edge manifest")
    if manifest.get("format_version") != EDGE_FORMAT_VERSION:
        raise EdgeArchiveError(
            f"{where}: format_version {manifest.get('format_version')!r}, this verifier reads "
            f"{EDGE_FORMAT_VERSION}; use the verify_edge.py shipped inside that archive"
        )
    if not isinstance(manifest.get("files"), dict):
        raise EdgeArchiveError(f"{where}: has no 'files' table")
    return manifest


def _compare(source: str, manifest: dict[str, Any], actual: dict[str, str], **found: Any) -> EdgeReport:
    expected: dict[str, str] = manifest["files"]
    return EdgeReport(
        source=source,
        manifest=manifest,
        changed=sorted(n for n in expected if n in actual and actual[n] != expected[n]),
        missing=sorted(n for n in expected if n not in actual),
        extra=sorted(n for n in actual if n not in expected),
        **found,
    )


def verify_archive(path: str | Path) -> EdgeReport:
    """Hash every member of the tar.gz at ``path`` in one streaming pass and compare with its edge.json.

    Members are named relative to the archive's single top-level folder. Links, devices and paths
    escaping the folder are refused. Raises ``EdgeArchiveError`` when the archive cannot be read to
    its end (truncated or corrupt), naming the member being read when it broke.
    """
    path = Path(path)
    actual: dict[str, str] = {}
    unsafe: list[str] = []
    roots: set[str] = set()
    manifest_bytes: bytes | None = None
    total = 0
    current = "(archive header)"
    try:
        with gzip.open(path, "rb") as compressed:
            with tarfile.open(fileobj=compressed, mode="r|") as archive:
                for member in archive:
                    current = member.name
                    relative = _safe_relative(member.name)
                    if relative is None or not (member.isfile() or member.isdir()):
                        unsafe.append(member.name)
                        continue
                    roots.add(relative.parts[0])
                    if member.isdir() or len(relative.parts) < 2:
                        if member.isfile():
                            unsafe.append(member.name)  # a file beside the top-level folder
                        continue
                    inner = PurePosixPath(*relative.parts[1:]).as_posix()
                    handle = archive.extractfile(member)
                    assert handle is not None  # a regular file always has data
                    if inner == EDGE_MANIFEST_NAME and member.size <= _MAX_MANIFEST_BYTES:
                        manifest_bytes = handle.read()
                        if len(manifest_bytes) != member.size:
                            raise EOFError("unexpected end of data")
                        continue
                    digest, size = _hash_stream(handle)
                    if size != member.size:
                        raise EOFError("unexpected end of data")
                    actual[inner] = digest
                    total += size
            current = "(end of archive)"
            # Reading to the end checks the gzip trailer (CRC and length): a cut tail is refused too.
            while compressed.read(_CHUNK):
                pass
    except FileNotFoundError as error:
        raise EdgeArchiveError(f"{path}: no such file") from error
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError) as error:
        raise EdgeArchiveError(
            f"{path}: truncated or corrupt archive (failed while reading {current}: {error})"
        ) from error
    if len(roots) != 1:
        raise EdgeArchiveError(
            f"{path}: expected one top-level folder, found {sorted(roots) or 'none'}; not an edge archive"
        )
    if manifest_bytes is None:
        raise EdgeArchiveError(f"{path}: {EDGE_MANIFEST_NAME} is missing; not an edge archive")
    manifest = _parse_manifest(manifest_bytes, f"{path}:{EDGE_MANIFEST_NAME}")
    return _compare(str(path), manifest, actual, unsafe=sorted(unsafe), total_bytes=total)


def verify_directory(path: str | Path) -> EdgeReport:
    """Compare an unpacked archive folder with its edge.json; the launcher's ``.venv`` is ignored."""
    root = Path(path)
    manifest_path = root / EDGE_MANIFEST_NAME
    if not manifest_path.is_file():
        raise EdgeArchiveError(f"{root}: {EDGE_MANIFEST_NAME} is missing; not an unpacked edge archive")
    manifest = _parse_manifest(manifest_path.read_bytes(), str(manifest_path))
    actual: dict[str, str] = {}
    unsafe: list[str] = []
    total = 0
    for folder, subfolders, files in os.walk(root):
        here = Path(folder)
        if here == root:
            subfolders[:] = [name for name in subfolders if name not in LOCAL_STATE_NAMES]
        for name in sorted(files) + [d for d in subfolders if (here / d).is_symlink()]:
            file_path = here / name
            relative = file_path.relative_to(root).as_posix()
            if relative == EDGE_MANIFEST_NAME:
                continue
            if file_path.is_symlink() or not file_path.is_file():
                unsafe.append(relative)
                continue
            with open(file_path, "rb") as handle:
                digest, size = _hash_stream(handle)
            actual[relative] = digest
            total += size
    return _compare(str(root), manifest, actual, unsafe=sorted(unsafe), total_bytes=total)


def verify_path(path: str | Path) -> EdgeReport:
    """Verify an archive file or an unpacked archive folder."""
    return verify_directory(path) if Path(path).is_dir() else verify_archive(path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: verify_edge.py EDGE_ARCHIVE_OR_FOLDER", file=sys.stderr)
        return 2
    try:
        report = verify_path(args[0])
    except EdgeArchiveError as error:
        print(f"verify: REFUSED: {error}", file=sys.stderr)
        return 1
    if not report.ok:
        print(f"verify: REFUSED: {report.source} does not match its {EDGE_MANIFEST_NAME}", file=sys.stderr)
        print(report.describe(), file=sys.stderr)
        return 1
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
