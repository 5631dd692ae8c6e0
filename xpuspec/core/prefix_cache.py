"""Prefix caching: a block manager whose full KV blocks are content-addressed and outlive their sequences.

Design (after vLLM v1's ``KVCacheManager`` / ``BlockPool``, written for this engine):

* A block that is **full of accepted tokens whose KV is computed** gets a digest: SHA-256 of its
  parent block's digest and its token ids. The digest names the block's contents, since the KV of a
  position depends on every token before it (the chain) and on the model (the pool belongs to one
  engine: one target and one draft). A partial last block never gets one, and neither does a block
  that holds speculative (not yet verified) or rejected tokens: the engine calls :meth:`commit`
  after verification, and only positions below ``num_computed_tokens`` are hashed.
* Blocks carry **reference counts**. A block nobody holds sits in the free queue: uncached blocks
  first, then cached ones ordered by last use, so cached KV is evicted (its digest dropped) only
  when no uncached block is left, and the least recently used first.
* At **admission** the longest chain of cached blocks that matches the prompt is shared with the
  new sequence, which starts computing at the first uncached token. At least one token is always
  left to compute, so the logits of the last prompt token exist.
* The **target and the draft** share block ids (one table per sequence), but not what is valid in
  them: a cached block records whether the draft's KV of its tokens is there as well. A hit sets
  ``num_computed_tokens`` from the target's chain and ``num_draft_computed_tokens`` from the
  leading blocks whose draft KV is valid, so a prefix that hits in one cache and misses in the
  other is computed again only where it misses.
* **Writes**: the target only ever writes at positions from ``num_computed_tokens`` on, which lie in
  blocks the sequence holds alone. The draft's catch-up may write the draft half of a shared block
  whose draft KV is not valid yet; it writes the KV of exactly the tokens the block's digest names
  (positions below ``num_tokens`` hold accepted tokens), which is what every holder of that block
  would write there. Speculative draft tokens land at positions from ``num_tokens`` on, in blocks
  the sequence holds alone.
* **Preemption and abort** free a sequence's blocks after committing what it computed, so they stay
  reusable until evicted; a sequence that failed (its KV may hold NaN) leaves nothing cached.
* **Partial tails** (after OpenVINO GenAI's partially filled blocks): when a sequence frees a last
  block that holds ``k`` computed tokens (0 < k < block size) and nobody else holds it, the block
  stays in the cached free queue under one digest per leading length ``1 .. k`` (parent digest and
  those tokens, in a namespace of their own). A sequence admitted after a full-block hit takes such a
  block whole for its longest matching length ``j`` and computes from ``j`` on, overwriting the rest.
  A conversation's next turn then recomputes only its new tokens, not up to a block of old ones
  (before: docs/experiments/2026-12-01-prefix-caching.md). Draft KV in such a block is not claimed:
  the draft recomputes the tail. Tails are evicted before any full block.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from xpuspec.core.block_manager import BlockGeometry
from xpuspec.core.sequence import Sequence

logger = logging.getLogger(__name__)


def block_digest(parent: bytes, token_ids: list[int] | tuple[int, ...]) -> bytes:
    """The digest of a full block: its parent's digest chained with its token ids."""
    return hashlib.sha256(parent + np.asarray(token_ids, dtype=np.int64).tobytes()).digest()


def tail_digest(parent: bytes, token_ids: list[int] | tuple[int, ...]) -> bytes:
    """The digest of a block's leading tokens (a partial tail), never equal to a full block's."""
    return hashlib.sha256(b"tail:" + parent + np.asarray(token_ids, dtype=np.int64).tobytes()).digest()


@dataclass
class _Holding:
    """What the manager knows of one sequence holding blocks."""

    # Digests of the sequence's leading full, computed blocks (its chain), whoever registered them.
    digests: list[bytes] = field(default_factory=list)
    # Leading blocks whose draft KV validity has been recorded.
    num_draft_checked: int = 0


