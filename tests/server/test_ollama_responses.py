"""OpenAI SSE frames and bodies into Ollama's NDJSON lines and objects, with its counters."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

from xpuspec.core.request_stats import RequestStats
from xpuspec.server.ollama_responses import OllamaContext, ollama_body, ollama_stream, ollama_tool_calls
from xpuspec.server.responses import sse


def context(generate: bool = False) -> OllamaContext:
    # On the engine's clock: arrived 0.5 s after the request, first token 0.5 s later, last 2 s after.
    received = time.perf_counter() - 10.0
    made = OllamaContext(kind="chat", model="m", num_prompt_tokens=5, num_choices=1, received=received)
    made.requested_model, made.generate = "m:latest", generate
    stats = RequestStats(
        arrival_time=received + 0.5,
        max_draft_tokens=4,
        first_token_time=received + 1.0,
        last_token_time=received + 3.0,
    )
    stats.num_output_tokens = 3
    made.record_final(0, stats)
    return made


def chunk(delta: dict, finish: str | None = None) -> str:
    return sse({"id": "x", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def lines(writes: list[str], made: OllamaContext) -> list[dict]:
    def frames() -> Iterator[str]:
        yield from writes

    return [json.loads(line) for write in ollama_stream(frames(), made) for line in write.splitlines()]


def test_text_lines_then_the_final_line_with_counters_in_nanoseconds() -> None:
    writes = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}) + chunk({"content": "lo"}),
        chunk({"content": "!"}),
    ]
    out = lines([*writes, chunk({}, "length") + sse("[DONE]")], context())
    assert [line["message"]["content"] for line in out] == ["Hello", "!", ""]  # no line without text
    assert [line["done"] for line in out] == [False, False, True]
    final = out[-1]
    assert final["model"] == "m:latest" and final["done_reason"] == "length"
    assert final["prompt_eval_count"] == 5 and final["eval_count"] == 3
    assert abs(final["load_duration"] - 500_000_000) < 1000
    assert abs(final["prompt_eval_duration"] - 500_000_000) < 1000
    assert abs(final["eval_duration"] - 2_000_000_000) < 1000
    assert final["total_duration"] >= 10_000_000_000


def test_generate_lines_carry_response() -> None:
    out = lines([chunk({"content": "a"}) + chunk({}, "stop") + sse("[DONE]")], context(generate=True))
    assert [(line["response"], line["done"]) for line in out] == [("a", False), ("", True)]
    assert "message" not in out[0] and out[-1]["done_reason"] == "stop"


def test_tool_call_deltas_become_ollamas_calls_with_object_arguments() -> None:
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "w", "arguments": '{"a": 1}'},
    }
    writes = [chunk({"tool_calls": [call]}) + chunk({}, "tool_calls") + sse("[DONE]")]
    out = lines(writes, context())
    assert out[0]["message"]["tool_calls"] == [
        {"id": "call_1", "function": {"index": 0, "name": "w", "arguments": {"a": 1}}}
    ]
    assert out[-1]["done_reason"] == "stop"  # Ollama says stop after calls


def test_an_error_frame_is_ollamas_error_line_and_ends_the_reply() -> None:
    error = sse({"error": {"message": "engine failed", "type": "server_error", "param": None, "code": None}})
    out = lines([chunk({"content": "a"}) + chunk({}, "error") + error + sse("[DONE]")], context())
    assert [line.get("message", {}).get("content") for line in out] == ["a", None]
    assert out[0]["done"] is False and out[1] == {"error": "engine failed"}


def test_closing_the_lines_closes_the_frames_which_cancels_the_request() -> None:
    closed = []

    def frames() -> Iterator[str]:
        try:
            while True:
                yield chunk({"content": "x"})
        finally:
            closed.append(True)  # responses.stream cancels its generation here

    reply = ollama_stream(frames(), context())
    assert json.loads(next(reply))["message"]["content"] == "x"
    reply.close()  # type: ignore[attr-defined]
    assert closed == [True]


def test_a_whole_body_in_ollamas_shape() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "w", "arguments": "{}"}}
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                         "finish_reason": "tool_calls"}]}  # fmt: skip
    out = ollama_body(body, context())
    assert out["message"] == {"role": "assistant", "content": "", "tool_calls": ollama_tool_calls([call])}
    assert out["done"] is True and out["done_reason"] == "stop" and out["eval_count"] == 3
    text = ollama_body({"choices": [{"index": 0, "text": "t", "finish_reason": "length"}]}, context(True))
    assert text["response"] == "t" and text["done_reason"] == "length"


def test_a_call_whose_arguments_are_not_an_object_is_dropped() -> None:
    calls = [
        {"id": "a", "function": {"name": "w", "arguments": "not json"}},
        {"id": "b", "function": {"name": "w", "arguments": "[1]"}},
        {"id": "c", "function": {"name": "w", "arguments": '{"k": "v"}'}},
    ]
    assert ollama_tool_calls(calls) == [
        {"id": "c", "function": {"index": 0, "name": "w", "arguments": {"k": "v"}}}
    ]
