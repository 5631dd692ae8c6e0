"""Start-up caches (xpuspec.api.calibration_cache): a second start of the same setup replays the first
start's calibration timings."""

from __future__ import annotations

import dataclasses

import numpy as np

from tests.conftest import EXACT_PRESET
from xpuspec.api import calibration_cache
from xpuspec.api.pipeline import Pipeline
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
    first = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    stored = list((calibration_cache.cache_dir() / calibration_cache.FOLDER).glob("*.json"))
    assert stored, "the first start stores its timings"
    calls = _count_target_forwards(Pipeline, monkeypatch)
    second = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    # Timed figures are never equal twice; replayed ones are.
    np.testing.assert_array_equal(_cost_figures(second), _cost_figures(first))
    # Only the warm-up passes ran: the target's one per verification size, one per size timed at the
    # largest batch, and the draft's two (PagedModelRunner runs both), none of the timed rounds.
    largest = second.engine.config.max_draft_tokens + 1
    assert calls[0] == largest + len(batch_calibration_sizes(second.engine.config, largest)) + 2
    params = SamplingParams(max_tokens=12, temperature=0)
    prompt = "def add(a, b):"
    assert second.generate(prompt, params)[0].text == first.generate(prompt, params)[0].text


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
    import json

    again = CalibrationTimings.from_json(json.loads(json.dumps(timings.to_json())))
    assert dataclasses.asdict(again) == dataclasses.asdict(timings)


def test_a_damaged_store_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("XPUSPEC_CACHE", str(tmp_path))
    folder = tmp_path / calibration_cache.FOLDER
    folder.mkdir()
    (folder / "k.json").write_text("{not json")
    assert calibration_cache.load("k") is None
    assert calibration_cache.load("absent") is None
