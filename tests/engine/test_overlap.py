"""Overlapped draft/verify keeps greedy output token-identical to the target alone."""

from __future__ import annotations

import pytest

from tests.conftest import F32
from tests.engine.test_exactness import PROMPTS
from xpuspec import Pipeline, SamplingParams
from xpuspec.engine.engine import EngineConfig, LLMEngine
from xpuspec.engine.overlap import OverlappedSteps, overlap_wanted
from xpuspec.executor.stateful_runner import StatefulModelRunner
from xpuspec.models.bundle import ModelBundle
from xpuspec.spec_decode.proposal import DraftModelProposer
from xpuspec.text import Tokenizer

MAX_TOKENS = 32
SIXTEEN = PROMPTS[:16]


def greedy(num_draft_tokens: int | None) -> SamplingParams:
    return SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=num_draft_tokens
    )


@pytest.fixture(scope="module")
def target_only(pair_bundle) -> list[list[int]]:
    pipe = Pipeline(pair_bundle, drafter="none", properties=F32)
    return [result.token_ids for result in pipe.generate(SIXTEEN, greedy(None))]


class EventLog:
    """Records the order of target start/wait and draft proposals, to see that they overlap."""

    def __init__(self, engine: LLMEngine) -> None:
        self.events: list[str] = []
        target, proposer = engine.target, engine.proposer
        start, wait, propose = target.start, target.wait, proposer.propose

        def logged(name, function):
            def call(*args, **kwargs):
                self.events.append(name)
                return function(*args, **kwargs)

            return call

        target.start = logged("start", start)
        target.wait = logged("wait", wait)
        proposer.propose = logged("propose", propose)

    @property
    def num_overlapped(self) -> int:
        """Proposals made while a target inference was running."""
        running, count = False, 0
        for event in self.events:
            running = event == "start" or (running and event != "wait")
            count += event == "propose" and running
        return count


@pytest.fixture(scope="module")
def overlapped(pair_bundle) -> Pipeline:
    pipe = Pipeline(pair_bundle, drafter="draft", properties=F32, overlap=True)
    assert isinstance(pipe.engine.strategy, OverlappedSteps)
    return pipe


@pytest.mark.parametrize("num_draft_tokens", [4, None])
def test_sixteen_in_flight_match_target_alone(overlapped, target_only, num_draft_tokens):
    log = EventLog(overlapped.engine)
    results = overlapped.generate(SIXTEEN, greedy(num_draft_tokens))
    assert [result.token_ids for result in results] == target_only
    if num_draft_tokens:
        # Adaptive γ may rightly choose 0 on this pair (its draft costs as much as its target).
        assert log.num_overlapped > 0, "the drafter never ran while the target did"
    if num_draft_tokens:
        drafted = sum(r.stats["drafted"] for r in results)
        accepted = sum(r.stats["accepted"] for r in results)
        assert 0 < accepted < drafted, "the perturbed draft must both accept and reject"


def test_preemption_under_overlap_stays_exact(pair_bundle, target_only):
    pipe = Pipeline(pair_bundle, drafter="draft", properties=F32, overlap=True, num_kv_blocks=10)
    results = pipe.generate(SIXTEEN, greedy(3))
    assert [result.token_ids for result in results] == target_only
    assert sum(r.stats["num_preemptions"] for r in results) > 0
    assert pipe.engine.block_manager.num_used_blocks == 0


def test_overlap_with_stateful_executors(pair_bundle, target_only):
    bundle = ModelBundle.open(pair_bundle)
    target = StatefulModelRunner(bundle.target.path, properties=F32, max_sequences=8, max_context=256)
    draft = StatefulModelRunner(bundle.draft.path, properties=F32, max_sequences=8, max_context=256)
    engine = LLMEngine(
        target, DraftModelProposer(draft, target.vocab_size), EngineConfig(max_num_seqs=8), [], overlap=True
    )
    tokenizer = Tokenizer(bundle.target.path)
    tokens: dict[str, list[int]] = {}
    for index, prompt in enumerate(SIXTEEN[:8]):
        engine.add_request(str(index), tokenizer.encode(prompt), greedy(4))
        tokens[str(index)] = []
    while engine.has_unfinished():
        for output in engine.step():
            tokens[output.request_id].extend(output.new_token_ids)
    assert list(tokens.values()) == target_only[:8]
    assert target.num_active_sequences == draft.num_active_sequences == 0


def test_overlap_default_follows_devices():
    assert overlap_wanted(None, "CPU", "GPU")
    assert not overlap_wanted(None, "CPU", "CPU")
    assert not overlap_wanted(None, "CPU", None)
    assert overlap_wanted(True, "CPU", "CPU")
    assert not overlap_wanted(False, "NPU", "CPU")
    with pytest.raises(ValueError, match="draft model"):
        overlap_wanted(True, "CPU", None)


def test_overlap_needs_a_drafter(pair_bundle):
    with pytest.raises(ValueError, match="draft model"):
        Pipeline(pair_bundle, drafter="none", properties=F32, overlap=True)
