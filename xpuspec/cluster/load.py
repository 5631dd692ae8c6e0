"""A load of two-turn conversations against any xpuspec URL (the cluster's ingress or ``xpuspec serve``).

``clients`` threads each hold ``conversations`` conversations in turn: a first turn with a prompt of
its own, then a second turn that extends it by the reply and a question, so the second turn finds
its prefix in the cache only where it reaches the replica that ran the first. Every request is a
streamed, greedy completion of ``max_tokens`` tokens (end-of-sequence ignored). Reported: requests
and tokens per second, p50/p99 request latency and time to first token, the share of second turns
that found cached prompt tokens, and the router's counts from ``/metrics`` where the URL has them.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from xpuspec.bench.server_process import sse_events

FILLER = (
    "The maintenance log lists each machine on the floor, its last inspection, the parts replaced "
    "and the technician who signed it off. "
) * 3


@dataclass(frozen=True)
class LoadConfig:
    url: str
    clients: int = 4
    conversations: int = 4  # per client
    max_tokens: int = 32
    salt: str = ""  # makes the prompts new to every cache (a second run after a first)


@dataclass
class Request:
    turn: int
    seconds: float
    ttft_s: float | None
    output_tokens: int
    cached_tokens: int
    error: str | None = None


@dataclass
class LoadReport:
    url: str
    clients: int
    requests: int
    errors: int
    seconds: float
    requests_per_s: float
    output_tokens_per_s: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    ttft_p50_ms: float | None
    second_turn_hit_rate: float | None
    router: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_load(config: LoadConfig) -> LoadReport:
    model = _model(config.url)
    results: list[Request] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        with httpx.Client(timeout=600) as http:
            for number in range(config.conversations):
                prompt = f"# log {config.salt}{index}.{number}\n{FILLER}"
                first = _complete(http, config, model, prompt, turn=1)
                second_prompt = f"{prompt}{first[1]}\n# question {number}: which part failed most?\n"
                second = _complete(http, config, model, second_prompt, turn=2)
                with lock:
                    results.extend((first[0], second[0]))

    before = router_counts(config.url)
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(index,), daemon=True) for index in range(config.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    after = router_counts(config.url)
    ok = [request for request in results if request.error is None]
    seconds_turns = [request for request in ok if request.turn == 2]
    return LoadReport(
        url=config.url,
        clients=config.clients,
        requests=len(results),
        errors=len(results) - len(ok),
        seconds=seconds,
        requests_per_s=len(ok) / seconds,
        output_tokens_per_s=sum(request.output_tokens for request in ok) / seconds,
        latency_p50_ms=_percentile_ms([request.seconds for request in ok], 50),
        latency_p99_ms=_percentile_ms([request.seconds for request in ok], 99),
        ttft_p50_ms=_percentile_ms([request.ttft_s for request in ok if request.ttft_s is not None], 50),
        second_turn_hit_rate=(
            sum(request.cached_tokens > 0 for request in seconds_turns) / len(seconds_turns)
            if seconds_turns
            else None
        ),
        router={outcome: after[outcome] - before.get(outcome, 0.0) for outcome in after},
    )


def router_counts(url: str) -> dict[str, float]:
    """``xpuspec_router_requests_total`` by outcome, from the URL's /metrics (empty without a router)."""
    counts: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("xpuspec_router_requests_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            counts[outcome] = float(line.rsplit(" ", 1)[1])
    return counts


def _model(url: str) -> str:
    return str(httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"])


def _complete(
    http: httpx.Client, config: LoadConfig, model: str, prompt: str, turn: int
) -> tuple[Request, str]:
    """One streamed completion: its timings and usage, and its text."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": config.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    try:
        with http.stream("POST", f"{config.url}/v1/completions", json=body) as response:
            for event in sse_events(response):
                for choice in event.get("choices", ()):
                    if choice.get("text"):
                        first = first or time.perf_counter()
                        text.append(choice["text"])
                usage = event.get("usage") or usage
    except (httpx.HTTPError, RuntimeError, json.JSONDecodeError) as error:
        return Request(turn, time.perf_counter() - started, None, 0, 0, str(error)), ""
    details = usage.get("prompt_tokens_details") or {}
    request = Request(
        turn,
        time.perf_counter() - started,
        None if first is None else first - started,
        int(usage.get("completion_tokens", 0)),
        int(details.get("cached_tokens") or 0),
    )
    return request, "".join(text)


def _percentile_ms(values: list[float], percent: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0] * 1000
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1] * 1000
