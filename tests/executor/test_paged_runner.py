"""PagedModelRunner against optimum-intel's stateful model, on tiny random llama and qwen2 checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from xpuspec.core.chunks import SequenceChunk
from xpuspec.executor.graph_edits import SAMPLED_TOKEN_INDICES, make_paged_model
from xpuspec.executor.paged_runner import MODEL_FILE, PagedModelRunner

pytestmark = pytest.mark.slow

# Exact comparisons need f32 compute and an f32 KV cache (the CPU defaults are bf16 / low precision).
F32_PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
# The runner and the stateful reference run the same f32 graph except for the attention kernel
# (paged vs SDPA): measured differences are ~1e-6 on logits of magnitude ~5.
REFERENCE_ATOL = 1e-4
# Same runner, same kernel, different batch composition or chunking.
RUNNER_ATOL = 1e-5
NUM_BLOCKS = 48


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def architecture(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def ir_dir(tiny_ir_dir: Callable[[str], Path], architecture: str) -> Path:
    return tiny_ir_dir(architecture)


@pytest.fixture(scope="module")
def runner(ir_dir: Path) -> PagedModelRunner:
    return PagedModelRunner(ir_dir, properties=F32_PROPERTIES, num_blocks=NUM_BLOCKS)


@pytest.fixture(scope="module")
def reference(ir_dir: Path):
    from optimum.intel import OVModelForCausalLM

    return OVModelForCausalLM.from_pretrained(ir_dir, ov_config={"INFERENCE_PRECISION_HINT": "f32"})


def reference_logits(reference, tokens: list[int]) -> np.ndarray:
    """Logits of every position of ``tokens`` from one fresh stateful forward: [len(tokens), vocab]."""
    import torch

    with torch.no_grad():
        return reference(input_ids=torch.tensor([tokens])).logits[0].numpy()


def random_tokens(count: int, seed: int, vocab_size: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab_size, size=count).tolist()


class BlockPool:
    """Hands out disjoint, deliberately non-contiguous block tables for the sequences of one test."""

    def __init__(self, num_blocks: int) -> None:
        self._free = list(range(num_blocks - 1, -1, -1))

    def table(self, num_tokens: int, block_size: int) -> list[int]:
        return [self._free.pop() for _ in range(-(-num_tokens // block_size))][::-1]


def test_prefill_and_greedy_decode_match_reference(runner: PagedModelRunner, reference) -> None:
    import torch

    prompt = random_tokens(40, seed=1, vocab_size=runner.vocab_size)
    num_new = 20
    table = BlockPool(NUM_BLOCKS).table(len(prompt) + num_new, runner.block_size)
    rows = [runner.forward([SequenceChunk(prompt, 0, table, len(prompt))]).copy()]
    tokens = list(prompt)
    for _ in range(num_new - 1):
        tokens.append(int(rows[-1][-1].argmax()))
        rows.append(runner.forward([SequenceChunk([tokens[-1]], len(tokens) - 1, table, 1)]).copy())
    tokens.append(int(rows[-1][-1].argmax()))

    expected = reference.generate(
        torch.tensor([prompt]), max_new_tokens=num_new, min_new_tokens=num_new, do_sample=False
    )[0].tolist()
    assert tokens == expected
    logits = np.concatenate(rows)  # [len(tokens) - 1, vocab]
    np.testing.assert_allclose(logits, reference_logits(reference, tokens[:-1]), rtol=0, atol=REFERENCE_ATOL)


def test_mixed_batch_equals_each_sequence_alone(runner: PagedModelRunner, reference) -> None:
    vocab, block_size = runner.vocab_size, runner.block_size
    pool = BlockPool(NUM_BLOCKS)
    prefill = random_tokens(10, seed=2, vocab_size=vocab)  # new sequence, one chunk
    decode = random_tokens(38, seed=3, vocab_size=vocab)  # 37 cached, 1 new
    verify = random_tokens(24, seed=4, vocab_size=vocab)  # 20 cached, 4 to verify
    middle = random_tokens(48, seed=5, vocab_size=vocab)  # 32 cached, 8 more of the prompt, 8 later
    tables = [pool.table(len(tokens), block_size) for tokens in (prefill, decode, verify, middle)]
    cached = {1: 37, 2: 20, 3: 32}
    sequences = {1: decode, 2: verify, 3: middle}
    for index, past in cached.items():
        runner.forward([SequenceChunk(sequences[index][:past], 0, tables[index], 0)])

    batch = [
        SequenceChunk(prefill, 0, tables[0], 1),
        SequenceChunk(decode[37:], 37, tables[1], 1),
        SequenceChunk(verify[20:], 20, tables[2], 4),
        SequenceChunk(middle[32:40], 32, tables[3], 0),
    ]
    mixed = runner.forward(batch).copy()
    assert mixed.shape == (6, vocab)

    alone_tables = [pool.table(len(tokens), block_size) for tokens in (prefill, decode, verify)]
    for index, past in cached.items():
        if index < 3:
            runner.forward([SequenceChunk(sequences[index][:past], 0, alone_tables[index], 0)])
    alone = np.concatenate(
        [
            runner.forward([SequenceChunk(prefill, 0, alone_tables[0], 1)]).copy(),
            runner.forward([SequenceChunk(decode[37:], 37, alone_tables[1], 1)]).copy(),
            runner.forward([SequenceChunk(verify[20:], 20, alone_tables[2], 4)]).copy(),
        ]
    )
    np.testing.assert_allclose(mixed, alone, rtol=0, atol=RUNNER_ATOL)

    expected = np.concatenate(
        [
            reference_logits(reference, prefill)[-1:],
            reference_logits(reference, decode)[-1:],
            reference_logits(reference, verify)[-4:],
        ]
    )
    np.testing.assert_allclose(mixed, expected, rtol=0, atol=REFERENCE_ATOL)
    # The middle chunk returned no rows but must have filled its KV: the rest of its prompt sees it.
    tail = runner.forward([SequenceChunk(middle[40:], 40, tables[3], 8)])
    np.testing.assert_allclose(tail, reference_logits(reference, middle)[-8:], rtol=0, atol=REFERENCE_ATOL)


def test_chunked_prefill_equals_one_shot(runner: PagedModelRunner) -> None:
    prompt = random_tokens(70, seed=6, vocab_size=runner.vocab_size)
    pool = BlockPool(NUM_BLOCKS)
    one_shot_table = pool.table(len(prompt), runner.block_size)
    one_shot = runner.forward([SequenceChunk(prompt, 0, one_shot_table, 15)]).copy()

    table = pool.table(len(prompt), runner.block_size)
    first = runner.forward([SequenceChunk(prompt[:25], 0, table, 0)])
    assert first.shape == (0, runner.vocab_size)
    runner.forward([SequenceChunk(prompt[25:55], 25, table, 0)])
    chunked = runner.forward([SequenceChunk(prompt[55:], 55, table, 15)])
    np.testing.assert_allclose(chunked, one_shot, rtol=0, atol=RUNNER_ATOL)


def test_rollback_overwrites_speculated_positions(runner: PagedModelRunner, reference) -> None:
    vocab = runner.vocab_size
    prompt = random_tokens(30, seed=7, vocab_size=vocab)
    speculated = random_tokens(4, seed=8, vocab_size=vocab)
    accepted_then_corrected = [speculated[0], (speculated[1] + 1) % vocab]
    table = BlockPool(NUM_BLOCKS).table(len(prompt) + len(speculated) + 4, runner.block_size)

    runner.forward([SequenceChunk(prompt, 0, table, 1)])
    # Positions 30..33 (crossing into the second block) get the speculated tokens' KV ...
    runner.forward([SequenceChunk(speculated, 30, table, 4)])
    # ... then only the first is kept: positions 31.. are recomputed with other tokens.
    after_rollback = runner.forward([SequenceChunk(accepted_then_corrected[1:], 31, table, 1)]).copy()
    next_token = int(after_rollback[-1].argmax())
    continued = runner.forward([SequenceChunk([next_token], 32, table, 1)]).copy()

    never_speculated = reference_logits(reference, prompt + accepted_then_corrected + [next_token])
    np.testing.assert_allclose(after_rollback, never_speculated[-2:-1], rtol=0, atol=REFERENCE_ATOL)
    np.testing.assert_allclose(continued, never_speculated[-1:], rtol=0, atol=REFERENCE_ATOL)


def test_cache_tensors_follow_the_compiled_model(runner: PagedModelRunner) -> None:
    assert runner.block_size > 0
    assert runner.num_blocks == NUM_BLOCKS
    ports = {port.get_any_name(): port for port in runner.compiled_model.inputs}
    cache_names = sorted(name for name in ports if "_cache." in name)
    assert cache_names == sorted(runner.cache_tensors)
    assert len(cache_names) == 2 * 2  # key and value of the 2 tiny layers
    for name in cache_names:
        tensor, port = runner.cache_tensors[name], ports[name]
        assert tensor.get_element_type() == port.get_element_type() == ov.Type.f32
        assert list(tensor.shape)[0] == NUM_BLOCKS + 1  # and the scratch block padding writes into
        assert list(tensor.shape)[1:] == [dim.get_length() for dim in list(port.get_partial_shape())[1:]]
    assert list(runner.cache_tensors["value_cache.0"].shape)[2] == runner.block_size


def test_cache_bytes_budget_sets_num_blocks(ir_dir: Path, runner: PagedModelRunner) -> None:
    cache_bytes = sum(tensor.byte_size for tensor in runner.cache_tensors.values())
    bytes_per_block = cache_bytes // (runner.num_blocks + 1)  # the scratch block is outside the budget
    budgeted = PagedModelRunner(ir_dir, properties=F32_PROPERTIES, cache_bytes=5 * bytes_per_block + 1)
    assert budgeted.num_blocks == 5 and budgeted.cache_bytes == 5 * bytes_per_block
    with pytest.raises(ValueError, match="below one KV block"):
        PagedModelRunner(ir_dir, properties=F32_PROPERTIES, cache_bytes=bytes_per_block - 1)


def test_async_start_wait_matches_forward(runner: PagedModelRunner) -> None:
    prompt = random_tokens(12, seed=9, vocab_size=runner.vocab_size)
    pool = BlockPool(NUM_BLOCKS)
    expected = runner.forward([SequenceChunk(prompt, 0, pool.table(12, runner.block_size), 3)]).copy()
    runner.start([SequenceChunk(prompt, 0, pool.table(12, runner.block_size), 3)])
    with pytest.raises(RuntimeError, match="still running"):
        runner.start([SequenceChunk(prompt, 0, [0], 1)])
    np.testing.assert_allclose(runner.wait(), expected, rtol=0, atol=RUNNER_ATOL)
    with pytest.raises(RuntimeError, match="no inference"):
        runner.wait()


def test_padding_leaves_the_real_rows_and_every_named_block_alone(runner: PagedModelRunner) -> None:
    """Padding tokens run after a chunk's own, give no logits, and write past the sequence's length
    only: into its last block's later slots and the scratch block, never into another block the
    table names (it may be shared) nor another sequence's."""
    size, vocab = runner.block_size, runner.vocab_size
    prompt = random_tokens(size - 2, seed=11, vocab_size=vocab)  # 2 free slots left in block 0
    pool = BlockPool(NUM_BLOCKS)
    padded_table, plain_table, neighbour_table = (pool.table(3 * size, size) for _ in range(3))
    neighbour = random_tokens(2 * size, seed=12, vocab_size=vocab)
    runner.forward([SequenceChunk(neighbour, 0, neighbour_table, 1)])
    expected_first = runner.forward([SequenceChunk(prompt, 0, plain_table, 1)]).copy()
    np.testing.assert_allclose(
        runner.forward([SequenceChunk(prompt, 0, padded_table, 1)]), expected_first, rtol=0, atol=RUNNER_ATOL
    )

    def blocks(table: list[int]) -> dict[str, np.ndarray]:
        return {name: tensor.data[table].copy() for name, tensor in runner.cache_tensors.items()}

    untouched = blocks(neighbour_table + padded_table[1:])
    token = int(expected_first[-1].argmax())
    # 1 token and 5 padding tokens: positions size - 2 .. size + 3, past the table's first block.
    padded = runner.forward([SequenceChunk([token], size - 2, padded_table[:1], 1, padding=5)]).copy()
    plain = runner.forward([SequenceChunk([token], size - 2, plain_table, 1)]).copy()
    assert padded.shape == plain.shape == (1, vocab)
    np.testing.assert_allclose(padded, plain, rtol=0, atol=RUNNER_ATOL)
    for name, before in untouched.items():
        np.testing.assert_array_equal(blocks(neighbour_table + padded_table[1:])[name], before)
    # The next tokens overwrite the padding's slots before anything reads them.
    following = [int(plain[-1].argmax()), 7, 8]
    after_padding = runner.forward([SequenceChunk(following, size - 1, padded_table, 3)]).copy()
    after_plain = runner.forward([SequenceChunk(following, size - 1, plain_table, 3)]).copy()
    np.testing.assert_allclose(after_padding, after_plain, rtol=0, atol=RUNNER_ATOL)
    with pytest.raises(ValueError, match="padding"):
        runner.forward([SequenceChunk([token], size - 2, padded_table, 1, padding=-1)])


