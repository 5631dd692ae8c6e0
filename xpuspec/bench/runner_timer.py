"""What the timers of a runner alone share (``bench.draft_pass``, ``bench.shape_change``): their
arguments, their compile properties and their one-line errors."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

Result = TypeVar("Result")

# GenAI's CPU defaults on AVX-512, made explicit: what the engines are compared at.
DEFAULT_PROPERTIES = {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "bf16"}


def parser(description: str | None, steps: int, rounds: int) -> argparse.ArgumentParser:
    """A parser with ``--bundle``, ``--steps``, ``--rounds`` and ``--property``."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", default=None, help="bundle folder or demo (default: the default model)")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="compile property (default: bf16 compute and KV cache, GenAI's CPU defaults on AVX-512)",
    )
    return parser


def properties(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The compile properties: the defaults above under the user's ``--property`` settings."""
    from xpuspec.generate_command import parse_properties

    try:
        user_properties = parse_properties(args.property)
    except ValueError as error:
        parser.error(str(error))
    return {**DEFAULT_PROPERTIES, **user_properties}


def measure_or_usage_error(parser: argparse.ArgumentParser, measure: Callable[[], Result]) -> Result:
    """``measure()``, with a bundle that does not open or does not fit as a usage error (exit 2)."""
    from xpuspec.model_bundle import BundleError

    try:
        return measure()
    except (BundleError, ValueError) as error:
        parser.error(str(error))
