"""Constraints that cannot be compiled (unsatisfiable, too large, too slow) are the client's 400, with a
message naming the request's own constraint and none of its text; the server serves on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import LiveServer, start_server, stop_server

SECRET = "SECRET-CUSTOMER-12345"
RECURSIVE = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
REPROS = [
    ({"guided_grammar": "start: a\na: a"}, "guided_grammar", "the Lark grammar allows no output"),
    (
        {"guided_grammar": f'start: a\na: a S\nS: "{SECRET}"'},
        "guided_grammar",
        "the Lark grammar allows no output",
    ),
    ({"guided_regex": "[^\\x00-\\U0010FFFF]"}, "guided_regex", "the regular expression allows no output"),
    ({"guided_regex": "a{99999999}"}, "guided_regex", "the regular expression is too large"),
    ({"guided_regex": f"{SECRET}{{99999999}}"}, "guided_regex", "the regular expression is too large"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "chain", "schema": RECURSIVE}}},
        "response_format",
        "the JSON schema 'chain' allows no finite value",
    ),
]


def refused(client: openai.OpenAI, model: str, extra: dict) -> dict:
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=model, prompt="x", max_tokens=8, temperature=0, extra_body=extra)
    return error.value.body  # type: ignore[return-value]


def server_with_budget(
    pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory, seconds: str
) -> Iterator[LiveServer]:
    log = tmp_path_factory.mktemp("budget") / "server.log"
    server = start_server(pair_bundle, log, "--grammar-compile-timeout", seconds)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def patient_server(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # A generous compile budget: a busy machine must not turn a refusal into "too slow".
    yield from server_with_budget(pair_bundle, tmp_path_factory, "60")


def client_of(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_each_repro_is_a_400_about_its_own_constraint_and_the_server_serves_on(
    patient_server: LiveServer,
) -> None:
    client = client_of(patient_server)

    def normal() -> str:
        reply = client.completions.create(
            model=patient_server.model, prompt="Once upon a time", max_tokens=12, temperature=0
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        return reply.choices[0].text

    before = normal()
    for extra, param, message in REPROS:
        for _ in range(2):  # the second use comes from the compiled-grammar cache
            error = refused(client, patient_server.model, extra)
            assert error["param"] == param and error["message"].startswith(message), error
            assert "SECRET" not in error["message"] and "99999999" not in error["message"], error
    assert normal() == before
    assert httpx.get(f"{patient_server.base_url}/health", timeout=10).status_code == 200


def test_a_refused_chat_schema_names_the_schema(patient_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client_of(patient_server).chat.completions.create(
            model=patient_server.model,
            messages=[{"role": "user", "content": "A linked list, please."}],
            response_format={"type": "json_schema", "json_schema": {"name": "chain", "schema": RECURSIVE}},
            max_tokens=8,
        )
    assert "the JSON schema 'chain' allows no finite value" in error.value.body["message"]  # type: ignore[index]


@pytest.fixture(scope="module")
def impatient_server(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from server_with_budget(pair_bundle, tmp_path_factory, "0.001")


def test_the_compile_budget_is_a_serve_option(impatient_server: LiveServer) -> None:
    """A constraint llguidance needs a good part of a second for is refused within a 1-ms budget."""
    client = client_of(impatient_server)
    error = refused(client, impatient_server.model, {"guided_regex": "c{99999999}"})
    assert error["message"].startswith("the regular expression is too slow to compile"), error
    reply = client.completions.create(model=impatient_server.model, prompt="x", max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")
