"""Ray Serve's request-router API, implemented by prefix affinity (``request_router_config``).

Serve builds one router per deployment handle, in the process that holds the handle (the ingress
replica), and calls :meth:`PrefixAffinityRouter.choose_replicas` for each request to the engine
replicas. The router reads the prompt's token ids from the request's arguments (a list of
:class:`~xpuspec.api.engine_loop.ChoiceRequest`), computes their block digests, and ranks the
replica that holds the longest prefix first (:func:`~xpuspec.cluster.routing.decide`); the rest
follow, least loaded first. Replicas report their cached digests through Serve's routing stats
(``record_routing_stats``), which reach the router with each replica-set update.

``request_router_kwargs``: ``policy`` (``"affinity"``, or ``"random"``: the baseline it is measured
against), ``imbalance_threshold`` (how many more queued requests than the least loaded replica the
best-matching one may have before the least loaded gets the request), ``recent_ttl_s``.

Serve pickles this module by value to ship the class: shared state (the report board) is reached
through the ``reports`` module, which pickles by reference, never bound to a name here.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from xpuspec.cluster import reports
from xpuspec.cluster.prefix_index import CacheGeometry, PrefixIndex, prompt_digests
from xpuspec.cluster.routing import Decision, Outcome, decide

logger = logging.getLogger(__name__)

DEFAULT_IMBALANCE_THRESHOLD = 4
MAX_PENDING_DECISIONS = 10000


class PrefixAffinityRouter(RequestRouter):
    """Longest cached prefix first, the least loaded replica when that one's queue is too long."""

    def initialize_state(
        self,
        policy: str = "affinity",
        imbalance_threshold: int = DEFAULT_IMBALANCE_THRESHOLD,
        recent_ttl_s: float = 30.0,
        **_: Any,
    ) -> None:
        if policy not in ("affinity", "random"):
            raise ValueError(f"policy must be 'affinity' or 'random', got {policy!r}")
        self._policy = policy
        self._imbalance_threshold = imbalance_threshold
        self._index = PrefixIndex(recent_ttl_s=recent_ttl_s)
        self._geometry: CacheGeometry | None = None
        self._seen_reports: dict[str, int] = {}
        # The decision taken for each request being routed (counted once it is sent). A request
        # cancelled before it was sent leaves its entry: the oldest go beyond MAX_PENDING_DECISIONS.
        self._decisions: OrderedDict[str, tuple[Decision, list[bytes]]] = OrderedDict()

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._take_reports(replicas)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        self._take_reports(candidate_replicas)
        by_key = {_key(replica.replica_id): replica for replica in candidate_replicas}
        if self._policy == "random":
            first = random.choice(candidate_replicas)
            self._remember(pending_request, Decision(_key(first.replica_id), "random"), [])
            return [[first], candidate_replicas]
        digests = self._digests(pending_request)
        queues = {key: self._queue_length(replica) for key, replica in by_key.items()}
        decision = decide(self._index.matches(digests, by_key), queues, self._imbalance_threshold)
        self._remember(pending_request, decision, digests)
        if decision.preferred is None:
            return [candidate_replicas]
        preferred = by_key[decision.preferred]
        return [[preferred], [replica for replica in candidate_replicas if replica is not preferred]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        decision, digests = self._decisions.pop(_request_id(pending_request), (Decision(None, "miss"), []))
        key = _key(replica_id)
        outcome: Outcome = decision.outcome
        if outcome == "affinity" and decision.preferred != key:
            outcome = "fallback"  # the preferred replica refused (its queue was full)
        reports.REPORTS.counts.add(outcome)
        if digests:
            self._index.routed(key, digests)

    # ------------------------------------------------------------------ helpers
    def _remember(
        self, pending_request: PendingRequest | None, decision: Decision, digests: list[bytes]
    ) -> None:
        if pending_request is not None:
            self._decisions[_request_id(pending_request)] = (decision, digests)
            while len(self._decisions) > MAX_PENDING_DECISIONS:
                self._decisions.popitem(last=False)

    def _digests(self, pending_request: PendingRequest | None) -> list[bytes]:
        if pending_request is None or self._geometry is None or not pending_request.args:
            return []
        choices = pending_request.args[0]
        if not isinstance(choices, list) or not choices:
            return []
        return prompt_digests(choices[0].prompt_token_ids, self._geometry)

    def _queue_length(self, replica: RunningReplica) -> int:
        cached = self.replica_queue_len_cache.get(replica.replica_id)
        if cached is not None:
            return int(cached)
        report = reports.REPORTS.get(_key(replica.replica_id))
        return report.num_in_flight if report is not None else 0

    def _take_reports(self, replicas: list[RunningReplica]) -> None:
        """Fold new routing stats into the index; forget replicas that are gone."""
        keys = []
        for replica in replicas:
            key = _key(replica.replica_id)
            keys.append(key)
            report = reports.ReplicaReport.from_stats(key, replica.routing_stats)
            if report is None or self._seen_reports.get(key) == report.sequence:
                continue
            self._seen_reports[key] = report.sequence
            self._geometry = report.geometry
            self._index.report(key, report.digests)
            reports.REPORTS.put(report)
        self._index.retain(keys)
        reports.REPORTS.retain(keys)
        for key in list(self._seen_reports):
            if key not in keys:
                del self._seen_reports[key]


def _key(replica_id: ReplicaID) -> str:
    return replica_id.unique_id


def _request_id(pending_request: PendingRequest) -> str:
    return pending_request.metadata.internal_request_id
