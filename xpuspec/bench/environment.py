"""The machine and software a benchmark ran on, for its report."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = (
    "xpuspec",
    "openvino",
    "openvino-genai",
    "openvino-tokenizers",
    "torch",
    "transformers",
    "llama-cpp-python",
)


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        if name == "xpuspec":  # run from a source tree without being installed
            import xpuspec

            return getattr(xpuspec, "__version__", "source tree")
        return None


def environment() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": {name: package_version(name) for name in PACKAGES},
    }
