"""Turning a Generation's events into OpenAI response bodies: one JSON object, or SSE chunks."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from xpuspec.api.engine_loop import ChoiceEvent, Generation
from xpuspec.core.request_stats import RequestStats
from xpuspec.server.errors import APIError
from xpuspec.server.provenance import Runs, Speculation, summary

logger = logging.getLogger(__name__)

# How often a waiting response looks whether its client is still there, whether or not tokens
# arrive meanwhile: a client that left is noticed (and its KV freed) within this plus one step.
DISCONNECT_POLL_S = 0.25

Kind = Literal["completion", "chat"]
# How long a stream holds text back after a frame: seconds, or a function giving them when asked.
HoldSeconds = float | Callable[[], float]
# Said in a constrained choice (response_format, guided_*) that ran out of tokens before its output
# satisfied the constraint: its text is cut short, so it does not parse.
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
    constrained: bool = False  # the output is constrained (a "length" finish may then be cut short)
    num_choices_per_prompt: int = 1  # choice i answers prompt i // num_choices_per_prompt
    # Prompt tokens found in the prefix cache, per prompt (the most any of its choices found).
    cached_per_prompt: dict[int, int] = field(default_factory=dict)
    # Per finished choice: did its output satisfy the constraint (None: the engine did not say).
    constraint_complete: dict[int, bool | None] = field(default_factory=dict)

    def record_final(self, index: int, stats: RequestStats) -> None:
        """Count a finished choice's tokens and what it found cached."""
        self.num_completion_tokens += stats.num_output_tokens
        prompt = index // self.num_choices_per_prompt
        self.cached_per_prompt[prompt] = max(self.cached_per_prompt.get(prompt, 0), stats.cached_tokens or 0)
        self.constraint_complete[index] = stats.constraint_complete

    @property
    def num_cached_tokens(self) -> int:
        """Cached prompt tokens counted as ``prompt_tokens`` is: each prompt once, however many choices."""
        return min(sum(self.cached_per_prompt.values()), self.num_prompt_tokens)

    def note(self, index: int, finish_reason: str | None) -> dict[str, str]:
        """The choice's extra field saying a constrained output was cut short, if it was: it ran out of
        tokens and the engine did not report the constraint satisfied (e.g. with ``ignore_eos`` a
        complete output runs on to ``max_tokens`` and needs no note)."""
        if self.constrained and finish_reason == "length" and self.constraint_complete.get(index) is not True:
            return {"xpuspec_note": CONSTRAINT_INCOMPLETE}
        return {}

    @property
    def response_id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.id

    def usage(self, num_completion_tokens: int) -> dict[str, object]:
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": num_completion_tokens,
            "total_tokens": self.num_prompt_tokens + num_completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.num_cached_tokens},
        }


def _batches(
    generation: Generation, context: ResponseContext, hold_s: HoldSeconds = 0.0, finals_only: bool = False
) -> Iterator[list[ChoiceEvent]]:
    """The events until all choices finished, in batches of what arrived together.

    After each batch is handed out (the caller resumes this generator once it wrote its frame), the
    next one is held back for ``hold_s`` (seconds, or a function giving them at that moment) unless a
    choice finishes meanwhile: tokens that arrive faster than that go out together. ``finals_only``
    wakes only for finished choices (a response built at the end). Raises ClientGone when the client
    has left.
    """
    client_disconnected = context.client_disconnected
    next_check = time.monotonic() + DISCONNECT_POLL_S
    hold_until = 0.0
    while not generation.done:
        if finals_only:
            events = generation.take_final_events(DISCONNECT_POLL_S)
        else:
            events = generation.take_events(DISCONNECT_POLL_S, hold_until)
        if client_disconnected is not None and (not events or time.monotonic() >= next_check):
            next_check = time.monotonic() + DISCONNECT_POLL_S
            if client_disconnected():
                raise ClientGone
        if events:
            for event in events:
                if event.finish_reason is not None and event.stats is not None:
                    context.record_final(event.index, event.stats)
            yield events
            hold = hold_s() if callable(hold_s) else hold_s
            if hold > 0.0:
                hold_until = time.monotonic() + hold


def failure(event: ChoiceEvent, num_choices: int) -> APIError:
    """The error of a choice that failed: its own output constraint's (the client's mistake, a 400),
    its own otherwise ("error" finish), or the engine's."""
    assert event.error is not None
    which = f"choice {event.index} failed: " if num_choices > 1 else ""
    if event.failed_constraint:
        return APIError(400, which + event.error, code="constraint_failed")
    if event.finish_reason == "error":
        return APIError(500, which + event.error, code="request_failed", error_type="server_error")
    return APIError(500, which + event.error, code="engine_error", error_type="server_error")


