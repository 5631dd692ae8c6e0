"""The SmolLM2 draft recipe's parts on tiny models: examples, the distillation loss, held-out acceptance,
the teacher's top-k scorer (on a tiny GGUF converted by OpenVINO GenAI) and the instruction sets."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from research.training.smollm2_instructions import (  # noqa: E402
    HELDOUT_TOPICS,
    heldout_instructions,
    training_instructions,
)
from research.training.smollm2_teacher import (  # noqa: E402
    ScoredSequence,
    TeacherScorer,
    read_shards,
    score_to_shards,
)
from research.training.train_smollm2 import (  # noqa: E402
    Example,
    attach_teacher,
    collate,
    distillation_loss,
    greedy_acceptance,
    to_examples,
)

VOCAB = 64


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
        pad_token_id=2,
    )
    return LlamaForCausalLM(config).eval()


def test_examples_train_on_the_answer_only():
    records = [
        {"prompt_ids": [1, 5, 6], "answer_ids": [7, 8, 2]},
        {"prompt_ids": [1, 9], "answer_ids": [10, 11, 12, 13, 2]},
    ]
    examples = to_examples(records, max_len=6)
    assert [(e.ids, e.start) for e in examples] == [([1, 5, 6, 7, 8, 2], 2), ([1, 9, 10, 11, 12, 13], 1)]
    batch = collate(examples)
    # the last prompt position predicts the first answer token; the cut second answer loses its tail
    assert batch.labels.tolist() == [7, 8, 2, 10, 11, 12, 13]
    assert batch.wanted.sum().item() == 7 and batch.top_ids is None
    assert batch.input_ids[0, batch.wanted[0]].tolist() == [6, 7, 8]


def test_the_teacher_term_is_the_cross_entropy_to_its_top_k():
    model = tiny_llama()
    example = Example(ids=[1, 5, 6, 7, 8], start=1)
    hard = collate([example])
    ce_only, ce = distillation_loss(model, hard, kl_weight=0.5)
    assert torch.isclose(ce_only, ce)
    logits = model(input_ids=hard.input_ids).logits[0, 1:4]
    assert torch.isclose(ce, torch.nn.functional.cross_entropy(logits, hard.labels), atol=1e-5)
    # A one-hot teacher on the same tokens: the soft term equals the hard one.
    one_hot = Example(
        ids=example.ids,
        start=1,
        top_ids=np.array([[6], [7], [8]], dtype=np.int32),
        top_logprobs=np.zeros((3, 1), dtype=np.float16),
    )
    mixed, ce_again = distillation_loss(model, collate([one_hot]), kl_weight=0.5)
    assert torch.isclose(mixed, ce_again, atol=1e-5)
    # A teacher spreading half its mass on another token pulls the loss toward that token's log-probability.
    spread = Example(
        ids=example.ids,
        start=1,
        top_ids=np.array([[6, 9], [7, 9], [8, 9]], dtype=np.int32),
        top_logprobs=np.full((3, 2), math.log(0.5), dtype=np.float16),
    )
    soft, _ = distillation_loss(model, collate([spread]), kl_weight=1.0)
    logprobs = torch.log_softmax(logits, -1)
    expected = -(0.5 * logprobs[torch.arange(3), hard.labels] + 0.5 * logprobs[:, 9]).mean()
    assert torch.isclose(soft, expected, atol=1e-3)


def test_held_out_acceptance_counts_agreeing_positions_and_runs():
    model = tiny_llama()
    prompt = [1, 5, 6]
    ids = list(prompt)
    for _ in range(6):  # the model's own greedy continuation: it agrees everywhere
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    agreeing = Example(ids=ids, start=len(prompt) - 1)
    result = greedy_acceptance(model, [agreeing], gamma=4)
    assert result["greedy_acceptance"] == 1.0 and result["positions"] == 6
    assert result["accepted_per_round"] == pytest.approx((4 + 4 + 4 + 3 + 2 + 1) / 6)
    wrong = list(ids)
    wrong[len(prompt) + 1] = (wrong[len(prompt) + 1] + 1) % VOCAB  # the 2nd answer token disagrees
    result = greedy_acceptance(model, [Example(ids=wrong[: len(prompt) + 2], start=len(prompt) - 1)], gamma=4)
    assert result["greedy_acceptance"] == 0.5 and result["accepted_per_round"] == 0.5


def test_teacher_top_k_attaches_only_to_the_same_tokens():
    examples = [Example(ids=[1, 2, 3, 4], start=1), Example(ids=[1, 2, 5, 6], start=1)]
    top = np.arange(4, dtype=np.int32).reshape(2, 2)
    scored = [
        ScoredSequence(np.array([1, 2, 3, 4], np.int32), 1, top, np.zeros((2, 2), np.float16)),
        ScoredSequence(np.array([1, 2, 9, 9], np.int32), 1, top, np.zeros((2, 2), np.float16)),
    ]
    assert attach_teacher(examples, scored) == 1
    assert examples[0].top_ids is not None and examples[1].top_ids is None
    with pytest.raises(ValueError, match="do not match"):
        ScoredSequence(np.array([1, 2, 3], np.int32), 0, top[:1], np.zeros((1, 2), np.float16))


def test_instruction_sets_are_disjoint_and_the_first_order_is_stable():
    training = training_instructions()
    assert len(training) == len(set(training)) > 10_000
    assert training[:2416] == training_instructions(extended=False)
    topics = [topic.lower() for topic in HELDOUT_TOPICS]
    assert not [text for text in training if any(topic in text.lower() for topic in topics)]
    assert not set(training) & set(heldout_instructions())


@pytest.fixture(scope="module")
def tiny_target_ir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama written as GGUF and converted by OpenVINO GenAI: a stateful IR as SmolLM2's is."""
    pytest.importorskip("openvino_genai")
    from research.training.train_smollm2 import convert_target
    from tests.support.tiny_gguf import tiny_llama_gguf

    work = tmp_path_factory.mktemp("teacher")
    return convert_target(tiny_llama_gguf(work), work / "ir")


def test_scoring_in_padded_batches_equals_scoring_alone_and_resumes(tiny_target_ir, tmp_path):
    scorer = TeacherScorer(tiny_target_ir, top_k=4)
    items = [([1, 40, 41, 42, 43, 44, 45], 2), ([1, 50, 51, 52], 1), ([1, 60, 61, 62, 63, 64], 3)]
    together = scorer.score(items)
    for item, batched in zip(items, together, strict=True):
        (alone,) = scorer.score([item])
        assert np.array_equal(alone.top_ids[:, 0], batched.top_ids[:, 0])
        assert np.allclose(alone.top_logprobs, batched.top_logprobs, atol=2e-2)
        assert (np.diff(batched.top_logprobs.astype(np.float32), axis=1) <= 0).all()  # ranked
        assert (batched.top_logprobs <= 0).all()
    assert score_to_shards(scorer, items[:2], tmp_path, "t", batch_size=2, shard_size=2) == 2
    # resumed with a longer list: the first shard is kept, only the rest is scored
    first_shard = (tmp_path / "t-00000.npz").stat().st_mtime_ns
    assert score_to_shards(scorer, items, tmp_path, "t", batch_size=2, shard_size=2) == 3
    assert (tmp_path / "t-00000.npz").stat().st_mtime_ns == first_shard
    stored = read_shards(tmp_path, "t")
    assert [list(s.ids) for s in stored] == [list(ids) for ids, _ in items]
    assert np.array_equal(stored[2].top_ids, together[2].top_ids)
