"""Benchmark prompts, settings checks and the /metrics differences of the load mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xpuspec.bench.config import BenchConfig
from xpuspec.bench.load import _speculation_delta
from xpuspec.bench.workloads import load_workload


def test_jsonl_workload_reads_text_and_chat_prompts_and_cycles(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    records = [{"prompt": "def f():"}, {"messages": [{"role": "user", "content": "hi"}]}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    prompts = load_workload(str(path), 3)
    assert [p.text for p in prompts] == ["def f():", records[1]["messages"], "def f():"]


def test_bad_workloads_are_explained(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither"):
        load_workload(str(tmp_path / "missing.jsonl"), 2)
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="prompt"):
        load_workload(str(path), 2)


def test_code_and_chat_workloads_have_the_asked_count() -> None:
    assert len(load_workload("code", 4, prompt_chars=200)) == 4
    chat = load_workload("chat", 3)
    assert len(chat) == 3 and all(isinstance(p.text, list) for p in chat)


@pytest.mark.parametrize(
    "fields",
    [
        {"mode": "fast"},
        {"draft_lengths": (0,)},
        {"draft_lengths": (99,)},
        {"concurrency": ()},
        {"max_tokens": 0},
    ],
)
def test_config_rejects_bad_settings(fields: dict, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        BenchConfig(out=tmp_path, **fields)


def test_config_needs_both_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="both"):
        BenchConfig(out=tmp_path, hf_target=tmp_path)


def test_speculation_delta_subtracts_scrapes_per_position() -> None:
    before = {
        "xpuspec_spec_draft_tokens_total": 10.0,
        "xpuspec_spec_accepted_tokens_total": 5.0,
        'xpuspec_spec_draft_tokens_per_position_total{position="0"}': 5.0,
        'xpuspec_spec_accepted_tokens_per_position_total{position="0"}': 4.0,
    }
    after = {
        "xpuspec_spec_draft_tokens_total": 30.0,
        "xpuspec_spec_accepted_tokens_total": 15.0,
        'xpuspec_spec_draft_tokens_per_position_total{position="0"}': 15.0,
        'xpuspec_spec_accepted_tokens_per_position_total{position="0"}': 12.0,
        'xpuspec_spec_draft_tokens_per_position_total{position="1"}': 10.0,
        'xpuspec_spec_accepted_tokens_per_position_total{position="1"}': 2.0,
    }
    delta = _speculation_delta(before, after)
    assert delta["drafted"] == 20 and delta["accepted"] == 10 and delta["acceptance_rate"] == 0.5
    assert delta["acceptance_per_position"] == [0.8, 0.2]
