"""The exit codes as documented (README.md, docs/cli.md, `xpuspec --help`) are the ones the code uses,
and the cases the docs name exit with the code they say."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from xpuspec.api.errors import EXIT_CODES, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE
from xpuspec.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def _table(markdown: str) -> dict[int, str]:
    """The exit-code table of docs/cli.md: ``| code | meaning |`` rows."""
    section = markdown.split("## Errors and exit codes", 1)[1].split("\n## ", 1)[0]
    return {
        int(code): meaning.strip() for code, meaning in re.findall(r"^\| (\d+) \| (.+) \|$", section, re.M)
    }


def test_the_documented_table_is_the_code() -> None:
    table = _table((REPO / "docs" / "cli.md").read_text(encoding="utf-8"))
    assert sorted(table) == sorted(EXIT_CODES)
    for code, meaning in EXIT_CODES.items():
        assert table[code].startswith(meaning), (code, table[code])
    assert (EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED) == (1, 2, 130)


def test_readme_and_help_say_the_same_codes() -> None:
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())  # lines wrap anywhere
    for code in (EXIT_FAILED, EXIT_USAGE):
        assert f"{code} ({EXIT_CODES[code]})" in readme, code
    epilog = build_parser().epilog or ""
    for code, meaning in EXIT_CODES.items():
        assert f"{code} {meaning}" in epilog


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"xpuspec {version}"


# The cases the table names, by the code it gives them.


def test_prepare_into_an_existing_folder_is_a_usage_error_like_bundle(
    smollm2_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "out"
    existing.mkdir()
    assert main(["prepare", str(smollm2_gguf), "-o", str(existing)]) == EXIT_USAGE
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("xpuspec: error: ") and "--overwrite" in err[0]
    archive = tmp_path / "edge.tar.gz"
    archive.write_bytes(b"older")
    assert main(["bundle", "demo", "-o", str(archive)]) == EXIT_USAGE
    assert "--overwrite" in capsys.readouterr().err


def test_recompressing_a_quantised_gguf_is_a_usage_error(
    smollm2_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prepare", str(smollm2_gguf), "--weights", "int4", "-o", str(tmp_path / "b")]) == EXIT_USAGE
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "NNCF recompression does not apply" in err[0] and "Q4_1" in err[0]
    assert not (tmp_path / "b").exists()


def test_a_taken_port_fails_the_work_in_the_common_form() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "xpuspec.cli", "serve", "--bundle", "demo", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
    assert result.returncode == EXIT_FAILED
    assert result.stderr.startswith("xpuspec: error: cannot listen on ") and result.stderr.count("\n") == 1
