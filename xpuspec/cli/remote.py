"""`xpuspec generate` through a running `xpuspec serve`, as `ollama run` uses its server: no model load.

Before loading, `generate` asks ``--server`` (default ``http://127.0.0.1:8000``, `serve`'s default) for
``/health`` and ``/v1/models`` with a short timeout; when that server is ready and serves the model the
command names, the prompt is streamed from it (chat or completion, the same sampling fields). Anything
else (no server, another model, an error, a flag that only a local load can honour) means a local load,
as before. ``--local`` skips the probe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from xpuspec.api.errors import CommandError

DEFAULT_SERVER = "http://127.0.0.1:8000"
PROBE_TIMEOUT_S = 0.5
API_KEY_ENV = "XPUSPEC_API_KEY"


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=DEFAULT_SERVER,
        help=f"use this running `xpuspec serve` when it serves the same model (default {DEFAULT_SERVER}); "
        f"its API key from ${API_KEY_ENV}",
    )
    parser.add_argument("--local", action="store_true", help="load the model here; never ask a server")


def wants_server(args: argparse.Namespace) -> bool:
    """Only flags a request can carry: load-time ones (devices, properties, presets, a drafter other
    than the server's, --json's token ids) need a local load."""
    local_only = (
        args.local
        or args.json
        or args.property
        or args.exact
        or args.stable
        or args.target_device != "CPU"
        or args.draft_device != "CPU"
        or args.drafter not in ("auto", "none")
    )
    return not local_only


def _request(url: str, body: dict[str, Any] | None = None, timeout: float = PROBE_TIMEOUT_S) -> Any:
    headers = {"content-type": "application/json"}
    if os.environ.get(API_KEY_ENV):
        headers["authorization"] = f"Bearer {os.environ[API_KEY_ENV]}"
    data = json.dumps(body).encode() if body is not None else None
    return urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout)


def serving(server: str, names: tuple[str, ...]) -> tuple[str, int] | None:
    """The name ``server`` serves the model under and its reply cap, when it is up, ready and serves
    one of ``names``; None otherwise."""
    try:
        with _request(f"{server}/health") as health:
            if health.status != 200:
                return None
        with _request(f"{server}/v1/models") as models:
            listed = [entry.get("id") for entry in json.load(models).get("data", [])]
        name = next((name for name in names if name in listed), None)
        if name is None:
            return None
        with _request(f"{server}/v1/xpuspec/defaults") as defaults:
            return name, int(json.load(defaults)["max_tokens"])
    except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError):
        return None


def request_body(
    args: argparse.Namespace, served: tuple[str, int], prompt: str, chat: bool, fields: dict[str, Any]
) -> dict[str, Any]:
    """The OpenAI request of ``generate``'s arguments (``fields``: the sampling flags given)."""
    model, cap = served
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True, "include_speculation": True},
        **fields,
        **({"seed": args.seed} if args.seed is not None else {}),
        **({"stop": args.stop} if args.stop else {}),
        **({"ignore_eos": True} if args.ignore_eos else {}),
        **({"num_draft_tokens": args.num_draft_tokens} if args.num_draft_tokens is not None else {}),
        **({"draft_tree": args.draft_tree} if args.draft_tree else {}),
        **({"drafter": "none"} if args.no_draft or args.drafter == "none" else {}),
    }
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        if "max_tokens" in body:
            body["max_completion_tokens"] = body.pop("max_tokens")
    else:
        body["prompt"] = prompt
        body.setdefault("max_tokens", cap)  # the server's cap: /v1/completions would give OpenAI's 16
    return body


def _events(response: Any) -> Iterator[dict[str, Any]]:
    for raw in response:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: ") :])
        if "error" in event:
            raise RuntimeError(event["error"].get("message", "the server's request failed"))
        yield event


def stream_from(server: str, body: dict[str, Any], echo: str | None) -> int:
    """Stream the reply from ``server``, then a summary line on stderr (the same clock as local runs)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    if echo is not None:
        print(echo, end="", flush=True)
    text_end, first_token_s, tokens = (echo or "")[-1:], None, 0
    started = time.perf_counter()
    try:
        response = _request(f"{server}{path}", body, timeout=600)
    except urllib.error.HTTPError as error:  # the server's one-line reason, as a local run gives it
        try:
            message = json.load(error)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {error.code}"
        raise CommandError(f"{server}: {message}") from None
    with response:
        for event in _events(response):
            for choice in event.get("choices", []):
                piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if piece:
                    if first_token_s is None:
                        first_token_s = time.perf_counter() - started
                    print(piece, end="", flush=True)
                    text_end = piece[-1:]
            tokens = (event.get("usage") or {}).get("completion_tokens", tokens)
    elapsed = time.perf_counter() - started
    if text_end != "\n":
        print(flush=True)
    first = f"{first_token_s * 1000:.0f} ms" if first_token_s is not None else "n/a"
    print(
        f"[server {server}] {tokens} tokens in {elapsed:.2f}s ({tokens / max(elapsed, 1e-9):.1f} tokens/s, "
        f"first token {first})",
        file=sys.stderr,
    )
    return 0
