"""The engine and its interfaces import no OpenVINO: execution is the executors' alone."""

from __future__ import annotations

import subprocess
import sys


def test_the_engine_imports_no_openvino():
    code = (
        "import sys, xpuspec.engine.engine, xpuspec.core.interfaces; "
        "assert 'openvino' not in sys.modules, sorted(m for m in sys.modules if 'openvino' in m)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
