"""One request can never hurt another (issue 10), through the Python API on the demo bundle.

Atomic admission, per-request failures (NaN logits rows, drafting, detokenizing, stop strings),
recovery from a failed step, exact stops, and the speculation limits. Faults are injected into the
real runners and text parts (tests/support/faults.py); everything else is the real engine.
"""

from __future__ import annotations

import math

import pytest

from tests.engine.test_exactness import PROMPTS
from tests.support.faults import EXACT, FaultyRunner, RaisingDetokenizer, RaisingStopMatcher, fail_nth
from xpuspec import Pipeline, SamplingParams
from xpuspec.api import request_text as request_text_module
from xpuspec.api.pipeline import GenerationError
from xpuspec.engine.engine import EngineConfig, LLMEngine
from xpuspec.spec_decode.proposal import NgramDraftProposer
from xpuspec.text import IncrementalDetokenizer, StopStringMatcher

EIGHT = PROMPTS[:8]
MAX_TOKENS = 20
FAULTY = 2  # the index of the request that fails


def mixed_params(**extra) -> list[SamplingParams]:
    """Greedy, seeded sampled and fixed/adaptive γ, so every verification path runs beside the fault."""
    params = []
    for index in range(len(EIGHT)):
        sampled = index % 2 == 1
        params.append(
            SamplingParams(
                max_tokens=MAX_TOKENS,
                temperature=0.8 if sampled else 0.0,
                top_k=20 if sampled else 0,
                seed=100 + index if sampled else None,
                ignore_eos=True,
                num_draft_tokens=None if index % 4 == 3 else 4,
                **extra,
            )
        )
    return params


def make_pipe(drafter: str, overlap: bool = False) -> Pipeline:
    return Pipeline("demo", drafter=drafter, properties=EXACT, overlap=overlap)


@pytest.fixture(scope="module", params=["draft", "ngram", "overlap"])
def pipe(request) -> Pipeline:
    if request.param == "overlap":
        return make_pipe("draft", overlap=True)
    return make_pipe(request.param)


@pytest.fixture(scope="module")
def reference(pipe) -> list[list[int]]:
    return [result.token_ids for result in pipe.generate(EIGHT, mixed_params())]


def assert_clean(engine: LLMEngine) -> None:
    assert engine.num_requests == 0 and not engine.has_unfinished()
    assert engine.block_manager.num_used_blocks == 0
    engine.scheduler.check_invariants()


def assert_others_unchanged(results, reference, faulty: int = FAULTY) -> None:
    for index, (result, expected) in enumerate(zip(results, reference, strict=True)):
        if index != faulty:
            assert result.finish_reason == "length", (index, result.error)
            assert result.token_ids == expected, index


# ------------------------------------------------------------------------------- admission
@pytest.mark.parametrize(
    "field, value",
    [
        ("seed", -1),
        ("seed", 2**64),
        ("seed", 1.5),
        ("temperature", 1e-320),
        ("temperature", 5e-5),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("top_p", math.nan),
        ("max_tokens", True),
        ("top_k", 2.0),
        ("ignore_eos", "yes"),
    ],
)
def test_bad_sampling_parameters_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_extreme_but_valid_parameters_are_accepted():
    SamplingParams(seed=2**64 - 1, temperature=1e-4, top_p=1e-9)
    SamplingParams(seed=0, temperature=0)


@pytest.mark.parametrize(
    "prompt, change, match",
    [
        ([1, 2, 3], {"seed": -1}, "seed"),
        ([1, 2, 3], {"temperature": 1e-320}, "temperature"),
        ([1, -1, 3], {}, "token ids"),
        ([1, 4096, 3], {}, "token ids"),
        ([1, 2.5, 3], {}, "integers"),
        ([], {}, "empty"),
        ([1] * 600, {}, "context"),
    ],
)
def test_a_rejected_request_leaves_no_trace(pipe, reference, prompt, change, match):
    engine = pipe.engine
    params = SamplingParams(max_tokens=8)
    for name, value in change.items():
        setattr(params, name, value)  # after construction: the engine must check again
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", prompt, params)
    assert_clean(engine)
    assert engine.scheduler.get("bad") is None
    results = pipe.generate(EIGHT, mixed_params())
    assert [r.token_ids for r in results] == reference


