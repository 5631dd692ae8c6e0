"""Prefix caching through the real server: the official `openai` client sees the cached prompt
tokens in ``usage.prompt_tokens_details``, /metrics counts them, and --no-prefix-caching turns it off."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import LiveServer, start_server, stop_server

# Several KV blocks of prompt, distinct from every other test's prompts.
PROMPT = "Prefix caching test. " + "def square(x):\n    return x * x\n\n" * 12 + "print(square(3))"


def _metric(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert values, f"{name} is not in /metrics"
    return values[0]


def test_a_repeated_prompt_reports_cached_tokens(
    openai_client: openai.OpenAI, live_server: LiveServer
) -> None:
    kwargs = dict(model=live_server.model, prompt=PROMPT, max_tokens=8, temperature=0)
    first = openai_client.completions.create(**kwargs)
    second = openai_client.completions.create(**kwargs)
    assert second.choices[0].text == first.choices[0].text
    details = second.usage.prompt_tokens_details
    assert details is not None and 0 < details.cached_tokens < second.usage.prompt_tokens
    # The chat route and the streamed usage chunk report it too.
    messages = [{"role": "user", "content": PROMPT}]
    openai_client.chat.completions.create(model=live_server.model, messages=messages, max_tokens=4)
    chunks = list(
        openai_client.chat.completions.create(
            model=live_server.model,
            messages=messages,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    assert _metric(live_server.base_url, "xpuspec_prefix_cache_blocks") > 0
    assert 0 < _metric(live_server.base_url, "xpuspec_prefix_cache_hit_rate") <= 1
    assert _metric(live_server.base_url, "xpuspec_prefix_cache_hit_tokens_total") >= details.cached_tokens


@pytest.fixture(scope="module")
def uncached_server(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    server = start_server(
        pair_bundle, tmp_path_factory.mktemp("uncached") / "server.log", "--no-prefix-caching"
    )
    yield server
    stop_server(server)


def test_no_prefix_caching_recomputes_every_prompt(uncached_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{uncached_server.base_url}/v1", api_key="unused", max_retries=0)
    kwargs = dict(model=uncached_server.model, prompt=PROMPT, max_tokens=8, temperature=0)
    client.completions.create(**kwargs)
    second = client.completions.create(**kwargs)
    assert second.usage.prompt_tokens_details.cached_tokens == 0
    assert _metric(uncached_server.base_url, "xpuspec_prefix_cache_blocks") == 0
