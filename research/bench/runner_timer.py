"""What the timers of a runner alone share (``research.bench.draft_pass``,
``research.bench.shape_change``): their arguments, their compile properties and their one-line errors."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

Result = TypeVar("Result")


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
        help="compile property (default: GenAI's CPU defaults on this CPU, as `xpuspec bench` compares at)",
    )
    return parser


def integers(parser: argparse.ArgumentParser, text: str, option: str) -> list[int]:
    """The comma-separated integers of ``option``'s ``text``, or a usage error (exit 2) naming it."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        parser.error(f"{option} must list integers, got {text!r}")


def properties(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The compile properties: GenAI's CPU defaults on this CPU (bf16 compute and KV where the CPU has
    bf16, else f32 with an f16 cache) under the user's ``--property`` settings."""
    from xpuspec.bench.latency import genai_default_properties
    from xpuspec.executor.properties import parse_properties

    try:
        user_properties = parse_properties(args.property)
    except ValueError as error:
        parser.error(str(error))
    return {**genai_default_properties(), **user_properties}


def measure_or_usage_error(parser: argparse.ArgumentParser, measure: Callable[[], Result]) -> Result:
    """``measure()``, with a bundle that does not open or does not fit, or properties this CPU does not
    compile (e.g. a bf16 KV cache without bf16 hardware), as a one-line usage error (exit 2)."""
    from xpuspec.api.errors import openvino_message
    from xpuspec.models.bundle import BundleError

    try:
        return measure()
    except (BundleError, ValueError) as error:
        parser.error(str(error))
    except RuntimeError as error:
        message = openvino_message(error)
        if message is None:
            raise
        parser.error(f"OpenVINO cannot compile with these properties here: {message}")
