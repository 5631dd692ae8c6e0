"""Prometheus metrics of one app, in its own registry (so two apps in one process never collide)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from xpuspec.api.engine_loop import EngineSnapshot
from xpuspec.core.request_stats import RequestStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class ServerMetrics:
    """Counters fed by the engine loop and HTTP hooks; gauges read the loop's snapshot at scrape time."""

    def __init__(self, snapshot: Callable[[], EngineSnapshot], num_in_flight: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        # Totals since start, read by the ratio gauges at scrape time.
        self._drafted_total = 0
        self._accepted_total = 0
        self._verifications_total = 0
        self._prompt_total = 0
        self._cached_prompt_total = 0
        # Registered in this order, the order /metrics lists them.
        self._register_request_metrics()
        self._register_speculation_metrics()
        self._register_engine_gauges(snapshot, num_in_flight)

    def _register_request_metrics(self) -> None:
        """Requests answered and finished, their tokens and their latencies."""
        registry = self.registry
        self.http_requests = Counter(
            "xpuspec_http_requests", "HTTP requests answered", ["endpoint", "status"], registry=registry
        )
        self.finished_requests = Counter(
            "xpuspec_requests_finished",
            "Engine requests (choices) finished",
            ["finish_reason"],
            registry=registry,
        )
        self.cancelled_requests = Counter(
            "xpuspec_requests_cancelled",
            "Engine requests aborted because their client left",
            registry=registry,
        )
        self.prompt_tokens = Counter("xpuspec_prompt_tokens", "Prompt tokens processed", registry=registry)
        self.generation_tokens = Counter("xpuspec_generation_tokens", "Tokens generated", registry=registry)
        self.target_passes = Counter(
            "xpuspec_target_passes",
            "Target passes that gave a request tokens, once per request (a batched pass once per request "
            "in it): generated tokens over these are the tokens each pass yields",
            registry=registry,
        )
        self.time_to_first_token = Histogram(
            "xpuspec_time_to_first_token_seconds",
            "Arrival to first generated token",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.time_per_output_token = Histogram(
            "xpuspec_time_per_output_token_seconds",
            "Mean gap between generated tokens of a request",
            buckets=PER_TOKEN_BUCKETS,
            registry=registry,
        )

    def _register_speculation_metrics(self) -> None:
        """Draft tokens proposed and accepted: in all, by position, by prompt lookup and in trees."""
        registry = self.registry
        self.draft_tokens = Counter("xpuspec_spec_draft_tokens", "Draft tokens proposed", registry=registry)
        self.accepted_tokens = Counter(
            "xpuspec_spec_accepted_tokens", "Draft tokens accepted by the target", registry=registry
        )
        self.drafted_per_position = Counter(
            "xpuspec_spec_draft_tokens_per_position",
            "Draft tokens proposed at each draft position",
            ["position"],
            registry=registry,
        )
        self.accepted_per_position = Counter(
            "xpuspec_spec_accepted_tokens_per_position",
            "Draft tokens accepted at each draft position",
            ["position"],
            registry=registry,
        )
        self.verification_steps = Counter(
            "xpuspec_spec_verification_steps",
            "Target passes that verified a request's draft tokens, once per request",
            registry=registry,
        )
        acceptance = Gauge(
            "xpuspec_spec_acceptance_rate", "Accepted / proposed draft tokens since start", registry=registry
        )
        acceptance.set_function(self._acceptance_rate)
        # Tree speculation: trees verified, their nodes, and the depth each accepted path reached.
        self.tree_verifications = Counter(
            "xpuspec_spec_tree_verifications", "Draft trees verified by the target", registry=registry
        )
        self.tree_nodes = Counter(
            "xpuspec_spec_tree_nodes_verified", "Draft tree nodes verified by the target", registry=registry
        )
        self.tree_accepted_depth = Counter(
            "xpuspec_spec_tree_accepted_depth",
            "Tree verifications whose accepted path reached each depth",
            ["depth"],
            registry=registry,
        )
        self.lookup_draft_tokens = Counter(
            "xpuspec_spec_lookup_draft_tokens",
            "Of the draft tokens, those drafted by prompt lookup beside the draft model",
            registry=registry,
        )
        self.lookup_accepted_tokens = Counter(
            "xpuspec_spec_lookup_accepted_tokens",
            "Of the accepted draft tokens, those drafted by prompt lookup",
            registry=registry,
        )
        Gauge(
            "xpuspec_spec_accepted_tokens_per_target_pass",
            "Tokens emitted per verifying target pass (accepted drafts + 1) since start",
            registry=registry,
        ).set_function(self._tokens_per_target_pass)

    def _register_engine_gauges(
        self, snapshot: Callable[[], EngineSnapshot], num_in_flight: Callable[[], int]
    ) -> None:
        """The engine loop's state, read from its snapshot at scrape time, and the prefix cache's hits."""
        registry = self.registry

        def gauge(name: str, documentation: str, read: Callable[[], float]) -> None:
            Gauge(name, documentation, registry=registry).set_function(read)

        gauge("xpuspec_requests_running", "Requests in the running batch", lambda: snapshot().num_running)
        gauge("xpuspec_queue_depth", "Requests waiting for a batch slot", lambda: snapshot().num_waiting)
        gauge("xpuspec_requests_in_flight", "Admitted requests not yet finished", lambda: num_in_flight())
        gauge("xpuspec_kv_cache_blocks_used", "KV-cache blocks held", lambda: snapshot().kv_blocks_used)
        gauge("xpuspec_kv_cache_blocks_total", "KV-cache blocks in all", lambda: snapshot().kv_blocks_total)
        gauge(
            "xpuspec_kv_cache_usage_ratio",
            "Fraction of KV-cache blocks held",
            lambda: snapshot().kv_blocks_used / max(1, snapshot().kv_blocks_total),
        )

        gauge(
            "xpuspec_prefix_cache_blocks",
            "KV-cache blocks holding a reusable prompt prefix (held or free)",
            lambda: snapshot().prefix_cached_blocks,
        )
        self.cached_prompt_tokens = Counter(
            "xpuspec_prefix_cache_hit_tokens",
            "Prompt tokens of finished requests whose KV came from the prefix cache",
            registry=registry,
        )
        gauge(
            "xpuspec_prefix_cache_hit_rate",
            "Cached / all prompt tokens of finished requests since start",
            lambda: self._cached_prompt_total / self._prompt_total if self._prompt_total else 0.0,
        )

        registry.register(_EngineFailures(snapshot))

    def _tokens_per_target_pass(self) -> float:
        if not self._verifications_total:
            return 0.0
        return (self._accepted_total + self._verifications_total) / self._verifications_total

    def _acceptance_rate(self) -> float:
        return self._accepted_total / self._drafted_total if self._drafted_total else 0.0

    def record_finished(self, num_prompt_tokens: int, stats: RequestStats, finish_reason: str) -> None:
        """Called by the engine loop thread when a choice ends."""
        self.finished_requests.labels(finish_reason).inc()
        self.prompt_tokens.inc(num_prompt_tokens)
        cached = min(stats.cached_tokens or 0, num_prompt_tokens)
        self.cached_prompt_tokens.inc(cached)
        self._prompt_total += num_prompt_tokens
        self._cached_prompt_total += cached
        self.generation_tokens.inc(stats.num_output_tokens)
        self.target_passes.inc(stats.target_passes)
        if stats.ttft_s is not None:
            self.time_to_first_token.observe(stats.ttft_s)
        if stats.num_output_tokens > 1 and stats.first_token_time is not None and stats.last_token_time:
            gap = (stats.last_token_time - stats.first_token_time) / (stats.num_output_tokens - 1)
            self.time_per_output_token.observe(gap)
        self.draft_tokens.inc(stats.drafted)
        self.accepted_tokens.inc(stats.accepted)
        self._drafted_total += stats.drafted
        self._accepted_total += stats.accepted
        self._verifications_total += stats.verification_steps
        self.verification_steps.inc(stats.verification_steps)
        self.lookup_draft_tokens.inc(stats.lookup_drafted)
        self.lookup_accepted_tokens.inc(stats.lookup_accepted)
        self.tree_verifications.inc(stats.tree_verifications)
        self.tree_nodes.inc(stats.tree_nodes_verified)
        for depth, count in stats.accepted_depths.items():
            self.tree_accepted_depth.labels(str(depth)).inc(count)
        for position, (drafted, accepted) in enumerate(
            zip(stats.drafted_per_position, stats.accepted_per_position, strict=True)
        ):
            if drafted:
                self.drafted_per_position.labels(str(position)).inc(drafted)
                self.accepted_per_position.labels(str(position)).inc(accepted)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineFailures(Collector):
    """Counters the engine loop keeps itself (in its snapshot), exposed at scrape time."""

    def __init__(self, snapshot: Callable[[], EngineSnapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[CounterMetricFamily]:
        # Called at registration, before the loop exists: names only, no snapshot.
        return self._families(EngineSnapshot())

    def collect(self) -> Iterator[CounterMetricFamily]:
        return self._families(self._snapshot())

    @staticmethod
    def _families(snapshot: EngineSnapshot) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "xpuspec_engine_failures",
            "Engine steps that failed as a whole (every request in them ended; the engine recovered)",
            value=snapshot.engine_failures,
        )
        yield CounterMetricFamily(
            "xpuspec_requests_failed",
            "Engine requests (choices) ended by an error: their own or an engine failure",
            value=snapshot.requests_failed,
        )
