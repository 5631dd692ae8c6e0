from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xpuspec.core.block_manager import BlockManager
from xpuspec.core.sequence import Sequence, SequenceStatus
from xpuspec.sample.sampling_params import SamplingParams


def make_sequence(request_id: str, num_prompt_tokens: int = 4) -> Sequence:
    return Sequence(request_id, list(range(num_prompt_tokens)), SamplingParams())


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 4), (4, 0), (-1, 4), (4.0, 4), (True, 4)])
def test_rejects_bad_sizes(num_blocks: object, block_size: object) -> None:
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        BlockManager(num_blocks, block_size)  # type: ignore[arg-type]


@pytest.mark.parametrize(("num_tokens", "expected"), [(0, 0), (1, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_blocks_needed_rounds_up(num_tokens: int, expected: int) -> None:
    assert BlockManager(num_blocks=8, block_size=4).blocks_needed(num_tokens) == expected


def test_ensure_capacity_grows_the_table_and_is_idempotent() -> None:
    manager = BlockManager(num_blocks=8, block_size=4)
    seq = make_sequence("a")
    assert manager.ensure_capacity(seq, 5)
    assert len(seq.block_table) == 2
    assert manager.num_free_blocks == 6
    assert manager.ensure_capacity(seq, 8)  # still inside the second block
    assert len(seq.block_table) == 2
    assert manager.ensure_capacity(seq, 9)
    assert len(seq.block_table) == 3
    assert manager.num_used_blocks == 3
    manager.check_invariants()


def test_ensure_capacity_is_all_or_nothing() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    first, second = make_sequence("a"), make_sequence("b")
    assert manager.ensure_capacity(first, 6)  # 3 blocks
    table_before = list(second.block_table)
    assert not manager.ensure_capacity(second, 4)  # needs 2, 1 free
    assert second.block_table == table_before
    assert manager.num_free_blocks == 1
    assert manager.ensure_capacity(second, 2)
    manager.check_invariants()


def test_free_sequence_returns_every_block() -> None:
    manager = BlockManager(num_blocks=6, block_size=3)
    first, second = make_sequence("a"), make_sequence("b")
    manager.ensure_capacity(first, 7)
    manager.ensure_capacity(second, 4)
    second_blocks = list(second.block_table)
    manager.free_sequence(first)
    assert first.block_table == []
    assert manager.num_free_blocks == 4
    assert second.block_table == second_blocks
    manager.free_sequence(first)  # freeing twice is harmless
    manager.check_invariants()
    manager.free_sequence(second)
    assert manager.num_free_blocks == 6
    manager.check_invariants()


def test_num_coverable_tokens_counts_own_and_free_blocks() -> None:
    manager = BlockManager(num_blocks=5, block_size=4)
    seq, other = make_sequence("a"), make_sequence("b")
    manager.ensure_capacity(seq, 3)
    manager.ensure_capacity(other, 8)
    assert manager.num_coverable_tokens(seq) == (1 + 2) * 4
    assert manager.ensure_capacity(seq, manager.num_coverable_tokens(seq))
    assert not manager.ensure_capacity(seq, manager.num_coverable_tokens(seq) + 1)


def test_check_invariants_catches_a_block_in_two_tables() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    first, second = make_sequence("a"), make_sequence("b")
    manager.ensure_capacity(first, 2)
    manager.ensure_capacity(second, 2)
    second.block_table[0] = first.block_table[0]
    with pytest.raises(AssertionError):
        manager.check_invariants()


def test_check_invariants_catches_a_finished_holder() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    seq = make_sequence("a")
    manager.ensure_capacity(seq, 2)
    seq.status = SequenceStatus.FINISHED_STOPPED
    with pytest.raises(AssertionError, match="still holds blocks"):
        manager.check_invariants()


def test_check_invariants_catches_a_leaked_block() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    seq = make_sequence("a")
    manager.ensure_capacity(seq, 4)
    seq.block_table.pop()  # dropped without returning it to the free list
    with pytest.raises(AssertionError):
        manager.check_invariants()


@settings(max_examples=60, deadline=None)
@given(
    num_blocks=st.integers(1, 12),
    block_size=st.integers(1, 5),
    operations=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.booleans()), max_size=40),
)
def test_random_allocations_keep_the_books(
    num_blocks: int, block_size: int, operations: list[tuple[int, int, bool]]
) -> None:
    manager = BlockManager(num_blocks, block_size)
    sequences = [make_sequence(str(index)) for index in range(4)]
    for index, num_tokens, free in operations:
        seq = sequences[index]
        if free:
            manager.free_sequence(seq)
            assert seq.block_table == []
        else:
            before = list(seq.block_table)
            fits = manager.blocks_needed(num_tokens) - len(before) <= manager.num_free_blocks
            assert manager.ensure_capacity(seq, num_tokens) == fits
            if fits:
                assert len(seq.block_table) * block_size >= num_tokens
                assert seq.block_table[: len(before)] == before
            else:
                assert seq.block_table == before
        manager.check_invariants()
    for seq in sequences:
        manager.free_sequence(seq)
    assert manager.num_free_blocks == num_blocks
    manager.check_invariants()
