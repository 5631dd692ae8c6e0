"""The cross-request lookup through the engine, on the demo pair in exact mode: outputs as the target
alone gives them, drafts from earlier requests that are accepted, and never from another tenant's."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.engine_runs import draft_whenever_the_cost_model_says
from xpuspec import Pipeline, SamplingParams
from xpuspec.core.proposal import Proposal
from xpuspec.engine.engine import LLMEngine
from xpuspec.engine.outputs import EngineConfig
from xpuspec.spec_decode.suffix_index import DEFAULT_CAPACITY, SharedSuffixIndex

GREEDY = SamplingParams(max_tokens=40, temperature=0.0)
# An agent re-sending one tool result under changing headers: the answers repeat across requests.
TOOL = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n"
REQUESTS = [f"# call {call}\n{TOOL}" for call in range(4)]


@pytest.fixture(scope="module")
def pipe() -> Pipeline:
    pipe = Pipeline("demo", properties="exact", use_placement=False, shared_lookup_tokens=4096)
    draft_whenever_the_cost_model_says(pipe.engine)  # these tests are of what lookups draft
    return pipe


@pytest.fixture(scope="module")
def target_only(pipe) -> list[list[int]]:
    """The target alone (γ = 0: no drafts of any kind) on the same compiled model; then an empty index."""
    alone = dataclasses.replace(GREEDY, num_draft_tokens=0)
    outputs = [pipe.generate(prompt, alone)[0].token_ids for prompt in REQUESTS]
    pipe.engine.prompt_lookup.shared = SharedSuffixIndex(4096)
    return outputs


def _record_proposals(engine: LLMEngine) -> dict[str, list[Proposal]]:
    """Every proposal the engine's propose phase hands on, by request id (the real phase runs)."""
    seen: dict[str, list[Proposal]] = {}
    propose = engine.drafting.propose

    def recording(chunks):  # type: ignore[no-untyped-def]
        proposals = propose(chunks)
        for request_id, proposal in proposals.items():
            seen.setdefault(request_id, []).append(proposal)
        return proposals

    engine.drafting.propose = recording  # type: ignore[method-assign]
    return seen


def _run(engine: LLMEngine, request_id: str, prompt: list[int], tenant: str | None) -> list[int]:
    engine.add_request(request_id, prompt, GREEDY, tenant=tenant)
    tokens: list[int] = []
    while engine.has_unfinished():
        for output in engine.step():
            tokens += output.new_token_ids
            assert output.finish_reason != "error", output.error
    return tokens


def test_repeated_requests_draft_from_each_other_and_stay_exact(pipe, target_only):
    lookup = pipe.engine.prompt_lookup
    drafted, accepted = lookup.shared_drafted, lookup.shared_accepted
    results = [pipe.generate(prompt, GREEDY)[0] for prompt in REQUESTS]
    assert [r.token_ids for r in results] == target_only
    assert lookup.shared_drafted > drafted, "no shared draft: the comparison would not test it"
    assert lookup.shared_accepted > accepted
    assert lookup.shared.tenants() == [None]  # the Python API's requests: the anonymous tenant


def test_a_tenants_requests_never_draft_from_another_tenants(pipe, target_only):
    engine = pipe.engine
    engine.prompt_lookup.shared = SharedSuffixIndex(4096)  # empty, for this test
    seen = _record_proposals(engine)
    try:
        prompts = [pipe.encode(prompt) for prompt in REQUESTS]
        for number, prompt in enumerate(prompts[:3]):
            assert _run(engine, f"a-{number}", prompt, "key-a") == target_only[number]
        # The same request from another key: nothing of key a's may be proposed to it ...
        assert _run(engine, "b-0", prompts[3], "key-b") == target_only[3]
        assert _run(engine, "anonymous-0", prompts[3], None) == target_only[3]
        # ... while from key a itself it draws on key a's earlier requests (so the test can fail).
        assert _run(engine, "a-3", prompts[3], "key-a") == target_only[3]
    finally:
        del engine.drafting.propose
    assert not any(p.lookup_shared for p in seen.get("b-0", []) + seen.get("anonymous-0", []))
    assert any(p.lookup_shared for p in seen["a-3"])
    assert engine.prompt_lookup.shared.tenants() == ["key-a", "key-b", None]


def test_on_by_default_off_at_zero_and_refused_below_zero():
    assert EngineConfig().shared_lookup_tokens == DEFAULT_CAPACITY > 0
    assert EngineConfig(shared_lookup_tokens=0).shared_lookup_tokens == 0
    with pytest.raises(ValueError, match="shared_lookup_tokens"):
        EngineConfig(shared_lookup_tokens=-1)
