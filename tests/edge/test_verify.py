"""The verifier on small fake archives: every kind of damage is refused and named."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.edge.archive_tools import (
    FAKE_FILES,
    extract_what_survives,
    fake_archive,
    flip_one_byte,
    repack,
    truncate,
)
from xpuspec.cli import main as cli_main
from xpuspec.edge import EdgeArchiveError, verify_archive, verify_directory, verify_path
from xpuspec.edge.archive import write_edge_archive

MODEL = "bundle/target/openvino_model.bin"


@pytest.fixture()
def archive(tmp_path: Path) -> Path:
    return fake_archive(tmp_path / "edge.tar.gz")


def test_intact_archive_verifies(archive: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = verify_archive(archive)
    assert report.ok, report.describe()
    assert sorted(report.manifest["files"]) == sorted(FAKE_FILES)
    assert report.total_bytes == sum(len(data) for data in FAKE_FILES.values())
    assert cli_main(["verify", str(archive)]) == 0
    assert "OK" in capsys.readouterr().out


def test_changed_byte_is_named(archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tampered = repack(archive, tmp_path / "tampered.tar.gz", flip_one_byte(MODEL))
    report = verify_archive(tampered)
    assert report.changed == [MODEL] and not report.missing and not report.extra
    assert cli_main(["verify", str(tampered)]) == 1
    assert MODEL in capsys.readouterr().err


def test_missing_and_extra_members_are_named(archive: Path, tmp_path: Path) -> None:
    dropped = repack(
        archive, tmp_path / "dropped.tar.gz", lambda i, d: None if i.name.endswith(".xml") else (i, d)
    )
    assert verify_archive(dropped).missing == ["bundle/target/openvino_model.xml"]
    added = repack(
        archive, tmp_path / "added.tar.gz", extra=[(tarfile.TarInfo("xpuspec-edge/evil.py"), b"x")]
    )
    assert verify_archive(added).extra == ["evil.py"]


@pytest.mark.parametrize("name", ["../escape.txt", "/abs.txt", "xpuspec-edge/../../escape.txt"])
def test_member_escaping_the_folder_is_refused(archive: Path, tmp_path: Path, name: str) -> None:
    bad = repack(archive, tmp_path / "bad.tar.gz", extra=[(tarfile.TarInfo(name), b"x")])
    report = verify_archive(bad)
    assert not report.ok and report.unsafe == [name]


def test_symlink_member_is_refused(archive: Path, tmp_path: Path) -> None:
    link = tarfile.TarInfo("xpuspec-edge/bundle/link")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    report = verify_archive(repack(archive, tmp_path / "link.tar.gz", extra=[(link, b"")]))
    assert report.unsafe == ["xpuspec-edge/bundle/link"]


@pytest.mark.parametrize("keep_fraction", [0.3, 0.9, 0.999])
def test_truncated_archive_is_refused(
    archive: Path, tmp_path: Path, keep_fraction: float, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = truncate(archive, tmp_path / "cut.tar.gz", keep_fraction)
    with pytest.raises(EdgeArchiveError, match="truncated or corrupt"):
        verify_archive(cut)
    assert cli_main(["verify", str(cut)]) == 1
    assert "truncated" in capsys.readouterr().err


def test_not_an_archive_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plain.tar.gz").write_bytes(b"not gzip at all")
    with pytest.raises(EdgeArchiveError):
        verify_archive(tmp_path / "plain.tar.gz")
    with pytest.raises(EdgeArchiveError, match="no such file"):
        verify_archive(tmp_path / "absent.tar.gz")


def test_unpacked_folder_verifies_and_ignores_its_venv(archive: Path, tmp_path: Path) -> None:
    with tarfile.open(archive) as opened:
        opened.extractall(tmp_path / "out", filter="data")
    folder = tmp_path / "out" / "xpuspec-edge"
    (folder / ".venv" / "bin").mkdir(parents=True)
    (folder / ".venv" / "bin" / "python").write_text("made by the launcher")
    assert verify_path(folder).ok
    (folder / "bundle" / "notes.txt").write_text("extra")
    (folder / "requirements.txt").write_text("numpy==9\n")
    report = verify_directory(folder)
    assert report.extra == ["bundle/notes.txt"] and report.changed == ["requirements.txt"]


def test_partly_unpacked_folder_is_refused(archive: Path, tmp_path: Path) -> None:
    extract_what_survives(truncate(archive, tmp_path / "cut.tar.gz", 0.6), tmp_path / "out")
    folder = tmp_path / "out" / "xpuspec-edge"
    if not (folder / "edge.json").exists():  # edge.json comes first; a cut this early leaves nothing
        pytest.fail("edge.json should have survived: it is the archive's first member")
    report = verify_directory(folder)
    assert not report.ok and (report.missing or report.changed)


def test_shipped_script_runs_without_xpuspec(archive: Path, tmp_path: Path) -> None:
    import xpuspec.edge.verify_edge as module

    script = tmp_path / "alone" / "verify_edge.py"
    script.parent.mkdir()
    shutil.copy(module.__file__, script)
    # -I: isolated mode, so neither PYTHONPATH nor the working directory can supply xpuspec.
    ok = subprocess.run([sys.executable, "-I", str(script), str(archive)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    tampered = repack(archive, tmp_path / "tampered.tar.gz", flip_one_byte(MODEL))
    refused = subprocess.run(
        [sys.executable, "-I", str(script), str(tampered)], capture_output=True, text=True
    )
    assert refused.returncode == 1 and MODEL in refused.stderr


def test_failed_write_leaves_no_file(tmp_path: Path) -> None:
    output = tmp_path / "edge.tar.gz"
    with pytest.raises(FileNotFoundError):
        write_edge_archive(output, {"bundle/missing.bin": tmp_path / "nope.bin"}, {})
    assert list(tmp_path.iterdir()) == []


def test_archive_replaces_an_older_one_whole(tmp_path: Path) -> None:
    output = fake_archive(tmp_path / "edge.tar.gz")
    write_edge_archive(output, {"only.txt": b"new"}, {})
    assert sorted(verify_archive(output).manifest["files"]) == ["only.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["edge.tar.gz"]
