"""A replica's report survives Serve's routing stats (a dict) and its metrics reach the ingress's
/metrics labelled by replica, beside the router's counts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from xpuspec.cluster.prefix_index import CacheGeometry
from xpuspec.cluster.reports import ReplicaMetricsCollector, ReplicaReport, ReportBoard


def replica_metrics(finished: int) -> str:
    registry = CollectorRegistry()
    Counter("xpuspec_requests_finished", "finished", ["finish_reason"], registry=registry).labels("stop").inc(
        finished
    )
    return generate_latest(registry).decode()


def report(replica: str, sequence: int, finished: int) -> ReplicaReport:
    return ReplicaReport(
        replica, sequence, CacheGeometry(b"r" * 32, 32), (b"d" * 8,), 3, replica_metrics(finished)
    )


def test_a_report_round_trips_through_routing_stats() -> None:
    original = report("r1", 7, 2)
    assert ReplicaReport.from_stats("r1", original.to_stats()) == original
    assert ReplicaReport.from_stats("r1", {}) is None  # before the first report


def test_the_collector_labels_each_replicas_series_and_counts_routing() -> None:
    board = ReportBoard()
    board.put(report("r1", 1, 2))
    board.put(report("r2", 1, 5))
    board.counts.add("affinity")
    registry = CollectorRegistry()
    registry.register(ReplicaMetricsCollector(board))
    text = generate_latest(registry).decode()
    assert 'xpuspec_requests_finished_total{finish_reason="stop",replica="r1"} 2.0' in text
    assert 'xpuspec_requests_finished_total{finish_reason="stop",replica="r2"} 5.0' in text
    assert 'xpuspec_router_requests_total{outcome="affinity"} 1.0' in text
    board.retain(["r2"])  # r1 was scaled down
    assert 'replica="r1"' not in generate_latest(registry).decode()