@dataclass
class PrefixCacheStats:
    """Counters since the manager was built (admissions of preempted sequences included)."""

    num_queried_tokens: int = 0  # tokens of admitted sequences
    num_hit_tokens: int = 0  # of those, target KV found in the cache
    num_tail_hit_tokens: int = 0  # of the hits, those found in partial tails
    num_draft_hit_tokens: int = 0  # of those, draft KV found in the cache
    num_evicted_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0


class PrefixCachingBlockManager(BlockGeometry):
    """A :class:`~xpuspec.core.block_manager.BlockManager` that keeps and shares computed prefixes.

    Same interface as ``BlockManager`` plus :meth:`admit` (lookup at admission) and :meth:`commit`
    (register newly full blocks). ``namespace`` is folded into the root digest: two pools with
    different namespaces never share digests. ``cache_draft`` is false when the draft keeps its KV
    outside the shared blocks (a stateful draft executor): draft hits are then always empty.
    """

    def __init__(
        self, num_blocks: int, block_size: int, *, namespace: bytes = b"", cache_draft: bool = True
    ) -> None:
        super().__init__(num_blocks, block_size)
        self.cache_draft = cache_draft
        self.root_digest = hashlib.sha256(b"xpuspec-prefix-cache:" + namespace).digest()
        self._ref_count = [0] * num_blocks
        self._digest: list[bytes | None] = [None] * num_blocks
        self._parent: list[bytes | None] = [None] * num_blocks
        self._tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._draft_valid = [False] * num_blocks
        self._cached: dict[bytes, int] = {}  # digest -> block
        # Free partial tails: tail digest of each leading length -> block, and block -> its digests.
        self._tails: dict[bytes, int] = {}
        self._tail_digests: dict[int, list[bytes]] = {}
        # Free blocks without a digest, as a stack handing out low ids first.
        self._free_uncached: list[int] = list(range(num_blocks - 1, -1, -1))
        # Free blocks with a digest, least recently used first: evicted from the front.
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._holders: dict[Sequence, _Holding] = {}
        self.stats = PrefixCacheStats()

    # --- sizes ---------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds (cached ones included: they are evicted on demand)."""
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a reusable prefix (held by a sequence or free)."""
        return len(self._cached)

    def cached_digests(self) -> list[bytes]:
        """The digests of the blocks holding a reusable prefix, for a router that matches prompts
        against them (``xpuspec.cluster``). Safe from another thread than the engine's: one copy of
        a dict of bytes keys, which runs under the GIL without calling back into Python code."""
        return list(self._cached.copy())

    # --- admission -----------------------------------------------------------------------------
    def lookup(self, token_ids: list[int]) -> list[int]:
        """Blocks of the longest cached prefix of ``token_ids`` that leaves at least one token."""
        size = self.block_size
        parent = self.root_digest
        blocks: list[int] = []
        for index in range((len(token_ids) - 1) // size):
            digest = block_digest(parent, token_ids[index * size : (index + 1) * size])
            block = self._cached.get(digest)
            if block is None:
                break
            blocks.append(block)
            parent = digest
        return blocks

    def admit(self, seq: Sequence) -> bool:
        """Give a waiting ``seq`` blocks for all its tokens, sharing its longest cached prefix.

        Sets ``num_computed_tokens`` (and ``num_draft_computed_tokens``) to the cached prefix.
        All or nothing: returns False, changing nothing, when the blocks do not fit.
        """
        if seq.block_table or seq.num_computed_tokens or seq.num_draft_computed_tokens:
            raise ValueError(f"request {seq.request_id!r}: admit() takes a sequence with no KV")
        hits = self.lookup(seq.token_ids)
        tail, tail_length = self._lookup_tail(seq.token_ids, hits)
        free_hits = sum(1 for block in hits if self._ref_count[block] == 0) + (tail is not None)
        missing = self.blocks_needed(seq.num_tokens) - len(hits) - (tail is not None)
        if missing > self.num_free_blocks - free_hits:
            return False
        holding = _Holding()
        for block in hits:
            if self._ref_count[block] == 0:
                del self._free_cached[block]
            self._ref_count[block] += 1
            seq.block_table.append(block)
            digest = self._digest[block]
            if digest is None:
                raise AssertionError(f"block {block} is a prefix hit without a digest")
            holding.digests.append(digest)
        if tail is not None:  # taken whole: its new holder overwrites it from tail_length on
            del self._free_cached[tail]
            self._drop_tail(tail)
            self._ref_count[tail] = 1
            seq.block_table.append(tail)
        for _ in range(missing):
            seq.block_table.append(self._take_free_block())
        num_draft_hits = 0
        if self.cache_draft:
            while num_draft_hits < len(hits) and self._draft_valid[hits[num_draft_hits]]:
                num_draft_hits += 1
        holding.num_draft_checked = num_draft_hits
        self._holders[seq] = holding
        seq.num_computed_tokens = len(hits) * self.block_size + tail_length
        seq.num_draft_computed_tokens = num_draft_hits * self.block_size
        self.stats.num_queried_tokens += seq.num_tokens
        self.stats.num_hit_tokens += seq.num_computed_tokens
        self.stats.num_tail_hit_tokens += tail_length
        self.stats.num_draft_hit_tokens += seq.num_draft_computed_tokens
        if hits:
            logger.debug(
                "%r: %d of %d tokens cached (draft %d)",
                seq.request_id,
                seq.num_computed_tokens,
                seq.num_tokens,
                seq.num_draft_computed_tokens,
            )
        return True

    def _lookup_tail(self, token_ids: list[int], hits: list[int]) -> tuple[int | None, int]:
        """A free partial tail holding the tokens after the full-block ``hits``, and how many of
        them (its longest match that still leaves a token to compute), or (None, 0)."""
        if not self._tails:
            return None, 0
        size = self.block_size
        start = len(hits) * size
        longest = min(size - 1, len(token_ids) - 1 - start)
        parent = self._digest[hits[-1]] if hits else self.root_digest
        if parent is None:
            raise AssertionError(f"block {hits[-1]} is a prefix hit without a digest")
        for length in range(longest, 0, -1):
            block = self._tails.get(tail_digest(parent, token_ids[start : start + length]))
            if block is not None:
                return block, length
        return None, 0

    def _keep_tail(self, seq: Sequence, block: int) -> bool:
        """Register ``block``, ``seq``'s first block past its committed chain, as a partial tail
        if it holds computed tokens; return whether it did."""
        holding = self._holders.get(seq)
        if holding is None or self._digest[block] is not None:
            return False
        size = self.block_size
        index = len(holding.digests)
        if index >= len(seq.block_table) or seq.block_table[index] != block:
            return False
        length = min(seq.num_computed_tokens, seq.num_tokens) - index * size
        if not 0 < length < size:
            return False
        parent = holding.digests[-1] if holding.digests else self.root_digest
        tokens = seq.token_ids[index * size : index * size + length]
        digests = []
        for prefix in range(1, length + 1):
            digest = tail_digest(parent, tokens[:prefix])
            if digest not in self._tails:  # another tail holds these tokens already: it serves them
                self._tails[digest] = block
                digests.append(digest)
        if not digests:
            return False
        self._tail_digests[block] = digests
        return True

    def _drop_tail(self, block: int) -> None:
        for digest in self._tail_digests.pop(block, ()):
            del self._tails[digest]

    def ensure_capacity(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow ``seq.block_table`` with fresh blocks to cover ``[0, num_tokens)``; all or nothing."""
        missing = self.blocks_needed(num_tokens) - len(seq.block_table)
        if missing <= 0:
            return True
        if missing > self.num_free_blocks:
            return False
        for _ in range(missing):
            seq.block_table.append(self._take_free_block())
        self._holders.setdefault(seq, _Holding())
        return True

    # --- after a step --------------------------------------------------------------------------
    def commit(self, seq: Sequence) -> None:
        """Register ``seq``'s blocks that are now full of accepted tokens with computed KV.

        Call after verification (accepted tokens appended, rejected drafts rolled back): target KV
        below ``num_computed_tokens`` and draft KV below ``min(num_draft_computed_tokens,
        num_tokens)`` belong to accepted tokens.
        """
        holding = self._holders.get(seq)
        if holding is None:
            return
        size = self.block_size
        tokens = seq.token_ids
        num_full = min(seq.num_computed_tokens, seq.num_tokens) // size
        num_full = min(num_full, len(seq.block_table))
        digests = holding.digests
        while len(digests) < num_full:
            index = len(digests)
            parent = digests[-1] if digests else self.root_digest
            block_tokens = tuple(tokens[index * size : (index + 1) * size])
            digest = block_digest(parent, block_tokens)
            digests.append(digest)
            block = seq.block_table[index]
            # Another block may already hold these contents (two sequences computed them at once):
            # the first one registered stays the cached copy, this one is freed uncached.
            if digest not in self._cached and self._digest[block] is None:
                self._cached[digest] = block
                self._digest[block] = digest
                self._parent[block] = parent
                self._tokens[block] = block_tokens
        if self.cache_draft:
            num_draft_full = min(seq.num_draft_computed_tokens, seq.num_tokens) // size
            num_draft_full = min(num_draft_full, len(digests))
            while holding.num_draft_checked < num_draft_full:
                index = holding.num_draft_checked
                block = seq.block_table[index]
                if self._digest[block] == digests[index]:
                    self._draft_valid[block] = True
                holding.num_draft_checked += 1

    # --- release -------------------------------------------------------------------------------
    def free_sequence(self, seq: Sequence, reusable: bool = True) -> None:
        """Drop ``seq``'s hold on its blocks and empty its table.

        With ``reusable`` (preemption, abort, a normal finish) its computed full blocks are
        committed first and stay cached; otherwise (a failed request) the blocks only it held are
        uncached.
        """
        if reusable:
            self.commit(seq)
        # The tail first into the queue, so that a sequence's last blocks are evicted before the
        # prefix others are likelier to share.
        for block in reversed(seq.block_table):
            self._ref_count[block] -= 1
            if self._ref_count[block] > 0:
                continue
            if self._digest[block] is not None and not reusable:
                self._uncache(block)
            if self._digest[block] is not None:
                self._free_cached[block] = None
            elif reusable and self._keep_tail(seq, block):
                # At the front: a tail saves less than a block, so tails are evicted first.
                self._free_cached[block] = None
                self._free_cached.move_to_end(block, last=False)
            else:
                self._free_uncached.append(block)
        seq.block_table.clear()
        self._holders.pop(seq, None)

    def reset_cache(self) -> int:
        """Forget every cached block no sequence holds; return how many were dropped."""
        dropped = list(self._free_cached)
        self._free_cached.clear()
        for block in dropped:
            self._uncache(block)
            self._free_uncached.append(block)
        return len(dropped)

    # --- internals -----------------------------------------------------------------------------
    def _take_free_block(self) -> int:
        if self._free_uncached:
            block = self._free_uncached.pop()
        else:
            block, _ = self._free_cached.popitem(last=False)  # tails, then least recently used
            if self._digest[block] is not None:
                self.stats.num_evicted_blocks += 1
            self._uncache(block)
        self._ref_count[block] = 1
        return block

    def _uncache(self, block: int) -> None:
        self._drop_tail(block)
        digest = self._digest[block]
        if digest is not None and self._cached.get(digest) == block:
            del self._cached[digest]
        self._digest[block] = None
        self._parent[block] = None
        self._tokens[block] = None
        self._draft_valid[block] = False

    # --- checks (tests) ------------------------------------------------------------------------
    def block_tokens(self, block: int) -> tuple[int, ...] | None:
        """The token ids a cached block's KV holds, or None for an uncached block."""
        return self._tokens[block]

    def is_draft_valid(self, block: int) -> bool:
        return self._draft_valid[block]

    def check_invariants(self) -> None:
        """Raise AssertionError unless reference counts, free queue, digests and holders agree."""
        free_uncached = set(self._free_uncached)
        if len(free_uncached) != len(self._free_uncached):
            raise AssertionError("the uncached free list holds a block twice")
        if free_uncached & set(self._free_cached):
            raise AssertionError("a block is in both free queues")
        held: list[int] = [0] * self.num_blocks
        for seq, holding in self._holders.items():
            if seq.status.is_finished:
                raise AssertionError(f"finished sequence {seq.request_id!r} still holds blocks")
            table = seq.block_table
            if len(set(table)) != len(table):
                raise AssertionError(f"sequence {seq.request_id!r} holds a block twice: {table}")
            parent = self.root_digest
            for index, digest in enumerate(holding.digests):
                expected = block_digest(
                    parent, seq.token_ids[index * self.block_size : (index + 1) * self.block_size]
                )
                if index < seq.num_tokens // self.block_size and digest != expected:
                    raise AssertionError(
                        f"{seq.request_id!r}: digest of block {index} does not match its tokens"
                    )
                block = table[index]
                if self._digest[block] is not None and self._digest[block] != digest:
                    raise AssertionError(f"{seq.request_id!r}: block {block} is cached with other contents")
                parent = digest
            for block in table[len(holding.digests) :]:
                if self._digest[block] is not None:
                    raise AssertionError(
                        f"{seq.request_id!r}: block {block} past its computed prefix is cached"
                    )
            if (
                seq.num_computed_tokens < len(holding.digests) * self.block_size
                and seq.num_computed_tokens < seq.num_tokens
            ):
                raise AssertionError(f"{seq.request_id!r}: computed tokens fell below its committed blocks")
            for block in table:
                held[block] += 1
        for block in range(self.num_blocks):
            count = self._ref_count[block]
            if count != held[block]:
                raise AssertionError(f"block {block}: reference count {count}, held by {held[block]} tables")
            is_free = block in free_uncached or block in self._free_cached
            if (count == 0) != is_free:
                raise AssertionError(f"block {block}: reference count {count} but free={is_free}")
            own_digest = self._digest[block]
            tails = self._tail_digests.get(block)
            if tails and (count or own_digest is not None):
                raise AssertionError(f"block {block} is a partial tail but held or fully cached")
            if block in self._free_cached and own_digest is None and not tails:
                raise AssertionError(f"block {block} is in the cached free queue without a digest")
            if block in free_uncached and own_digest is not None:
                raise AssertionError(f"block {block} is in the uncached free list with a digest")
            if count > 1 and own_digest is None:
                raise AssertionError(f"block {block} is shared by {count} sequences but not a cached block")
            if self._draft_valid[block] and own_digest is None:
                raise AssertionError(f"block {block} claims draft KV without being cached")
            if own_digest is not None:
                if self._cached.get(own_digest) != block:
                    raise AssertionError(f"block {block}'s digest does not map back to it")
                own_parent, tokens = self._parent[block], self._tokens[block]
                if own_parent is None or tokens is None or block_digest(own_parent, tokens) != own_digest:
                    raise AssertionError(f"block {block}'s digest does not match its tokens")
        if len(self._cached) != sum(digest is not None for digest in self._digest):
            raise AssertionError("the digest map and the blocks disagree")
        if sorted(self._tails.values()) != sorted(b for b, ds in self._tail_digests.items() for _ in ds):
            raise AssertionError("the tail map and the tail blocks disagree")
        num_held = sum(1 for count in self._ref_count if count > 0)
        if num_held + self.num_free_blocks != self.num_blocks:
            raise AssertionError(f"{num_held} held + {self.num_free_blocks} free != {self.num_blocks} blocks")
