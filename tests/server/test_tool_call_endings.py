"""Tool-call replies that run out of tokens, through the official ``openai`` client and a real server
on the demo pair: ``finish_reason`` stays "length", only complete calls are returned, and no call
markup ever reaches the content, whole or streamed; with ``required`` or ``auto``."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.server.conftest import LiveServer
from tests.server.test_structured_tools import ASK, SCHEMAS, TOOLS

MARKUP = ("<tool_call", "</tool_call", "{", "<")


@pytest.fixture
def client(demo_live_server: LiveServer) -> openai.OpenAI:
    url = f"{demo_live_server.base_url}/v1"
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def _calls(calls: Any) -> list[tuple[str, dict]]:
    parsed = [(c.function.name, json.loads(c.function.arguments)) for c in calls or []]
    for name, arguments in parsed:
        jsonschema.validate(arguments, SCHEMAS[name])
    return parsed


def _streamed(client: openai.OpenAI, request: dict) -> dict[int, dict[str, Any]]:
    """Per choice: its content deltas joined, its calls assembled and its finish_reason."""
    choices: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(stream=True, **request):  # type: ignore[call-overload]
        for choice in chunk.choices:
            entry = choices.setdefault(choice.index, {"content": "", "calls": {}, "finish": None})
            entry["content"] += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = entry["calls"].setdefault(delta.index, {"name": "", "arguments": ""})
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
            entry["finish"] = choice.finish_reason or entry["finish"]
    return choices


def test_required_calls_cut_by_max_tokens(client: openai.OpenAI, demo_live_server: LiveServer) -> None:
    # Sampled: some replies stop after one call, some are cut inside their first or second call.
    request = dict(
        model=demo_live_server.model, messages=ASK, tools=TOOLS, tool_choice="required", n=6, temperature=1.0,
        max_tokens=50, seed=1,
    )  # fmt: skip
    reply = client.chat.completions.create(**request)  # type: ignore[call-overload]
    for choice in reply.choices:
        assert choice.message.content is None, choice.message.content
        calls = _calls(choice.message.tool_calls)
        assert choice.finish_reason in ("tool_calls", "length")
        assert calls or choice.finish_reason == "length"
    assert any(c.finish_reason == "length" and c.message.tool_calls for c in reply.choices)
    streamed = _streamed(client, request)
    for choice in reply.choices:
        got = streamed[choice.index]
        assert got["content"] == "" and got["finish"] == choice.finish_reason
        calls = [(c["name"], json.loads(c["arguments"])) for c in got["calls"].values()]
        assert calls == _calls(choice.message.tool_calls)


def test_a_named_call_cut_before_it_completes(client: openai.OpenAI, demo_live_server: LiveServer) -> None:
    request = dict(
        model=demo_live_server.model, messages=ASK, tools=TOOLS, temperature=0, max_tokens=12,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    choice = client.chat.completions.create(**request).choices[0]  # type: ignore[call-overload]
    assert choice.finish_reason == "length"
    assert choice.message.content is None and choice.message.tool_calls is None
    streamed = _streamed(client, request)[0]
    assert streamed == {"content": "", "calls": {}, "finish": "length"}


def test_auto_reply_cut_inside_a_call_keeps_only_its_text(
    client: openai.OpenAI, demo_live_server: LiveServer
) -> None:
    # The regex makes the model open a call and run out inside it, as a model choosing to call would.
    opened = 'Sure\\. <tool_call>\\n\\{"name": "get_weather", "arguments": \\{"city": "[a-z]{30}'
    request = dict(
        model=demo_live_server.model, messages=ASK, tools=TOOLS, tool_choice="auto", temperature=0,
        max_tokens=12, extra_body={"guided_regex": opened},
    )  # fmt: skip
    choice = client.chat.completions.create(**request).choices[0]  # type: ignore[call-overload]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content == "Sure."
    streamed = _streamed(client, request)[0]
    assert streamed["content"].strip() == "Sure." and not streamed["calls"] and streamed["finish"] == "length"
    assert not any(mark in streamed["content"] for mark in MARKUP)
