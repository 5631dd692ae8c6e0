"""Load mode: throughput and latency versus concurrency against the real server, and GenAI's CB peer.

At concurrency N, N client threads each send ``requests_per_client`` streaming completions in turn
(greedy, fixed length, end-of-sequence ignored), so N requests are in flight most of the time. The
server's speculation counters (/metrics) are read before and after each level. OpenVINO GenAI's
``ContinuousBatchingPipeline`` generates the same requests as lists of N prompts.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from typing import Any

import httpx

from xpuspec.bench.config import BenchConfig
from xpuspec.bench.figures import SKIPPED, LoadLevel, LoadResult
from xpuspec.bench.latency import GENAI, XPUSPEC
from xpuspec.bench.peers import GenaiBatchRunner, genai_unavailable, why_failed
from xpuspec.bench.progress import Progress
from xpuspec.bench.server_process import ServerProcess, StreamedCompletion, stream_completion
from xpuspec.models.bundle import ModelBundle

logger = logging.getLogger(__name__)

# GenAI's speculative CB runs at this fixed draft length (the middle of the usual sweep).
GENAI_DRAFT_LENGTH = 4
SPEC_COUNTERS = ("xpuspec_spec_draft_tokens_total", "xpuspec_spec_accepted_tokens_total")


def _speculation_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Drafted/accepted tokens, overall and per draft position, between two /metrics scrapes."""
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    drafted, accepted = delta.get(SPEC_COUNTERS[0], 0.0), delta.get(SPEC_COUNTERS[1], 0.0)
    per_position: dict[int, list[float]] = {}
    for name, value in delta.items():
        for index, prefix in enumerate(
            (
                "xpuspec_spec_draft_tokens_per_position_total{",
                "xpuspec_spec_accepted_tokens_per_position_total{",
            )
        ):
            if name.startswith(prefix):
                position = int(name.split('position="')[1].split('"')[0])
                per_position.setdefault(position, [0.0, 0.0])[index] = value
    # The server's counters list every position any earlier configuration drafted (adaptive γ may
    # reach 8): the level's own positions are those it drafted.
    while per_position and per_position[max(per_position)][0] == 0:
        del per_position[max(per_position)]
    return {
        "drafted": int(drafted),
        "accepted": int(accepted),
        "acceptance_rate": accepted / drafted if drafted else None,
        "acceptance_per_position": [a / d if d else None for _, (d, a) in sorted(per_position.items())],
    }


def _run_level(
    server: ServerProcess,
    prompts: list[list[int]],
    concurrency: int,
    config: BenchConfig,
    fields: dict[str, Any],
) -> LoadLevel:
    results: list[StreamedCompletion] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        with httpx.Client() as http:
            for turn in range(config.requests_per_client):
                prompt = prompts[(index * config.requests_per_client + turn) % len(prompts)]
                body = {
                    "prompt": prompt,
                    "max_tokens": config.max_tokens,
                    "temperature": 0.0,
                    "ignore_eos": True,
                    **fields,
                }
                completion = stream_completion(http, server, body)
                with lock:
                    results.append(completion)

    before = server.metrics()
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    ok = [r for r in results if r.error is None]
    for failed in (r for r in results if r.error is not None):
        logger.warning("request failed at concurrency %d: %s", concurrency, failed.error)
    return LoadLevel(
        concurrency=concurrency,
        requests=len(results),
        output_tokens=sum(r.output_tokens for r in ok),
        seconds=seconds,
        ttft_ms=_median_ms([r.ttft_s for r in ok]),
        tpot_ms=_median_ms([r.tpot_s for r in ok]),
        errors=len(results) - len(ok),
        speculation=_speculation_delta(before, server.metrics()),
    )


def _median_ms(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) * 1000 if present else None


