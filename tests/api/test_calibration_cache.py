"""Start-up caches (xpuspec.api.calibration_cache): a second start of the same setup replays the first
start's calibration timings."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from tests.conftest import EXACT_PRESET
from xpuspec.api import calibration_cache
from xpuspec.api.pipeline import Pipeline
from xpuspec.engine import calibration
from xpuspec.engine.calibration import CalibrationTimings, batch_calibration_sizes
from xpuspec.sample.sampling_params import SamplingParams


def _cost_figures(pipe: Pipeline) -> tuple[float, ...]:
    cost = pipe.engine.cost_model
    return (
        cost.target.intercept,
        cost.target.slope,
        cost.draft.intercept,
        cost.shape_change,
        *(cost.target_cost(n, 1) for n in range(1, 5)),
        *(cost.drafting_cost(gamma, 1) for gamma in range(1, 4)),
    )


def _count_target_forwards(pipe_class: type[Pipeline], monkeypatch) -> list[int]:
    from xpuspec.executor.paged_runner import PagedModelRunner

    calls = [0]
    forward = PagedModelRunner.forward

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(PagedModelRunner, "forward", counted)
    return calls


def test_a_second_start_replays_the_first_starts_timings(pair_bundle, monkeypatch):
    # The check that the stored figures still hold (the next test) passes whatever the machine's noise.
    monkeypatch.setattr(calibration, "STORED_SHAPE_TOLERANCE", float("inf"))
    first = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    stored = list((calibration_cache.cache_dir() / calibration_cache.FOLDER).glob("*.json"))
    assert stored, "the first start stores its timings"
    calls = _count_target_forwards(Pipeline, monkeypatch)
    second = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    # Timed figures are never equal twice; replayed ones are.
    np.testing.assert_array_equal(_cost_figures(second), _cost_figures(first))
    # Only the warm-up passes ran: the target's one per verification size, one per size timed at the
    # largest batch, and the draft's two (PagedModelRunner runs both); then the check of the stored
    # figures, four passes of the smallest size and four of the largest; none of the timed rounds.
    largest = second.engine.config.max_draft_tokens + 1
    check = 2 * 4
    assert calls[0] == largest + len(batch_calibration_sizes(second.engine.config, largest)) + 2 + check
    params = SamplingParams(max_tokens=12, temperature=0)
    prompt = "def add(a, b):"
    assert second.generate(prompt, params)[0].text == first.generate(prompt, params)[0].text


def test_stored_timings_whose_shape_no_longer_holds_are_timed_again_and_replaced(pair_bundle):
    """A calibration stored while the machine was busy priced the larger verifications far above their
    cost; the next start notices (the largest size over one token, timed again) and times afresh."""
    Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    (path,) = (calibration_cache.cache_dir() / calibration_cache.FOLDER).glob("*.json")
    timings = CalibrationTimings.from_json(json.loads(path.read_text()))
    largest = max(size for _, size, _ in timings.target)
    distorted = [
        (seqs, size, seconds * (4 if size == largest else 1)) for seqs, size, seconds in timings.target
    ]
    path.write_text(json.dumps(dataclasses.replace(timings, target=distorted).to_json()))
    second = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    restored = CalibrationTimings.from_json(json.loads(path.read_text()))
    assert restored.target != distorted and restored.target != timings.target  # timed again, stored

    def ratio(rows: list[tuple[int, int, float]]) -> float:
        fastest = {
            n: min(seconds for seqs, size, seconds in rows if seqs == 1 and size == n) for n in (1, largest)
        }
        return fastest[largest] / fastest[1]

    assert ratio(restored.target) < 2 * ratio(timings.target)  # the distorted store said 4 times
    curve = second.engine.cost_model.verify.table(1)
    assert curve[largest]["calibrated"] == min(s for q, n, s in restored.target if q == 1 and n == largest)


def test_the_shape_check_compares_the_ratio_of_the_largest_size_to_one_token(monkeypatch):
    stored = CalibrationTimings(target=[(1, 1, 0.010), (1, 1, 0.012), (1, 4, 0.020), (1, 4, 0.030)])
    chunks = {1: "one", 2: "two", 4: "four"}

    def holds(now: dict[str, float]) -> bool:
        monkeypatch.setattr(calibration, "_steady_seconds", lambda engine, chunk: now[chunk])
        return calibration.stored_shape_holds(None, chunks, stored)  # type: ignore[arg-type]

    assert holds({"one": 0.010, "four": 0.020})  # the stored fastest passes: a ratio of 2
    assert holds({"one": 0.030, "four": 0.060})  # every size 3 times slower: the shape holds
    assert not holds({"one": 0.010, "four": 0.030})  # the largest 1.5 times dearer
    assert not holds({"one": 0.010, "four": 0.014})  # or cheaper
    assert calibration.stored_shape_holds(None, {1: "one"}, stored)  # type: ignore[arg-type]


def test_another_setup_or_no_cache_times_again(pair_bundle):
    first = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    fresh = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET, startup_cache=False)
    assert _cost_figures(fresh) != _cost_figures(first)
    other = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET, num_kv_blocks=64)
    assert _cost_figures(other) != _cost_figures(first)


def test_timings_survive_their_json_form():
    timings = CalibrationTimings(
        target=[(1, 1, 0.01), (1, 3, 0.02)], shape_change=[0.001], draft=[0.002], drafting=[(1, 2, 0.005)]
    )

    again = CalibrationTimings.from_json(json.loads(json.dumps(timings.to_json())))
    assert dataclasses.asdict(again) == dataclasses.asdict(timings)


def test_a_damaged_store_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("XPUSPEC_CACHE", str(tmp_path))
    folder = tmp_path / calibration_cache.FOLDER
    folder.mkdir()
    (folder / "k.json").write_text("{not json")
    assert calibration_cache.load("k") is None
    assert calibration_cache.load("absent") is None
