"""Chat clients for the serve comparison: N threads sending streamed greedy chat requests back to back.

The same client drives ``xpuspec serve`` and ``llama-server`` through their OpenAI chat routes. At N
clients, the round's requests (every prompt once, cycled when there are fewer prompts than clients)
sit in one queue; each client takes the next as soon as its previous answer is complete, so N requests
are in flight until the queue runs dry. A round's aggregate throughput is its tokens over its wall
time, from the first request sent to the last answer complete.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from xpuspec.bench.server_process import sse_events

Messages = list[dict[str, str]]


@dataclass
class ChatResult:
    text: str
    tokens: int
    seconds: float
    ttft_s: float | None
    prompt_index: int = 0
    # llama-server's own draft counts (its final event's ``timings``), when it speculated.
    draft_n: int | None = None
    draft_accepted: int | None = None


@dataclass
class ClientsRound:
    """One round at one client count: every request's result (in the order they completed) and the
    round's wall time."""

    clients: int
    results: list[ChatResult]
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.results) / max(self.wall_s, 1e-9)

    def texts_by_prompt(self, prompts: int) -> list[str]:
        """The first answer to each prompt, in prompt order ("" for one that got none)."""
        texts: dict[int, str] = {}
        for result in self.results:
            texts.setdefault(result.prompt_index, result.text)
        return [texts.get(index, "") for index in range(prompts)]


def stream_chat(
    client: httpx.Client,
    base_url: str,
    model: str,
    messages: Messages,
    max_tokens: int,
    ignore_eos: bool = False,
) -> ChatResult:
    """One streamed greedy /v1/chat/completions; the text, the completion tokens (usage, else one per
    chunk with content), the wall time, the time to the first content, and llama-server's draft counts
    where its ``timings`` carry them. Every server gets the same plain greedy request: no repetition
    penalty, DRY included, whatever a server's or a model's own default (the default model's penalises
    repeats, llama.cpp's does not). ``ignore_eos``: the answer is ``max_tokens`` long whatever the
    model ends with (both servers read the field)."""
    payload = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "dry_multiplier": 0.0,
        "seed": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        payload["ignore_eos"] = True
    started = time.perf_counter()
    first = None
    pieces: list[str] = []
    usage_tokens = None
    timings: dict[str, Any] = {}
    # One connection per request, for both servers alike: llama-server's HTTP library closes a kept-alive
    # connection after a few requests, and a reused connection it closed fails the next request.
    headers = {"Connection": "close"}
    with client.stream(
        "POST", f"{base_url}/v1/chat/completions", json=payload, headers=headers, timeout=600
    ) as response:
        for event in sse_events(response):
            for choice in event.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    first = first or time.perf_counter()
                    pieces.append(content)
            if event.get("usage"):
                usage_tokens = int(event["usage"]["completion_tokens"])
            if isinstance(event.get("timings"), dict):
                timings = event["timings"]
    seconds = time.perf_counter() - started
    tokens = usage_tokens if usage_tokens is not None else len(pieces)
    result = ChatResult("".join(pieces), tokens, seconds, None if first is None else first - started)
    if "draft_n" in timings:
        result.draft_n = int(timings["draft_n"])
        result.draft_accepted = int(timings.get("draft_n_accepted") or 0)
    return result


def run_clients(
    base_url: str,
    model: str,
    prompts: Sequence[Messages],
    clients: int,
    max_tokens: int | Sequence[int],
    *,
    cycle: bool = True,
    ignore_eos: bool = False,
) -> ClientsRound:
    """``clients`` threads answering the round's requests back to back; the first failure is raised
    once every thread has stopped (the others stop taking new requests after it). With ``cycle`` the
    prompts repeat until every client has one; without, each prompt is sent once (a server that indexes
    earlier requests would answer a repeat faster), so at most ``len(prompts)`` are in flight.
    ``max_tokens``: one limit for every request, or one a prompt (with ``ignore_eos``, each answer's
    length)."""
    limits = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    if len(limits) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(limits)} token limits")
    queue = list(range(max(len(prompts), clients) if cycle else len(prompts)))
    lock = threading.Lock()
    results: list[ChatResult] = []
    failures: list[BaseException] = []

    def client() -> None:
        with httpx.Client() as http:
            while True:
                with lock:
                    if not queue or failures:
                        return
                    index = queue.pop(0) % len(prompts)
                try:
                    result = stream_chat(http, base_url, model, prompts[index], limits[index], ignore_eos)
                except (httpx.HTTPError, RuntimeError, ValueError) as error:
                    with lock:
                        failures.append(error)
                    return
                result.prompt_index = index
                with lock:
                    results.append(result)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall_s = time.perf_counter() - started
    if failures:
        raise failures[0]
    return ClientsRound(clients, results, wall_s)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), linear between the closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
