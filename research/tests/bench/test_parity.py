"""`python -m research.bench.parity`: one compile per engine, interleaved rounds, the ratios printed."""

from __future__ import annotations

import re

import pytest

from research.bench import parity

pytestmark = pytest.mark.slow


def _run(capsys, *arguments: str) -> list[str]:
    """Run the command on the 2-layer pair, 1 prompt x 4 tokens; return its printed lines."""
    assert parity.main(["--bundle", "demo", "--prompts", "1", "--max-tokens", "4", *arguments]) == 0
    return capsys.readouterr().out.strip().splitlines()


def test_parity_prints_both_engines_and_their_ratios_per_draft_length(capsys):
    lines = _run(capsys, "--draft-lengths", "0,2", "--rounds", "2")
    assert [line.split(":")[0] for line in lines] == ["target-only", "γ=2"]
    for line in lines:
        match = re.search(
            r"xpuspec ([\d.]+) tokens/s, GenAI ([\d.]+) \(best of 2\); "
            r"÷ GenAI best ([\d.]+), median round ([\d.]+), per-prompt best ([\d.]+)",
            line,
        )
        assert match and all(float(value) > 0 for value in match.groups()), line


def test_parity_default_compares_adaptive_with_genai_as_it_comes(capsys):
    lines = _run(capsys, "--default", "--draft-lengths", "2", "--rounds", "1")
    assert [line.split(":")[0] for line in lines] == [
        "xpuspec adaptive vs GenAI target-only",
        "xpuspec adaptive vs GenAI γ=2",
    ]


def test_xpuspec_side_reuses_no_prompt_prefix_since_genai_side_cannot():
    from xpuspec.sample.sampling_params import SamplingParams

    pipeline = parity.xpuspec_pipeline("demo", None, needs_draft=False)
    prompt = pipeline.encode("def fibonacci(n):\n    " * 8)
    cached = []
    for _ in range(2):  # the same prompt twice, as every round repeats its prompts
        request_id = pipeline.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        finished = [step.output for step in pipeline.steps([request_id]) if step.output.finished]
        cached.append(finished[0].stats.cached_tokens)
    assert len(prompt) > 2 * pipeline.block_manager.block_size  # a cache would hold full blocks
    assert cached == [0, 0]


def test_compare_alternates_prompt_by_prompt_and_sums_per_prompt_bests(monkeypatch):
    """Order and arithmetic on a simulated clock: each run advances it by its scripted seconds."""
    calls: list[tuple[str, int]] = []
    now = [0.0]
    monkeypatch.setattr(parity.time, "perf_counter", lambda: now[0])

    class Engine:
        def __init__(self, name: str, seconds: dict[int, list[float]]) -> None:
            self.name, self.seconds = name, seconds

        def generate(self, token_ids, max_tokens, draft_length):
            calls.append((self.name, token_ids[0]))
            now[0] += self.seconds[token_ids[0]].pop(0)

    # Two prompts, two rounds (after one warm-up run each): xpuspec's prompt 0 is slow in round 0
    # only, GenAI's prompt 1 in round 1 only; each prompt's best run is 10 ms for xpuspec, 20 for GenAI.
    ours = Engine("xpuspec", {0: [0.0, 0.08, 0.01], 1: [0.0, 0.01, 0.01]})
    genai = Engine("genai", {0: [0.0, 0.02, 0.02], 1: [0.0, 0.02, 0.09]})
    result = parity.compare(ours, genai, [[0], [1]], 4, 2, None, None)
    timed = calls[4:]  # after the warm-up
    assert timed == [
        ("xpuspec", 0),
        ("genai", 0),
        ("genai", 1),
        ("xpuspec", 1),
        ("genai", 0),
        ("xpuspec", 0),
        ("xpuspec", 1),
        ("genai", 1),
    ]
    assert result["per_prompt_best_ratio"] == pytest.approx(2.0)
    assert result["tokens"] == 8


def test_parity_rejects_bad_counts():
    with pytest.raises(SystemExit):
        parity.main(["--rounds", "0"])


def test_parity_rejects_an_unknown_workload():
    with pytest.raises(SystemExit, match="--workload is"):
        parity.main(["--bundle", "demo", "--workload", "no-such-file.jsonl", "--draft-lengths", "0"])
