"""Turning a Generation's events into OpenAI response bodies: one JSON object, or SSE chunks."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from xpuspec.server.engine_loop import ChoiceEvent, Generation
from xpuspec.server.errors import APIError

logger = logging.getLogger(__name__)

# How often a waiting response looks whether its client is still there, whether or not tokens
# arrive meanwhile: a client that left is noticed (and its KV freed) within this plus one step.
DISCONNECT_POLL_S = 0.25

Kind = Literal["completion", "chat"]
# Said in a constrained choice (response_format, guided_*) that ran out of tokens: its text is cut
# short of what the constraint requires, so it does not parse.
CONSTRAINT_INCOMPLETE = (
    "the output constraint was not complete within max_tokens: the text is cut short and does not "
    "satisfy it; raise max_tokens"
)


class ClientGone(Exception):
    """The client closed its connection while its request was running."""


@dataclass
class ResponseContext:
    """What every body of one HTTP request repeats."""

    kind: Kind
    model: str
    num_prompt_tokens: int
    num_choices: int
    client_disconnected: Callable[[], bool] | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    num_completion_tokens: int = 0  # so far; read by the access log when the response closes
    constrained: bool = False  # the output is constrained (a "length" finish then says so)

    def note(self, finish_reason: str | None) -> dict[str, str]:
        """The choice's extra field saying a constrained output was cut short, if it was."""
        if self.constrained and finish_reason == "length":
            return {"xpuspec_note": CONSTRAINT_INCOMPLETE}
        return {}

    @property
    def response_id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.id

    def usage(self, num_completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": num_completion_tokens,
            "total_tokens": self.num_prompt_tokens + num_completion_tokens,
        }


def _events(generation: Generation, context: ResponseContext) -> Iterator[ChoiceEvent]:
    """Every event until all choices finished; raises ClientGone when the client has left."""
    next_check = time.monotonic() + DISCONNECT_POLL_S
    while not generation.done:
        event = generation.next_event(timeout=DISCONNECT_POLL_S)
        if context.client_disconnected is not None and (event is None or time.monotonic() >= next_check):
            next_check = time.monotonic() + DISCONNECT_POLL_S
            if context.client_disconnected():
                raise ClientGone
        if event is not None:
            if event.finish_reason is not None:
                context.num_completion_tokens += event.stats.num_output_tokens if event.stats else 0
            yield event


def failure(event: ChoiceEvent, num_choices: int) -> APIError:
    """The error of a choice that failed: its own ("error" finish) or the engine's."""
    assert event.error is not None
    which = f"choice {event.index} failed: " if num_choices > 1 else ""
    if event.finish_reason == "error":
        return APIError(500, which + event.error, code="request_failed", error_type="server_error")
    return APIError(500, which + event.error, code="engine_error", error_type="server_error")


def collect(generation: Generation, context: ResponseContext) -> dict[str, Any]:
    """Wait for every choice and build the non-streamed body; a failed choice fails the request (500)."""
    texts = [""] * context.num_choices
    reasons: list[str | None] = [None] * context.num_choices
    try:
        for event in _events(generation, context):
            if event.error is not None:
                raise failure(event, context.num_choices)
            texts[event.index] += event.text
            if event.finish_reason is not None:
                reasons[event.index] = event.finish_reason
    finally:
        generation.cancel()  # a no-op after a normal end
    if context.kind == "chat":
        choices = [
            {
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
                **context.note(reason),
            }
            for index, (text, reason) in enumerate(zip(texts, reasons, strict=True))
        ]
    else:
        choices = [
            {"index": index, "text": text, "logprobs": None, "finish_reason": reason, **context.note(reason)}
            for index, (text, reason) in enumerate(zip(texts, reasons, strict=True))
        ]
    return {
        "id": context.response_id,
        "object": "chat.completion" if context.kind == "chat" else "text_completion",
        "created": context.created,
        "model": context.model,
        "choices": choices,
        "usage": context.usage(context.num_completion_tokens),
    }


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def stream(generation: Generation, context: ResponseContext, include_usage: bool) -> Iterator[str]:
    """SSE frames: chunks per choice, one finish_reason each, the usage chunk if asked, then [DONE].

    A client that disconnects makes the WSGI server close this generator (GeneratorExit at a
    ``yield``) or fails the disconnect poll; either way the ``finally`` aborts the engine requests,
    which frees their KV blocks.
    """
    chat = context.kind == "chat"
    base = {
        "id": context.response_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": context.created,
        "model": context.model,
    }
    extra = {"usage": None} if include_usage else {}

    def chunk(index: int, text: str | None, finish_reason: str | None, role: bool = False) -> str:
        if chat:
            delta: dict[str, str] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": text or ""}
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        choice.update(context.note(finish_reason))
        return sse({**base, "choices": [choice], **extra})

    try:
        if chat:
            for index in range(context.num_choices):
                yield chunk(index, "", None, role=True)
        for event in _events(generation, context):
            if event.error is not None:
                # A choice's own failure closes it with finish_reason "error"; then the error frame
                # (which the OpenAI client raises) ends the stream.
                if event.finish_reason == "error":
                    yield chunk(event.index, event.text or None, "error")
                yield sse(failure(event, context.num_choices).body())
                break
            if event.finish_reason is None:
                if event.text:
                    yield chunk(event.index, event.text, None)
                continue
            if chat:
                if event.text:
                    yield chunk(event.index, event.text, None)
                yield chunk(event.index, None, event.finish_reason)
            else:
                yield chunk(event.index, event.text, event.finish_reason)
        else:
            if include_usage:
                yield sse({**base, "choices": [], "usage": context.usage(context.num_completion_tokens)})
        yield sse("[DONE]")
    except ClientGone:
        logger.info("client of %s disconnected; aborting", context.response_id)
    finally:
        generation.cancel()
