"""The step profile: timers around the real step and text path, a report, and the HTTP comparison."""

from __future__ import annotations

import pytest

from research.bench import profile
from research.bench.profile import ROWS, Timers, profile_configuration
from xpuspec.api.pipeline import Pipeline

PROMPTS = ["def add(a, b):\n", "import os\n"]
TIMERS = Timers()


@pytest.fixture(scope="module")
def demo_pipeline() -> Pipeline:
    return Pipeline("demo", drafter="draft", phase_hooks=TIMERS)


@pytest.mark.parametrize("num_draft_tokens", [0, 3])
def test_profile_times_each_stage_and_restores_the_pipeline(
    demo_pipeline: Pipeline, num_draft_tokens
) -> None:
    draft_runner = demo_pipeline.proposer.runner
    result = profile_configuration(demo_pipeline, TIMERS, PROMPTS, 12, num_draft_tokens, "run")
    assert result.num_tokens == 2 * 12
    assert 0 < result.num_steps <= result.num_tokens
    assert set(result.rows) == set(ROWS)
    for row in ("target device", "target input binding", "schedule", "verify/accept", "detokenize"):
        assert result.rows[row] > 0, row
    speculating = num_draft_tokens > 0
    assert (result.rows["draft device"] > 0) == speculating
    assert sum(result.rows.values()) == pytest.approx(result.wall_seconds)
    assert result.rows["target device"] < result.wall_seconds
    # The wrappers are gone: the methods are the classes' again.
    for owner in (demo_pipeline.target_runner, draft_runner):
        assert not {"step", "wait", "start", "_fill_inputs", "_schedule"} & set(vars(owner))
    from xpuspec.api.request_text import RequestText
    from xpuspec.text.detokenizer import IncrementalDetokenizer

    assert (
        not hasattr(RequestText.push, "__wrapped__") and RequestText.push.__qualname__ == "RequestText.push"
    )
    assert IncrementalDetokenizer.push.__qualname__ == "IncrementalDetokenizer.push"
    # The profiled text is what an unprofiled run gives.
    from xpuspec.sample.sampling_params import SamplingParams

    params = SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, num_draft_tokens=num_draft_tokens
    )
    assert demo_pipeline.generate(PROMPTS[:1], params)[0].text


def test_profile_command_prints_each_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    # The demo pair: the default model's compiles (with and without counters) took ~50 s of CI here.
    argv = ["--bundle", "demo", "--prompts", "1", "--max-tokens", "8", "--draft-lengths", "0,2", "--layers"]
    assert profile.main(argv) == 0
    out = capsys.readouterr().out
    assert "target-only: 8 tokens" in out and "γ = 2: 8 tokens" in out
    assert "detokenize" in out and "draft device" in out
    assert "by layer type" in out and "PagedAttention" in out


def test_profile_command_streams_through_a_real_server(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--bundle", "demo", "--prompts", "1", "--max-tokens", "8", "--draft-lengths", "0", "--http"]
    assert profile.main(argv) == 0
    out = capsys.readouterr().out
    assert "HTTP, one streaming client" in out and "tokens/s in-process" in out


def test_draft_lengths_take_integers_and_adaptive() -> None:
    from research.bench.profile import _draft_length

    assert [_draft_length(v) for v in ("0", "4", "a", " adaptive")] == [0, 4, None, None]
    with pytest.raises(SystemExit, match="'x'"):
        _draft_length("x")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--property", "INFERENCE_PRECISION_HINT"], "KEY=VALUE"),
        (["--bundle", "demo", "--property", "KV_CACHE_PRECISION=i64"], "Wrong value i64"),
        (["--bundle", "/nowhere/bundle"], "/nowhere/bundle"),
    ],
)
def test_mistakes_are_one_line_errors(argv, said, capsys: pytest.CaptureFixture[str]) -> None:
    assert profile.main(["--prompts", "1", "--max-tokens", "2", "--draft-lengths", "0", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err and "Traceback" not in err
