"""The `xpuspec` command: one module per subcommand, listed in :data:`COMMANDS`.

Every command fails the same way (:mod:`xpuspec.api.errors`): a user mistake or an environment problem
prints one line on stderr, ``xpuspec: error: <what is wrong>; <what to do>``, and exits with
``EXIT_USAGE`` (the command line or its input was wrong) or ``EXIT_FAILED`` (the work failed).
Tracebacks are shown only with ``--debug`` (or ``XPUSPEC_DEBUG=1``), or for exceptions that are bugs
in xpuspec. A closed standard output (``xpuspec inspect | head``) ends the command quietly with exit 0.

The subcommand modules are imported here, plainly: a module that fails to import fails the command
with its traceback rather than leaving its subcommand out.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from types import ModuleType

from xpuspec.api.errors import (
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    describe_error,
    report_error,
)
from xpuspec.cli import bench, cluster, devices, edge, generate, inspect, plan, prepare, quality, serve
from xpuspec.cli.parser import DEBUG_ENV, ArgumentParser, finish_subparsers
from xpuspec.version import __version__

__all__ = ["COMMANDS", "build_parser", "main"]

# Each module's `register(subparsers)` adds its subcommands (in this order) and sets `func`.
COMMANDS: tuple[ModuleType, ...] = (
    prepare,
    inspect,
    generate,
    devices,
    plan,
    quality,
    serve,
    bench,
    edge,
    cluster,
)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="xpuspec",
        description="Speculative decoding on Intel CPUs, GPUs and NPUs with OpenVINO.",
        epilog="exit codes: "
        + ", ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items())
        + ". Errors are one line; --debug (or XPUSPEC_DEBUG=1) shows tracebacks.",
    )
    parser.add_argument("--version", action="version", version=f"xpuspec {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--debug", action="store_true", help=f"show tracebacks for errors (also {DEBUG_ENV}=1)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(subparsers)
    finish_subparsers(subparsers)
    return parser


class LogFormatter(logging.Formatter):
    """INFO lines are progress for the user (the default model's first conversion, stage by stage): the
    message alone. Warnings and debug lines keep their level and logger."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno == logging.INFO:
            return record.getMessage()
        return super().format(record)


def debug_wanted(args: argparse.Namespace | None = None) -> bool:
    if args is not None and args.debug:
        return True
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _quiet_closed_stdout() -> int:
    """Standard output was closed by the reader (``| head``): end without a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
    except (OSError, ValueError):
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(LogFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the guard: a reader that went away is not an error
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _quiet_closed_stdout()
    except Exception as error:  # noqa: BLE001 - the one place errors become exit codes
        described = describe_error(error)
        if described is None:  # a bug: show everything
            traceback.print_exc()
            report_error(f"{type(error).__name__}: {error} (a bug in xpuspec; please report it)")
            return EXIT_FAILED
        message, code = described
        if debug_wanted(args):
            traceback.print_exc()
        report_error(message)
        return code
