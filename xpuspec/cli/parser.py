"""The argument parser every subcommand shares: one-line usage errors and defaults in every help."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from xpuspec.api.errors import ERROR_PREFIX, EXIT_USAGE

DEBUG_ENV = "XPUSPEC_DEBUG"


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
        print(f"{ERROR_PREFIX}{message}; see `{self.prog} --help`", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def finish_subparsers(subparsers: argparse._SubParsersAction) -> None:
    """What every subcommand gets once registered: a help line for each option, and the top-level
    ``--verbose``/``--debug`` accepted after the subcommand too."""
    for subparser in subparsers.choices.values():
        for action in subparser._actions:
            # argparse prints no line at all for an option without help; give it its default.
            if action.help is None and action.option_strings and not isinstance(action.default, bool):
                action.help = "(default: none)" if action.default is None else "(default: %(default)s)"
        # SUPPRESS keeps the top-level value when the flag is absent after the subcommand.
        for flags, help_text in (
            (("-v", "--verbose"), "debug logging"),
            (("--debug",), f"show tracebacks for errors (also {DEBUG_ENV}=1)"),
        ):
            if not any(flag in subparser._option_string_actions for flag in flags):
                subparser.add_argument(*flags, action="store_true", default=argparse.SUPPRESS, help=help_text)


def add_precision_flags(parser: argparse.ArgumentParser) -> None:
    """``--exact`` and ``--stable``: the two presets above the fast default (docs/exactness.md)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--exact",
        action="store_true",
        help="exact mode: f32 compute, f32 KV cache, no dynamic quantisation (the 'exact' properties "
        "preset); --property values still apply on top",
    )
    group.add_argument(
        "--stable",
        action="store_true",
        help="the target at f32 compute and an f32 KV cache (the 'stable' preset): drafting and batch "
        "mates change no greedy answer, at a lower speed than the default; the draft keeps its defaults",
    )


def precision_preset(args: argparse.Namespace) -> str | None:
    """The properties preset the precision flags name, or None for the default."""
    return "exact" if args.exact else "stable" if args.stable else None


def draft_precision(args: argparse.Namespace) -> dict[str, Any] | None:
    """The draft's properties for the precision flags: ``--stable`` leaves the draft at its own defaults
    (what it proposes never changes the answer, only how many drafts are accepted); otherwise None,
    the target's."""
    return {} if args.stable else None
