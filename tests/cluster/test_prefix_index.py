"""The router's view of the replicas' prefix caches: digests that are the prefix cache's own, matched
by leading run, from reports and from what was routed."""

from __future__ import annotations

from xpuspec.cluster.prefix_index import DIGEST_BYTES, CacheGeometry, PrefixIndex, prompt_digests
from xpuspec.core.prefix_cache import PrefixCachingBlockManager
from xpuspec.core.sequence import Sequence
from xpuspec.sample.sampling_params import SamplingParams

BLOCK = 4


def cached_after_running(token_ids: list[int]) -> tuple[PrefixCachingBlockManager, CacheGeometry]:
    """A real prefix cache after one sequence with this prompt was computed and freed."""
    manager = PrefixCachingBlockManager(num_blocks=16, block_size=BLOCK)
    sequence = Sequence("a", list(token_ids), SamplingParams())
    assert manager.admit(sequence)
    sequence.num_computed_tokens = sequence.num_tokens  # the prefill, as the engine runs it
    sequence.append_tokens([99])
    manager.commit(sequence)
    manager.free_sequence(sequence)
    return manager, CacheGeometry(manager.root_digest, manager.block_size)


def test_prompt_digests_are_the_caches_own_block_digests() -> None:
    prompt = list(range(10, 21))  # 11 tokens: two full blocks and a partial one
    manager, geometry = cached_after_running(prompt)
    digests = prompt_digests(prompt, geometry)
    assert len(digests) == 2
    assert {digest[:DIGEST_BYTES] for digest in manager.cached_digests()} == set(digests)
    # A prompt that differs in its second block shares only the first digest.
    other = prompt_digests(prompt[:5] + [99] + prompt[6:], geometry)
    assert other[0] == digests[0] and other[1] != digests[1]


def test_the_longest_leading_run_counts_and_reports_replace_each_other() -> None:
    index = PrefixIndex()
    a, b, c = b"a" * 8, b"b" * 8, b"c" * 8
    index.report("r1", [a, b])
    index.report("r2", [a, c])  # holds c, but not b: a run stops at the first block it lacks
    assert index.matches([a, b, c], ["r1", "r2", "r3"]) == {"r1": 2, "r2": 1, "r3": 0}
    index.report("r1", [c])  # evicted a and b since
    assert index.matches([a, b, c], ["r1"]) == {"r1": 0}


def test_routed_prompts_count_until_they_expire_and_gone_replicas_are_forgotten() -> None:
    now = [0.0]
    index = PrefixIndex(recent_ttl_s=10.0, clock=lambda: now[0])
    digests = [b"x" * 8, b"y" * 8]
    index.routed("r1", digests)
    assert index.matches(digests, ["r1"]) == {"r1": 2}
    now[0] = 11.0
    assert index.matches(digests, ["r1"]) == {"r1": 0}
    index.routed("r2", digests)
    index.retain(["r1"])
    assert index.replicas() == ["r1"]
