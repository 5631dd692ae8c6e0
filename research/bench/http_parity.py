"""HTTP against in-process: ``python -m research.bench.http_parity [--bundle demo] [--clients 1,16]``.

For each draft length (0 = target-only) and each concurrency N, a round is ``--requests`` turns; in
each turn both sides generate the same N prompts at once, one after the other (which goes first
alternates by turn and round):

- **in-process**: ``Pipeline.generate`` on the N prompts;
- **HTTP**: a real ``xpuspec serve`` subprocess (same bundle, drafter and properties) and N client
  threads, each streaming one completion (greedy, fixed length, end-of-sequence ignored,
  ``stream_options.include_usage``) over its own kept-alive connection, counting the usage chunk's
  tokens.

Prefix caching is alike on both sides: off unless ``--prefix-caching`` (each line counts the prompt
tokens either side took from its cache). So the ratio of their aggregate tokens/s is the cost of the
server path (HTTP, Flask/waitress, SSE frames, the engine thread's hand-over, and the client itself,
which shares the machine). The ratio is taken per round; the median is reported. Interleaving turn by
turn, not round by round, lets load from other tenants of the machine hit both sides alike.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from xpuspec.bench.server_process import ServerProcess, StreamedCompletion, stream_completion
from xpuspec.bench.workloads import heldout_code_prompts
from xpuspec.sample.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class ParityResult:
    """Aggregate tokens/s of each round, in-process and over HTTP, at one draft length and concurrency."""

    label: str
    clients: int
    local: list[float] = field(default_factory=list)
    http: list[float] = field(default_factory=list)
    # CPU ms per token summed over the rounds: this process in-process; the server and the client
    # over HTTP (Linux only, else NaN). All cores are shared, so CPU beyond in-process is time lost.
    local_cpu_ms: list[float] = field(default_factory=list)
    server_cpu_ms: list[float] = field(default_factory=list)
    client_cpu_ms: list[float] = field(default_factory=list)
    # Prompt tokens served from the prefix cache, summed over the rounds: equal settings on both
    # sides show as both zero (off) or both above zero (on, since the rounds repeat their prompts).
    local_cached_tokens: int = 0
    http_cached_tokens: int = 0

    @property
    def ratios(self) -> list[float]:
        return [http / local for local, http in zip(self.local, self.http, strict=False) if local > 0]

    def line(self) -> str:
        ratios = self.ratios
        return (
            f"{self.label:12s} {self.clients:3d} client(s): in-process {statistics.median(self.local):8.1f}, "
            f"HTTP {statistics.median(self.http):8.1f} tokens/s (medians); HTTP / in-process per round "
            f"{' '.join(f'{ratio:.2f}' for ratio in ratios)}, median {statistics.median(ratios):.2f}; "
            f"CPU ms/token in-process {statistics.median(self.local_cpu_ms):.3f}, "
            f"HTTP server {statistics.median(self.server_cpu_ms):.3f} + client "
            f"{statistics.median(self.client_cpu_ms):.3f}; prompt tokens from the prefix cache "
            f"in-process {self.local_cached_tokens}, HTTP {self.http_cached_tokens}"
        )


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) from /proc; NaN where there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fitting_prompts(pipeline: Any, count: int, max_tokens: int) -> list[str]:
    """``count`` held-out code prompts that leave room for ``max_tokens`` in the model's context."""
    room = pipeline.max_model_len - max_tokens
    candidates = [prompt.text for prompt in heldout_code_prompts(4 * count)]
    fitting = [text for text in candidates if len(pipeline.tokenizer.encode(text)) <= room]
    if len(fitting) < count:
        raise ValueError(
            f"only {len(fitting)} held-out prompts fit {max_tokens} new tokens; lower --max-tokens"
        )
    return fitting[:count]


@dataclass
class _SideTotals:
    """One side's sums over the turns of a round."""

    seconds: float = 0.0
    tokens: int = 0
    cpu_s: float = 0.0  # in-process: this process; HTTP: the server process
    client_cpu_s: float = 0.0  # HTTP only: this process, which runs the clients
    cached_tokens: int = 0

    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def cpu_ms_per_token(self, cpu_s: float) -> float:
        return 1e3 * cpu_s / max(1, self.tokens)


def _local_turn(pipeline: Any, prompts: list[str], params: SamplingParams, totals: _SideTotals) -> None:
    """Generate ``prompts`` in-process, all at once, and add the turn to ``totals``."""
    cpu = time.process_time()
    started = time.perf_counter()
    results = pipeline.generate(prompts, params)
    totals.seconds += time.perf_counter() - started
    totals.cpu_s += time.process_time() - cpu
    totals.tokens += sum(len(result.token_ids) for result in results)
    totals.cached_tokens += sum(int(result.stats.get("cached_tokens") or 0) for result in results)


def _http_turn(
    server: ServerProcess,
    clients: list[httpx.Client],
    prompts: list[str],
    body: dict[str, Any],
    totals: _SideTotals,
) -> None:
    """Stream ``prompts`` at once, one client thread each, and add the turn to ``totals``."""
    assert server.process is not None
    results: list[StreamedCompletion] = [None] * len(prompts)  # type: ignore[list-item]

    def client(index: int) -> None:
        results[index] = stream_completion(clients[index], server, {**body, "prompt": prompts[index]})

    threads = [threading.Thread(target=client, args=(index,)) for index in range(len(prompts))]
    server_cpu = process_cpu_seconds(server.process.pid)
    client_cpu = time.process_time()
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    totals.seconds += time.perf_counter() - started
    totals.cpu_s += process_cpu_seconds(server.process.pid) - server_cpu
    totals.client_cpu_s += time.process_time() - client_cpu
    errors = [result.error for result in results if result.error]
    if errors:
        raise RuntimeError(f"{len(errors)} streaming requests failed, the first: {errors[0]}")
    totals.tokens += sum(result.output_tokens for result in results)
    totals.cached_tokens += sum(result.cached_prompt_tokens for result in results)