def test_invalid_chunks_are_rejected(runner: PagedModelRunner) -> None:
    too_long = list(range(3, 3 + runner.block_size + 1))
    with pytest.raises(ValueError, match="block table"):
        runner.forward([SequenceChunk(too_long, 0, [0], 1)])
    with pytest.raises(ValueError, match="block ids"):
        runner.forward([SequenceChunk([5], 0, [NUM_BLOCKS], 1)])
    with pytest.raises(ValueError, match="num_logits"):
        runner.forward([SequenceChunk([5, 6], 0, [0], 3)])
    with pytest.raises(ValueError, match="at least one chunk"):
        runner.forward([])


def test_graph_edit_adds_sampled_token_gather(ir_dir: Path) -> None:
    model = make_paged_model(ov.Core().read_model(ir_dir / MODEL_FILE))
    inputs = {port.get_any_name(): port for port in model.inputs}
    indices = inputs[SAMPLED_TOKEN_INDICES]
    assert indices.get_element_type() == ov.Type.i64
    assert indices.get_partial_shape() == ov.PartialShape([-1])
    assert {"input_ids", "position_ids", "past_lens", "block_indices", "key_cache.0"} <= set(inputs)
    assert "beam_idx" not in inputs
    with pytest.raises(ValueError, match="stateful"):
        make_paged_model(model)


