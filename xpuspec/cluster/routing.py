"""The routing decision, apart from Ray: prefix affinity first, then load.

``decide`` takes how many leading blocks of a prompt each replica is taken to hold and each one's
queue (requests sent and not finished) and returns the replica to prefer, or None for the least
loaded. :class:`RoutingCounts` counts the outcomes for ``/metrics``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Outcome = Literal["affinity", "fallback", "miss", "random"]


@dataclass(frozen=True)
class Decision:
    """The replica to try first (None: the least loaded of all) and why."""

    preferred: str | None
    outcome: Outcome
    matched_blocks: int = 0


def decide(matches: Mapping[str, int], queues: Mapping[str, int], imbalance_threshold: int) -> Decision:
    """The replica holding the longest prefix, unless its queue is longer than the shortest queue by
    more than ``imbalance_threshold`` (then the least loaded: a hot prefix must not pile every
    request onto one replica). Ties in the match go to the shorter queue. No match: the least loaded.
    """
    if not matches:
        return Decision(None, "miss")
    best = max(matches.values())
    if best == 0:
        return Decision(None, "miss")
    holders = [replica for replica, blocks in matches.items() if blocks == best]
    chosen = min(holders, key=lambda replica: queues.get(replica, 0))
    shortest = min(queues.get(replica, 0) for replica in matches)
    if queues.get(chosen, 0) - shortest > imbalance_threshold:
        return Decision(None, "fallback", best)
    return Decision(chosen, "affinity", best)


class RoutingCounts:
    """How requests were routed, since the process started (read by the ingress's ``/metrics``).

    ``affinity``: sent to the replica that held the longest prefix; ``fallback``: a replica held it
    but its queue was too long (or it refused), so the least loaded one got it; ``miss``: no replica
    held any block of the prompt; ``random``: routed at random (the baseline policy).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {"affinity": 0, "fallback": 0, "miss": 0, "random": 0}

    def add(self, outcome: Outcome) -> None:
        with self._lock:
            self._counts[outcome] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
