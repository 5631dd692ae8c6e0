"""What each replica holds in its prefix cache, as the router sees it: block digests, matched by prefix.

A replica's prefix cache names each full KV block by a digest chained from the prompt's start
(:func:`xpuspec.core.prefix_cache.block_digest`). The router computes the same chain for a request's
prompt and looks for the replica holding its longest leading run. Two sources feed the view of one
replica:

* its **report** (Serve's routing stats, every ``request_routing_stats_period_s``): the digests its
  cache holds now, shortened to :data:`DIGEST_BYTES`; a report replaces the previous one, so blocks
  the replica evicted drop out;
* what the router **sent** it since: a report lags by up to a period, and a conversation's next turn
  often comes sooner, so the digests of each routed prompt count as held for ``recent_ttl_s`` (by
  then a report says whether they stayed).

The view holds plain data: no Ray, no engine.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from xpuspec.core.prefix_cache import block_digest

# Digests are reported and matched by their first bytes: 64 bits make a collision between the blocks
# of one cluster's caches unlikely, and a collision only misroutes a request (its output is unchanged).
DIGEST_BYTES = 8
# The most leading blocks of a prompt the router hashes: a longer shared prefix changes no decision
# among replicas that already match this many.
MAX_MATCH_BLOCKS = 64


@dataclass(frozen=True)
class CacheGeometry:
    """How a replica names its blocks: the chain's root digest and the block size (same on every
    replica of one deployment, since all load the same bundle)."""

    root: bytes
    block_size: int


def prompt_digests(
    token_ids: Sequence[int], geometry: CacheGeometry, limit: int = MAX_MATCH_BLOCKS
) -> list[bytes]:
    """The short digests of the prompt's leading full blocks, in order (at most ``limit``)."""
    digests: list[bytes] = []
    parent = geometry.root
    size = geometry.block_size
    for start in range(0, min(len(token_ids) // size, limit) * size, size):
        parent = block_digest(parent, list(token_ids[start : start + size]))
        digests.append(parent[:DIGEST_BYTES])
    return digests


@dataclass
class ReplicaView:
    """One replica's cached digests: its last report and what was routed to it since."""

    reported: frozenset[bytes] = frozenset()
    recent: OrderedDict[bytes, float] = field(default_factory=OrderedDict)  # digest -> when routed

    def holds(self, digest: bytes) -> bool:
        return digest in self.reported or digest in self.recent

    def matched_blocks(self, digests: Sequence[bytes]) -> int:
        """How many leading blocks of the prompt this replica is taken to hold."""
        count = 0
        for digest in digests:
            if not self.holds(digest):
                break
            count += 1
        return count


class PrefixIndex:
    """The router's view of every replica's prefix cache."""

    def __init__(
        self, recent_ttl_s: float = 30.0, max_recent: int = 65536, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.recent_ttl_s = recent_ttl_s
        self.max_recent = max_recent
        self._clock = clock
        self._views: dict[str, ReplicaView] = {}

    def replicas(self) -> list[str]:
        return list(self._views)

    def report(self, replica: str, digests: Iterable[bytes]) -> None:
        """A replica's report: the digests its cache holds now."""
        view = self._views.setdefault(replica, ReplicaView())
        view.reported = frozenset(digests)

    def routed(self, replica: str, digests: Sequence[bytes]) -> None:
        """A prompt with these digests was sent to ``replica``: it will hold them once it ran."""
        view = self._views.setdefault(replica, ReplicaView())
        now = self._clock()
        for digest in digests:
            view.recent[digest] = now
            view.recent.move_to_end(digest)
        while len(view.recent) > self.max_recent:
            view.recent.popitem(last=False)

    def retain(self, replicas: Iterable[str]) -> None:
        """Forget replicas that are gone (died, or scaled down)."""
        keep = set(replicas)
        for replica in list(self._views):
            if replica not in keep:
                del self._views[replica]

    def matches(self, digests: Sequence[bytes], replicas: Iterable[str]) -> dict[str, int]:
        """Per replica, how many leading blocks of the prompt it is taken to hold."""
        self._expire()
        return {
            replica: self._views[replica].matched_blocks(digests) if replica in self._views else 0
            for replica in replicas
        }

    def _expire(self) -> None:
        oldest = self._clock() - self.recent_ttl_s
        for view in self._views.values():
            recent = view.recent
            while recent and next(iter(recent.values())) < oldest:
                recent.popitem(last=False)
