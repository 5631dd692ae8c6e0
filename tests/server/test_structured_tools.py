"""tools / tool_choice on chat completions through the official ``openai`` client and a real server.

The tiny random model cannot choose tools sensibly, so ``required`` and named choices (forced by a
grammar) carry the checks that calls parse and follow the parameter schemas; ``auto`` and ``none``
check that the reply is well-formed whatever the model wrote.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.server.conftest import LiveServer

# The demo pair: its 4096-token vocabulary keeps a prompt with tools well inside the 512-token
# context (the pair_bundle's 384-token one spends about a token per character).


@pytest.fixture(scope="module")
def live_server(demo_live_server: LiveServer) -> LiveServer:
    return demo_live_server


@pytest.fixture
def openai_client(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": TIME},
    },
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


def check_calls(calls) -> None:  # type: ignore[no-untyped-def]
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_always_yields_valid_calls(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    reply = openai_client.chat.completions.create(
        model=live_server.model, messages=ASK, tools=TOOLS, tool_choice="required", n=6, temperature=1.0,
        max_tokens=210, seed=1,
    )  # fmt: skip
    # Room for the most calls the grammar allows (4 of <= 40 tokens): every choice ends in calls.
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls", choice.message.content
        check_calls(choice.message.tool_calls)


def test_no_parallel_calls_means_one_call(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    request = dict(
        model=live_server.model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=1.0,
        max_tokens=60, seed=1, n=6,
    )  # fmt: skip
    for choice in openai_client.chat.completions.create(parallel_tool_calls=False, **request).choices:  # type: ignore[call-overload]
        assert choice.finish_reason == "tool_calls", choice.message.content
        assert len(choice.message.tool_calls or []) == 1
        check_calls(choice.message.tool_calls)
    # With parallel calls (the default) the same sampled replies go on calling: the grammar allows it.
    parallel = openai_client.chat.completions.create(**{**request, "max_tokens": 210})  # type: ignore[call-overload]
    assert max(len(c.message.tool_calls or []) for c in parallel.choices) > 1


def test_named_choice_calls_that_function(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    reply = openai_client.chat.completions.create(
        model=live_server.model, messages=ASK, tools=TOOLS, temperature=0, max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls or []] == ["get_time"]
    check_calls(choice.message.tool_calls)


def test_streaming_assembles_the_same_calls(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    request = dict(
        model=live_server.model, messages=ASK, tools=TOOLS, temperature=0, max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    whole = openai_client.chat.completions.create(**request).choices[0]  # type: ignore[call-overload]
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in openai_client.chat.completions.create(stream=True, **request):  # type: ignore[call-overload]
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls or []
    ]


@pytest.mark.parametrize("tool_choice", ["auto", "none"])
def test_auto_and_none_reply_well_formed(
    openai_client: openai.OpenAI, live_server: LiveServer, tool_choice: str
) -> None:
    reply = openai_client.chat.completions.create(
        model=live_server.model,
        messages=ASK,
        tools=TOOLS,
        tool_choice=tool_choice,
        temperature=0,
        max_tokens=24,
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if tool_choice == "none":
        assert choice.message.tool_calls is None


def test_tool_history_is_accepted(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "C"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"},
    ]  # fmt: skip
    reply = openai_client.chat.completions.create(
        model=live_server.model, messages=messages, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_bad_tools_are_400(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.chat.completions.create(
            model=live_server.model, messages=ASK, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "missing"}},
        )  # fmt: skip
    assert refused.value.body["param"] == "tool_choice"  # type: ignore[index]


def test_forced_call_round_trip(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    """The official client's own reply, dumped as it sends history (no ``content`` key), goes back."""
    forced = openai_client.chat.completions.create(
        model=live_server.model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60,
        parallel_tool_calls=False, temperature=0,
    )  # fmt: skip
    assert forced.choices[0].finish_reason == "tool_calls"
    message = forced.choices[0].message
    check_calls(message.tool_calls)
    assistant = message.model_dump(exclude_none=True)
    assert "content" not in assistant and assistant["tool_calls"]
    results = [
        {"role": "tool", "tool_call_id": call.id, "content": "4 degrees, rain"} for call in message.tool_calls
    ]
    reply = openai_client.chat.completions.with_raw_response.create(
        model=live_server.model, messages=[*ASK, assistant, *results], tools=TOOLS, max_tokens=8,
        temperature=0,
    )  # fmt: skip
    assert reply.status_code == 200
    assert reply.parse().choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_content_is_needed_outside_tool_calls(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.chat.completions.create(
            model=live_server.model,
            messages=[{"role": "user"}],
            max_tokens=4,  # type: ignore[list-item,misc]
        )
    assert "content" in refused.value.body["message"]  # type: ignore[index]