def collect(generation: Generation, context: ResponseContext) -> dict[str, Any]:
    """Wait for every choice and build the non-streamed body; a failed choice fails the request (500)."""
    texts = [""] * context.num_choices
    reasons: list[str | None] = [None] * context.num_choices
    try:
        for events in _batches(generation, context, finals_only=True):
            for event in events:
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
                **context.note(index, reason),
            }
            for index, (text, reason) in enumerate(zip(texts, reasons, strict=True))
        ]
    else:
        choices = [
            {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": reason,
                **context.note(index, reason),
            }
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


# A stand-in text that json.dumps leaves as one recognisable escaped string, to cut templates at.
_TEXT_SLOT = "\x00text\x00"
_ENCODED_TEXT_SLOT = json.dumps(_TEXT_SLOT)


class _ChunkFrames:
    """SSE frames of one streamed response, byte for byte what ``sse(chunk dict)`` gives.

    Text chunks, one or more per frame, are the hot path: each is a pre-built template per choice
    around one ``json.dumps`` of the text, instead of a dict built and encoded whole.
    """

    def __init__(
        self, context: ResponseContext, include_usage: bool, speculation: Speculation | None = None
    ) -> None:
        self.context = context
        # With provenance, each choice's runs of text not yet framed (see xpuspec.server.provenance).
        self.speculation = speculation
        self.runs: dict[int, Runs] = {}
        self.chat = context.kind == "chat"
        self.base = {
            "id": context.response_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": context.created,
            "model": context.model,
        }
        self.extra = {"usage": None} if include_usage else {}
        self._templates: dict[int, tuple[str, str]] = {}

    def add(self, event: ChoiceEvent) -> None:
        """Note a text event's provenance (a no-op without ``speculation``)."""
        if self.speculation is not None:
            self.runs.setdefault(event.index, Runs()).add(event)

    def chunk(
        self,
        index: int,
        text: str | None,
        finish_reason: str | None,
        role: bool = False,
        stats: RequestStats | None = None,
    ) -> str:
        if self.chat:
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
        choice.update(self.context.note(index, finish_reason))
        chunk = {**self.base, "choices": [choice], **self.extra}
        if self.speculation is not None and not role:
            runs = self.runs.setdefault(index, Runs())
            provenance: dict[str, Any] = {"runs": runs.take()}
            if finish_reason is not None:
                provenance["speculation"] = summary(stats, self.speculation, runs.accepted_tokens)
            chunk["xpuspec"] = provenance
        return sse(chunk)

    def text(self, index: int, text: str) -> str:
        """The frame of a text chunk (no finish_reason) of choice ``index``."""
        if self.speculation is not None:
            return self.chunk(index, text, None)
        template = self._templates.get(index)
        if template is None:
            head, _, tail = self.chunk(index, _TEXT_SLOT, None).partition(_ENCODED_TEXT_SLOT)
            template = self._templates[index] = (head, tail)
        return template[0] + json.dumps(text, ensure_ascii=False) + template[1]


def stream(
    generation: Generation,
    context: ResponseContext,
    include_usage: bool,
    coalesce_s: HoldSeconds = 0.0,
    speculation: Speculation | None = None,
) -> Iterator[str]:
    """SSE frames: chunks per choice, one finish_reason each, the usage chunk if asked, then [DONE].

    Everything that arrived for a choice together (the tokens of one engine step, and those of later
    steps while the previous frame was written or within ``coalesce_s`` of it) goes out as one text
    chunk, and all chunks of one batch in one write. A finished choice is never held back.

    A client that disconnects makes the WSGI server close this generator (GeneratorExit at a
    ``yield``) or fails the disconnect poll; either way the ``finally`` aborts the engine requests,
    which frees their KV blocks.

    ``speculation`` (``stream_options.include_speculation``): chunks carry the ``xpuspec`` field of
    :mod:`xpuspec.server.provenance`.
    """
    frames = _ChunkFrames(context, include_usage, speculation)
    chat = frames.chat
    try:
        if chat:
            yield "".join(frames.chunk(index, "", None, role=True) for index in range(context.num_choices))
        failed = False
        tail: list[str] = []
        for events in _batches(generation, context, hold_s=coalesce_s):
            out: list[str] = []
            texts: dict[int, list[str]] = {}  # text not yet framed, per choice, in arrival order
            for event in events:
                if event.error is not None:
                    # A choice's own failure closes it with finish_reason "error"; then the error
                    # frame (which the OpenAI client raises) ends the stream.
                    out.extend(frames.text(index, "".join(parts)) for index, parts in texts.items())
                    texts.clear()
                    if event.finish_reason == "error":
                        frames.add(event)
                        out.append(frames.chunk(event.index, event.text or None, "error", stats=event.stats))
                    out.append(sse(failure(event, context.num_choices).body()))
                    failed = True
                    break
                frames.add(event)
                if event.finish_reason is None:
                    if event.text:
                        texts.setdefault(event.index, []).append(event.text)
                    continue
                text = "".join(texts.pop(event.index, ())) + event.text
                if chat:
                    if text:
                        out.append(frames.text(event.index, text))
                    out.append(frames.chunk(event.index, None, event.finish_reason, stats=event.stats))
                else:
                    out.append(frames.chunk(event.index, text, event.finish_reason, stats=event.stats))
            out.extend(frames.text(index, "".join(parts)) for index, parts in texts.items())
            if failed or generation.done:
                tail = out  # the last frames, the usage chunk and [DONE] go out in one write
                break
            if out:
                yield "".join(out)
        if not failed and include_usage:
            tail.append(
                sse({**frames.base, "choices": [], "usage": context.usage(context.num_completion_tokens)})
            )
        tail.append(sse("[DONE]"))
        yield "".join(tail)
    except ClientGone:
        logger.info("client of %s disconnected; aborting", context.response_id)
    finally:
        generation.cancel()
