"""`xpuspec serve`: the OpenAI-compatible API on waitress, with a graceful drain on SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from xpuspec.server.config import DEMO_MODEL_NAME, ServerConfig

logger = logging.getLogger(__name__)

# How long a drain waits for in-flight requests before stopping anyway.
DRAIN_TIMEOUT_S = 120.0
# The serving loop's poll interval: how soon it notices the stop flag.
POLL_S = 0.2
# Waitress worker threads: each streaming response holds one for its duration.
DEFAULT_THREADS = 32


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve an OpenAI-compatible HTTP API (completions, chat, metrics)",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics and "
        "/openapi.json over one speculative-decoding engine.",
    )
    parser.add_argument("--bundle", default=None, help="a bundle folder, or demo (default: SmolLM2 + draft)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("XPUSPEC_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every endpoint but /health (default: $XPUSPEC_API_KEY)",
    )
    parser.add_argument("--target-device", default="CPU")
    parser.add_argument("--draft-device", default="CPU")
    parser.add_argument("--drafter", choices=["auto", "draft", "ngram", "none"], default="auto")
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an OpenVINO compile property for both models (repeatable)",
    )
    parser.add_argument("--max-queue", type=int, default=256, help="requests in flight before 503")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger bodies get 413")
    parser.add_argument(
        "--num-kv-blocks", type=int, default=None, help="KV-cache blocks (default: what the device fits)"
    )
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="HTTP worker threads")
    parser.set_defaults(func=run)


def served_name(bundle: str | None) -> str:
    # The folder's name only; the name a client sends is compared with it, never opened.
    if bundle is None:
        return DEMO_MODEL_NAME
    return os.path.basename(os.path.normpath(os.path.expanduser(bundle))) or DEMO_MODEL_NAME


def run(args: argparse.Namespace) -> int:
    from waitress.server import create_server

    from xpuspec.generate_command import parse_properties
    from xpuspec.server.app import create_app
    from xpuspec.server.state import server_state

    try:
        config = ServerConfig(
            served_model_name=served_name(args.bundle),
            api_key=args.api_key or None,
            max_queue=args.max_queue,
            max_body_bytes=args.max_body_bytes,
        )
    except ValueError as error:
        print(f"xpuspec serve: {error}", file=sys.stderr)
        return 2
    properties = parse_properties(args.property) or None

    def load() -> Any:
        from xpuspec.pipeline import Pipeline

        return Pipeline(
            args.bundle,
            target_device=args.target_device,
            draft_device=args.draft_device,
            drafter=args.drafter,
            properties=properties,
            num_kv_blocks=args.num_kv_blocks,
        )

    app = create_app(load, config)
    state = server_state(app)
    socket_map: dict[int, Any] = {}
    # channel_request_lookahead lets a waiting response notice that its client hung up.
    server = create_server(
        app,
        map=socket_map,
        host=args.host,
        port=args.port,
        threads=args.threads,
        channel_request_lookahead=1,
        ident="xpuspec",
    )
    stop = threading.Event()

    def drain() -> None:
        logger.info("draining: no new requests; waiting for %d in flight", state.loop.num_in_flight)
        state.loop.stop_accepting()
        if not state.loop.wait_idle(DRAIN_TIMEOUT_S):
            logger.warning("drain timed out with %d requests in flight", state.loop.num_in_flight)
        state.wait_responses_closed(DRAIN_TIMEOUT_S)
        stop.set()

    def on_signal(signum: int, _frame: Any) -> None:
        if state.loop.draining:
            logger.warning("second signal: stopping now")
            stop.set()
            return
        threading.Thread(target=drain, name="xpuspec-drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logger.info("serving %r on http://%s:%s", config.served_model_name, args.host, server.effective_port)
    print(f"xpuspec serve: listening on http://{args.host}:{server.effective_port}", flush=True)
    _serve_until(server, socket_map, stop, state)
    state.loop.stop()
    if state.loop.load_error is not None:
        print(f"xpuspec serve: loading the model failed: {state.loop.load_error}", file=sys.stderr)
        return 1
    return 0


def _serve_until(server: Any, socket_map: dict[int, Any], stop: threading.Event, state: Any) -> None:
    """Run waitress's event loop until ``stop``, then flush what clients are still owed and close."""
    from waitress import wasyncore

    while not stop.is_set() and state.loop.load_error is None:
        wasyncore.loop(timeout=POLL_S, map=socket_map, count=1)
    server.close()  # stop listening
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(
        getattr(channel, "total_outbufs_len", 0) for channel in list(socket_map.values())
    ):
        wasyncore.loop(timeout=POLL_S, map=socket_map, count=1)
    server.task_dispatcher.shutdown(timeout=2)