# -------------------------------------------------------------------- per-request failures
def poison_prompt(pipe: Pipeline, prompt: str):
    """A poison predicate for FaultyRunner: the sequence whose prompt is ``prompt``."""
    prompt_ids = pipe.encode(prompt)

    def poisoned(sequence_id: str | None) -> bool:
        sequence = pipe.engine.scheduler.get(sequence_id) if sequence_id else None
        return sequence is not None and sequence.prompt_token_ids == prompt_ids

    return poisoned


@pytest.mark.parametrize("faulty", [FAULTY, FAULTY + 1], ids=["greedy", "seeded"])
def test_nan_target_rows_end_that_request_alone(pipe, reference, faulty):
    target = FaultyRunner(pipe.engine.target)
    target.poison = poison_prompt(pipe, EIGHT[faulty])
    pipe.engine.target = target
    try:
        results = pipe.generate(EIGHT, mixed_params())
    finally:
        pipe.engine.target = target._runner
    assert results[faulty].finish_reason == "error" and "NaN" in results[faulty].error
    assert_others_unchanged(results, reference, faulty)
    assert_clean(pipe.engine)
    assert pipe.engine.num_engine_failures == 0


def test_nan_draft_rows_end_that_request_alone(pipe, reference):
    proposer = pipe.engine.proposer
    if isinstance(proposer, NgramDraftProposer):
        pytest.skip("n-gram drafting runs no model")
    draft = FaultyRunner(proposer.runner)
    draft.poison = poison_prompt(pipe, EIGHT[FAULTY])
    proposer.runner = draft
    try:
        results = pipe.generate(EIGHT, mixed_params())
    finally:
        proposer.runner = draft._runner
    assert results[FAULTY].finish_reason == "error" and "drafting" in results[FAULTY].error
    assert_others_unchanged(results, reference)
    assert_clean(pipe.engine)


def test_a_failed_step_ends_every_request_and_the_engine_recovers(pipe, reference, caplog):
    engine = pipe.engine
    failures, failed = engine.num_engine_failures, engine.num_requests_failed
    target = FaultyRunner(engine.target)
    target.fail_at = 4  # a few steps in: prefills done, decodes with drafts running
    engine.target = target
    try:
        results = pipe.generate(EIGHT, mixed_params())
    finally:
        engine.target = target._runner
    assert [r.finish_reason for r in results] == ["error"] * len(EIGHT)
    # A generic message to each request; the detail goes to the log only.
    assert all(r.error.startswith("engine failure, request id ") for r in results)
    assert not any("injected inference failure" in r.error for r in results)
    assert "injected inference failure" in caplog.text
    assert engine.num_engine_failures == failures + 1
    assert engine.num_requests_failed == failed + len(EIGHT)
    assert_clean(engine)
    again = pipe.generate(EIGHT, mixed_params())
    assert [r.token_ids for r in again] == reference


def test_a_failed_draft_pass_ends_every_request_and_the_engine_recovers(pipe, reference):
    proposer = pipe.engine.proposer
    if isinstance(proposer, NgramDraftProposer):
        pytest.skip("n-gram drafting runs no model")
    draft = FaultyRunner(proposer.runner)
    draft.fail_at = 3
    proposer.runner = draft
    try:
        results = pipe.generate(EIGHT, mixed_params())
    finally:
        proposer.runner = draft._runner
    assert {r.finish_reason for r in results} == {"error"}
    assert_clean(pipe.engine)
    assert [r.token_ids for r in pipe.generate(EIGHT, mixed_params())] == reference


@pytest.mark.parametrize("part", ["detokenizer", "stop matcher"])
def test_a_text_failure_ends_that_request_alone(pipe, reference, monkeypatch, part):
    if part == "detokenizer":
        factory = fail_nth(IncrementalDetokenizer, RaisingDetokenizer, FAULTY)
        monkeypatch.setattr(request_text_module, "IncrementalDetokenizer", factory)
    else:
        factory = fail_nth(StopStringMatcher, RaisingStopMatcher, FAULTY)
        monkeypatch.setattr(request_text_module, "StopStringMatcher", factory)
    # A stop string that never appears: every request has a matcher, none stops.
    results = pipe.generate(EIGHT, mixed_params(stop=["\x00never\x00"]))
    assert results[FAULTY].finish_reason == "error" and "injected" in results[FAULTY].error
    assert_others_unchanged(results, reference)
    assert_clean(pipe.engine)


def test_stream_raises_when_its_request_fails(pipe, monkeypatch):
    monkeypatch.setattr(
        request_text_module, "IncrementalDetokenizer", fail_nth(IncrementalDetokenizer, RaisingDetokenizer, 0)
    )
    with pytest.raises(GenerationError, match="injected"):
        list(pipe.stream("def", SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)))
    assert_clean(pipe.engine)


