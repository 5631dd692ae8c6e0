"""The `xpuspec` command. Each subsystem registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Exit codes every subcommand uses: 0 done, 1 the work failed, 2 the command line or input was wrong.
EXIT_FAILED = 1
EXIT_USAGE = 2

# Modules with `register(subparsers)`; each adds its subcommands and sets `func`.
COMMAND_MODULES = [
    "xpuspec.prepare.commands",
    "xpuspec.generate_command",
    "xpuspec.devices.commands",
    "xpuspec.server.command",
    "xpuspec.bench.command",
    "xpuspec.edge.commands",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xpuspec", description="Speculative decoding on Intel CPUs, GPUs and NPUs with OpenVINO."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and error.name.startswith("xpuspec"):
                continue  # a subsystem not built yet
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
