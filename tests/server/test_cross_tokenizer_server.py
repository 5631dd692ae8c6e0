"""A real `xpuspec serve` on a pair whose draft has a tokenizer of its own, driven with the `openai` client:
its drafts are translated into the target's tokens, and greedy output is the target's alone (F32)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer, start_server, stop_server

openai = pytest.importorskip("openai")
PROMPTS = ["def add(a, b):", "class Point:\n    def __init__(self, x, y):", "The quick brown fox"]


@pytest.fixture(scope="module")
def translating_server(
    translating_bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    log = tmp_path_factory.mktemp("translating_server") / "server.log"
    server = start_server(translating_bundle, log)
    yield server
    stop_server(server)


@pytest.fixture
def client(translating_server: LiveServer):  # type: ignore[no-untyped-def]
    return openai.OpenAI(
        base_url=f"{translating_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    )


def _drafted_total(server: LiveServer) -> float:
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("xpuspec_spec_draft_tokens_total")
    )


def test_completions_across_tokenizers_equal_the_target_alone(client, translating_server) -> None:
    for prompt in PROMPTS:

        def complete(prompt: str = prompt, **extra):  # type: ignore[no-untyped-def]
            return client.completions.create(
                model=translating_server.model, prompt=prompt, max_tokens=24, temperature=0, extra_body=extra
            )

        alone = complete(drafter="none", ignore_eos=True)
        drafted = complete(num_draft_tokens=3, ignore_eos=True)
        assert drafted.choices[0].text == alone.choices[0].text
        assert drafted.usage is not None and drafted.usage.completion_tokens == 24
    assert _drafted_total(translating_server) > 0  # the draft model's translated drafts were verified


def test_streamed_chat_across_tokenizers_equals_the_target_alone(client, translating_server) -> None:
    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]

    def chat(**extra):  # type: ignore[no-untyped-def]
        stream = client.chat.completions.create(
            model=translating_server.model,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, **extra},
        )
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    assert chat(num_draft_tokens=4) == chat(drafter="none")
