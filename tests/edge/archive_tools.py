"""Helpers that make and damage small edge archives for the tests."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

from xpuspec.edge.archive import write_edge_archive

FAKE_FILES = {
    "bundle/xpuspec.json": b'{"format_version": 1}\n',
    "bundle/target/openvino_model.bin": bytes(range(256)) * 64,
    "bundle/target/openvino_model.xml": b"<net/>\n",
    "requirements.txt": b"numpy==2.0.0\n",
}


def fake_archive(path: Path) -> Path:
    write_edge_archive(path, dict(FAKE_FILES), {"xpuspec_version": "0.0.test", "bundle": {"name": "fake"}})
    return path


def repack(
    source: Path,
    target: Path,
    edit: Callable[[tarfile.TarInfo, bytes], tuple[tarfile.TarInfo, bytes] | None] = lambda i, d: (i, d),
    extra: list[tuple[tarfile.TarInfo, bytes]] = (),  # type: ignore[assignment]
) -> Path:
    """Copy a tar.gz member by member through ``edit`` (None drops the member), then add ``extra``."""
    with tarfile.open(source, "r:gz") as original, tarfile.open(target, "w:gz") as copy:
        for member in original.getmembers():
            data = original.extractfile(member).read() if member.isfile() else b""
            result = edit(member, data)
            if result is None:
                continue
            info, data = result
            info.size = len(data) if info.isfile() else 0
            copy.addfile(info, io.BytesIO(data) if info.isfile() else None)
        for info, data in extra:
            info.size = len(data)
            copy.addfile(info, io.BytesIO(data))
    return target


def flip_one_byte(name_suffix: str) -> Callable[[tarfile.TarInfo, bytes], tuple[tarfile.TarInfo, bytes]]:
    def edit(info: tarfile.TarInfo, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
        if info.name.endswith(name_suffix):
            middle = len(data) // 2
            data = data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]
        return info, data

    return edit


def truncate(source: Path, target: Path, keep_fraction: float) -> Path:
    data = source.read_bytes()
    target.write_bytes(data[: int(len(data) * keep_fraction)])
    return target


def extract_what_survives(archive: Path, destination: Path) -> None:
    """Unpack members until the archive breaks, as `tar -x` of a cut download leaves them."""
    try:
        with tarfile.open(archive, "r:gz") as opened:
            for member in opened:
                opened.extract(member, destination, filter="data")
    except (tarfile.TarError, EOFError, OSError):
        pass
