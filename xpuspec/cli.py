"""The `xpuspec` command. Each subsystem registers its own subcommands.

One error path for every command: a user mistake or an environment problem prints one line on
stderr, ``xpuspec: error: <what is wrong>; <what to do>``, and exits with :data:`EXIT_USAGE` (the
command line or its input was wrong) or :data:`EXIT_FAILED` (the work failed). Tracebacks are shown
only with ``--debug`` (or ``XPUSPEC_DEBUG=1``), or for exceptions that are bugs in xpuspec.
A closed standard output (``xpuspec inspect | head``) ends the command quietly with exit 0.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
import traceback
from typing import Any, NoReturn

# Exit codes every subcommand uses: 0 done, 1 the work failed, 2 the command line or input was wrong.
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

DEBUG_ENV = "XPUSPEC_DEBUG"

# Modules with `register(subparsers)`; each adds its subcommands and sets `func`.
COMMAND_MODULES = [
    "xpuspec.prepare.commands",
    "xpuspec.generate_command",
    "xpuspec.devices.commands",
    "xpuspec.server.command",
    "xpuspec.bench.command",
    "xpuspec.edge.commands",
]


class CommandError(Exception):
    """A user mistake or environment problem a command reports as one line, with its exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions as written and appends ``(default: X)`` to every option with a default.

    Options whose help already says its default, flags (off unless given) and required options are
    left as they are; an option that is absent by default (``None``, or an empty list for a
    repeatable one) says ``(default: none)``.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        default = action.default
        if (
            "default" in help_text.lower()
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or action.required
            or not action.option_strings
            or action.nargs == 0
        ):
            return help_text
        shown = "none" if default is None or default == [] else "%(default)s"
        return f"{help_text} (default: {shown})" if help_text else f"(default: {shown})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line usage errors and defaults shown in every subcommand's help."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"xpuspec: error: {message}; see `{self.prog} --help`", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="xpuspec",
        description="Speculative decoding on Intel CPUs, GPUs and NPUs with OpenVINO.",
        epilog="exit codes: 0 done, 1 the work failed, 2 the command line or its input was wrong, "
        "130 interrupted. Errors are one line; --debug (or XPUSPEC_DEBUG=1) shows tracebacks.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--debug", action="store_true", help=f"show tracebacks for errors (also {DEBUG_ENV}=1)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and error.name.startswith("xpuspec"):
                continue  # a subsystem not built yet
            raise
        module.register(subparsers)
    for subparser in subparsers.choices.values():
        for action in subparser._actions:
            # argparse prints no line at all for an option without help; give it its default.
            if action.help is None and action.option_strings and not isinstance(action.default, bool):
                action.help = "(default: none)" if action.default is None else "(default: %(default)s)"
        # Also accepted after the subcommand; SUPPRESS keeps the top-level value when absent.
        for flags, help_text in (
            (("-v", "--verbose"), "debug logging"),
            (("--debug",), f"show tracebacks for errors (also {DEBUG_ENV}=1)"),
        ):
            if not any(flag in subparser._option_string_actions for flag in flags):
                subparser.add_argument(*flags, action="store_true", default=argparse.SUPPRESS, help=help_text)
    return parser


def debug_wanted(args: argparse.Namespace | None = None) -> bool:
    if args is not None and getattr(args, "debug", False):
        return True
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


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
    from xpuspec.model_bundle import BundleError

    if isinstance(error, CommandError):
        return str(error), error.exit_code
    if isinstance(error, BundleError):
        return _one_line(str(error)), EXIT_USAGE
    prepare_error = _prepare_error_type()
    if prepare_error is not None and isinstance(error, prepare_error):
        return _one_line(str(error)), EXIT_FAILED
    if isinstance(error, FileNotFoundError):
        name = error.filename or str(error)
        return f"{name}: no such file or folder; check the path", EXIT_USAGE
    if isinstance(error, PermissionError):
        return f"{error.filename or error}: permission denied; check the file's owner and mode", EXIT_FAILED
    if isinstance(error, ValueError):
        return _one_line(str(error)), EXIT_USAGE
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


def _prepare_error_type() -> type[BaseException] | None:
    module = sys.modules.get("xpuspec.prepare.config")
    return getattr(module, "PrepareError", None) if module is not None else None


def _one_line(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return "; ".join(lines) if lines else "unknown error"


def report_error(message: str) -> None:
    print(f"xpuspec: error: {message}", file=sys.stderr, flush=True)


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
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
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


if __name__ == "__main__":
    sys.exit(main())