def measure(
    bundle: str | None,
    num_draft_tokens: int,
    concurrencies: list[int],
    rounds: int,
    requests_per_client: int,
    max_tokens: int,
    properties: dict[str, Any] | None = None,
    server_args: list[str] | None = None,
    prefix_caching: bool = False,
) -> list[ParityResult]:
    """Interleaved rounds for one draft length; one result per concurrency."""
    from xpuspec.api.pipeline import Pipeline

    drafter = "none" if num_draft_tokens == 0 else "draft"
    label = "target-only" if num_draft_tokens == 0 else f"γ = {num_draft_tokens}"
    # Prefix caching is set alike on both sides: the rounds repeat their prompts, so a cache on one
    # side only would skip that side's prefills (it made HTTP look ~6% slower than it is).
    pipeline = Pipeline(bundle, drafter=drafter, properties=properties, enable_prefix_caching=prefix_caching)
    # As `xpuspec serve` does after loading: what loading allocated is out of the collector's reach.
    gc.collect()
    gc.freeze()
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, num_draft_tokens=num_draft_tokens or None
    )
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    if num_draft_tokens:
        body["num_draft_tokens"] = num_draft_tokens
    results = [ParityResult(label, clients) for clients in concurrencies]
    prompt_sets = {
        clients: _fitting_prompts(pipeline, clients * requests_per_client, max_tokens)
        for clients in concurrencies
    }
    with tempfile.TemporaryDirectory() as folder:
        server = ServerProcess(
            Path(pipeline.bundle.root),
            Path(folder) / "server.log",
            drafter,
            properties=properties,
            prefix_caching=prefix_caching,
        )
        server.command += ["--quiet", *(server_args or [])]
        with server:
            connections = [httpx.Client() for _ in range(max(concurrencies))]
            try:
                # Warm-up: the first shapes compile kernels, in both.
                for clients in concurrencies:
                    warm = prompt_sets[clients][:clients]
                    _local_turn(pipeline, warm, params, _SideTotals())
                    _http_turn(server, connections, warm, body, _SideTotals())
                for round_index in range(rounds):
                    for result in results:
                        _measure_round(
                            pipeline,
                            server,
                            connections,
                            prompt_sets[result.clients],
                            result,
                            round_index,
                            params,
                            body,
                        )
                        logger.info("round %d: %s", round_index, result.line())
            finally:
                for connection in connections:
                    connection.close()
    return results


def _measure_round(
    pipeline: Any,
    server: ServerProcess,
    connections: list[httpx.Client],
    prompts: list[str],
    result: ParityResult,
    round_index: int,
    params: SamplingParams,
    body: dict[str, Any],
) -> None:
    """One round at ``result.clients``: turn by turn (each side generating that many prompts at once),
    the sides alternating which goes first, so load from outside hits both alike."""
    local, http = _SideTotals(), _SideTotals()
    clients = result.clients
    for turn_index, first in enumerate(range(0, len(prompts), clients)):
        turn = prompts[first : first + clients]
        sides = ("local", "http") if (round_index + turn_index) % 2 == 0 else ("http", "local")
        for side in sides:
            if side == "local":
                _local_turn(pipeline, turn, params, local)
            else:
                _http_turn(server, connections, turn, body, http)
    result.local.append(local.rate())
    result.local_cpu_ms.append(local.cpu_ms_per_token(local.cpu_s))
    result.local_cached_tokens += local.cached_tokens
    result.http.append(http.rate())
    result.server_cpu_ms.append(http.cpu_ms_per_token(http.cpu_s))
    result.client_cpu_ms.append(http.cpu_ms_per_token(http.client_cpu_s))
    result.http_cached_tokens += http.cached_tokens


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m research.bench.http_parity", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--bundle", default="demo", help="bundle folder, or 'demo' (the default)")
    parser.add_argument("--draft-lengths", default="0,4", help="γ values; 0 is target-only")
    parser.add_argument("--clients", default="1,16", help="concurrencies to measure")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per side (at least 3)")
    parser.add_argument("--requests", type=int, default=6, help="requests per client per round")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per request")
    parser.add_argument("--property", action="append", default=[], help="compile property KEY=VALUE")
    parser.add_argument(
        "--prefix-caching",
        action="store_true",
        help="prefix caching on in both the server and the in-process engine (default: off in both)",
    )
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra `xpuspec serve` argument (repeatable)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be at least 3")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    properties = dict(item.split("=", 1) for item in args.property) or None
    concurrencies = [int(value) for value in args.clients.split(",") if value.strip()]
    for gamma in (int(value) for value in args.draft_lengths.split(",") if value.strip()):
        for result in measure(
            args.bundle,
            gamma,
            concurrencies,
            args.rounds,
            args.requests,
            args.max_tokens,
            properties,
            args.server_arg,
            args.prefix_caching,
        ):
            print(result.line())
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
