"""The stateful executor (one infer request per sequence) gives the paged executor's greedy output."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import F32
from tests.support.engine_runs import run_engine
from xpuspec import Pipeline, SamplingParams
from xpuspec.core.chunks import SequenceChunk
from xpuspec.engine.engine import EngineConfig, LLMEngine
from xpuspec.executor.paged_runner import PagedModelRunner
from xpuspec.executor.stateful_runner import Rollback, StatefulModelRunner
from xpuspec.models.bundle import ModelBundle
from xpuspec.spec_decode.proposal import DraftModelProposer

PROMPTS = [
    "def",
    "def add(a, b):",
    "import os\nimport sys\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "for i in range(10):\n    if i % 2 == 0:\n        continue\n",
    "x = 1\ny = 2\nz = x + y\n" * 4,
    "class",
    "lazy dog " * 10,
]
MAX_TOKENS = 24


def greedy(num_draft_tokens: int | None = None) -> SamplingParams:
    return SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=num_draft_tokens
    )


@pytest.fixture(scope="module")
def reference(pair_bundle) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts' token ids, and the paged target-only greedy output for each."""
    pipe = Pipeline(pair_bundle, drafter="none", properties=F32)
    prompt_ids = [pipe.tokenizer.encode(prompt) for prompt in PROMPTS]
    return prompt_ids, [result.token_ids for result in pipe.generate(PROMPTS, greedy())]


@pytest.fixture(scope="module")
def bundle(pair_bundle) -> ModelBundle:
    return ModelBundle.open(pair_bundle)


def stateful(path, rollback: Rollback | None = None, max_sequences: int = 8, max_context: int = 256):
    return StatefulModelRunner(
        path, properties=F32, max_sequences=max_sequences, max_context=max_context, rollback=rollback
    )


def test_target_alone_matches_paged(bundle, reference):
    prompt_ids, expected = reference
    engine = LLMEngine(stateful(bundle.target.path), None, EngineConfig(max_num_seqs=8), [])
    assert run_engine(engine, prompt_ids, greedy())[0] == expected
    assert engine.target.num_active_sequences == 0  # every finished sequence released its request


@pytest.mark.parametrize("rollback", [Rollback.SLICE, Rollback.REPREFILL])
def test_stateful_draft_and_target_match_paged_after_rejections(bundle, reference, rollback):
    prompt_ids, expected = reference
    target = stateful(bundle.target.path, rollback)
    draft = stateful(bundle.draft.path, rollback)
    engine = LLMEngine(target, DraftModelProposer(draft, target.vocab_size), EngineConfig(max_num_seqs=8), [])
    tokens, stats = run_engine(engine, prompt_ids, greedy(num_draft_tokens=4))
    assert tokens == expected
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    assert 0 < accepted < drafted, "the perturbed draft must both accept and reject"
    assert target.num_active_sequences == draft.num_active_sequences == 0


def test_stateful_draft_beside_paged_target(bundle, reference):
    prompt_ids, expected = reference
    target = PagedModelRunner(bundle.target.path, properties=F32, num_blocks=64)
    proposer = DraftModelProposer(stateful(bundle.draft.path), target.vocab_size)
    engine = LLMEngine(target, proposer, EngineConfig(max_num_seqs=8), [])
    assert run_engine(engine, prompt_ids, greedy(num_draft_tokens=3))[0] == expected


def test_preemption_releases_and_recomputes(bundle, reference):
    """Three notional blocks for two running sequences of up to ~70 tokens: preemption, exact output."""
    prompt_ids, expected = reference
    target = stateful(bundle.target.path, max_sequences=2, max_context=48)
    draft = stateful(bundle.draft.path, max_sequences=2, max_context=48)
    engine = LLMEngine(
        target,
        DraftModelProposer(draft, target.vocab_size),
        EngineConfig(max_num_seqs=2, max_model_len=96),
        [],
    )
    tokens, stats = run_engine(engine, prompt_ids, greedy(num_draft_tokens=4))
    assert tokens == expected
    assert sum(s.num_preemptions for s in stats) > 0
    assert engine.block_manager.num_used_blocks == 0
    assert target.num_active_sequences == draft.num_active_sequences == 0


def test_cut_back_state_gives_fresh_logits(bundle):
    runner = stateful(bundle.target.path)
    tokens = list(range(5, 45))
    fresh = runner.forward([SequenceChunk(tokens, 0, (), num_logits=10, sequence_id="fresh")])
    runner.forward([SequenceChunk(tokens[:30] + [1, 2, 3], 0, (), num_logits=0, sequence_id="cut")])
    again = runner.forward([SequenceChunk(tokens[30:], 30, (), num_logits=10, sequence_id="cut")])
    np.testing.assert_allclose(again, fresh, atol=1e-4)


def test_chunks_must_match_the_state(bundle):
    runner = stateful(bundle.target.path, max_sequences=1)
    with pytest.raises(ValueError, match="starts at 0"):
        runner.forward([SequenceChunk([1, 2], 3, (), num_logits=1, sequence_id="a")])
    runner.forward([SequenceChunk([1, 2], 0, (), num_logits=1, sequence_id="a")])
    with pytest.raises(ValueError, match="holds only 2 positions"):
        runner.forward([SequenceChunk([3], 5, (), num_logits=1, sequence_id="a")])
    with pytest.raises(ValueError, match="appears twice"):
        runner.forward([SequenceChunk([3], 2, (), 1, "a"), SequenceChunk([4], 2, (), 1, "a")])
    with pytest.raises(RuntimeError, match="max_sequences=1"):
        runner.forward([SequenceChunk([1], 0, (), num_logits=1, sequence_id="b")])
    runner.release("a")
    assert runner.forward([SequenceChunk([1], 0, (), num_logits=1, sequence_id="b")]).shape == (
        1,
        runner.vocab_size,
    )


def test_engine_refuses_more_sequences_than_the_executor_holds(bundle):
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLMEngine(stateful(bundle.target.path, max_sequences=4), None, EngineConfig(max_num_seqs=8), [])
