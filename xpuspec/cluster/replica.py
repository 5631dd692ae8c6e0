"""One engine replica: a Serve deployment that owns a Pipeline in the server's own EngineLoop.

``generate`` streams the events of one request's choices (lists of
:class:`~xpuspec.api.engine_loop.ChoiceEvent`, one per engine iteration that had any) to the
ingress. ``check_health`` is the engine's own health (the loop is stepping, as ``/health`` says).
``record_routing_stats`` reports what the prefix cache holds, the requests in flight and the
replica's Prometheus text (:class:`~xpuspec.cluster.reports.ReplicaReport`).

Scale-down drains: Serve stops routing to a replica it is about to stop and waits (up to
``graceful_shutdown_timeout_s``) for its requests to finish before the replica's ``__del__`` stops
the loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from xpuspec.api.engine_loop import ChoiceEvent, ChoiceRequest, EngineLoop
from xpuspec.cluster.prefix_index import DIGEST_BYTES, CacheGeometry
from xpuspec.cluster.reports import ReplicaReport
from xpuspec.cluster.settings import ClusterSettings
from xpuspec.core.prefix_cache import PrefixCachingBlockManager
from xpuspec.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 600.0
# How long one wait for a request's next events lasts before the stream looks again (a cancelled
# stream is noticed within this).
EVENT_WAIT_S = 0.5
# How long __del__ waits for requests still in flight (Serve has already drained them by then).
STOP_WAIT_S = 30.0


class EngineReplica:
    """The deployment class of the engine replicas (wrapped by ``serve.deployment`` in application.py)."""

    _started_loop: EngineLoop | None = None  # set once the loop runs: what __del__ stops

    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = ClusterSettings.from_args(settings)
        self.metrics = ServerMetrics(lambda: self.loop.snapshot, lambda: self.loop.num_in_flight)
        self.loop = EngineLoop(
            self._settings.load_pipeline,
            max_in_flight=self._settings.replica_max_in_flight,
            on_finish=self.metrics.record_finished,
            on_cancel=self.metrics.cancelled_requests.inc,
        )
        self.loop.start()
        self._started_loop = self.loop
        if not self.loop.ready.wait(LOAD_TIMEOUT_S) or self.loop.load_error is not None:
            # Serve reports the replica as failed to start, with this message.
            raise RuntimeError(f"the engine did not load: {self.loop.load_error or 'timed out'}")
        # The threads that wait for events, one per stream: a Condition wait each, no CPU.
        self._waiters = ThreadPoolExecutor(
            max_workers=max(64, os.cpu_count() or 1), thread_name_prefix="events"
        )
        self._reports = itertools.count()

    async def generate(self, choices: list[ChoiceRequest]) -> AsyncIterator[list[ChoiceEvent]]:
        """The events of the request's choices until all finished; aborts them if cancelled."""
        generation = self.loop.submit(choices)
        running = asyncio.get_running_loop()
        try:
            while not generation.done:
                events = await running.run_in_executor(self._waiters, generation.take_events, EVENT_WAIT_S)
                if events:
                    yield events
        finally:
            generation.cancel()  # a no-op once every choice finished

    def check_health(self) -> None:
        """Serve's health check: the engine loop is alive and stepping (not stalled, not failed)."""
        if not self.loop.stepping:
            raise RuntimeError("the engine loop is not stepping (stalled, failed or stopped)")

    def record_routing_stats(self) -> dict[str, Any]:
        """What the router needs: the prefix cache's block digests, the load, and the metrics."""
        pipeline = self.loop.pipeline
        assert pipeline is not None
        block_manager = pipeline.block_manager
        if isinstance(block_manager, PrefixCachingBlockManager):
            root = block_manager.root_digest
            digests = tuple(digest[:DIGEST_BYTES] for digest in block_manager.cached_digests())
        else:
            root, digests = b"", ()
        report = ReplicaReport(
            replica="",  # the router names replicas by Serve's id
            sequence=next(self._reports),
            geometry=CacheGeometry(root, block_manager.block_size),
            digests=digests,
            num_in_flight=self.loop.num_in_flight,
            metrics_text=self.metrics.render().decode(),
        )
        return report.to_stats()

    def __del__(self) -> None:
        loop = self._started_loop
        if loop is None:  # __init__ failed before the loop started
            return
        loop.stop_accepting()
        if not loop.wait_idle(STOP_WAIT_S):
            logger.warning("stopping with %d requests still in flight", loop.num_in_flight)
        loop.stop()