# ------------------------------------------------------------------------------ exact stops
STOP_PROMPT = "for i in range(10):"


@pytest.fixture(scope="module")
def target_only() -> Pipeline:
    return make_pipe("none")


@pytest.mark.parametrize("drafter", ["ngram", "draft"])
def test_tokens_after_a_stop_string_are_dropped(target_only, drafter):
    """Issue 10's case: n-gram γ=8 used to keep 15 tokens where target-only gives 7, same text."""
    speculative = make_pipe(drafter)
    plain = SamplingParams(max_tokens=64, temperature=0.0)
    text = target_only.generate(STOP_PROMPT, plain)[0].text
    assert "h.p" in text
    params = SamplingParams(max_tokens=64, temperature=0.0, stop=["h.p"])
    expected = target_only.generate(STOP_PROMPT, params)[0]
    result = speculative.generate(STOP_PROMPT, SamplingParams(**{**vars(params), "num_draft_tokens": 8}))[0]
    assert result.stats["accepted"] > 0, "no draft accepted: the case would not test a multi-token step"
    assert result.finish_reason == expected.finish_reason == "stop"
    assert result.text == expected.text == text[: text.index("h.p")]
    assert result.token_ids == expected.token_ids
    assert result.stats["num_output_tokens"] == len(expected.token_ids)
    assert_clean(speculative.engine)


@pytest.mark.parametrize("drafter", ["ngram", "none"])
def test_stop_wins_over_length_in_the_same_step(target_only, drafter):
    pipe = target_only if drafter == "none" else make_pipe(drafter)
    stopped = target_only.generate(STOP_PROMPT, SamplingParams(max_tokens=64, temperature=0.0, stop=["h.p"]))[
        0
    ]
    # max_tokens ends generation exactly at the token that completes the stop string.
    num_tokens = len(stopped.token_ids)
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, stop=["h.p"], num_draft_tokens=8)
    result = pipe.generate(STOP_PROMPT, params)[0]
    assert result.finish_reason == "stop"
    assert result.token_ids == stopped.token_ids
    assert "".join(pipe.stream(STOP_PROMPT, params)) == result.text


# ------------------------------------------------------------------------ speculation limits
def test_the_probe_respects_max_draft_tokens_zero():
    pipe = Pipeline(
        "demo",
        drafter="draft",
        properties=EXACT,
        engine_config=EngineConfig(max_model_len=512, max_draft_tokens=0),
        use_placement=False,  # adaptive γ: the probe's path
    )
    engine = pipe.engine
    engine.policy.draft_choice.steps_without_drafting = 10_000  # the probe is due at every step
    result = pipe.generate("def", SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))[0]
    assert len(result.token_ids) == 40 and result.stats["drafted"] == 0


def test_calibrate_covers_its_dummy_chunk_with_blocks(tmp_path):
    """16-token blocks and 16 drafts: the 17-token dummy chunk spans two blocks."""
    from tests.support.tiny_checkpoints import make_tiny_checkpoint
    from xpuspec_plugins.torch_runner import TorchModelRunner

    runner = TorchModelRunner(make_tiny_checkpoint(tmp_path / "ckpt", "llama"), num_blocks=8, block_size=16)
    engine = LLMEngine(runner, NgramDraftProposer(), EngineConfig(max_model_len=64, max_draft_tokens=16), [])
    engine.calibrate(repeats=1)
    engine.add_request("r", [5, 6, 7, 5, 6], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert_clean(engine)


def test_a_seeded_sequence_whose_gamma_fell_to_zero_drafts_again():
    """Seeded requests choose γ from the acceptance rate alone; γ = 0 steps must decay the rate's
    counts, or one bad stretch would end speculation for the rest of the request."""
    pipe = make_pipe("draft")
    engine = pipe.engine
    params = SamplingParams(max_tokens=60, temperature=0.8, seed=7, ignore_eos=True)
    engine.add_request("r", pipe.encode("def"), params)
    tracker = engine.policy.acceptance.tracker("r")
    for _ in range(40):
        tracker.update(8, 0)  # a long run of rejections: γ is 0 now
    assert engine.length_policy.choose_without_timing(tracker.rate) == 0
    drafted = 0
    while engine.has_unfinished():
        for output in engine.step():
            drafted = output.stats.drafted
    assert drafted > 0
