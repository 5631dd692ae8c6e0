"""`xpuspec cluster up CONFIG` (the Ray Serve application on a running Ray cluster) and
`xpuspec cluster load --url URL` (two-turn conversations against an ingress or a server).

Both need the ``cluster`` extra (``pip install xpuspec[cluster]``); ``up`` hands the config to Serve's
own ``serve run --non-blocking`` (the application outlives the command), then waits until Serve
reports every application RUNNING and the ingress answers ``/health``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from xpuspec.api.errors import EXIT_FAILED, EXIT_USAGE, CommandError

DEFAULT_HOST = "127.0.0.1"  # Serve's own defaults, where the config names no http_options
DEFAULT_PORT = 8000


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cluster",
        help="run the OpenAI-compatible API as Ray Serve replicas (needs xpuspec[cluster])",
        description="Replicas of the engine on a Ray cluster behind one ingress that routes by prefix "
        "affinity (docs/cluster.md).",
    )
    commands = parser.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND", required=True)
    up = commands.add_parser(
        "up",
        help="deploy a Serve config (e.g. deploy/ray/serve_config.yaml) on a running Ray cluster",
        description="Deploy the applications of a Serve config file on a running Ray cluster (start one "
        "with `ray start --head`), wait until the ingress answers /health, print its URL.",
    )
    up.add_argument("config", type=Path, help="a Serve config file")
    up.add_argument(
        "--address", default=None, help="the Ray cluster (default: RAY_ADDRESS, or the local one)"
    )
    up.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health (default 600)")
    up.set_defaults(func=run_up)
    load = commands.add_parser(
        "load",
        help="two-turn conversations against an ingress or a server: requests/s, latency, cache hits",
        description="Clients each hold conversations of two turns (the second extends the first), as "
        "streamed greedy completions; prints requests/s, p50/p99 latency and the share of second turns "
        "that found their prefix cached, per client count.",
    )
    load.add_argument(
        "--url", required=True, help="the ingress (or `xpuspec serve`), e.g. http://127.0.0.1:8000"
    )
    load.add_argument("--clients", default="1,4", help="client counts, comma-separated (default 1,4)")
    load.add_argument("--conversations", type=int, default=4, help="conversations per client (default 4)")
    load.add_argument("--max-tokens", type=int, default=32, help="new tokens per turn (default 32)")
    load.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    load.set_defaults(func=run_load_command)


def run_up(args: argparse.Namespace) -> int:
    import yaml

    try:
        config = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise CommandError(f"cannot read the Serve config {args.config}: {error}") from error
    if not isinstance(config, dict) or not config.get("applications"):
        raise CommandError(f"{args.config} is not a Serve config: it lists no applications")
    http = config.get("http_options") or {}
    host = http.get("host", DEFAULT_HOST)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{http.get('port', DEFAULT_PORT)}"
    serve = shutil.which("serve", path=str(Path(sys.executable).parent)) or shutil.which("serve")
    if serve is None:
        raise CommandError("Ray Serve is not installed: pip install 'xpuspec[cluster]'", EXIT_FAILED)
    command = [serve, "run", "--non-blocking", str(args.config)]
    if args.address:
        command[2:2] = ["--address", args.address]
    done = subprocess.run(command, env=os.environ.copy(), check=False)
    if done.returncode != 0:
        raise CommandError(
            f"`serve run` failed with exit code {done.returncode} (its output is above)", EXIT_FAILED
        )
    names = [app.get("name", "default") for app in config["applications"]]
    if not _wait_running(args.address, names, args.timeout) or not _wait_healthy(url, args.timeout):
        raise CommandError(
            f"the application did not answer {url}/health within {args.timeout:.0f} s", EXIT_FAILED
        )
    print(f"xpuspec cluster: ready on {url}")
    return 0


def _wait_running(address: str | None, names: list[str], timeout: float) -> bool:
    """Serve reports every application of the config RUNNING (an update replaces replicas first)."""
    import ray
    from ray import serve

    ray.init(
        address=address or os.environ.get("RAY_ADDRESS", "auto"),
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            applications = serve.status().applications
            if all(name in applications and applications[name].status == "RUNNING" for name in names):
                return True
            time.sleep(1.0)
        return False
    finally:
        ray.shutdown()


def _wait_healthy(url: str, timeout: float) -> bool:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(1.0)
    return False


def run_load_command(args: argparse.Namespace) -> int:
    import logging

    from xpuspec.cluster.load import LoadConfig, run_load

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the results
    try:
        counts = [int(part) for part in args.clients.split(",") if part.strip()]
    except ValueError:
        raise CommandError(
            f"--clients takes integers separated by commas, got {args.clients!r}", EXIT_USAGE
        ) from None
    if not counts or min(counts) < 1 or args.conversations < 1 or args.max_tokens < 1:
        raise CommandError("--clients, --conversations and --max-tokens must be at least 1", EXIT_USAGE)
    reports = []
    for number, clients in enumerate(counts):
        config = LoadConfig(
            args.url.rstrip("/"),
            clients,
            args.conversations,
            args.max_tokens,
            salt=f"{time.time_ns()}-{number}-",
        )
        report = run_load(config)
        reports.append(report.as_dict())
        print(
            f"{clients} clients: {report.requests} requests ({report.errors} failed) "
            f"in {report.seconds:.1f} s, "
            f"{report.requests_per_s:.2f} requests/s, {report.output_tokens_per_s:.1f} tokens/s, "
            f"latency p50 {_ms(report.latency_p50_ms)} p99 {_ms(report.latency_p99_ms)}, "
            f"TTFT p50 {_ms(report.ttft_p50_ms)}, second turns cached {_share(report.second_turn_hit_rate)}"
            + (f", router {report.router}" if report.router else "")
        )
    if args.json is not None:
        args.json.write_text(json.dumps(reports, indent=2) + "\n", encoding="utf-8")
    return 0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
