"""Run a command and read its peak resident memory, apart from the test process's own.

A child's ``ru_maxrss`` starts from the high-water mark of the process it was executed from: a command
started straight from pytest reports at least pytest's own peak, which grows with every model the
suite compiled before. So the command runs under a small Python process that starts it and reports
the largest resident set among its waited-for processes (the command and anything it waited for).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

_MEASURE = (
    "import resource, subprocess, sys; "
    "rc = subprocess.run(sys.argv[2:]).returncode; "
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
    "sys.exit(rc)"
)


def run_with_peak_rss(
    command: list[str], record: Path, **run_arguments: Any
) -> tuple[subprocess.CompletedProcess, int]:
    """``subprocess.run(command, **run_arguments)`` through the measuring process, and the peak RSS in
    KiB of the command (``record`` is the file it is passed through)."""
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(record), *command], **run_arguments)
    return done, int(record.read_text()) if record.is_file() else 0
