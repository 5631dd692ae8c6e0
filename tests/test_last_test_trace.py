"""The CI post-mortem's trace (tests/support/last_test.py): the id of the test running when the
process ended, in the file ``XPUSPEC_LAST_TEST`` names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, source: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(source, encoding="utf-8")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.support.last_test",
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_sample.py"),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_file_names_the_test_that_was_running_when_the_process_died(tmp_path):
    trace = tmp_path / "last"
    source = (
        "import os\n\ndef test_first():\n    pass\n\n"
        "def test_dies():\n    os._exit(127)\n\ndef test_never():\n    pass\n"
    )
    result = _run(tmp_path, source, {"XPUSPEC_LAST_TEST": str(trace)})
    assert result.returncode == 127
    assert trace.read_text(encoding="utf-8").startswith("test_sample.py::test_dies (pytest's peak RSS")


def test_without_the_variable_nothing_is_written(tmp_path):
    result = _run(tmp_path, "def test_one():\n    pass\n", {"XPUSPEC_LAST_TEST": ""})
    assert result.returncode == 0, result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_sample.py"]
