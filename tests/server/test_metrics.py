"""The server's Prometheus counters (xpuspec.server.metrics) as a finished request feeds them: the target
passes and verification steps `bench --mode categories` reads beside the draft counts."""

from __future__ import annotations

from xpuspec.api.engine_loop import EngineSnapshot
from xpuspec.core.request_stats import RequestStats
from xpuspec.server.metrics import ServerMetrics


def _samples(metrics: ServerMetrics) -> dict[str, float]:
    samples = {}
    for line in metrics.render().decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_finished_requests_count_their_target_passes_and_verifications() -> None:
    metrics = ServerMetrics(EngineSnapshot, lambda: 0)
    speculative = RequestStats(arrival_time=0.0, max_draft_tokens=4)
    speculative.record_tokens(1, 0.1)  # the prefill's token
    for drafted, accepted in ((4, 3), (4, 1)):
        speculative.record_verification(drafted, accepted)
        speculative.record_tokens(accepted + 1, 0.2)
    plain = RequestStats(arrival_time=0.0, max_draft_tokens=0)
    for _ in range(5):
        plain.record_tokens(1, 0.3)
    metrics.record_finished(10, speculative, "length")
    metrics.record_finished(10, plain, "length")
    samples = _samples(metrics)
    assert samples["xpuspec_target_passes_total"] == 3 + 5
    assert samples["xpuspec_spec_verification_steps_total"] == 2
    assert samples["xpuspec_generation_tokens_total"] == 7 + 5
    assert (
        samples["xpuspec_spec_draft_tokens_total"] == 8 and samples["xpuspec_spec_accepted_tokens_total"] == 4
    )
    # The gauge the counters agree with: (accepted + verifications) / verifications.
    assert samples["xpuspec_spec_accepted_tokens_per_target_pass"] == 3.0
