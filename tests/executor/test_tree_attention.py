"""Tree chunks in the paged runner: the qq_bias mask, tree position ids and KV moves, at f32.

Each node of a tree run in one chunk must get the logits of its root-to-node path run alone as a
chain; the same tokens without the mask must not (so the comparison can fail); and after moving an
accepted path's KV to consecutive positions, decoding on matches a sequence that only ever saw
the path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import F32
from xpuspec.core.chunks import SequenceChunk
from xpuspec.executor.paged_inputs import tree_depths, tree_mask
from xpuspec.executor.paged_runner import PagedModelRunner

pytestmark = pytest.mark.slow

ATOL = 1e-4  # same kernel and weights, different batch composition: measured ~4e-6
NUM_BLOCKS = 32
BLOCKS_PER_SEQUENCE = 4
# A root (the last accepted token, index 0) and 9 drafts over 3 depths, in topological order.
PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 6]
PROMPT_LENGTH = 37  # crosses a 32-token block boundary, so the tree straddles blocks


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def runner(request, tiny_ir_dir: Callable[[str], Path]) -> PagedModelRunner:
    return PagedModelRunner(tiny_ir_dir(request.param), properties=F32, num_blocks=NUM_BLOCKS)


def _blocks(sequence_index: int) -> list[int]:
    return list(range(sequence_index * BLOCKS_PER_SEQUENCE, (sequence_index + 1) * BLOCKS_PER_SEQUENCE))


def _tokens(count: int, seed: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, size=count).tolist()


def _path(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def _prefill(runner: PagedModelRunner, prompt: list[int], sequence_index: int) -> None:
    runner.forward([SequenceChunk(prompt, 0, _blocks(sequence_index), num_logits=0)])


def _chain_logits(runner: PagedModelRunner, prompt: list[int], tokens: list[int], sequence_index: int):
    """Logits of the last of ``tokens`` run as a plain chain after ``prompt`` on a fresh sequence."""
    _prefill(runner, prompt, sequence_index)
    past = len(prompt)
    return runner.forward([SequenceChunk(tokens, past, _blocks(sequence_index), num_logits=1)])[0].copy()


def test_mask_and_depths_helpers():
    assert tree_depths(PARENTS).tolist() == [0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    mask = tree_mask([-1, 0, 0, 1])
    assert mask.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


def test_each_node_matches_its_path_run_alone(runner):
    assert runner.supports_trees
    vocab = runner.vocab_size
    prompt = _tokens(PROMPT_LENGTH, 1, vocab)
    tree = _tokens(len(PARENTS), 2, vocab)
    _prefill(runner, prompt[:-1], 0)
    past = PROMPT_LENGTH - 1
    tree_tokens = [prompt[-1]] + tree[1:]  # the root is the last prompt token
    chunk = SequenceChunk(tree_tokens, past, _blocks(0), num_logits=len(PARENTS), tree_parents=PARENTS)
    tree_logits = runner.forward([chunk]).copy()  # [n, vocab]
    for node in range(len(PARENTS)):
        path_tokens = [tree_tokens[i] for i in _path(PARENTS, node)]
        expected = _chain_logits(runner, prompt[:-1], path_tokens, 1)
        np.testing.assert_allclose(tree_logits[node], expected, atol=ATOL, err_msg=f"node {node}")

    # Without the mask the siblings see each other: the same rows must differ (the test can fail).
    _prefill(runner, prompt[:-1], 0)
    causal = runner.forward([SequenceChunk(tree_tokens, past, _blocks(0), num_logits=len(PARENTS))])
    assert np.abs(causal[-1] - tree_logits[-1]).max() > 1e-2


def test_mixed_batch_of_tree_decode_chain_and_prefill(runner):
    vocab = runner.vocab_size
    prompts = [_tokens(PROMPT_LENGTH + i, 10 + i, vocab) for i in range(4)]
    tree = [prompts[0][-1]] + _tokens(len(PARENTS) - 1, 20, vocab)
    chain = _tokens(4, 21, vocab)
    for index in range(3):
        _prefill(runner, prompts[index][:-1], index)
    chunks = [
        SequenceChunk(tree, PROMPT_LENGTH - 1, _blocks(0), num_logits=len(PARENTS), tree_parents=PARENTS),
        SequenceChunk([prompts[1][-1]], PROMPT_LENGTH, _blocks(1), num_logits=1),
        SequenceChunk([prompts[2][-1]] + chain, PROMPT_LENGTH + 1, _blocks(2), num_logits=5),
        SequenceChunk(prompts[3], 0, _blocks(3), num_logits=1),
    ]
    mixed = runner.forward(chunks).copy()
    alone = []
    for index, chunk in enumerate(chunks):
        if index < 3:
            _prefill(runner, prompts[index][:-1], index)
        alone.append(runner.forward([chunk]).copy())
    np.testing.assert_allclose(mixed, np.concatenate(alone), atol=ATOL)


def test_padding_after_a_tree_changes_no_row_and_no_named_block(runner):
    """Padding tokens after a tree (the engine keeps a step's token count with them) are roots of
    their own: no node sees them, the next sequence's rows are unchanged, and past the tree's last
    block they write only the scratch block, not the blocks the table names beyond it."""
    vocab = runner.vocab_size
    prompts = [_tokens(PROMPT_LENGTH, 40 + i, vocab) for i in range(2)]
    tree = [prompts[0][-1]] + _tokens(len(PARENTS) - 1, 42, vocab)
    chain = [prompts[1][-1]] + _tokens(2, 43, vocab)
    past = PROMPT_LENGTH - 1
    padding = 2 * runner.block_size - past - len(PARENTS) + 5  # runs 5 slots into a third block

    def run(padding: int) -> np.ndarray:
        for index, prompt in enumerate(prompts):
            _prefill(runner, prompt[:-1], index)
        chunks = [
            SequenceChunk(tree, past, _blocks(0), len(PARENTS), tree_parents=PARENTS, padding=padding),
            SequenceChunk(chain, past, _blocks(1), num_logits=3),
        ]
        return runner.forward(chunks).copy()

    plain = run(0)
    later_blocks = _blocks(0)[2:] + _blocks(2)
    before = {name: tensor.data[later_blocks].copy() for name, tensor in runner.cache_tensors.items()}
    padded = run(padding)
    assert padded.shape == plain.shape == (len(PARENTS) + 3, vocab)
    np.testing.assert_allclose(padded, plain, atol=ATOL)
    for name, tensor in runner.cache_tensors.items():
        np.testing.assert_array_equal(tensor.data[later_blocks], before[name], err_msg=name)


def test_moved_path_decodes_like_the_path_alone(runner):
    vocab = runner.vocab_size
    prompt = _tokens(PROMPT_LENGTH, 30, vocab)
    tree = [prompt[-1]] + _tokens(len(PARENTS) - 1, 31, vocab)
    past = PROMPT_LENGTH - 1
    _prefill(runner, prompt[:-1], 0)
    runner.forward([SequenceChunk(tree, past, _blocks(0), num_logits=0, tree_parents=PARENTS)])
    accepted = _path(PARENTS, 9)[1:]  # nodes 2, 6, 9: positions past + 2, + 6, + 9
    runner.move_kv(_blocks(0), [past + node for node in accepted], [past + 1 + i for i in range(3)])
    following = _tokens(1, 32, vocab)
    after = past + 1 + len(accepted)
    decoded = runner.forward([SequenceChunk(following, after, _blocks(0), num_logits=1)])[0].copy()
    expected = _chain_logits(runner, prompt[:-1], [tree[0]] + [tree[n] for n in accepted] + following, 1)
    np.testing.assert_allclose(decoded, expected, atol=ATOL)
    # Without the move the next token reads the rejected nodes' KV: it must differ.
    _prefill(runner, prompt[:-1], 0)
    runner.forward([SequenceChunk(tree, past, _blocks(0), num_logits=0, tree_parents=PARENTS)])
    unmoved = runner.forward([SequenceChunk(following, after, _blocks(0), num_logits=1)])[0]
    assert np.abs(unmoved - expected).max() > 1e-2


def test_bad_tree_parents_raise(runner):
    with pytest.raises(ValueError, match="parent"):
        runner.forward([SequenceChunk([1, 2], 0, _blocks(0), num_logits=1, tree_parents=[-1, 1])])
    with pytest.raises(ValueError, match="entries"):
        runner.forward([SequenceChunk([1, 2], 0, _blocks(0), num_logits=1, tree_parents=[-1])])