@pytest.mark.parametrize("properties", [None, {"KV_CACHE_PRECISION": "u8"}], ids=["default", "u8-cache"])
def test_default_cpu_precision_runs(ir_dir: Path, architecture: str, properties: dict | None) -> None:
    """bf16 compute with the plugin's default or a quantised u8 cache (scale rows change the shapes)."""
    if architecture != "llama":
        pytest.skip("one architecture is enough for the low-precision smoke test")
    runner = PagedModelRunner(ir_dir, properties=properties, num_blocks=8)
    assert list(runner.cache_tensors["value_cache.0"].shape)[2] == runner.block_size > 0
    pool = BlockPool(8)
    prompt = random_tokens(40, seed=10, vocab_size=runner.vocab_size)
    table = pool.table(41, runner.block_size)
    runner.forward([SequenceChunk(prompt, 0, table, 1)])
    logits = runner.forward(
        [
            SequenceChunk([prompt[0]], 40, table, 1),
            SequenceChunk(prompt[:5], 0, pool.table(5, runner.block_size), 2),
        ]
    )
    assert logits.shape == (3, runner.vocab_size)
    assert np.isfinite(logits).all()


def test_a_decode_lane_shares_the_cache_and_gives_the_same_logits(
    ir_dir: Path, runner: PagedModelRunner
) -> None:
    """A draft's steps alternate a catch-up chunk with one-token passes; with ``decode_lane`` the
    one-token batches run on a second compiled copy bound to the same KV-cache tensors. The logits
    of a prefill, alternating multi-token and one-token passes, and a two-sequence decode equal the
    single-lane runner's exactly (same graph, same kernels)."""
    laned = PagedModelRunner(ir_dir, properties=F32_PROPERTIES, num_blocks=NUM_BLOCKS, decode_lane=True)
    assert laned.has_decode_lane and not runner.has_decode_lane
    used = []
    for lane_runner in (runner, laned):
        pool = BlockPool(NUM_BLOCKS)
        tokens = random_tokens(60, seed=7, vocab_size=runner.vocab_size)
        tables = [pool.table(64, runner.block_size), pool.table(64, runner.block_size)]
        rows = [lane_runner.forward([SequenceChunk(tokens[:20], 0, tables[0], 1)]).copy()]
        rows.append(lane_runner.forward([SequenceChunk(tokens[:5], 0, tables[1], 1)]).copy())
        past = 20
        for size in (3, 1, 1, 2, 1, 4, 1):
            chunk = SequenceChunk(tokens[past : past + size], past, tables[0], size)
            rows.append(lane_runner.forward([chunk]).copy())
            past += size
        decode = [
            SequenceChunk([tokens[past]], past, tables[0], 1),
            SequenceChunk([tokens[5]], 5, tables[1], 1),
        ]
        lane_runner.start(decode)
        used.append(lane_runner._pending)
        rows.append(lane_runner.wait().copy())
        if lane_runner is runner:
            expected = rows
        else:
            for got, want in zip(rows, expected, strict=True):
                np.testing.assert_array_equal(got, want)
    assert used[1] is laned._decode_lane and used[0] is runner._lane


