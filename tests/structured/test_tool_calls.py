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
    assert required.startswith('start: call ("\\n" (call ("\\n" (call ("\\n" (call)?)?)?)?)?)?\n')
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


# ------------------------------------------------------------ replies that end inside a call
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
PARTIAL = '<tool_call>\n{"name": "weather", "arguments": {"city":'


@pytest.mark.parametrize(
    ("text", "content", "names"),
    [
        ("Let me check.\n" + PARTIAL, "Let me check.", []),
        (CALL + "\n" + PARTIAL, None, ["weather"]),
        ("Sure. <tool_c", "Sure.", []),  # cut inside the opening tag
        (CALL + "\n" + CALL[:-3], None, ["weather"]),  # the second cut inside its closing tag
        ('<|python_tag|>{"name": "weather", "parameters": {"ci', None, []),
        ('{"name": "a", "parameters": {}}; {"name": "b", "par', None, ["a"]),
        ('{"answer": "not a ca', '{"answer": "not a ca', []),  # JSON text, not calls: kept
        ("plain text", "plain text", []),
    ],
)
def test_a_call_cut_by_max_tokens_is_dropped_not_returned_as_text(text, content, names):
    got_content, calls = tools.parse_calls(text, cut=True)
    assert (got_content, [c["function"]["name"] for c in calls]) == (content, names)
    if not names and content is None:
        assert tools.parse_calls(text) == (text, [])  # not cut: what the model wrote, as before


def test_forced_replies_have_no_content():
    assert tools.parse_calls(PARTIAL, cut=True, forced=True) == (None, [])
    content, calls = tools.parse_calls(CALL + "\n", forced=True)
    assert content is None and [c["function"]["name"] for c in calls] == ["weather"]


def test_a_cut_reply_keeps_length_and_only_its_complete_calls():
    body = {
        "choices": [{"index": 0, "message": {"content": CALL + "\n" + PARTIAL}, "finish_reason": "length"}]
    }
    choice = tools.rewrite_body(body, forced=True)["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["weather"]
    cut = {"choices": [{"index": 0, "message": {"content": "Hm. " + PARTIAL}, "finish_reason": "length"}]}
    message = tools.rewrite_body(cut)["choices"][0]["message"]
    assert message == {"content": "Hm."}


@pytest.mark.parametrize("forced", [False, True])
def test_a_streamed_cut_call_sends_no_markup(forced):
    text = ("Sure. " if not forced else "") + CALL + "\n" + PARTIAL
    frames = _frames([text[i : i + 4] for i in range(0, len(text), 4)], finish="length")
    events = [e for w in tools.rewrite_stream(iter(frames), forced=forced) for e in w.split("\n\n")]
    choices = [json.loads(e[6:])["choices"][0] for e in events if e.startswith("data: {")]
    content = "".join(c["delta"].get("content") or "" for c in choices)
    calls = [call["function"]["name"] for c in choices for call in c["delta"].get("tool_calls", [])]
    assert content.strip() == ("" if forced else "Sure.") and "<" not in content and "{" not in content
    finishes = [c["finish_reason"] for c in choices if c.get("finish_reason")]
    assert calls == ["weather"] and finishes == ["length"]


# --------------------------------------------------- the forced grammar lets the reply end
@pytest.fixture(scope="module")
def demo_grammar():
    from tests.support.demo_grammar import demo_grammar_compiler

    return demo_grammar_compiler()


def _guide_after(demo_grammar, request: tools.ToolRequest, text: str):  # type: ignore[no-untyped-def]
    from xpuspec.structured.constraint import Constraint

    tokenizer, compiler = demo_grammar
    guide = compiler.compile(Constraint("lark", request.forced_grammar()))
    guide.advance(tokenizer.encode(text, add_special_tokens=False))
    return guide, compiler.eos_token_ids


WEATHER_CALL = '<tool_call>\n{"name": "weather", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize(
    ("choice", "parallel", "text", "more_allowed"),
    [
        ("required", None, WEATHER_CALL, True),
        ("required", None, WEATHER_CALL + "\n", True),  # a newline after the call may still end it
        ("required", None, "\n".join([WEATHER_CALL] * tools.MAX_FORCED_CALLS), False),
        ("required", False, WEATHER_CALL, False),
        ({"type": "function", "function": {"name": "weather"}}, None, WEATHER_CALL, False),
    ],
)
def test_the_reply_may_end_after_any_complete_call(demo_grammar, choice, parallel, text, more_allowed):
    request = tools.parse_tools([WEATHER], choice, "", parallel_tool_calls=parallel)
    guide, eos_ids = _guide_after(demo_grammar, request, text)
    allowed = guide.allowed()
    assert guide.is_accepting() and all(allowed[eos] for eos in eos_ids)
    # Further calls only where parallel calls are allowed and the bound is not reached.
    assert (allowed.sum() > len(set(eos_ids))) == more_allowed


@pytest.mark.parametrize("strict", [False, True])
def test_a_strict_function_closes_its_arguments(demo_grammar, strict):
    """OpenAI's function strict mode: a forced call's arguments get no keys the parameters leave unsaid."""
    function = {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": strict,
    }
    request = tools.parse_tools([{"type": "function", "function": function}], "required", "")
    tokenizer, _ = demo_grammar
    guide, _ = _guide_after(
        demo_grammar, request, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"'
    )
    comma = tokenizer.encode(",", add_special_tokens=False)
    assert guide.allowed()[comma[0]] == (not strict)
