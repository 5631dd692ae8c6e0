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


# The instruction sets the CPU plugin's kernels choose between; amx_* stands for every AMX flag.
RELEVANT_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx")


def cpu_flags(wanted: tuple[str, ...] = RELEVANT_CPU_FLAGS) -> list[str]:
    """Which of ``wanted`` the CPU has (``amx``: any ``amx_*`` flag, each listed), from /proc/cpuinfo."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return []
    flags: set[str] = set()
    for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    present = []
    for flag in wanted:
        if flag == "amx":
            present += sorted(f for f in flags if f.startswith("amx"))
        elif flag in flags:
            present.append(flag)
    return present


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, where the platform has them."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def cpu_line(env: dict[str, Any]) -> str:
    """One line naming the CPU, its relevant flags, its cores and the load average at the start."""
    flags = ", ".join(env.get("cpu_flags") or []) or "none of " + ", ".join(RELEVANT_CPU_FLAGS)
    load = env.get("load_average_at_start")
    load_text = " / ".join(f"{value:.2f}" for value in load) if load else "unknown"
    return (
        f"CPU: {env['cpu']} ({flags}), {env['cores']} cores; load average at start (1/5/15 min): {load_text}"
    )


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
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": {name: package_version(name) for name in PACKAGES},
    }
