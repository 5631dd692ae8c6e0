"""Speculation provenance in streams (``stream_options.include_speculation``): which tokens of each
chunk were accepted drafts, against a real server whose draft model speculates."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.server.conftest import LiveServer
from tests.server.test_streaming import data_lines, generation
from xpuspec.api.engine_loop import ChoiceEvent
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.server.provenance import Speculation, speculation_of
from xpuspec.server.responses import ResponseContext, stream

PROMPT = "one two three four one two three four one two"


def chunks_of(frames: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for frame in frames for line in data_lines(frame) if line != "[DONE]"]


def test_runs_cut_each_chunk_at_its_accepted_drafts_and_count_them() -> None:
    gen = generation()
    gen.deliver([ChoiceEvent(0, "abcdef", 3, num_accepted_drafts=2, draft_chars=4)])
    gen.deliver([ChoiceEvent(0, "", 1, num_accepted_drafts=1, draft_chars=0)])  # text held back
    gen.deliver([ChoiceEvent(0, "gh", 2, finish_reason="length")])
    context = ResponseContext(kind="chat", model="m", num_prompt_tokens=1, num_choices=1)
    chunks = chunks_of(list(stream(gen, context, False, speculation=Speculation("draft", "adaptive γ"))))
    runs = [run for chunk in chunks for run in chunk.get("xpuspec", {}).get("runs", [])]
    assert "xpuspec" not in chunks[0]  # the role chunk
    assert "".join(run["text"] for run in runs) == "abcdefgh"
    assert sum(run["tokens"] for run in runs) == 6
    assert sum(run["tokens"] for run in runs if run["accepted_draft"]) == 3
    assert runs[0] == {"text": "abcd", "tokens": 2, "accepted_draft": True}
    final = chunks[-1]["xpuspec"]["speculation"]
    assert final["accepted_tokens"] == 3 and final["drafter"] == "draft"


def test_the_gamma_policy_names_what_the_request_runs_under() -> None:
    assert speculation_of(SamplingParams(), "draft") == Speculation("draft", "adaptive γ")
    assert speculation_of(SamplingParams(num_draft_tokens=3), "ngram") == Speculation("ngram", "fixed γ=3")
    assert speculation_of(SamplingParams(num_draft_tokens=0), "draft") == Speculation("none", "off")
    tree = speculation_of(SamplingParams(draft_tree={"depth": 3, "width": 2, "nodes": 6}), "draft")
    assert tree.gamma_policy == "tree depth 3, width 2, 6 nodes"


def test_chunks_carry_no_provenance_unless_asked() -> None:
    gen = generation()
    gen.deliver([ChoiceEvent(0, "ab", 2, num_accepted_drafts=1, draft_chars=1, finish_reason="stop")])
    context = ResponseContext(kind="completion", model="m", num_prompt_tokens=1, num_choices=1)
    assert all("xpuspec" not in chunk for chunk in chunks_of(list(stream(gen, context, True))))


def stream_chat(server: LiveServer, **extra: Any) -> list[dict[str, Any]]:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
        **extra,
    }
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_speculating_server_marks_accepted_drafts_and_the_text_is_unchanged(
    live_server: LiveServer, kind: str
) -> None:
    client = openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    # A fixed γ drafts at every step; an adaptive one may, on a busy machine, choose not to.
    common: dict[str, Any] = {
        "model": live_server.model,
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
        "extra_body": {"num_draft_tokens": 4},
    }
    if kind == "chat":
        create: Any = client.chat.completions.create
        common["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        create = client.completions.create
        common["prompt"] = PROMPT

    def text_of(chunk: Any) -> str:
        if not chunk.choices:
            return ""
        return (chunk.choices[0].delta.content or "") if kind == "chat" else chunk.choices[0].text

    plain = list(create(**common, stream_options={"include_usage": True}))
    marked = list(create(**common, stream_options={"include_usage": True, "include_speculation": True}))
    assert all(chunk.model_extra.get("xpuspec") is None for chunk in plain)
    text = "".join(map(text_of, marked))
    assert text == "".join(map(text_of, plain))  # exact: provenance changes nothing
    runs = [
        run
        for chunk in marked
        if chunk.model_extra.get("xpuspec")
        for run in chunk.model_extra["xpuspec"]["runs"]
    ]
    assert "".join(run["text"] for run in runs) == text
    assert sum(run["tokens"] for run in runs) == marked[-1].usage.completion_tokens
    finals = [
        chunk.model_extra["xpuspec"]["speculation"]
        for chunk in marked
        if chunk.model_extra.get("xpuspec") and "speculation" in chunk.model_extra["xpuspec"]
    ]
    assert len(finals) == 1
    summary = finals[0]
    accepted_tokens = sum(run["tokens"] for run in runs if run["accepted_draft"])
    assert summary["accepted_tokens"] == accepted_tokens > 0
    assert accepted_tokens <= summary["accepted"] <= summary["drafted"]
    assert summary["drafter"] == "draft" and summary["gamma_policy"] == "fixed γ=4"
    assert summary["output_tokens"] == marked[-1].usage.completion_tokens
    assert summary["tokens_per_target_pass"] > 1


def test_without_a_drafter_no_token_is_an_accepted_draft(live_server: LiveServer) -> None:
    chunks = stream_chat(live_server, drafter="none", stream_options={"include_speculation": True})
    runs = [run for chunk in chunks if "xpuspec" in chunk for run in chunk["xpuspec"]["runs"]]
    assert runs and not any(run["accepted_draft"] for run in runs)
    summary = chunks[-1]["xpuspec"]["speculation"]
    assert summary["drafter"] == "none" and summary["accepted_tokens"] == 0 and summary["drafted"] == 0
