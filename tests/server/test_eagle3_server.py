"""A real `xpuspec serve --drafter eagle3` on a bundle with an EAGLE-3 head, driven with the `openai` client:
the request field ``drafter: "eagle3"`` (``extra_body``) drafts with the head, exactly (F32, greedy)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer, start_server, stop_server

openai = pytest.importorskip("openai")
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def eagle3_server(eagle3_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    log = tmp_path_factory.mktemp("eagle3_server") / "server.log"
    server = start_server(eagle3_bundle, log, "--drafter", "eagle3")
    yield server
    stop_server(server)


@pytest.fixture
def client(eagle3_server: LiveServer):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=f"{eagle3_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def _complete(client, server: LiveServer, **extra):  # type: ignore[no-untyped-def]
    return client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=16, temperature=0, extra_body=extra
    )


def test_drafter_eagle3_drafts_with_the_head_and_keeps_greedy_output(client, eagle3_server) -> None:
    alone = _complete(client, eagle3_server, drafter="none", ignore_eos=True)
    drafted = _complete(client, eagle3_server, drafter="eagle3", num_draft_tokens=3, ignore_eos=True)
    by_default = _complete(client, eagle3_server, drafter="auto", ignore_eos=True)
    assert drafted.choices[0].text == alone.choices[0].text == by_default.choices[0].text
    assert drafted.usage is not None and drafted.usage.completion_tokens == 16
    metrics = httpx.get(f"{eagle3_server.base_url}/metrics", timeout=10).text
    drafted_total = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("xpuspec_spec_draft_tokens_total")
    )
    assert drafted_total > 0  # the head drafted (only the eagle3 request had a fixed γ)


def test_a_drafter_the_server_was_not_built_with_is_refused(client, eagle3_server) -> None:
    with pytest.raises(openai.BadRequestError, match="this server runs 'eagle3'"):
        _complete(client, eagle3_server, drafter="draft")
