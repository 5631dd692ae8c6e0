"""A request that names no limit ends at the default reply cap, never at the end of the context:
through the official `openai` and `ollama` clients against a real server started with --max-tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import LiveServer, start_server, stop_server

CAP = 24  # far below the tiny model's context of 512
ASK = [{"role": "user", "content": "Count to one thousand."}]


@pytest.fixture(scope="module")
def capped_server(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    log = tmp_path_factory.mktemp("capped-server") / "server.log"
    server = start_server(pair_bundle, log, "--max-tokens", str(CAP))
    yield server
    stop_server(server)


def test_an_openai_chat_without_a_limit_ends_at_the_cap(capped_server: LiveServer) -> None:
    import openai

    client = openai.OpenAI(
        base_url=f"{capped_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120
    )
    reply = client.chat.completions.create(
        model=capped_server.model,
        messages=ASK,
        extra_body={"ignore_eos": True},  # type: ignore[arg-type]
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == CAP
    # A limit named is the request's own, above the cap too.
    longer = client.chat.completions.create(
        model=capped_server.model,
        messages=ASK,
        max_tokens=CAP + 8,
        extra_body={"ignore_eos": True},  # type: ignore[arg-type]
    )
    assert longer.usage is not None and longer.usage.completion_tokens == CAP + 8


def test_an_ollama_chat_without_num_predict_ends_at_the_cap(capped_server: LiveServer) -> None:
    import ollama

    client = ollama.Client(host=capped_server.base_url, timeout=120)
    reply = client.chat(model=capped_server.model, messages=ASK, options={"temperature": 0})
    assert reply.eval_count is not None and reply.eval_count <= CAP
    assert reply.done_reason == "stop" or reply.eval_count == CAP
    # -1 asks for the whole room, as in Ollama: past the cap.
    unlimited = client.generate(
        model=capped_server.model, prompt="a b c", raw=True, options={"num_predict": -1, "temperature": 0}
    )
    assert unlimited.done_reason == "stop" or (unlimited.eval_count or 0) > CAP


def test_the_defaults_endpoint_names_the_cap_and_its_source(capped_server: LiveServer) -> None:
    import httpx

    defaults = httpx.get(f"{capped_server.base_url}/v1/xpuspec/defaults", timeout=10).json()
    assert defaults["max_tokens"] == CAP and defaults["sources"]["max_tokens"] == "max_tokens_default"
