"""The routing decision: the longest cached prefix, unless its replica's queue is too long."""

from __future__ import annotations

from xpuspec.cluster.routing import Decision, RoutingCounts, decide


def test_the_replica_with_the_longest_prefix_is_preferred() -> None:
    assert decide({"a": 1, "b": 3}, {"a": 0, "b": 2}, imbalance_threshold=4) == Decision("b", "affinity", 3)


def test_ties_go_to_the_shorter_queue_and_no_match_to_the_least_loaded() -> None:
    assert decide({"a": 2, "b": 2}, {"a": 3, "b": 1}, 4).preferred == "b"
    assert decide({"a": 0, "b": 0}, {"a": 3, "b": 1}, 4) == Decision(None, "miss")
    assert decide({}, {}, 4) == Decision(None, "miss")


def test_a_queue_longer_than_the_threshold_falls_back_to_the_least_loaded() -> None:
    assert decide({"a": 5, "b": 0}, {"a": 5, "b": 1}, 4) == Decision("a", "affinity", 5)  # 4 more: still a
    assert decide({"a": 5, "b": 0}, {"a": 6, "b": 1}, 4) == Decision(None, "fallback", 5)


def test_counts_start_at_zero_for_every_outcome() -> None:
    counts = RoutingCounts()
    counts.add("affinity")
    counts.add("fallback")
    counts.add("affinity")
    assert counts.snapshot() == {"affinity": 2, "fallback": 1, "miss": 0, "random": 0}
