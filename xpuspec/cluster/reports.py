"""What an engine replica reports through Serve's routing stats, and where the ingress keeps it.

A replica's ``record_routing_stats`` returns :meth:`ReplicaReport.to_stats`: its cache geometry, the
short digests of the blocks its prefix cache holds, its requests in flight and its Prometheus text.
Serve polls it every ``request_routing_stats_period_s`` and hands it to the router in the ingress
process, which keeps the latest report per replica in :data:`REPORTS`. The ingress's ``/metrics``
reads them from there (:class:`ReplicaMetricsCollector`): each replica's metrics, labelled by
replica, and the router's counts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from xpuspec.cluster.prefix_index import CacheGeometry
from xpuspec.cluster.routing import RoutingCounts

REPLICA_LABEL = "replica"


@dataclass(frozen=True)
class ReplicaReport:
    """One replica's routing stats, as plain data."""

    replica: str
    sequence: int  # increases with every report of one replica
    geometry: CacheGeometry
    digests: tuple[bytes, ...]
    num_in_flight: int
    metrics_text: str

    def to_stats(self) -> dict[str, Any]:
        return {
            "xpuspec": 1,
            "sequence": self.sequence,
            "root": self.geometry.root,
            "block_size": self.geometry.block_size,
            "digests": list(self.digests),
            "num_in_flight": self.num_in_flight,
            "metrics": self.metrics_text,
        }

    @classmethod
    def from_stats(cls, replica: str, stats: Mapping[str, Any] | None) -> ReplicaReport | None:
        """The report in a replica's routing stats; None before its first report."""
        if not stats or stats.get("xpuspec") != 1:
            return None
        return cls(
            replica=replica,
            sequence=int(stats["sequence"]),
            geometry=CacheGeometry(bytes(stats["root"]), int(stats["block_size"])),
            digests=tuple(stats["digests"]),
            num_in_flight=int(stats["num_in_flight"]),
            metrics_text=str(stats["metrics"]),
        )


class ReportBoard:
    """The latest report of each live replica and the routing counts, shared within one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports: dict[str, ReplicaReport] = {}
        self.counts = RoutingCounts()

    def put(self, report: ReplicaReport) -> None:
        with self._lock:
            self._reports[report.replica] = report

    def get(self, replica: str) -> ReplicaReport | None:
        with self._lock:
            return self._reports.get(replica)

    def retain(self, replicas: Iterable[str]) -> None:
        keep = set(replicas)
        with self._lock:
            for replica in list(self._reports):
                if replica not in keep:
                    del self._reports[replica]

    def reports(self) -> list[ReplicaReport]:
        with self._lock:
            return sorted(self._reports.values(), key=lambda report: report.replica)


# The router and the ingress app of one process meet here: Serve builds the router inside the
# deployment handle, out of reach of the app that uses the handle.
REPORTS = ReportBoard()


class ReplicaMetricsCollector(Collector):
    """Every replica's metrics with a ``replica`` label, and the router's decisions."""

    def __init__(self, board: ReportBoard = REPORTS) -> None:
        self._board = board

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked: the families depend on what the replicas report

    def collect(self) -> Iterator[Metric]:
        routed = CounterMetricFamily(
            "xpuspec_router_requests",
            "Requests routed to engine replicas, by outcome: affinity (the replica holding the longest "
            "cached prefix), fallback (it held the prefix but was too loaded: the least loaded one), "
            "miss (no replica held any block), random (the baseline policy)",
            labels=["outcome"],
        )
        for outcome, count in self._board.counts.snapshot().items():
            routed.add_metric([outcome], count)
        yield routed
        merged: dict[str, Metric] = {}
        for report in self._board.reports():
            for family in text_string_to_metric_families(report.metrics_text):
                target = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    labels = {**sample.labels, REPLICA_LABEL: report.replica}
                    target.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
        yield from merged.values()
