"""A request's output constraint can hurt only that request (issue 38, cases 1-3), on the demo bundle.

Everything a step computes from one request's grammar — forced tokens, draft and verification
masks, the cut of proposals, the matcher's advance and rollback — fails that request alone: the
others keep exactly the tokens they have without it, and no other request's message names its data.
A grammar that compiles but can never be completed fails at run time (``start: "..." a; a: a``
admits its literal, then no token); failures of every other hook are injected into the real matcher.
"""

from __future__ import annotations

import pytest

from tests.engine.test_exactness import PROMPTS
from tests.support.faults import EXACT
from xpuspec import Pipeline, SamplingParams
from xpuspec.structured import matcher as matcher_module

NORMAL = PROMPTS[:4]
MAX_TOKENS = 16
SECRET = "SECRET-CUSTOMER-12345"
# Compiles, and its first state allows the literal; once it is written no token is allowed.
DEAD_END_GRAMMAR = f'start: "{SECRET}" a\na: a'
HOSTILE_REGEX = "[a-z ]+(HOSTILE)?"  # a plain constraint; the hooks of its matcher are made to fail


def normal_params() -> list[SamplingParams]:
    """Greedy and seeded sampled requests, drafting at a fixed γ and adaptively."""
    return [
        SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=0.8 if index % 2 else 0.0,
            top_k=20 if index % 2 else 0,
            seed=10 + index if index % 2 else None,
            ignore_eos=True,
            num_draft_tokens=4 if index < 2 else None,
        )
        for index in range(len(NORMAL))
    ]


@pytest.fixture(scope="module", params=["none", "draft", "ngram", "overlap"])
def pipe(request) -> Pipeline:
    if request.param == "overlap":
        return Pipeline("demo", drafter="draft", properties=EXACT, overlap=True)
    return Pipeline("demo", drafter=request.param, properties=EXACT)


@pytest.fixture(scope="module")
def reference(pipe) -> list[list[int]]:
    return [result.token_ids for result in pipe.generate(NORMAL, normal_params())]


def run_beside(pipe: Pipeline, hostile: SamplingParams):
    """The normal requests with the hostile one in the middle of the batch."""
    prompts = NORMAL[:2] + ["Hello"] + NORMAL[2:]
    params = normal_params()
    params = params[:2] + [hostile] + params[2:]
    results = pipe.generate(prompts, params)
    return results[:2] + results[3:], results[2]


def assert_unharmed(normal_results, reference) -> None:
    assert [r.token_ids for r in normal_results] == reference
    for result in normal_results:
        assert result.finish_reason == "length" and result.error is None


@pytest.mark.parametrize("num_draft_tokens", [None, 0, 4])
def test_a_grammar_that_dead_ends_fails_its_request_alone(pipe, reference, num_draft_tokens):
    hostile = SamplingParams(
        max_tokens=32, temperature=0.0, guided_grammar=DEAD_END_GRAMMAR, num_draft_tokens=num_draft_tokens
    )
    if pipe.engine.proposer is None and num_draft_tokens:
        hostile.num_draft_tokens = None
    normal, failed = run_beside(pipe, hostile)
    assert_unharmed(normal, reference)
    assert failed.finish_reason == "error"
    assert "output constraint" in failed.error
    # What it wrote before the dead end is its own; nothing of it reaches the others.
    assert all(SECRET not in (r.text + (r.error or "")) for r in normal)
    assert pipe.engine.num_engine_failures == 0


# Each hook of the matcher, made to fail on its second call for the hostile request only.
HOOKS = [
    "forced_tokens",
    "mask_draft_logits",
    "end_drafting",
    "valid_prefix",
    "prepare",
    "verification_masks",
    "advance",
]


