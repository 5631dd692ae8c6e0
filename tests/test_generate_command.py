"""`xpuspec generate`: streams the text, then the speculation figures."""

from __future__ import annotations

import json

from tests.conftest import F32
from xpuspec import Pipeline, SamplingParams
from xpuspec.cli import main
from xpuspec.cli.generate import summary_line


def test_streams_text_then_figures(pair_bundle, capsys):
    code = main(
        [
            "generate",
            "--bundle",
            str(pair_bundle),
            "def add(a, b):",
            "--raw",
            "--max-tokens",
            "12",
            "--num-draft-tokens",
            "3",
            "--property",
            "INFERENCE_PRECISION_HINT=f32",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert out.startswith("def add(a, b):") and len(out) > len("def add(a, b):")
    summary = err.strip().splitlines()[-1]
    assert summary.startswith("[draft drafter, γ = 3] 12 tokens in")
    assert "acceptance rate" in summary and "tokens/s" in summary and "first token" in summary


def test_no_draft_runs_the_target_alone_with_the_same_text(pair_bundle, capsys):
    args = [
        "generate",
        "--bundle",
        str(pair_bundle),
        "import os",
        "--max-tokens",
        "12",
        "--temperature",
        "0",  # greedy: the same text with and without drafting
        "--json",
        "--property",
        "INFERENCE_PRECISION_HINT=f32",
    ]
    assert main(args) == 0
    speculative = json.loads(capsys.readouterr().out)
    assert main(args + ["--no-draft"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["token_ids"] == speculative["token_ids"]
    assert alone["stats"]["drafted"] == 0


def test_bad_parameters_are_a_usage_error(pair_bundle, capsys):
    assert main(["generate", "--bundle", str(pair_bundle), "x", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err


def test_a_missing_bundle_is_named(tmp_path, capsys):
    assert main(["generate", "--bundle", str(tmp_path / "nope"), "x"]) == 2
    assert "nope" in capsys.readouterr().err


def test_the_prompt_is_a_chat_message_by_default(pair_bundle, capsys):
    args = [
        "generate",
        "--bundle",
        str(pair_bundle),
        "hello there",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--json",
    ]
    args += ["--property", "INFERENCE_PRECISION_HINT=f32", "--property", "KV_CACHE_PRECISION=f32"]
    assert main(args) == 0
    chat = json.loads(capsys.readouterr().out)
    assert main(args + ["--raw"]) == 0
    raw = json.loads(capsys.readouterr().out)
    pipe = Pipeline(pair_bundle, properties=F32, use_placement=False)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    expected = pipe.generate([[{"role": "user", "content": "hello there"}]], params)[0].token_ids
    assert chat["token_ids"] == expected
    assert raw["token_ids"] == pipe.generate(["hello there"], params)[0].token_ids


def test_summary_says_why_adaptive_gamma_kept_drafting_off(pair_bundle):
    pipe = Pipeline(pair_bundle, drafter="draft", properties=F32, use_placement=False)
    stats = {"num_output_tokens": 5, "tokens_per_s": 50.0, "ttft_s": 0.02, "drafted": 0, "accepted": 0}
    line = summary_line(pipe, stats, SamplingParams(max_tokens=5), 0.1, 0.02)
    assert line.startswith("[draft drafter, adaptive γ <= ")
    assert "first token 20 ms" in line and "drafted 0, accepted 0" in line
    assert "adaptive γ kept drafting off" in line and "cost ratio" in line and "acceptance 0.60" in line
    drafting = summary_line(
        pipe, {**stats, "drafted": 4, "accepted": 3, "acceptance_rate": 0.75}, SamplingParams(), 0.1, 0.02
    )
    assert "kept drafting off" not in drafting and "acceptance rate 75.0%" in drafting
    alone = Pipeline(pair_bundle, drafter="none", properties=F32, use_placement=False)
    assert summary_line(alone, stats, SamplingParams(), 0.1, 0.02).startswith("[none drafter, target only]")


def test_summary_names_the_decision_that_kept_drafting_off(pair_bundle):
    """A short reply runs no draft model, and steps measured slower turn drafting off: the summary says
    which, not a cost model's prediction that would have drafted."""
    pipe = Pipeline(pair_bundle, drafter="draft", properties=F32, use_placement=False)
    stats = {"num_output_tokens": 5, "tokens_per_s": 50.0, "ttft_s": 0.02, "drafted": 0, "accepted": 0}
    short = {**stats, "drafting_decisions": {"off: short reply": 4, "off: predicted slower": 1}}
    line = summary_line(pipe, short, SamplingParams(max_tokens=5), 0.1, 0.02)
    assert "drafting off: a reply of at most 16 tokens runs no draft model" in line
    assert "cost ratio" not in line
    measured = {**stats, "drafting_decisions": {"off: measured slower": 9}}
    line = summary_line(pipe, measured, SamplingParams(max_tokens=64), 0.1, 0.02)
    assert "whole steps with drafts were measured slower" in line and "cost ratio" not in line


def test_the_summary_reads_one_clock(pair_bundle):
    """Tokens/s is the tokens over the time shown beside them, not the engine's own figure."""
    pipe = Pipeline(pair_bundle, drafter="none", properties=F32, use_placement=False)
    stats = {"num_output_tokens": 20, "tokens_per_s": 99.0, "ttft_s": 0.001, "drafted": 0, "accepted": 0}
    line = summary_line(pipe, stats, SamplingParams(), 2.0, 0.5)
    assert "20 tokens in 2.00s (10.0 tokens/s, first token 500 ms)" in line
    assert "99.0" not in line


def test_demo_prompts_go_in_raw_said_once_and_the_text_ends_with_a_newline(capsys):
    args = ["generate", "--bundle", "demo", "def add(a, b):", "--max-tokens", "16", "--ignore-eos"]
    assert main([*args, "--exact"]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines[:2] == [
        "xpuspec generate: the demo pair was trained on plain text, not chat: the prompt goes in as it is "
        "(--raw)",
        "xpuspec generate: loading the demo pair ...",
    ]
    assert sum("the prompt goes in as it is" in line for line in lines) == 1
    assert out.startswith("def add(a, b):") and out.endswith("\n") and not out.endswith("\n\n")
    assert main([*args, "--exact", "--raw", "--json"]) == 0
    raw = json.loads(capsys.readouterr().out)
    assert out == "def add(a, b):" + raw["text"] + "\n"
    assert main([*args, "--exact", "--raw"]) == 0
    assert "goes in as it is" not in capsys.readouterr().err  # asked for: nothing to say


def test_max_tokens_beyond_the_context_is_refused_before_loading(monkeypatch, capsys):
    def no_loading(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr("xpuspec.api.pipeline.Pipeline.__init__", no_loading)
    assert main(["generate", "--bundle", "demo", "x", "--max-tokens", "1000000"]) == 2
    err = capsys.readouterr().err
    assert "--max-tokens 1000000" in err and "context of 512 tokens" in err


def test_stable_keeps_the_target_at_f32_and_the_draft_at_its_defaults(monkeypatch, capsys):
    seen: dict[str, object] = {}

    def recording(*args, **kwargs):  # `generate` imports Pipeline when it runs
        seen.update(kwargs)
        return Pipeline(*args, **kwargs)

    monkeypatch.setattr("xpuspec.api.pipeline.Pipeline", recording)
    command = ["generate", "--bundle", "demo", "--stable", "--max-tokens", "6", "--json", "def add(a, b):"]
    assert main(command) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"]
    assert seen["properties"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert seen["properties"]["KV_CACHE_PRECISION"] == "f32"
    assert seen["draft_properties"] == {}


def test_one_reply_compiles_the_target_once(monkeypatch, capsys):
    """A one-shot `generate` builds no decode lane for the target: its compile costs more than one
    reply gains (a Pipeline kept for many requests, or a server, has one)."""
    built: list[Pipeline] = []

    def recording(*args, **kwargs):
        built.append(Pipeline(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr("xpuspec.api.pipeline.Pipeline", recording)
    assert main(["generate", "--bundle", "demo", "--max-tokens", "6", "--json", "def add(a, b):"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"]
    assert built[0].drafter != "none" and not built[0].target_runner.caps.decode_lane


def test_exact_and_stable_exclude_each_other(capsys):
    import pytest

    with pytest.raises(SystemExit) as exited:
        main(["generate", "--bundle", "demo", "--exact", "--stable", "x"])
    assert exited.value.code == 2
    assert "--stable" in capsys.readouterr().err
