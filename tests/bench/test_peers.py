"""A peer's failure as one line: OpenVINO's multi-line C++ exceptions, and the report's table cells."""

from __future__ import annotations

from pathlib import Path

import openvino as ov
import pytest

from xpuspec.bench.peers import why_failed
from xpuspec.bench.report import latency_table, load_table


def _openvino_error(tmp_path: Path) -> RuntimeError:
    broken = tmp_path / "broken.xml"
    broken.write_text("<net name='x' version='11'><layers><layer id='0' type='Nope'/></layers></net>")
    with pytest.raises(RuntimeError) as raised:
        ov.Core().read_model(broken)
    return raised.value


def test_an_openvino_exception_becomes_one_line_without_its_source_frames(tmp_path: Path) -> None:
    error = _openvino_error(tmp_path)
    assert "\n" in str(error) and "Exception from src/" in str(error)
    reason = why_failed(error)
    assert "\n" not in reason and "Exception from src/" not in reason and reason.strip()
    assert len(why_failed(RuntimeError("x" * 1000))) <= 300


def test_a_row_that_did_not_run_is_one_escaped_line(tmp_path: Path) -> None:
    reason = "failed to load: first line | with a pipe\nsecond line"
    section = {"configurations": [{"name": "peer | one", "status": "skipped", "reason": reason}]}
    for table in (latency_table(section), load_table(section)):
        row = table[2]
        assert len(table) == 3 and "\n" not in row
        assert row.startswith(
            "| peer \\| one | not run: failed to load: first line \\| with a pipe second line |"
        )
        # Unescaped pipes delimit exactly the table's columns.
        assert row.replace("\\|", "").count("|") == table[0].count("|")
    # A reason that already says so is not said twice.
    once = {"configurations": [{"name": "x", "status": "skipped", "reason": "not run: no head"}]}
    assert "| not run: no head |" in latency_table(once)[2]
