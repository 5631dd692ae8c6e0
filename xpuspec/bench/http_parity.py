"""HTTP against in-process: ``python -m xpuspec.bench.http_parity [--bundle demo] [--clients 1,16]``.

For each draft length (0 = target-only) and each concurrency N, rounds alternate (and alternate
which goes first) between:

- **in-process**: ``Pipeline.generate`` on N prompts at once, ``--requests`` times in turn;
- **HTTP**: a real ``xpuspec serve`` subprocess (same bundle, drafter and properties) and N client
  threads, each streaming ``--requests`` completions in turn (greedy, fixed length, end-of-sequence
  ignored, ``stream_options.include_usage``), counting the usage chunk's tokens.

Both generate the same prompts to the same lengths, so the ratio of their aggregate tokens/s is the
cost of the server path (HTTP, Flask/waitress, SSE frames, the engine thread's hand-over, and the
client itself, which shares the machine). The ratio is taken per round pair; the median is reported.
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
            f"{statistics.median(self.client_cpu_ms):.3f}"
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


def _local_round(
    pipeline: Any, prompts: list[str], clients: int, params: SamplingParams
) -> tuple[float, float]:
    """(tokens/s, CPU ms per token) of generating ``prompts`` in-process, ``clients`` at a time."""
    cpu = time.process_time()
    started = time.perf_counter()
    tokens = 0
    for turn in range(0, len(prompts), clients):
        tokens += sum(
            len(result.token_ids) for result in pipeline.generate(prompts[turn : turn + clients], params)
        )
    seconds = time.perf_counter() - started
    return tokens / seconds, 1e3 * (time.process_time() - cpu) / max(1, tokens)


def _http_round(
    server: ServerProcess, prompts: list[str], clients: int, body: dict[str, Any]
) -> tuple[float, float, float]:
    """(tokens/s, server CPU ms per token, client CPU ms per token) of ``clients`` streaming clients."""
    assert server.process is not None
    results: list[StreamedCompletion] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        with httpx.Client() as http:
            for prompt in prompts[index::clients]:
                completion = stream_completion(http, server, {**body, "prompt": prompt})
                with lock:
                    results.append(completion)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    server_cpu = process_cpu_seconds(server.process.pid)
    client_cpu = time.process_time()
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    server_cpu = process_cpu_seconds(server.process.pid) - server_cpu
    client_cpu = time.process_time() - client_cpu
    errors = [result.error for result in results if result.error]
    if errors:
        raise RuntimeError(f"{len(errors)} streaming requests failed, the first: {errors[0]}")
    tokens = max(1, sum(result.output_tokens for result in results))
    return tokens / seconds, 1e3 * server_cpu / tokens, 1e3 * client_cpu / tokens


def measure(
    bundle: str | None,
    num_draft_tokens: int,
    concurrencies: list[int],
    rounds: int,
    requests_per_client: int,
    max_tokens: int,
    properties: dict[str, Any] | None = None,
    server_args: list[str] | None = None,
) -> list[ParityResult]:
    """Interleaved rounds for one draft length; one result per concurrency."""
    from xpuspec.pipeline import Pipeline

    drafter = "none" if num_draft_tokens == 0 else "draft"
    label = "target-only" if num_draft_tokens == 0 else f"γ = {num_draft_tokens}"
    pipeline = Pipeline(bundle, drafter=drafter, properties=properties)
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
            Path(pipeline.bundle.root), Path(folder) / "server.log", drafter, properties=properties
        )
        server.command += ["--quiet", *(server_args or [])]
        with server:
            # Warm-up: the first shapes compile kernels, in both.
            for clients in concurrencies:
                warm = prompt_sets[clients][:clients]
                _local_round(pipeline, warm, clients, params)
                _http_round(server, warm, clients, body)
            for round_index in range(rounds):
                for result in results:
                    prompts = prompt_sets[result.clients]
                    order = ("local", "http") if round_index % 2 == 0 else ("http", "local")
                    for kind in order:
                        if kind == "local":
                            rate, cpu_ms = _local_round(pipeline, prompts, result.clients, params)
                            result.local.append(rate)
                            result.local_cpu_ms.append(cpu_ms)
                        else:
                            rate, server_ms, client_ms = _http_round(server, prompts, result.clients, body)
                            result.http.append(rate)
                            result.server_cpu_ms.append(server_ms)
                            result.client_cpu_ms.append(client_ms)
                    logger.info("round %d: %s", round_index, result.line())
    return results


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m xpuspec.bench.http_parity", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--bundle", default="demo", help="bundle folder, or 'demo' (the default)")
    parser.add_argument("--draft-lengths", default="0,4", help="γ values; 0 is target-only")
    parser.add_argument("--clients", default="1,16", help="concurrencies to measure")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per side (at least 3)")
    parser.add_argument("--requests", type=int, default=6, help="requests per client per round")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per request")
    parser.add_argument("--property", action="append", default=[], help="compile property KEY=VALUE")
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
        ):
            print(result.line())
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