def _sweep_server(
    config: BenchConfig,
    drafter: str,
    variants: dict[str, dict[str, Any]],
    prompts: list[list[int]],
    progress: Progress,
) -> list[LoadResult]:
    """One server process; each variant (a name and extra request fields) sweeps every level."""
    results = []
    log = config.out / f"server-{drafter}.log"
    with ServerProcess(config.bundle, log, drafter, config.properties, config.server_timeout_s) as server:
        with httpx.Client() as http:  # warm-up: compile kernels before timing
            stream_completion(http, server, {"prompt": prompts[0], "max_tokens": 4, "temperature": 0.0})
        for name, fields in variants.items():
            result = LoadResult(name, XPUSPEC)
            for concurrency in config.concurrency:
                level = _run_level(server, prompts, concurrency, config, fields)
                result.levels.append(level)
                progress.advance(f"{name} at {concurrency} clients: {level.tokens_per_s:.1f} tokens/s")
            results.append(result)
    return results


def _sweep_genai(
    config: BenchConfig,
    bundle: ModelBundle,
    name: str,
    speculative: bool,
    prompts: list[list[int]],
    progress: Progress,
) -> LoadResult:
    result = LoadResult(name, GENAI)
    draft = bundle.draft.path if speculative and bundle.draft is not None else None
    runner = GenaiBatchRunner(bundle.target.path, draft, config.properties, max(config.concurrency))
    length = GENAI_DRAFT_LENGTH if speculative else None
    runner.generate(prompts[:1], 4, length)  # warm-up
    for concurrency in config.concurrency:
        tokens, started = 0, time.perf_counter()
        for turn in range(config.requests_per_client):
            batch = [
                prompts[(i * config.requests_per_client + turn) % len(prompts)] for i in range(concurrency)
            ]
            tokens += runner.generate(batch, config.max_tokens, length)
        seconds = time.perf_counter() - started
        level = LoadLevel(concurrency, concurrency * config.requests_per_client, tokens, seconds)
        result.levels.append(level)
        progress.advance(f"{name} at {concurrency} prompts: {level.tokens_per_s:.1f} tokens/s")
    return result


def run_load(config: BenchConfig, bundle: ModelBundle, prompts: list[list[int]]) -> dict[str, Any]:
    """Every load configuration; returns the report's ``load`` section."""
    speculative = {
        f"{XPUSPEC} server speculative (adaptive γ)": {},
        f"{XPUSPEC} server speculative (γ={GENAI_DRAFT_LENGTH})": {"num_draft_tokens": GENAI_DRAFT_LENGTH},
    }
    servers: dict[str, dict[str, dict[str, Any]]] = {
        "none": {f"{XPUSPEC} server target-only": {}},
        "draft": speculative,
    }
    genai = {f"{GENAI} CB target-only": False, f"{GENAI} CB speculative (γ={GENAI_DRAFT_LENGTH})": True}
    no_draft = "the bundle has no draft model"
    if config.quick:
        # A quick look: one server (xpuspec speculative as it serves by default, and at GenAI's γ) and
        # GenAI's speculative CB at that γ; target-only where the bundle has no draft.
        kind = "draft" if bundle.draft is not None else "none"
        servers = {kind: servers[kind]}
        genai = {name: with_draft for name, with_draft in genai.items() if with_draft == (kind == "draft")}
    progress = Progress("load", (sum(map(len, servers.values())) + len(genai)) * len(config.concurrency))
    results: list[LoadResult] = []

    def skip(name: str, engine: str, reason: str) -> None:
        results.append(LoadResult(name, engine, SKIPPED, reason))
        progress.advance(f"{name}: not run: {reason}", units=len(config.concurrency))

    for drafter, variants in servers.items():
        if drafter == "draft" and bundle.draft is None:
            for name in variants:
                skip(name, XPUSPEC, no_draft)
            continue
        results.extend(_sweep_server(config, drafter, variants, prompts, progress))
    for name, with_draft in genai.items():
        reason = genai_unavailable() or (no_draft if with_draft and bundle.draft is None else None)
        if reason is None:
            try:
                results.append(_sweep_genai(config, bundle, name, with_draft, prompts, progress))
                continue
            except Exception as error:  # a peer that fails is reported, not fatal
                reason = f"failed: {why_failed(error)}"  # said once, by skip's line
        skip(name, GENAI, reason)
    return {"configurations": [r.as_dict() for r in results]}
