"""The PyTorch reference executor: the paged runner's interface over recomputed contexts."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.tiny_checkpoints import make_tiny_checkpoint
from xpuspec.core.chunks import SequenceChunk
from xpuspec.engine.engine import EngineConfig, LLMEngine
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.proposal import NgramDraftProposer
from xpuspec_plugins.torch_runner import TorchModelRunner

PROMPT = [5, 17, 42, 8, 99, 3, 17, 42, 8, 7, 11]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("torch") / "ckpt", "llama", seed=3)


@pytest.fixture(scope="module")
def runner(checkpoint) -> TorchModelRunner:
    return TorchModelRunner(checkpoint, num_blocks=16, block_size=4)


def reference_logits(runner: TorchModelRunner, token_ids: list[int]) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return runner.model(input_ids=torch.tensor([token_ids])).logits[0].float().numpy()  # [n, vocab]


def test_chunked_prefill_through_scattered_blocks_matches_one_pass(runner):
    table = [9, 2, 14]  # non-contiguous physical blocks, 4 tokens each
    first = runner.forward([SequenceChunk(PROMPT[:5], 0, table, num_logits=1)])
    second = runner.forward([SequenceChunk(PROMPT[5:], 5, table, num_logits=2)])
    expected = reference_logits(runner, PROMPT)
    np.testing.assert_allclose(first[0], expected[4], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second, expected[-2:], rtol=1e-5, atol=1e-5)


def test_rejected_tokens_are_overwritten(runner):
    table = [0, 1, 3]
    runner.forward([SequenceChunk(PROMPT[:6] + [1, 1, 1], 0, table, num_logits=0)])
    # Roll back to 6 tokens (the engine only lowers its count) and continue differently.
    logits = runner.forward([SequenceChunk(PROMPT[6:], 6, table, num_logits=1)])
    np.testing.assert_allclose(logits[0], reference_logits(runner, PROMPT)[-1], rtol=1e-5, atol=1e-5)


def test_two_sequences_in_one_batch(runner):
    logits = runner.forward(
        [SequenceChunk(PROMPT[:3], 0, [4], num_logits=1), SequenceChunk(PROMPT[:7], 0, [5, 6], num_logits=1)]
    )
    assert logits.shape == (2, runner.vocab_size)
    np.testing.assert_allclose(logits[1], reference_logits(runner, PROMPT[:7])[-1], rtol=1e-5, atol=1e-5)


def test_bad_chunks_are_refused(runner):
    with pytest.raises(ValueError, match="block table"):
        runner.forward([SequenceChunk(PROMPT, 0, [0], num_logits=1)])
    with pytest.raises(ValueError, match="block ids"):
        runner.forward([SequenceChunk(PROMPT[:2], 0, [99], num_logits=1)])


def test_speculative_engine_on_the_reference_equals_greedy_generate(runner):
    import torch

    engine = LLMEngine(runner, NgramDraftProposer(), EngineConfig(max_model_len=128), eos_token_ids=[])
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=12, temperature=0.0, num_draft_tokens=3))
    tokens: list[int] = []
    while engine.has_unfinished():
        for output in engine.step():
            tokens += output.new_token_ids
    with torch.inference_mode():
        generated = runner.model.generate(
            torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert tokens == generated[0, len(PROMPT) :].tolist()
