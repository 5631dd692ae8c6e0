"""response_format (text, json_object, json_schema with strict) and the guided_* extensions over HTTP,
through the official ``openai`` client against a real server process."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.server.conftest import LiveServer

ITEM = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "express": {"type": "boolean"},
    },
    "required": ["sku", "count", "express"],
    "additionalProperties": False,
}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "item", "schema": ITEM, "strict": True}}
MESSAGES = [{"role": "user", "content": "Order one item as JSON."}]


def test_json_schema_on_chat(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    reply = openai_client.chat.completions.create(
        model=live_server.model,
        messages=MESSAGES,
        response_format=SCHEMA_FORMAT,
        temperature=0.8,
        n=4,
        seed=3,
    )
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), ITEM)


def test_json_schema_on_completions_and_streamed(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    reply = openai_client.completions.create(
        model=live_server.model,
        prompt="item:",
        max_tokens=80,
        temperature=0,
        extra_body={"response_format": SCHEMA_FORMAT},
    )
    jsonschema.validate(json.loads(reply.choices[0].text), ITEM)
    streamed = openai_client.chat.completions.create(
        model=live_server.model,
        messages=MESSAGES,
        response_format=SCHEMA_FORMAT,
        temperature=0,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    jsonschema.validate(json.loads(text), ITEM)


def test_json_object_and_text(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    reply = openai_client.chat.completions.create(
        model=live_server.model,
        messages=MESSAGES,
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=400,
    )
    choice = reply.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content or ""), dict)
    else:  # a random tiny model may write one endless string: then it says so
        assert choice.finish_reason == "length" and "xpuspec_note" in choice.model_extra  # type: ignore[operator]
    text = openai_client.chat.completions.create(
        model=live_server.model, messages=MESSAGES, response_format={"type": "text"}, max_tokens=4
    )
    assert text.choices[0].finish_reason in ("stop", "length")


def test_guided_regex_extension(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    reply = openai_client.completions.create(
        model=live_server.model,
        prompt="answer:",
        max_tokens=20,
        temperature=1.0,
        n=3,
        extra_body={"guided_regex": "(yes|no)!"},
    )
    assert {c.text for c in reply.choices} <= {"yes!", "no!"}


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "strnig"}}}},
            "response_format",
            "invalid JSON schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type", "'json_schema'"),
        ({"guided_regex": "(open"}, "guided_regex", "invalid regular expression"),
        ({"guided_grammar": "start: nothing_here"}, "guided_grammar", "invalid Lark grammar"),
        ({"grammar": 'root ::= "yes" | maybe'}, "grammar", "GBNF line 1, column 18: rule 'maybe' is used"),
        ({"guided_grammar": 'root ::= "a" {2'}, "guided_grammar", "GBNF line 1, column 16: expecting '}'"),
        ({"grammar": 'start: "yes"'}, "grammar", "Lark goes in guided_grammar"),
    ],
)
def test_invalid_constraints_are_400_with_the_engine_message(
    openai_client: openai.OpenAI, live_server: LiveServer, extra, param, message
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.completions.create(model=live_server.model, prompt="x", max_tokens=4, extra_body=extra)
    error = refused.value.body
    assert error["param"] == param and message in error["message"], error  # type: ignore[index]
    assert "\n" not in error["message"]  # type: ignore[index]


def test_llama_cpp_grammar_field_constrains_the_answer(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    reply = openai_client.chat.completions.create(
        model=live_server.model, messages=MESSAGES, temperature=1.0, n=6, seed=5, max_tokens=8,
        extra_body={"grammar": 'root ::= "yes" | "no"'},
    )  # fmt: skip
    assert {choice.message.content for choice in reply.choices} <= {"yes", "no"}
    assert {choice.finish_reason for choice in reply.choices} == {"stop"}


def test_gbnf_in_guided_grammar_with_classes_and_repetition(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    gbnf = 'root ::= code ("," code){0,2}  # up to three codes\ncode ::= [A-Z]{3} "-" [0-9]+ [^a-z,\\n]?\n'
    code = r"[A-Z]{3}-[0-9]+[^a-z,\n]?"
    reply = openai_client.completions.create(
        model=live_server.model, prompt="codes:", max_tokens=40, temperature=1.0, n=4, seed=2,
        extra_body={"guided_grammar": gbnf},
    )  # fmt: skip
    for choice in reply.choices:
        assert re.fullmatch(rf"{code}(,{code}){{0,2}}", choice.text) or choice.finish_reason == "length"
        assert re.match(code, choice.text), choice.text


def test_one_grammar_per_request(openai_client: openai.OpenAI, live_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.completions.create(
            model=live_server.model, prompt="x", max_tokens=4,
            extra_body={"grammar": 'root ::= "a"', "guided_regex": "a"},
        )  # fmt: skip
    assert "got grammar and guided_regex" in refused.value.body["message"]  # type: ignore[index]


def test_unsatisfiable_within_max_tokens_is_length_and_says_so(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    reply = openai_client.chat.completions.create(
        model=live_server.model, messages=MESSAGES, response_format=SCHEMA_FORMAT, max_tokens=3, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert "not complete within max_tokens" in choice.model_extra["xpuspec_note"]  # type: ignore[index]
    streamed = openai_client.chat.completions.create(
        model=live_server.model,
        messages=MESSAGES,
        response_format=SCHEMA_FORMAT,
        max_tokens=3,
        temperature=0,
        stream=True,
    )
    finals = [c.choices[0] for c in streamed if c.choices and c.choices[0].finish_reason]
    assert finals[-1].finish_reason == "length" and "xpuspec_note" in finals[-1].model_extra  # type: ignore[operator]
