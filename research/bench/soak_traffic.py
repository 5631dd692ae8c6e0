"""The kinds of client a soak runs against one `xpuspec serve` (research/bench/soak.py), each one call
that returns the HTTP status it got (0: none is due, e.g. a connection the client drops mid-request).

Kinds: OpenAI chat plain and streamed (the official client), early disconnects (a stream dropped after
its first frames), Ollama's client, structured output (a JSON schema), hostile requests (foreign
Host and Origin, malformed and oversized bodies, half-open connections: each should be a 4xx) and a
health prober.
"""

from __future__ import annotations

import json
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

TOPICS = (
    "the sea", "a binary search", "staying healthy", "the moon landing", "bread baking",
    "a chess opening", "photosynthesis", "a haiku about rain", "sorting algorithms", "volcanoes",
)  # fmt: skip
SYSTEM_PROMPT = "You are a concise assistant. Answer in a few sentences."
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Target:
    """The server a client calls: its URL, port and model name."""

    base_url: str
    port: int
    model: str


def user_prompt(rng: random.Random) -> str:
    """A prompt with a shared start (prefix-cache hits) and a unique tail (new prefixes to cache)."""
    return f"Tell me about {rng.choice(TOPICS)}. (note {rng.randrange(10**9)})"


def openai_chat(target: Target, rng: random.Random, stream: bool) -> int:
    import openai

    client = openai.OpenAI(base_url=f"{target.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    messages: Any = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_prompt(rng)},
    ]
    try:
        with client:
            if stream:
                chunks = client.chat.completions.create(
                    model=target.model, messages=messages, max_tokens=rng.randint(32, 256), stream=True
                )
                for _ in chunks:
                    pass
            else:
                client.chat.completions.create(
                    model=target.model, messages=messages, max_tokens=rng.randint(16, 128), temperature=0
                )
    except openai.APIStatusError as error:
        return error.status_code
    return 200


def early_disconnect(target: Target, rng: random.Random) -> int:
    """A stream closed after its first few frames: the server must abort it and free its KV."""
    body = {"model": target.model, "prompt": user_prompt(rng), "max_tokens": 256, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", f"{target.base_url}/v1/completions", json=body, timeout=120) as response:
        frames = 0
        for _ in response.iter_lines():
            frames += 1
            if frames >= rng.randint(1, 8):
                break
        return response.status_code


def ollama_chat(target: Target, rng: random.Random) -> int:
    import ollama

    client = ollama.Client(host=target.base_url, timeout=300)
    messages = [{"role": "user", "content": user_prompt(rng)}]
    options = {"num_predict": rng.randint(16, 128)}
    try:
        if rng.random() < 0.5:
            client.chat(model=target.model, messages=messages, options=options)
        else:
            for _ in client.chat(model=target.model, messages=messages, options=options, stream=True):
                pass
    except ollama.ResponseError as error:
        return error.status_code
    return 200


def structured(target: Target, rng: random.Random) -> int:
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": f"Invent a person who likes {rng.choice(TOPICS)}."}],
        "max_tokens": 64,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
    }
    response = httpx.post(f"{target.base_url}/v1/chat/completions", json=body, timeout=300)
    return response.status_code


def health(target: Target, rng: random.Random) -> int:
    return httpx.get(f"{target.base_url}/health", timeout=30).status_code


@dataclass(frozen=True)
class HostileRequest:
    """A POST the server must refuse: ``fields`` over a small valid completion, or ``raw`` bytes."""

    fields: dict[str, Any] = field(default_factory=dict)
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON_HEADERS))
    path: str = "/v1/completions"

    def send(self, target: Target) -> int:
        body = {"model": target.model, "prompt": "hi", "max_tokens": 4, **self.fields}
        content = self.raw if self.raw is not None else json.dumps(body).encode()
        url = f"{target.base_url}{self.path}"
        return httpx.post(url, content=content, headers=self.headers, timeout=60).status_code


def _half_open(target: Target) -> int:
    """Headers never finished, then dropped: the server times the connection out or sees it close."""
    with socket.create_connection(("127.0.0.1", target.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 40\r\n")
    return 0


EVIL = "http://evil.example"
HOSTILE: dict[str, Callable[[Target], int]] = {
    "foreign host": HostileRequest(headers={**JSON_HEADERS, "Host": "evil.example"}).send,
    "cross-origin text/plain": HostileRequest(headers={"Content-Type": "text/plain", "Origin": EVIL}).send,
    "text/plain body": HostileRequest(headers={"Content-Type": "text/plain"}).send,
    "malformed json": HostileRequest(raw=b"{nope").send,
    "deep nesting": HostileRequest(raw=b"[" * 5000 + b"]" * 5000).send,
    "huge integer": HostileRequest(raw=b'{"model": "m", "prompt": "x", "seed": ' + b"9" * 400 + b"}").send,
    "NaN": HostileRequest(raw=b'{"model": "m", "prompt": "x", "top_p": NaN}').send,
    "unknown route": HostileRequest(path="/v1/nothing").send,
    "wrong model": HostileRequest({"model": "no-such-model"}).send,
    "beyond context": HostileRequest({"max_tokens": 10**6}).send,
    "too many choices": HostileRequest({"n": 10_000}).send,
    "unsupported parameter": HostileRequest({"logit_bias": {"1": 5}}).send,
    "bad schema": HostileRequest({"response_format": {"type": "json_schema", "json_schema": 3}}).send,
    "oversized body": HostileRequest(raw=b" " * (3 << 20)).send,
    "ollama bad options": HostileRequest(raw=b'{"model": "x", "options": 7}', path="/api/generate").send,
    "half-open connection": _half_open,
}


def hostile(target: Target, rng: random.Random) -> int:
    """One hostile request, chosen at random; each should be refused with a 4xx (never a 5xx)."""
    return HOSTILE[rng.choice(sorted(HOSTILE))](target)


def plain(target: Target, rng: random.Random) -> int:
    return openai_chat(target, rng, stream=False)


def streamed(target: Target, rng: random.Random) -> int:
    return openai_chat(target, rng, stream=True)


# kind -> (call, clients running it at once, pause between its calls in seconds)
KINDS: dict[str, tuple[Callable[[Target, random.Random], int], int, float]] = {
    "openai plain": (plain, 2, 0.0),
    "openai streamed": (streamed, 2, 0.0),
    "early disconnect": (early_disconnect, 1, 0.5),
    "ollama": (ollama_chat, 1, 0.0),
    "structured": (structured, 1, 0.5),
    "hostile": (hostile, 1, 0.2),
    "health": (health, 1, 1.0),
}
