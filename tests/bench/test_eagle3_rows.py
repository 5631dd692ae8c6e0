"""The bench's EAGLE-3 rows and the planner's EAGLE-3 candidates, built for a bundle with a head (no
timings run, no model loaded)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from xpuspec.bench.config import BenchConfig
from xpuspec.bench.figures import LatencyResult, RequestTiming, add_speedups
from xpuspec.bench.latency_labels import ADAPTIVE, BASELINE_OF, EAGLE3_KEY, XPUSPEC, XPUSPEC_EAGLE3, row_label
from xpuspec.bench.latency_rows import configurations
from xpuspec.devices.placement import Placement
from xpuspec.planning.planner import PlanConfig, candidate_placements

SAME = {"INFERENCE_PRECISION_HINT": "f32"}


def _bundle(eagle3: bool, draft: bool = True) -> SimpleNamespace:
    model = SimpleNamespace(path=Path("/nowhere"))
    return SimpleNamespace(
        target=model,
        draft=model if draft else None,
        eagle3=SimpleNamespace(path=Path("/nowhere")) if eagle3 else None,
    )


def _rows(tmp_path: Path, eagle3: bool):  # type: ignore[no-untyped-def]
    built: list[tuple] = []

    def build(drafter, properties, draft_properties):  # type: ignore[no-untyped-def]
        built.append((drafter, properties, draft_properties))
        return SimpleNamespace(proposer=None)  # a pipeline without drafter

    config = BenchConfig(out=tmp_path, draft_lengths=(2, 4))
    configs, engines = configurations(config, _bundle(eagle3), build, SAME, (None, None))  # type: ignore[arg-type]
    return configs, engines, built


def test_a_bundle_with_a_head_gets_eagle3_rows_beside_the_draft_rows(tmp_path: Path) -> None:
    configs, engines, built = _rows(tmp_path, eagle3=True)
    eagle3 = [c for c in configs if c.result.engine == XPUSPEC_EAGLE3]
    assert [c.result.name for c in eagle3] == [
        "xpuspec EAGLE-3 speculative (γ=2)",
        "xpuspec EAGLE-3 speculative (γ=4)",
        "xpuspec EAGLE-3 speculative (adaptive γ)",
    ]
    assert all(c.engine_key == EAGLE3_KEY and c.result.reason is None for c in eagle3)
    names = [c.result.name for c in configs]
    assert names.index("xpuspec speculative (adaptive γ)") < names.index(eagle3[0].result.name)
    engines[EAGLE3_KEY].build()
    assert built == [("eagle3", SAME, SAME)]  # the same properties as the draft-model rows


def test_a_bundle_without_a_head_has_no_eagle3_rows(tmp_path: Path) -> None:
    configs, engines, _ = _rows(tmp_path, eagle3=False)
    assert EAGLE3_KEY not in engines and not [c for c in configs if c.result.engine == XPUSPEC_EAGLE3]


def test_eagle3_speedups_are_over_xpuspec_target_only() -> None:
    def timed(engine: str, length, seconds: float) -> LatencyResult:
        result = LatencyResult(row_label(engine, length), engine, length)
        result.record_round([RequestTiming(3, list(range(8)), seconds, 0.01, seconds / 8)])
        return result

    results = [timed(XPUSPEC, None, 2.0), timed(XPUSPEC_EAGLE3, ADAPTIVE, 1.0)]
    summaries = {r.name: r.summary() for r in results}
    add_speedups(results, summaries, None, BASELINE_OF)
    assert summaries["xpuspec EAGLE-3 speculative (adaptive γ)"]["speedup"] == 2.0


def test_the_planner_tries_the_head_on_every_device_pair() -> None:
    config = PlanConfig(draft_lengths=(2,), adaptive=True)
    with_head = candidate_placements(_bundle(eagle3=True), ["CPU", "GPU"], config)  # type: ignore[arg-type]
    eagle3 = {c for c in with_head if c.drafter == "eagle3"}
    assert eagle3 == {
        Placement(target, draft, "eagle3", length)
        for target in ("CPU", "GPU")
        for draft in ("CPU", "GPU")
        for length in (2, None)
    }
    without = candidate_placements(_bundle(eagle3=False), ["CPU"], config)  # type: ignore[arg-type]
    assert not [c for c in without if c.drafter == "eagle3"]
