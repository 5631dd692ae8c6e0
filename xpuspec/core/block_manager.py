"""The paged KV cache's bookkeeping: which physical blocks each sequence holds.

Blocks hold ``block_size`` consecutive token positions. A sequence's ``block_table[i]`` is the
physical block of its positions ``[i * block_size, (i + 1) * block_size)``. The target and draft
caches have the same number of blocks and share the table, so one allocation serves both.
"""

from __future__ import annotations

import logging

from xpuspec.core.sequence import Sequence

logger = logging.getLogger(__name__)


class BlockGeometry:
    """Sizes shared by every block manager: ``num_blocks`` blocks of ``block_size`` positions.

    Subclasses say how many blocks are free (``num_free_blocks``); the rest follows from it.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an integer >= 1, got {num_blocks!r}")
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size

    @property
    def num_free_blocks(self) -> int:
        raise NotImplementedError

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_token_slots(self) -> int:
        """Positions the whole cache holds: the longest sequence that can ever fit."""
        return self.num_blocks * self.block_size

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks covering positions ``[0, num_tokens)``."""
        return -(-num_tokens // self.block_size)

    def num_coverable_tokens(self, seq: Sequence) -> int:
        """Positions ``seq`` could cover now: its own blocks plus every free block."""
        return (len(seq.block_table) + self.num_free_blocks) * self.block_size


class BlockManager(BlockGeometry):
    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        # A stack: popping from the end hands out low block ids first, which keeps small runs readable.
        self._free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))
        self._block_owner: list[Sequence | None] = [None] * num_blocks
        # Sequences holding at least one block, for check_invariants (dict: ordered, identity-keyed).
        self._holders: dict[Sequence, None] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    def ensure_capacity(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow ``seq.block_table`` to cover positions ``[0, num_tokens)``; all or nothing.

        Returns False, changing nothing, when there are not enough free blocks.
        """
        missing = self.blocks_needed(num_tokens) - len(seq.block_table)
        if missing <= 0:
            return True
        if missing > len(self._free_blocks):
            return False
        for _ in range(missing):
            block = self._free_blocks.pop()
            self._block_owner[block] = seq
            seq.block_table.append(block)
        self._holders[seq] = None
        return True

    def admit(self, seq: Sequence) -> bool:
        """Blocks for all of a waiting ``seq``'s tokens; all or nothing (no prefix caching here)."""
        return self.ensure_capacity(seq, seq.num_tokens)

    def commit(self, seq: Sequence) -> None:
        """Nothing to register without prefix caching (see ``PrefixCachingBlockManager.commit``)."""

    def free_sequence(self, seq: Sequence, reusable: bool = True) -> None:
        """Return all of ``seq``'s blocks to the free list and empty its table."""
        for block in reversed(seq.block_table):
            self._block_owner[block] = None
            self._free_blocks.append(block)
        seq.block_table.clear()
        self._holders.pop(seq, None)

    def check_invariants(self) -> None:
        """Raise AssertionError unless every block is free or owned by exactly one live sequence."""
        free = set(self._free_blocks)
        if len(free) != len(self._free_blocks):
            raise AssertionError("the free list holds a block twice")
        if not all(0 <= block < self.num_blocks for block in free):
            raise AssertionError(f"the free list holds an out-of-range block: {sorted(free)}")
        owned = 0
        for seq in self._holders:
            if seq.status.is_finished:
                raise AssertionError(f"finished sequence {seq.request_id!r} still holds blocks")
            if not seq.block_table:
                raise AssertionError(f"sequence {seq.request_id!r} is a holder with an empty table")
            if len(set(seq.block_table)) != len(seq.block_table):
                raise AssertionError(f"sequence {seq.request_id!r} holds a block twice: {seq.block_table}")
            for block in seq.block_table:
                if block in free:
                    raise AssertionError(f"block {block} is free but in {seq.request_id!r}'s table")
                if self._block_owner[block] is not seq:
                    raise AssertionError(f"block {block} in {seq.request_id!r}'s table is owned by another")
            owned += len(seq.block_table)
        for block, owner in enumerate(self._block_owner):
            if (owner is None) != (block in free):
                raise AssertionError(f"block {block} is neither free nor owned, or both")
            if owner is not None and owner not in self._holders:
                raise AssertionError(f"block {block} is owned by {owner.request_id!r}, not a holder")
        if owned + len(free) != self.num_blocks:
            raise AssertionError(f"{owned} owned + {len(free)} free blocks != {self.num_blocks} blocks")
