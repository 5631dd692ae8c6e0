"""`xpuspec serve`'s options, in the groups `--help` lists them in, and the defaults they state."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from xpuspec.cli.parser import add_precision_flags
from xpuspec.devices.placement import add_drafter_argument
from xpuspec.sample.defaults import DEFAULT_MAX_TOKENS
from xpuspec.server.config import (
    DEFAULT_STREAM_INTERVAL_PER_STREAM_S,
    DEFAULT_STREAM_INTERVAL_S,
    MAX_STREAM_INTERVAL_S,
)
from xpuspec.server.http_server import BODY_RATE_GRACE_S, ListenerLimits
from xpuspec.structured.matcher import GrammarLimits

if TYPE_CHECKING:
    pass

# The KV cache's budget (target and draft model together, the prefix cache within it) unless
# --memory-budget or --num-kv-blocks says otherwise: a laptop's share, about 16k tokens of the default
# model's KV (docs/server.md, "Memory").
DEFAULT_MEMORY_BUDGET_MIB = 192
DEFAULT_LIMITS = ListenerLimits()


def _add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """What is served, where, to whom."""
    parser.add_argument(
        "--bundle", default=None, help="a bundle folder, or demo (default: SmolLM2-135M-Instruct + its draft)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (loopback only by default)")
    parser.add_argument(
        "--port", type=_port, default=8000, help="listen port (default 8000; 0: any free port)"
    )
    parser.add_argument(
        "--served-model-name",
        action="append",
        default=None,
        metavar="NAME",
        help="the model name requests use and responses show (repeatable: later names are aliases; "
        "default: the model's plain name, which an edge archive of the bundle answers too: "
        "SmolLM2-135M-Instruct for the default model, xpuspec-demo for demo, else the folder's name "
        "without a cache key; the older names stay aliases)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no access-log line per request on stderr (default: one line each, /health probes aside)",
    )
    parser.add_argument(
        "--log-health",
        action="store_true",
        help="log /health requests too (default: left out, as readiness loops and probes poll it)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("XPUSPEC_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every endpoint but /health (default: $XPUSPEC_API_KEY)",
    )
    parser.add_argument(
        "--allowed-hosts",
        action="append",
        default=[],
        metavar="NAME[,NAME...]",
        help="further Host names to answer (repeatable; * any): by default only localhost, IP "
        "addresses and --host are, so a web page cannot reach the server through DNS rebinding",
    )
    parser.add_argument(
        "--allowed-origins",
        action="append",
        default=[],
        metavar="ORIGIN[,ORIGIN...]",
        help="browser origins whose pages may call the server, e.g. http://localhost:3000 or "
        "'http://localhost:*' (repeatable; * any): by default only the server's own (the chat page)",
    )


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the models run and how they are compiled."""
    parser.add_argument("--target-device", default="CPU")
    parser.add_argument("--draft-device", default="CPU")
    add_drafter_argument(parser)
    parser.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="recompute every prompt (default: reuse the KV of prompt prefixes seen before)",
    )
    parser.add_argument(
        "--shared-lookup-tokens",
        type=int,
        default=None,
        metavar="N",
        help="beside a draft model, also draft from the tokens of recent finished requests with the same "
        "API key, keeping up to N tokens (docs/suffix-drafter.md; default: 32768; 0: off)",
    )
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an OpenVINO compile property for both models (repeatable)",
    )
    add_precision_flags(parser)


