"""`xpuspec serve`: the OpenAI-compatible API on waitress, with a graceful drain on SIGTERM.

Order of work: bind the port (a taken port is one line on stderr, exit 1), load the model while
/health answers 503 "loading", then print one line ``xpuspec serve: ready on URL (model: NAME)`` on
stdout. A model that cannot be loaded is one line on stderr and exit 2 (a bad bundle or argument)
or 1 (anything else, e.g. the device).
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xpuspec.api.errors import EXIT_FAILED, EXIT_USAGE, one_line, report_error, warn_if_draft_is_target
from xpuspec.api.memory_budget import describe
from xpuspec.cli.parser import draft_precision, precision_preset
from xpuspec.cli.serve_options import add_serve_arguments
from xpuspec.models.resolve import model_names
from xpuspec.server.config import ServerConfig
from xpuspec.server.http_server import HttpListener, ListenerLimits
from xpuspec.structured.matcher import GrammarLimits

if TYPE_CHECKING:
    from xpuspec.server.state import ServerState

logger = logging.getLogger(__name__)

# Input shapes whose prepared kernels the CPU plugin keeps per model (its own default, 5000, grows
# with every new context length a step sees); --property CPU_RUNTIME_CACHE_CAPACITY=N overrides it.
SHAPE_CACHE_PROPERTY = "CPU_RUNTIME_CACHE_CAPACITY"
DEFAULT_SHAPE_CACHE_ENTRIES = 64
# How long a drain waits for in-flight requests before stopping anyway.
DRAIN_TIMEOUT_S = 120.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve an OpenAI-compatible HTTP API (completions, chat, metrics)",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics and "
        "/openapi.json over one speculative-decoding engine. Binds the port, loads the model, then prints "
        "one 'ready' line with the URL and the served model name(s). Exit codes: 0 after a drain "
        "(SIGTERM/SIGINT), 1 the port is taken or the model failed to load, 2 a bad argument or bundle.",
    )
    add_serve_arguments(parser)
    parser.set_defaults(func=run)


class _Refused(Exception):
    """The server cannot start: ``xpuspec: error: MESSAGE`` on stderr, then exit with ``exit_code``."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class _Settings:
    """The command line, checked: what the app, the listener and the engine are made with."""

    config: ServerConfig
    limits: ListenerLimits
    properties: dict[str, Any] | None
    draft_properties: dict[str, Any] | None
    grammar_limits: GrammarLimits
    kv_cache_bytes: int | None  # None: --num-kv-blocks sizes the cache


def run(args: argparse.Namespace) -> int:
    from xpuspec.server.app import create_app, unauthenticated_request
    from xpuspec.server.state import server_state

    try:
        settings = _settings(args)
        _configure_access_log(quiet=args.quiet, log_health=args.log_health)
        app = create_app(_loader(args, settings), settings.config, start=False)
        state = server_state(app)
        listener = _listen(app, args, settings.limits, unauthenticated_request(settings.config))
    except _Refused as refused:
        report_error(str(refused))
        return refused.exit_code
    stop = threading.Event()
    _drain_on_signals(state, stop)
    _serve(listener, state, settings.config, f"http://{args.host}:{listener.port}", stop)
    error = state.loop.load_error
    if error is not None:
        report_error(f"cannot load the model: {one_line(str(error))}")
        return EXIT_USAGE if _is_input_error(error) else EXIT_FAILED
    return 0


def _settings(args: argparse.Namespace) -> _Settings:
    from xpuspec.executor.properties import parse_properties, with_preset

    names = args.served_model_name or list(model_names(args.bundle))
    try:
        return _Settings(
            config=ServerConfig(
                served_model_name=names[0],
                model_aliases=tuple(names[1:]),
                api_key=args.api_key or None,
                max_queue=args.max_queue,
                max_body_bytes=args.max_body_bytes,
                stream_interval_s=args.stream_interval_ms / 1e3,
                stream_interval_per_stream_s=args.stream_interval_per_stream_ms / 1e3,
                allowed_hosts=(args.host, *_comma_list(args.allowed_hosts)),
                allowed_origins=_comma_list(args.allowed_origins),
            ),
            limits=ListenerLimits(
                threads=args.threads,
                connection_limit=args.connection_limit,
                channel_timeout_s=args.idle_timeout,
                header_timeout_s=args.header_timeout,
                body_timeout_s=args.body_timeout,
                min_body_rate=args.min_body_rate,
                # Waitress cuts absurd bodies before buffering them; the app answers 413 up to this.
                max_request_body_bytes=4 * args.max_body_bytes,
            ),
            properties=_bounded_shape_cache(
                args, with_preset(precision_preset(args), parse_properties(args.property))
            ),
            draft_properties=draft_precision(args),
            grammar_limits=GrammarLimits(
                compile_seconds=args.grammar_compile_timeout,
                max_lexer_states=args.grammar_max_lexer_states,
                max_grammar_size=args.grammar_max_size,
            ),
            kv_cache_bytes=_kv_cache_bytes(args),
        )
    except ValueError as error:
        raise _Refused(str(error), EXIT_USAGE) from error


def _kv_cache_bytes(args: argparse.Namespace) -> int | None:
    if args.num_kv_blocks is not None:
        return None
    if args.memory_budget < 1:
        raise ValueError(f"--memory-budget must be at least 1 MiB, got {args.memory_budget}")
    return int(args.memory_budget) << 20


def _bounded_shape_cache(
    args: argparse.Namespace, properties: dict[str, Any] | None
) -> dict[str, Any] | None:
    """``properties`` with the CPU plugin's compiled-shape cache bounded, where both models run on the
    CPU (the property is the CPU plugin's own) and the user did not set it."""
    if (
        args.target_device != "CPU"
        or args.draft_device != "CPU"
        or SHAPE_CACHE_PROPERTY in (properties or {})
    ):
        return properties
    return {**(properties or {}), SHAPE_CACHE_PROPERTY: DEFAULT_SHAPE_CACHE_ENTRIES}


