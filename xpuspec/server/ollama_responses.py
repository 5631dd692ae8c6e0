"""Ollama's response bodies, made from the OpenAI ones the server already builds.

A streamed reply is the OpenAI SSE stream (``responses.stream``, rewritten by ``tools.rewrite_stream``
when the request has tools) read frame by frame and written as newline-delimited JSON: one line per
write with the text that arrived together, a line with the parsed tool calls, then the final line
with Ollama's counters. Durations are nanoseconds, as Ollama gives them. A non-streamed reply is the
OpenAI body (``responses.collect``) in Ollama's shape. Nothing here imports Flask.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from xpuspec.core.request_stats import RequestStats
from xpuspec.server.responses import ResponseContext

logger = logging.getLogger(__name__)

NS = 1_000_000_000
# OpenAI's finish reasons as Ollama's done_reason: a reply that called tools stopped.
DONE_REASONS = {"tool_calls": "stop"}


def created_at() -> str:
    """Ollama's timestamp: RFC 3339 in UTC."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class OllamaContext(ResponseContext):
    """A response context that keeps each finished choice's stats, for Ollama's counters.

    ``received`` is ``time.perf_counter()`` when the request arrived (the engine's clock);
    ``generate`` says the reply's text goes in ``response`` (/api/generate) rather than ``message``.
    """

    final_stats: dict[int, RequestStats] = field(default_factory=dict)
    received: float = field(default_factory=time.perf_counter)
    requested_model: str = ""
    generate: bool = False

    def record_final(self, index: int, stats: RequestStats) -> None:
        super().record_final(index, stats)
        self.final_stats[index] = stats

    def line(self, text: str, done: bool = False, tool_calls: list[dict[str, Any]] | None = None) -> dict:
        """One object of the reply (``done`` false: its counters come with the final one)."""
        body: dict[str, Any] = {"model": self.requested_model, "created_at": created_at()}
        if self.generate:
            body["response"] = text
        else:
            body["message"] = {"role": "assistant", "content": text}
            if tool_calls:
                body["message"]["tool_calls"] = tool_calls
        body["done"] = done
        return body

    def counters(self, finish_reason: str | None) -> dict[str, Any]:
        """The final object's fields: done_reason, durations (ns) and token counts."""
        now = time.perf_counter()
        stats = self.final_stats.get(0)
        arrival = stats.arrival_time if stats is not None else now
        first = stats.first_token_time if stats is not None and stats.first_token_time is not None else now
        last = stats.last_token_time if stats is not None and stats.last_token_time is not None else first
        reason = DONE_REASONS.get(finish_reason or "stop", finish_reason or "stop")
        return {
            "done_reason": reason,
            "total_duration": _ns(now - self.received),
            "load_duration": _ns(arrival - self.received),
            "prompt_eval_count": self.num_prompt_tokens,
            "prompt_eval_duration": _ns(first - arrival),
            "eval_count": self.num_completion_tokens,
            "eval_duration": _ns(last - first),
            # The note names the OpenAI parameter; here the limit is num_predict.
            **{
                k: v.replace("max_tokens", "options.num_predict")
                for k, v in self.note(0, finish_reason).items()
            },
        }


def _ns(seconds: float) -> int:
    return max(0, int(seconds * NS))


def ollama_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tool calls (arguments as JSON text) in Ollama's shape (arguments as an object).

    A call whose arguments are not a JSON object cannot be expressed in Ollama's shape: it is dropped,
    with a warning in the log.
    """
    converted: list[dict[str, Any]] = []
    for call in calls:
        function = call["function"]
        try:
            arguments = json.loads(function["arguments"])
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            logger.warning("dropping a call to %r whose arguments are not a JSON object", function["name"])
            continue
        converted.append(
            {
                "id": call["id"],
                "function": {"index": len(converted), "name": function["name"], "arguments": arguments},
            }
        )
    return converted


def ollama_body(body: dict[str, Any], context: OllamaContext) -> dict[str, Any]:
    """A non-streamed OpenAI body (chat or completion, tools already parsed) in Ollama's shape."""
    choice = body["choices"][0]
    if "message" in choice:
        message = choice["message"]
        text = message.get("content") or ""
        calls = ollama_tool_calls(message.get("tool_calls") or [])
    else:
        text, calls = choice["text"], []
    return {**context.line(text, done=True, tool_calls=calls), **context.counters(choice["finish_reason"])}


def ndjson(line: dict[str, Any]) -> str:
    return json.dumps(line, ensure_ascii=False) + "\n"


def ollama_stream(frames: Generator[str, None, None], context: OllamaContext) -> Generator[str, None, None]:
    """The NDJSON lines of a reply from the SSE frames of its OpenAI stream: per write, one line with
    its text and calls (none when it has neither), then an error line or the final one.

    Closing this generator closes ``frames``, whose own ``finally`` aborts the engine request: a
    client that leaves is cancelled as on /v1/*.
    """
    finish_reason: str | None = None
    try:
        for write in frames:
            out: list[str] = []
            text: list[str] = []
            calls: list[dict[str, Any]] = []
            for event in write.split("\n\n"):
                if not event.startswith("data: "):
                    continue
                payload = event[len("data: ") :]
                if payload == "[DONE]":
                    out.append(ndjson({**context.line("", done=True), **context.counters(finish_reason)}))
                    break
                chunk = json.loads(payload)
                if "error" in chunk:  # the Ollama client raises on a line with "error"
                    out.append(ndjson({"error": chunk["error"]["message"]}))
                    break
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta")
                    text.append((delta.get("content") if delta is not None else choice.get("text")) or "")
                    if delta is not None and delta.get("tool_calls"):
                        calls.extend(ollama_tool_calls(delta["tool_calls"]))
                    finish_reason = choice.get("finish_reason") or finish_reason
            # Text and calls come before the error or final line that may end the write.
            if "".join(text) or calls:
                out.insert(0, ndjson(context.line("".join(text), tool_calls=calls)))
            if out:
                yield "".join(out)
    finally:
        frames.close()
