"""EAGLE-3 drafting logic is plain: importing it loads neither OpenVINO nor torch (the head's executor is
passed in; torch is read only when preparing a bundle)."""

from __future__ import annotations

import subprocess
import sys


def test_drafting_modules_import_neither_openvino_nor_torch() -> None:
    code = (
        "import sys\n"
        "import xpuspec.spec_decode.eagle3.proposer, xpuspec.spec_decode.eagle3.tree\n"
        "import xpuspec.spec_decode.eagle3.weights\n"
        "print(sorted(name for name in ('openvino', 'torch') if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
