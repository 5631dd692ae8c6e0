"""Keep the terminal for xpuspec's own lines while conversion libraries talk.

torch's TracerWarnings, transformers' deprecation notes and progress bars, NNCF's statistics table
and rich progress bar, optimum's and openvino_tokenizers' log lines all write to the process's
standard output and error, some from C++. While converting, file descriptors 1 and 2 point at a log
file; xpuspec's progress and errors go to the terminal through a copy of the original stderr.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from xpuspec.models.bundle import cache_dir

logger = logging.getLogger(__name__)


def conversion_log_path() -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return cache_dir() / "logs" / f"prepare-{stamp}-{os.getpid()}.log"


@contextmanager
def third_party_output_to(log_path: Path) -> Iterator[TextIO]:
    """Send fds 1 and 2 (and Python warnings) to ``log_path``; yield a stream to the real stderr."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    previous_capture = logging.getLogger("py.warnings").handlers[:]  # captureWarnings state is global
    # xpuspec's own warnings still reach the terminal (and, through the root logger, the log).
    own_warnings = logging.StreamHandler(terminal)
    own_warnings.setLevel(logging.WARNING)
    own_warnings.setFormatter(logging.Formatter("xpuspec: warning: %(message)s"))
    logging.getLogger("xpuspec").addHandler(own_warnings)
    # Python-level writers too: sys.stdout/sys.stderr may be objects that do not write to fds 1 and 2.
    saved_streams = sys.stdout, sys.stderr
    log_stream = os.fdopen(os.dup(log_fd), "w", buffering=1, encoding="utf-8", errors="replace")
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        sys.stdout = sys.stderr = log_stream
        logging.captureWarnings(True)
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # every warning once, into the log
            yield terminal
    finally:
        logging.getLogger("xpuspec").removeHandler(own_warnings)
        logging.captureWarnings(False)
        logging.getLogger("py.warnings").handlers[:] = previous_capture
        log_stream.flush()
        sys.stdout, sys.stderr = saved_streams
        log_stream.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for fd in (saved_out, saved_err, log_fd):
            os.close(fd)
        terminal.flush()
        terminal.close()


class StageLines:
    """Prints each prepare stage once: ``[2/8] exporting target ... 12.0s``.

    On a terminal the start shows at once and is completed in place; elsewhere (a log, a pipe)
    only the finished line is written. A stage that fails leaves no half line before the error.
    """

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.interactive = stream.isatty()
        self.pending: str | None = None

    def __call__(self, line: str) -> None:
        if line.endswith(" ..."):  # a stage starts
            self.pending = line
            if self.interactive:
                self.stream.write(line)
                self.stream.flush()
            return
        if self.interactive and self.pending is not None and line.startswith(self.pending):
            self.stream.write(line[len(self.pending) :] + "\n")
        else:
            self.stream.write(line + "\n")
        self.pending = None
        self.stream.flush()

    def abandon(self) -> None:
        """Clear an unfinished stage line (the error message follows on its own line)."""
        if self.interactive and self.pending is not None:
            self.stream.write("\r\033[K")
            self.stream.flush()
        self.pending = None
