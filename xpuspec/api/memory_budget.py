"""The memory a server may take beyond its models: a budget for the KV cache, and how it is split.

The KV cache is most of what a server's memory grows by: its pages become resident as blocks are
first written, and the prefix cache keeps finished requests' blocks until they are needed again, so
a busy server ends up with the whole pool resident. The prefix cache lives in the pool's free blocks:
it is bounded by the pool, never beyond it. A budget sizes the pool of both models: the target's and
the draft model's (which share one block table) by their width per token, so that the two together
hold the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20


def kv_width(facts: Mapping[str, Any]) -> int | None:
    """A model's KV values per token (layers x KV heads x head size), or None where the manifest
    does not say."""
    try:
        return int(facts["num_layers"]) * int(facts["num_kv_heads"]) * int(facts["head_dim"])
    except (KeyError, TypeError, ValueError):
        return None


def target_share(target_facts: Mapping[str, Any], draft_facts: Mapping[str, Any] | None) -> float:
    """The part of a KV budget the target's cache takes, when a draft model shares its block table."""
    if draft_facts is None:
        return 1.0
    target, draft = kv_width(target_facts), kv_width(draft_facts)
    if target is None or draft is None:
        return 1.0  # unknown widths: the target gets it all (the draft's cache is the smaller one)
    return target / (target + draft)


@dataclass(frozen=True)
class KVCacheSize:
    """One model's KV cache as allocated."""

    role: str
    num_blocks: int
    block_size: int
    cache_bytes: int

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size


def describe(budget_bytes: int | None, caches: list[KVCacheSize], shape_cache_entries: int | None) -> str:
    """The one line `serve` logs at start: the budget and what it is split into."""
    total = sum(cache.cache_bytes for cache in caches)
    head = f"memory budget {budget_bytes / MIB:.0f} MiB" if budget_bytes is not None else "no memory budget"
    parts = [f"{cache.role} {cache.cache_bytes / MIB:.0f} MiB ({cache.tokens} tokens)" for cache in caches]
    line = f"{head}: KV cache {total / MIB:.0f} MiB"
    if parts:
        line += f" = {' + '.join(parts)}, the prefix cache within it"
    if shape_cache_entries is not None:
        line += f"; compiled-shape cache {shape_cache_entries} entries per model"
    return line


def kv_cache_sizes(runners: Sequence[tuple[str, Any]], num_blocks: int) -> list[KVCacheSize]:
    """The KV caches of the paged ``(role, runner)`` pairs (the other executors size theirs
    themselves), as ``num_blocks`` of their blocks each hold them."""
    from xpuspec.executor.paged_runner import PagedModelRunner

    return [
        KVCacheSize(role, num_blocks, runner.block_size, runner.cache_bytes * num_blocks // runner.num_blocks)
        for role, runner in runners
        if isinstance(runner, PagedModelRunner)
    ]


def usable_blocks(budget_bytes: int, allocated: list[KVCacheSize], num_blocks: int) -> int | None:
    """How many of the ``num_blocks`` blocks both caches ``allocated`` may use within ``budget_bytes``,
    counted from their real sizes (the budget's split by KV width does not know each cache's element
    type: a draft's f16 beside a target's u8); None where all of them fit, or nothing is paged."""
    if not allocated:
        return None
    bytes_per_block = sum(size.cache_bytes / size.num_blocks for size in allocated)
    usable = max(1, int(budget_bytes // bytes_per_block))
    return usable if usable < num_blocks else None