def _add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """How many requests, how large, how often a stream sends, how much KV cache."""
    parser.add_argument("--max-queue", type=int, default=256, help="requests in flight before 503")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger bodies get 413")
    parser.add_argument(
        "--stream-interval-ms",
        type=float,
        default=DEFAULT_STREAM_INTERVAL_S * 1e3,
        help="least time between two text frames of a stream; faster tokens share a frame, the first "
        "and a choice's last frame are never held: each frame costs the engine CPU "
        f"(default {DEFAULT_STREAM_INTERVAL_S * 1e3:g}; 0: one frame per step)",
    )
    parser.add_argument(
        "--stream-interval-per-stream-ms",
        type=float,
        default=DEFAULT_STREAM_INTERVAL_PER_STREAM_S * 1e3,
        help="with many streams open, this much more interval per open stream, up to "
        f"{MAX_STREAM_INTERVAL_S * 1e3:g} ms: fewer frames, less CPU taken from the engine "
        f"(default {DEFAULT_STREAM_INTERVAL_PER_STREAM_S * 1e3:g}; 0: a fixed interval)",
    )
    parser.add_argument(
        "--memory-budget",
        type=int,
        default=DEFAULT_MEMORY_BUDGET_MIB,
        metavar="MIB",
        help="MiB for the KV cache of the target and draft model together, the prefix cache within it; "
        f"logged at start with its split (default {DEFAULT_MEMORY_BUDGET_MIB})",
    )
    parser.add_argument(
        "--num-kv-blocks", type=int, default=None, help="KV-cache blocks (instead of --memory-budget)"
    )
    parser.add_argument(
        "--max-tokens",
        type=_positive,
        default=None,
        metavar="N",
        help="the reply cap of requests that name no limit (max_tokens, max_completion_tokens, "
        f"num_predict; default {DEFAULT_MAX_TOKENS}); within the context either way",
    )


def _add_listener_arguments(parser: argparse.ArgumentParser) -> None:
    """The HTTP listener's threads, connections and timeouts."""
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_LIMITS.threads,
        help=f"HTTP worker threads: each open stream holds one; /health and /metrics have their own "
        f"(default {DEFAULT_LIMITS.threads})",
    )
    parser.add_argument(
        "--connection-limit",
        type=int,
        default=DEFAULT_LIMITS.connection_limit,
        help=f"open connections accepted at once (default {DEFAULT_LIMITS.connection_limit})",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_LIMITS.header_timeout_s,
        help="seconds a client may take to send a request's headers before its connection is closed "
        f"(default {DEFAULT_LIMITS.header_timeout_s:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_LIMITS.body_timeout_s,
        help="seconds a client may take to send a request's body once its headers are in, before its "
        f"connection is closed (default {DEFAULT_LIMITS.body_timeout_s:g})",
    )
    parser.add_argument(
        "--min-body-rate",
        type=int,
        default=DEFAULT_LIMITS.min_body_rate,
        help="bytes per second a request body must arrive at, on average, once it has had "
        f"{BODY_RATE_GRACE_S:g} s; slower connections are closed "
        f"(default {DEFAULT_LIMITS.min_body_rate}; 0: no minimum)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=int,
        default=DEFAULT_LIMITS.channel_timeout_s,
        help="seconds an idle keep-alive connection is kept open "
        f"(default {DEFAULT_LIMITS.channel_timeout_s})",
    )


def _add_grammar_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = GrammarLimits()
    parser.add_argument(
        "--grammar-compile-timeout",
        type=float,
        default=defaults.compile_seconds,
        help="seconds a new output constraint (response_format, guided_regex, guided_grammar, forced "
        f"tool calls) may take to compile before the request is refused with 400 "
        f"(default {defaults.compile_seconds:g})",
    )
    parser.add_argument(
        "--grammar-max-lexer-states",
        type=int,
        default=defaults.max_lexer_states,
        help="lexer states one constraint's grammar may build (about 1-2 kB each); beyond it the "
        f"request is refused or ends with an error (default {defaults.max_lexer_states})",
    )
    parser.add_argument(
        "--grammar-max-size",
        type=int,
        default=defaults.max_grammar_size,
        help="symbols in one constraint's grammar; a larger one is a 400 "
        f"(default {defaults.max_grammar_size})",
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _port(text: str) -> int:
    # Checked here: waitress takes a port past 65535 modulo 65536 and would listen somewhere else.
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is an integer, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535 (0: any free port), got {port}")
    return port


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option of `xpuspec serve`, in the order --help lists its groups."""
    _add_endpoint_arguments(parser)
    _add_model_arguments(parser)
    _add_request_arguments(parser)
    _add_listener_arguments(parser)
    _add_grammar_arguments(parser)
