"""The prefix-caching block manager: unit cases and a property test over random engine histories.

The property test simulates what the runners would hold: the token whose KV each slot of the
target's and the draft's caches holds, written exactly where the engine writes (prefill chunks,
the last token plus drafts on the target, catch-up plus drafts on the draft). After every operation
every cached block's KV must be the KV of the tokens its digest names.
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from xpuspec.core.prefix_cache import PrefixCachingBlockManager, block_digest
from xpuspec.core.sequence import Sequence, SequenceStatus
from xpuspec.sample.sampling_params import SamplingParams

BLOCK = 4


def make_sequence(request_id: str, token_ids: list[int]) -> Sequence:
    return Sequence(request_id, list(token_ids), SamplingParams())


def prefill(manager: PrefixCachingBlockManager, seq: Sequence) -> None:
    """Compute the whole prompt and sample one token (the engine's prefill), then commit."""
    seq.num_computed_tokens = seq.num_tokens
    seq.append_tokens([99])
    manager.commit(seq)


def admitted(manager: PrefixCachingBlockManager, request_id: str, token_ids: list[int]) -> Sequence:
    seq = make_sequence(request_id, token_ids)
    assert manager.admit(seq)
    seq.status = SequenceStatus.RUNNING
    return seq


def test_a_repeated_prompt_reuses_its_full_blocks_and_computes_the_rest() -> None:
    manager = PrefixCachingBlockManager(num_blocks=16, block_size=BLOCK)
    prompt = list(range(10))  # two full blocks and a partial one
    first = admitted(manager, "a", prompt)
    assert first.num_computed_tokens == 0
    prefill(manager, first)
    assert manager.num_cached_blocks == 2
    second = admitted(manager, "b", prompt)
    assert second.num_computed_tokens == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert second.block_table[2] != first.block_table[2]  # the partial block is not shared
    manager.check_invariants()
    assert manager.stats.num_hit_tokens == 8 and manager.stats.num_queried_tokens == 20


def test_a_prompt_of_whole_blocks_leaves_its_last_token_to_compute() -> None:
    manager = PrefixCachingBlockManager(num_blocks=16, block_size=BLOCK)
    first = admitted(manager, "a", list(range(8)))
    prefill(manager, first)
    manager.free_sequence(first)
    second = admitted(manager, "b", list(range(8)))
    assert second.num_computed_tokens == 4  # block 2 would leave nothing to compute: no logits
    manager.check_invariants()


def test_only_computed_accepted_tokens_are_registered() -> None:
    manager = PrefixCachingBlockManager(num_blocks=16, block_size=BLOCK)
    seq = admitted(manager, "a", [1, 2, 3])
    seq.num_computed_tokens = 2  # a chunk of the prompt
    manager.commit(seq)
    assert manager.num_cached_blocks == 0
    seq.num_computed_tokens = 3
    seq.append_tokens([4])  # position 3 is known but its KV is not computed yet
    manager.ensure_capacity(seq, 8)
    manager.commit(seq)
    assert manager.num_cached_blocks == 0
    seq.num_computed_tokens = 4  # the decode computed it
    seq.append_tokens([5])
    manager.commit(seq)
    assert manager.num_cached_blocks == 1
    assert manager.block_tokens(seq.block_table[0]) == (1, 2, 3, 4)


def test_freed_prefixes_stay_cached_until_uncached_blocks_run_out_then_lru_goes_first() -> None:
    manager = PrefixCachingBlockManager(num_blocks=4, block_size=BLOCK)
    old = admitted(manager, "old", [1] * 5)
    prefill(manager, old)
    manager.free_sequence(old)
    new = admitted(manager, "new", [2] * 5)
    prefill(manager, new)
    manager.free_sequence(new)
    assert manager.num_cached_blocks == 2 and manager.num_free_blocks == 4
    # Two uncached blocks are free: a 2-block sequence evicts nothing.
    other = admitted(manager, "other", [3] * 5)
    assert manager.num_cached_blocks == 2 and manager.stats.num_evicted_blocks == 0
    manager.free_sequence(other)
    # Reuse "new" so that "old" is the least recently used, then force one eviction.
    again = admitted(manager, "again", [2] * 5)
    assert again.num_computed_tokens == 4
    manager.free_sequence(again)
    big = admitted(manager, "big", [4] * 9)  # 3 blocks: the 2 uncached free ones, then the LRU cached
    assert manager.stats.num_evicted_blocks == 1
    manager.free_sequence(big)
    manager.check_invariants()
    assert admitted(manager, "new again", [2] * 5).num_computed_tokens == 4
    assert admitted(manager, "old again", [1] * 5).num_computed_tokens == 0


def test_a_next_turn_reuses_the_partial_tail_of_the_last_one() -> None:
    """Turn 1 computed 6 tokens (a full block and 2 in a tail) and sampled a seventh; turn 2 repeats
    the 6 and adds 3: it takes the tail block whole and computes from position 6 on."""
    manager = PrefixCachingBlockManager(num_blocks=6, block_size=BLOCK)
    turn1 = admitted(manager, "turn1", [5, 6, 7, 8, 9, 10])
    prefill(manager, turn1)  # computes 6, appends the sampled 99 (not computed)
    tail_block = turn1.block_table[1]
    manager.free_sequence(turn1)
    manager.check_invariants()
    turn2 = admitted(manager, "turn2", [5, 6, 7, 8, 9, 10, 99, 11, 12])
    assert turn2.num_computed_tokens == 6 and turn2.num_draft_computed_tokens == 0  # no draft KV claimed
    assert turn2.block_table[1] == tail_block and manager.stats.num_tail_hit_tokens == 2
    manager.check_invariants()
    # Taken whole: nobody else can be handed it while turn 2 overwrites it.
    other = admitted(manager, "other", [5, 6, 7, 8, 9, 10, 13])
    assert other.num_computed_tokens == 4 and tail_block not in other.block_table
    manager.check_invariants()


def test_a_tail_matches_its_longest_prefix_and_leaves_a_token_to_compute() -> None:
    manager = PrefixCachingBlockManager(num_blocks=6, block_size=BLOCK)
    first = admitted(manager, "first", [5, 6, 7, 8, 9, 10, 11])
    prefill(manager, first)
    manager.free_sequence(first)
    # Shares 2 of the tail's 3 tokens; then the same 7 tokens exactly (one must stay to compute).
    fork = admitted(manager, "fork", [5, 6, 7, 8, 9, 10, 0])
    assert fork.num_computed_tokens == 6
    manager.free_sequence(fork)  # it computed nothing more: its tail holds the 2 tokens again
    again = admitted(manager, "again", [5, 6, 7, 8, 9, 10, 11])
    assert again.num_computed_tokens == 6  # 7 would leave nothing to compute
    manager.check_invariants()


def test_tails_are_evicted_before_full_blocks_and_failed_sequences_leave_none() -> None:
    manager = PrefixCachingBlockManager(num_blocks=3, block_size=BLOCK)
    kept = admitted(manager, "kept", [1, 2, 3, 4, 5])
    prefill(manager, kept)
    manager.free_sequence(kept)  # one full block and a tail of 1 token, both free
    filler = admitted(manager, "filler", [7, 7, 7, 7, 7])  # 2 blocks: the uncached one, then the tail
    assert manager.num_cached_blocks == 1 and manager.stats.num_evicted_blocks == 0
    manager.free_sequence(filler, reusable=False)
    assert not manager._tails
    manager.check_invariants()
    assert admitted(manager, "kept again", [1, 2, 3, 4, 5, 6]).num_computed_tokens == 4


def test_a_failed_sequence_leaves_nothing_cached() -> None:
    manager = PrefixCachingBlockManager(num_blocks=8, block_size=BLOCK)
    seq = admitted(manager, "a", list(range(9)))
    prefill(manager, seq)
    assert manager.num_cached_blocks == 2
    manager.free_sequence(seq, reusable=False)
    assert manager.num_cached_blocks == 0
    manager.check_invariants()


def test_draft_hits_are_tracked_apart_from_target_hits() -> None:
    manager = PrefixCachingBlockManager(num_blocks=16, block_size=BLOCK)
    prompt = list(range(13))
    first = admitted(manager, "a", prompt)
    prefill(manager, first)  # target computed 13 tokens; the draft nothing yet
    second = admitted(manager, "b", prompt)
    assert (second.num_computed_tokens, second.num_draft_computed_tokens) == (12, 0)
    first.num_draft_computed_tokens = 9  # the draft caught up with 9 tokens (2 full blocks)
    manager.commit(first)
    third = admitted(manager, "c", prompt)
    assert (third.num_computed_tokens, third.num_draft_computed_tokens) == (12, 8)
    manager.check_invariants()


def test_without_draft_caching_draft_hits_are_empty() -> None:
    manager = PrefixCachingBlockManager(num_blocks=16, block_size=BLOCK, cache_draft=False)
    first = admitted(manager, "a", list(range(9)))
    prefill(manager, first)
    first.num_draft_computed_tokens = 9
    manager.commit(first)
    second = admitted(manager, "b", list(range(9)))
    assert (second.num_computed_tokens, second.num_draft_computed_tokens) == (8, 0)


def test_admission_is_all_or_nothing() -> None:
    manager = PrefixCachingBlockManager(num_blocks=3, block_size=BLOCK)
    first = admitted(manager, "a", list(range(9)))
    prefill(manager, first)
    manager.free_sequence(first)
    holder = admitted(manager, "holder", [5, 5])
    big = make_sequence("big", list(range(9)) + [8] * 8)  # 2 cached blocks + 3 more: 5 > 3
    assert not manager.admit(big)
    assert big.block_table == [] and big.num_computed_tokens == 0
    manager.free_sequence(holder)
    manager.check_invariants()


def test_digests_chain_their_parents() -> None:
    root = PrefixCachingBlockManager(num_blocks=1, block_size=BLOCK).root_digest
    first = block_digest(root, [1, 2, 3, 4])
    assert block_digest(first, [5, 6, 7, 8]) != block_digest(root, [5, 6, 7, 8])
    assert PrefixCachingBlockManager(1, BLOCK, namespace=b"other").root_digest != root


# --- property test -----------------------------------------------------------------------------

BASES = ([1, 2, 1, 2, 1, 2, 1, 2, 0], [2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0], [0, 1])


class PrefixCacheMachine(RuleBasedStateMachine):
    """Random admissions, prefill chunks, speculative decodes with rollbacks, aborts, preemptions,
    failures and evictions (a small pool), with the KV each slot holds simulated."""

    def __init__(self) -> None:
        super().__init__()
        self.manager = PrefixCachingBlockManager(num_blocks=9, block_size=BLOCK)
        self.kv_target: list[list[int | None]] = [[None] * BLOCK for _ in range(9)]
        self.kv_draft: list[list[int | None]] = [[None] * BLOCK for _ in range(9)]
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.counter = 0

    # writes, checked as the engine must make them
    def write_target(self, seq: Sequence, position: int, token: int) -> None:
        block = seq.block_table[position // BLOCK]
        assert self.manager.block_tokens(block) is None, "the target wrote into a cached block"
        assert self.manager._ref_count[block] == 1, "the target wrote into a shared block"
        self.kv_target[block][position % BLOCK] = token

    def write_draft(self, seq: Sequence, position: int, token: int) -> None:
        block = seq.block_table[position // BLOCK]
        cached = self.manager.block_tokens(block)
        if cached is not None:
            assert cached[position % BLOCK] == token, "the draft wrote other tokens into a cached block"
        else:
            assert self.manager._ref_count[block] == 1, "the draft wrote into a shared block"
        self.kv_draft[block][position % BLOCK] = token

    def preempt_newest(self) -> None:
        victim = self.running.pop()
        self.manager.free_sequence(victim)
        victim.reset_for_recompute()
        self.waiting.appendleft(victim)

    @rule(base=st.sampled_from(BASES), keep=st.integers(0, 12), tail=st.lists(st.integers(0, 2), max_size=6))
    def add(self, base: list[int], keep: int, tail: list[int]) -> None:
        tokens = base[:keep] + tail
        if not tokens:
            tokens = [0]
        self.counter += 1
        self.waiting.append(make_sequence(f"r{self.counter}", tokens))

    @precondition(lambda self: self.waiting and len(self.running) < 4)
    @rule()
    def admit(self) -> None:
        seq = self.waiting[0]
        if self.manager.blocks_needed(seq.num_tokens) > self.manager.num_blocks:
            self.waiting.popleft()  # it grew past the whole cache: finished by length
            seq.status = SequenceStatus.FINISHED_LENGTH
            return
        if not self.manager.admit(seq):
            return
        self.waiting.popleft()
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        hit, draft_hit = seq.num_computed_tokens, seq.num_draft_computed_tokens
        # A hit ends at a block boundary, or within a partial tail; draft hits at a boundary.
        assert draft_hit % BLOCK == 0 and draft_hit <= hit < seq.num_tokens
        for position in range(hit):  # the reused KV is the KV of this sequence's tokens
            block = seq.block_table[position // BLOCK]
            assert self.kv_target[block][position % BLOCK] == seq.token_ids[position]
        for position in range(draft_hit):
            block = seq.block_table[position // BLOCK]
            assert self.kv_draft[block][position % BLOCK] == seq.token_ids[position]

    @precondition(lambda self: any(seq.is_prefilling for seq in self.running))
    @rule(data=st.data(), size=st.integers(1, 9))
    def prefill_chunk(self, data: st.DataObject, size: int) -> None:
        seq = data.draw(st.sampled_from([s for s in self.running if s.is_prefilling]))
        first = seq.num_computed_tokens
        last = min(first + size, seq.num_tokens)
        for position in range(first, last):
            self.write_target(seq, position, seq.token_ids[position])
        seq.num_computed_tokens = last
        if last == seq.num_tokens:  # the chunk reached the last token: it samples one
            seq.append_tokens([data.draw(st.integers(0, 2))])
        self.manager.commit(seq)

    @precondition(lambda self: any(not seq.is_prefilling for seq in self.running))
    @rule(data=st.data(), gamma=st.integers(0, 4), use_draft=st.booleans())
    def speculate(self, data: st.DataObject, gamma: int, use_draft: bool) -> None:
        seq = data.draw(st.sampled_from([s for s in self.running if not s.is_prefilling]))
        n = seq.num_tokens
        while not self.manager.ensure_capacity(seq, n + gamma):
            if gamma > 0:
                gamma -= 1  # speculation shrinks before anything is preempted
                continue
            self.preempt_newest()
            if seq not in self.running:
                return
        drafts = data.draw(st.lists(st.integers(0, 2), min_size=gamma, max_size=gamma))
        if use_draft and gamma:
            for position in range(seq.num_draft_computed_tokens, n):  # the draft's catch-up
                self.write_draft(seq, position, seq.token_ids[position])
            for offset, token in enumerate(drafts[:-1]):  # drafts fed back, one per draft step
                self.write_draft(seq, n + offset, token)
            seq.num_draft_computed_tokens = n + gamma - 1
        # The target computes the last token plus the drafts.
        for offset, token in enumerate([seq.last_token_id] + drafts):
            self.write_target(seq, n - 1 + offset, token)
        accepted = data.draw(st.integers(0, gamma))
        seq.num_computed_tokens += 1 + accepted
        seq.num_draft_computed_tokens = min(seq.num_draft_computed_tokens, seq.num_computed_tokens)
        # A rejected draft is replaced by another token (the recovered one), else a bonus token.
        bonus = (drafts[accepted] + 1) % 3 if accepted < gamma else data.draw(st.integers(0, 2))
        seq.append_tokens(drafts[:accepted] + [bonus])
        self.manager.commit(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), how=st.sampled_from(["finish", "abort", "stop", "fail", "preempt"]))
    def end(self, data: st.DataObject, how: str) -> None:
        seq = data.draw(st.sampled_from(self.running))
        if how == "preempt":
            self.running.remove(seq)
            self.manager.free_sequence(seq)
            seq.reset_for_recompute()
            self.waiting.appendleft(seq)
            return
        if how == "stop" and seq.num_output_tokens:
            seq.drop_last_tokens(data.draw(st.integers(0, seq.num_output_tokens)))
        self.running.remove(seq)
        self.manager.free_sequence(seq, reusable=how != "fail")
        seq.status = SequenceStatus.FINISHED_ERROR if how == "fail" else SequenceStatus.FINISHED_STOPPED

    @precondition(lambda self: self.waiting and not self.running)
    @rule()
    def drop_waiting(self) -> None:
        self.waiting.popleft().status = SequenceStatus.FINISHED_ABORTED

    @invariant()
    def bookkeeping_holds(self) -> None:
        self.manager.check_invariants()
        held = {block for seq in self.running for block in seq.block_table}
        assert self.manager.num_used_blocks == len(held), "a block is held by no sequence (leak)"
        for seq in self.waiting:
            assert not seq.block_table and not seq.num_computed_tokens

    @invariant()
    def cached_blocks_hold_their_tokens(self) -> None:
        for block in range(self.manager.num_blocks):
            tokens = self.manager.block_tokens(block)
            if tokens is None:
                continue
            assert tuple(self.kv_target[block]) == tokens, f"block {block}'s target KV is not its tokens"
            if self.manager.is_draft_valid(block):
                assert tuple(self.kv_draft[block]) == tokens, f"block {block}'s draft KV is not its tokens"

    def teardown(self) -> None:
        for seq in self.running:
            self.manager.free_sequence(seq)
        self.manager.check_invariants()
        assert self.manager.num_free_blocks == self.manager.num_blocks, "blocks leaked"


PrefixCacheMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_prefix_cache_properties = PrefixCacheMachine.TestCase


@pytest.mark.parametrize("reusable", [True, False])
def test_free_with_shared_blocks_keeps_the_other_holders_blocks(reusable: bool) -> None:
    manager = PrefixCachingBlockManager(num_blocks=8, block_size=BLOCK)
    first = admitted(manager, "a", list(range(9)))
    prefill(manager, first)
    second = admitted(manager, "b", list(range(9)))
    manager.free_sequence(first, reusable=reusable)
    manager.check_invariants()
    assert second.num_computed_tokens == 8
    assert manager.block_tokens(second.block_table[0]) == (0, 1, 2, 3)
