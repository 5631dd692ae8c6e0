"""How a command fails: exit codes, :class:`CommandError`, and the one-line error message.

One error path for every command: a user mistake or an environment problem prints one line on
stderr, ``xpuspec: error: <what is wrong>; <what to do>``, and exits with :data:`EXIT_USAGE` (the
command line or its input was wrong) or :data:`EXIT_FAILED` (the work failed). :func:`describe_error`
turns an exception into that line and its exit code, or says it is a bug (``None``: show the traceback).

This is the single definition: the command modules under :mod:`xpuspec.cli` and the measurement
scripts under :mod:`xpuspec.bench` use it. It imports nothing of xpuspec but two error types (the
bundle's and prepare's), so any layer's script may use it.
"""

from __future__ import annotations

import re
import sys

from xpuspec.models.bundle import DRAFT_IS_TARGET, BundleError, ModelBundle
from xpuspec.prepare.config import PrepareError

# Exit codes every subcommand uses: 0 done, 1 the work failed, 2 the command line or input was wrong.
EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# What each code means, as `xpuspec --help` says it; README.md and docs/cli.md say the same
# (tests/test_errors.py holds them to it).
EXIT_CODES: dict[int, str] = {
    EXIT_DONE: "done",
    EXIT_FAILED: "the work failed",
    EXIT_USAGE: "the command line or its input was wrong",
    EXIT_INTERRUPTED: "interrupted",
}

ERROR_PREFIX = "xpuspec: error: "


class CommandError(Exception):
    """A user mistake or environment problem a command reports as one line, with its exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


def one_line(message: str) -> str:
    """A (possibly multi-line) message as one line: its non-empty lines joined by ``"; "``."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return "; ".join(lines) if lines else "unknown error"


def report_warning(message: str) -> None:
    """Print ``xpuspec: warning: MESSAGE`` on stderr: something works, but likely not as meant."""
    print(f"xpuspec: warning: {message}", file=sys.stderr, flush=True)


def warn_if_draft_is_target(bundle: ModelBundle) -> None:
    """The warning of a bundle whose draft is its target, from every command that runs the pair."""
    if bundle.draft_is_target:
        report_warning(DRAFT_IS_TARGET)


def report_error(message: str) -> None:
    """Print ``xpuspec: error: MESSAGE`` on stderr: the one line every failing command ends with."""
    print(f"{ERROR_PREFIX}{message}", file=sys.stderr, flush=True)


# OpenVINO wraps plugin errors in "Exception from src/...:LINE:" lines; the last line says what happened.
_OPENVINO_FRAME = re.compile(r"^\s*Exception from \S+:\d+:\s*$")
# A failed internal check names its condition and the build machine's source path before the message.
_OPENVINO_CHECK = re.compile(r"Check '.*?' failed at \S+:\d+:\s*")


def openvino_message(error: BaseException) -> str | None:
    """The meaningful part of an OpenVINO runtime error, or ``None`` if ``error`` is not one."""
    text = str(error)
    if not isinstance(error, RuntimeError) or "Exception from src/" not in text:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip() and not _OPENVINO_FRAME.match(line)]
    return _OPENVINO_CHECK.sub("", " ".join(lines)).strip() or text.strip()


def describe_error(error: BaseException) -> tuple[str, int] | None:
    """``(one line, exit code)`` for a user or environment error; ``None`` for a bug (traceback)."""
    if isinstance(error, CommandError):
        return str(error), error.exit_code
    if isinstance(error, BundleError):
        return one_line(str(error)), EXIT_USAGE
    if isinstance(error, PrepareError):
        return one_line(str(error)), EXIT_FAILED
    if isinstance(error, FileNotFoundError):
        name = error.filename or str(error)
        return f"{name}: no such file or folder; check the path", EXIT_USAGE
    if isinstance(error, PermissionError):
        return f"{error.filename or error}: permission denied; check the file's owner and mode", EXIT_FAILED
    if isinstance(error, ValueError):
        return one_line(str(error)), EXIT_USAGE
    message = openvino_message(error)
    if message is not None:
        return _describe_openvino(message)
    if isinstance(error, MemoryError):
        return "out of memory; use a smaller model, fewer sequences or a shorter context", EXIT_FAILED
    if isinstance(error, OSError) and error.errno is not None:
        return f"{error.strerror or error}" + (f": {error.filename}" if error.filename else ""), EXIT_FAILED
    return None


def _describe_openvino(message: str) -> tuple[str, int]:
    if "Unsupported property" in message or message.startswith("NotFound"):
        detail = message.removeprefix("NotFound:").strip().rstrip(".")
        return (
            f"OpenVINO: {detail}; check the --property KEY=VALUE names for that device "
            "(`xpuspec devices` lists the devices)",
            EXIT_USAGE,
        )
    if message.startswith("Wrong value"):  # a known key with a value the device does not take
        return f"OpenVINO: {message.rstrip('.')}; fix that --property value", EXIT_USAGE
    if "Cannot load library" in message or "cannot open shared object file" in message:
        library = re.search(r"([\w.+-]+\.so[\w.]*): cannot open shared object file", message)
        plugin = re.search(r"libopenvino_(\w+?)_plugin", message)
        what = f"the OpenVINO {plugin.group(1)} plugin" if plugin else "an OpenVINO library"
        missing = f" ({library.group(1)} is missing)" if library else ""
        return (
            f"{what} cannot load{missing}; install that device's driver/runtime, or pick a present device "
            "from `xpuspec devices`",
            EXIT_FAILED,
        )
    return f"OpenVINO: {message}", EXIT_FAILED
