"""Parsing tool calls out of model text (Hermes and Llama 3 formats) and the streamed rewrite."""

from __future__ import annotations

import json

import pytest

from xpuspec.server import tools
from xpuspec.server.errors import APIError

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def test_hermes_blocks_and_surrounding_text():
    text = 'Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
    text += '<tool_call>{"name": "time", "arguments": {}}</tool_call>'
    content, calls = tools.parse_calls(text)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["weather", "time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)


def test_llama3_json_and_plain_text():
    content, calls = tools.parse_calls('<|python_tag|>{"name": "weather", "parameters": {"city": "Rome"}}')
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Rome"}
    _, calls = tools.parse_calls('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}')
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert tools.parse_calls("just text") == ("just text", [])
    assert tools.parse_calls('{"not": "a call"}') == ('{"not": "a call"}', [])
    broken = "<tool_call>{not json</tool_call>"
    assert tools.parse_calls(broken) == (broken, [])


def test_tool_choice_modes_and_errors():
    assert tools.parse_tools(None, None, "") is None
    assert tools.parse_tools([WEATHER], "none", "") is None
    assert tools.parse_tools([WEATHER], None, "").mode == "auto"
    named = tools.parse_tools([WEATHER], {"type": "function", "function": {"name": "weather"}}, "")
    assert named.mode == "named" and "start: call\n" in named.forced_grammar()
    required = tools.parse_tools([WEATHER], "required", "").forced_grammar()
    assert required.startswith('start: call ("\\n" call ("\\n" call ("\\n" call)?)?)?\n')
    single = tools.parse_tools([WEATHER], "required", "", parallel_tool_calls=False)
    assert single.max_calls == 1 and single.forced_grammar().startswith("start: call\ncall: ")
    assert tools.parse_tools([WEATHER], "auto", "", parallel_tool_calls=True).max_calls is None
    for bad_tools, choice in [
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}),
        ([WEATHER], "sometimes"),
        (None, "required"),
        ([{"type": "retrieval"}], "auto"),
        ([WEATHER, WEATHER], "auto"),
    ]:
        with pytest.raises(APIError):
            tools.parse_tools(bad_tools, choice, "")


def _frames(pieces: list[str], finish: str = "stop") -> list[str]:
    base = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    frames = [
        tools._frame({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    ]
    for piece in pieces:
        frames.append(tools._frame({**base, "choices": [{"index": 0, "delta": {"content": piece}}]}))
    frames.append(tools._frame({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    return [*frames, "data: [DONE]\n\n"]


def _replay(frames: list[str]) -> tuple[str, list[dict], str | None]:
    content, calls, finish = "", [], None
    events = [e for write in tools.rewrite_stream(iter(frames)) for e in write.split("\n\n") if e]
    for frame in events:
        if not frame.startswith("data: {"):
            continue
        choice = json.loads(frame[6:])["choices"][0]
        content += choice["delta"].get("content") or ""
        calls += choice["delta"].get("tool_calls", [])
        finish = choice.get("finish_reason") or finish
    return content, calls, finish


def test_stream_sends_text_and_holds_back_calls():
    text = 'Sure. <tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls, finish = _replay(_frames([text[i : i + 3] for i in range(0, len(text), 3)]))
    assert content.strip() == "Sure."
    assert finish == "tool_calls" and calls[0]["function"]["name"] == "weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    content, calls, finish = _replay(_frames(["a <tool", "_cal", "l"]))  # a prefix that never completes
    assert (content, calls, finish) == ("a <tool_call", [], "stop")


def test_stream_rewrites_coalesced_writes_event_by_event():
    # The server writes one engine step's frames together: several SSE events in one string.
    text = 'Sure. <tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    frames = _frames([text[i : i + 5] for i in range(0, len(text), 5)])
    coalesced = ["".join(frames[i : i + 3]) for i in range(0, len(frames), 3)]
    content, calls, finish = _replay(coalesced)
    expected_content, expected_calls, expected_finish = _replay(frames)
    assert (content, finish) == (expected_content, expected_finish) == ("Sure. ", "tool_calls")
    # Call ids are random per call; the calls themselves must match.
    assert [c["function"] for c in calls] == [c["function"] for c in expected_calls]
    assert calls[0]["function"]["name"] == "weather"


def test_one_call_kept_without_parallel_calls():
    two = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    two += '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    body = {"choices": [{"index": 0, "message": {"content": two}, "finish_reason": "stop"}]}
    message = tools.rewrite_body(json.loads(json.dumps(body)), max_calls=1)["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["a"]
    assert len(tools.rewrite_body(body)["choices"][0]["message"]["tool_calls"]) == 2
    events = [e for w in tools.rewrite_stream(iter(_frames([two])), max_calls=1) for e in w.split("\n\n")]
    streamed = [
        call["function"]["name"]
        for e in events
        if e.startswith("data: {")
        for call in json.loads(e[6:])["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert streamed == ["a"]