def test_warm_up_touches_block_zero_only(ir_dir: Path, runner: PagedModelRunner) -> None:
    fresh = PagedModelRunner(ir_dir, properties=F32_PROPERTIES, num_blocks=NUM_BLOCKS, decode_lane=True)
    before = {name: tensor.data.copy() for name, tensor in fresh.cache_tensors.items()}
    fresh.warm_up(2048)
    for name, tensor in fresh.cache_tensors.items():
        np.testing.assert_array_equal(tensor.data[1:], before[name][1:])
    tokens = random_tokens(40, seed=3, vocab_size=runner.vocab_size)
    table = BlockPool(NUM_BLOCKS).table(40, runner.block_size)
    table = [block + 1 for block in table if block + 1 < NUM_BLOCKS]  # block 0 holds the warm-up's KV
    chunk = SequenceChunk(tokens, 0, table, 5)
    np.testing.assert_array_equal(fresh.forward([chunk]), runner.forward([chunk]))


DEMO_DRAFT = Path(__file__).resolve().parents[2] / "xpuspec" / "models" / "demo" / "bundle" / "draft"


@pytest.mark.parametrize("source", ["tiny", "demo-int8"])
def test_a_cut_lm_head_gives_the_first_columns_of_the_logits(
    ir_dir: Path, architecture: str, source: str
) -> None:
    """``logits_vocab``: the LM head keeps its first rows, rebuilt from sliced (and for int8 weights,
    still compressed) constants; the logits are exactly the full model's first columns."""
    if source == "demo-int8" and architecture != "llama":
        pytest.skip("the demo draft is one model")
    model_dir = ir_dir if source == "tiny" else DEMO_DRAFT
    full = PagedModelRunner(model_dir, properties=F32_PROPERTIES, num_blocks=8)
    keep = full.vocab_size // 3
    cut = PagedModelRunner(model_dir, properties=F32_PROPERTIES, num_blocks=8, logits_vocab=keep)
    assert cut.vocab_size == keep
    tokens = random_tokens(24, seed=3, vocab_size=full.vocab_size)  # ids above the cut still embed
    rows: dict[int, list[np.ndarray]] = {}
    for each in (full, cut):
        table = BlockPool(8).table(25, each.block_size)
        rows[each.vocab_size] = [
            each.forward([SequenceChunk(tokens, 0, table, 3)]).copy(),
            each.forward([SequenceChunk([tokens[-1]], 24, table, 1)]).copy(),
        ]
    for got, want in zip(rows[keep], rows[full.vocab_size], strict=True):
        np.testing.assert_allclose(got, want[:, :keep], rtol=0, atol=RUNNER_ATOL)
    from xpuspec.executor.graph_edits import cut_logits_vocab

    model = make_paged_model(ov.Core().read_model(model_dir / MODEL_FILE))
    for bad in (0, full.vocab_size + 1):
        with pytest.raises(ValueError, match="draft vocabulary"):
            cut_logits_vocab(model, bad)