def _comma_list(values: list[str]) -> tuple[str, ...]:
    """Repeated, comma-separated flag values as one tuple, without blanks."""
    return tuple(item.strip() for value in values for item in value.split(",") if item.strip())


def _loader(args: argparse.Namespace, settings: _Settings) -> Callable[[], Any]:
    """What the engine loop calls to load the model, while /health answers "loading"."""

    def load() -> Any:
        from xpuspec.api.pipeline import Pipeline

        pipeline = Pipeline(
            args.bundle,
            target_device=args.target_device,
            draft_device=args.draft_device,
            drafter=args.drafter,
            properties=settings.properties,
            draft_properties=settings.draft_properties,
            num_kv_blocks=args.num_kv_blocks,
            kv_cache_bytes=settings.kv_cache_bytes,
            enable_prefix_caching=not args.no_prefix_caching,
            shared_lookup_tokens=args.shared_lookup_tokens,
            grammar_limits=settings.grammar_limits,
            max_tokens_default=args.max_tokens,
        )
        # Move everything loading allocated (model, tokenizer, libraries) out of the collector's
        # reach, before the first request: otherwise a full collection walks it all, stalling every
        # thread (and /health) for a few hundred ms, while requests only make short-lived objects.
        gc.collect()
        gc.freeze()
        shape_cache = (settings.properties or {}).get(SHAPE_CACHE_PROPERTY)
        logger.info(describe(settings.kv_cache_bytes, pipeline.kv_cache_sizes(), shape_cache))
        return pipeline

    return load


def _listen(app: Any, args: argparse.Namespace, limits: ListenerLimits, unauthenticated: Any) -> HttpListener:
    """Bind the port, then open the bundle's manifest: the cheap part of loading, here so that a wrong
    --bundle is one plain line rather than a failed load."""
    from xpuspec.models.bundle import BundleError
    from xpuspec.models.resolve import resolve_bundle

    try:
        listener = HttpListener(app, args.host, args.port, limits, unauthenticated)
    except OSError as error:
        reason = error.strerror or str(error)
        raise _Refused(
            f"cannot listen on {args.host}:{args.port}: {reason} "
            "(is another server running there? pick another --port)",
            EXIT_FAILED,
        ) from error
    except ValueError as error:  # waitress: a host it cannot resolve
        raise _Refused(
            f"cannot listen on {args.host}:{args.port}: {error} (check --host)", EXIT_USAGE
        ) from error
    try:
        bundle = resolve_bundle(args.bundle)
    except BundleError as error:
        listener.close(flush_timeout_s=0)
        raise _Refused(str(error), EXIT_USAGE) from error
    warn_if_draft_is_target(bundle)
    return listener


def _drain_on_signals(state: ServerState, stop: threading.Event) -> None:
    """SIGTERM/SIGINT: stop taking requests, let those in flight finish, then set ``stop``; a second
    signal, or one while loading, stops at once."""

    def drain() -> None:
        logger.info("draining: no new requests; waiting for %d in flight", state.loop.num_in_flight)
        state.loop.stop_accepting()
        if not state.loop.wait_idle(DRAIN_TIMEOUT_S):
            logger.warning("drain timed out with %d requests in flight", state.loop.num_in_flight)
        state.wait_responses_closed(DRAIN_TIMEOUT_S)
        stop.set()

    def on_signal(signum: int, _frame: Any) -> None:
        if state.loop.draining or not state.loop.ready.is_set():
            logger.warning("stopping now")
            stop.set()
            return
        threading.Thread(target=drain, name="xpuspec-drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _serve(
    listener: HttpListener, state: ServerState, config: ServerConfig, url: str, stop: threading.Event
) -> None:
    """Load the model and answer requests until ``stop`` (or a failed load); print the one 'ready' line
    once the model is loaded."""
    from xpuspec.server.allocator import IdleTrimmer, limit_arenas

    limit_arenas()  # before the engine loop and the plugin start their threads
    announced = False
    trimmer = IdleTrimmer(busy=lambda: state.loop.num_in_flight > 0)

    def announce_when_ready() -> None:
        nonlocal announced
        if announced or not state.loop.ready.is_set() or state.loop.load_error is not None:
            return
        announced = True
        aliases = f"; aliases: {', '.join(config.model_aliases)}" if config.model_aliases else ""
        print(f"xpuspec serve: ready on {url} (model: {config.served_model_name}{aliases})", flush=True)

    def tick() -> None:
        announce_when_ready()
        trimmer.tick()

    state.loop.start()
    listener.serve(stop=lambda: stop.is_set() or state.loop.load_error is not None, tick=tick)
    listener.close()
    state.loop.stop()


def _is_input_error(error: BaseException) -> bool:
    """A bundle or argument the user gave is wrong (exit 2), rather than the machine (exit 1)."""
    from xpuspec.models.bundle import BundleError

    return isinstance(error, (BundleError, ValueError, FileNotFoundError, NotADirectoryError))


def _configure_access_log(quiet: bool, log_health: bool) -> None:
    """Access lines go to stderr as they are (no level prefix); ``--quiet`` turns them off; /health's
    only with ``--log-health``."""
    from xpuspec.server.access_log import ACCESS_LOGGER, HealthProbeFilter

    access = logging.getLogger(ACCESS_LOGGER)
    access.propagate = False
    access.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    if not log_health:
        handler.addFilter(HealthProbeFilter())
    access.addHandler(handler)
    access.setLevel(logging.WARNING if quiet else logging.INFO)