@pytest.mark.parametrize("hook", HOOKS)
def test_a_failing_matcher_hook_fails_its_request_alone(pipe, reference, monkeypatch, hook):
    hostile_guides: set[int] = set()
    compile_original = matcher_module.GrammarCompiler.compile

    def compile_marking(self, constraint):
        guide = compile_original(self, constraint)
        if "HOSTILE" in constraint.source:
            hostile_guides.add(id(guide))
        return guide

    original = getattr(matcher_module.GuidedRequest, hook)
    calls = {"n": 0}

    def failing(self, *args, **kwargs):
        if id(self) in hostile_guides:
            calls["n"] += 1
            if calls["n"] >= 2:
                raise RuntimeError(f"injected failure in {hook}")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matcher_module.GrammarCompiler, "compile", compile_marking)
    monkeypatch.setattr(matcher_module.GuidedRequest, hook, failing)
    hostile = SamplingParams(max_tokens=24, temperature=0.0, guided_regex=HOSTILE_REGEX, ignore_eos=True)
    normal, failed = run_beside(pipe, hostile)
    assert_unharmed(normal, reference)
    assert pipe.engine.num_engine_failures == 0
    if calls["n"] >= 2:  # the hook ran for this drafter, and failed
        assert failed.finish_reason == "error"
        assert "injected failure" in failed.error
    else:  # a hook this drafter never calls (or calls once): the request is unaffected
        assert failed.finish_reason == "length"


def test_an_engine_failure_names_only_the_request_it_reaches(pipe, monkeypatch):
    """A failure of the shared step reaches every client as a generic message with its own id."""
    engine = pipe.engine

    def broken_forward(*args, **kwargs):
        raise RuntimeError(f"the step broke while serving {SECRET}")

    hostile = SamplingParams(max_tokens=8, temperature=0.0, guided_grammar=f'start: "{SECRET}"')
    for request_id, prompt, params in [
        ("a", [1, 2, 3], SamplingParams(max_tokens=8)),
        ("b", [4, 5], hostile),
    ]:
        engine.add_request(request_id, prompt, params)
    monkeypatch.setattr(type(engine), "schedule", broken_forward)
    before = engine.num_engine_failures
    outputs = engine.step()
    assert engine.num_engine_failures == before + 1
    assert sorted(o.request_id for o in outputs) == ["a", "b"]
    for output in outputs:
        assert output.finish_reason == "error"
        assert output.error.startswith(f"engine failure, request id {output.request_id}")
        assert SECRET not in output.error and "RuntimeError" not in output.error
    assert not engine.has_unfinished()


def test_a_cut_draft_vocabulary_under_a_constraint_drafts_nothing_there():
    """Case 3: every id the grammar allows lies beyond the draft's vocabulary: the draft proposes
    nothing at that position, the target decides it, and the output is target-only's."""
    cut = 100
    grammar = "start: t t t t t t t t t t\nt: <[200]> | <[201]>"  # two choices, both beyond the cut
    params = SamplingParams(max_tokens=12, temperature=0.0, guided_grammar=grammar, num_draft_tokens=4)
    target_only = Pipeline("demo", drafter="none", properties=EXACT).generate(["Once upon a time"], [params])
    drafted = Pipeline("demo", drafter="draft", properties=EXACT, draft_vocab=cut).generate(
        ["Once upon a time"], [params]
    )
    assert target_only[0].finish_reason == "stop"
    assert set(target_only[0].token_ids) <= {200, 201} and len(target_only[0].token_ids) == 10
    assert drafted[0].error is None
    assert drafted[0].token_ids == target_only[0].token_ids


@pytest.mark.parametrize("ignore_eos", [False, True])
@pytest.mark.parametrize("max_tokens", [3, 40])
def test_a_complete_constraint_stops_the_request(ignore_eos, max_tokens):
    """Case 7: once the constraint is complete and only end-of-sequence may follow, the request
    stops there, with ignore_eos too and when max_tokens ends at the same token: finish "stop"."""
    pipe = Pipeline("demo", drafter="draft", properties=EXACT)
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos, guided_regex="(yes|no)!"
    )
    result = pipe.generate(["Answer:"], [params])[0]
    assert result.text in ("yes!", "no!")
    assert result.finish_reason == "stop"
    assert len(result.token_ids) <= 3
