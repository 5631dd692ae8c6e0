"""The random-target bench bundle: a random Llama prepared beside the demo's int8 draft IR."""

from __future__ import annotations

import pytest

from research.bench.random_target import build_bundle
from xpuspec.api.pipeline import Pipeline
from xpuspec.models.bundle import ModelBundle
from xpuspec.sample.sampling_params import SamplingParams


@pytest.mark.slow
def test_a_random_target_pairs_with_the_demo_draft_and_speculates(tmp_path):
    parameters = build_bundle(tmp_path / "bundle", hidden_size=128, num_layers=2)
    assert 1e6 < parameters < 3e6  # the 110M default differs only in hidden size and layers
    bundle = ModelBundle.open(tmp_path / "bundle")  # checks every file's hash against the manifest
    assert bundle.draft is not None
    assert bundle.manifest["models"]["target"]["compression"]["weights"] == "int8"
    pipe = Pipeline(tmp_path / "bundle", drafter="draft", properties="exact", draft_properties="exact")
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, num_draft_tokens=3)
    result = pipe.generate("def f(", params)[0]
    alone = Pipeline(tmp_path / "bundle", drafter="none", properties="exact").generate("def f(", params)[0]
    assert result.token_ids == alone.token_ids and result.stats["drafted"] > 0
