"""Trees on the default model (SmolLM2-135M and its shipped draft): used, and exact at f32."""

from __future__ import annotations

import pytest

from tests.conftest import EXACT_PRESET
from xpuspec import Pipeline, SamplingParams

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

TREE = {"depth": 4, "width": 2, "nodes": 8}
QUESTIONS = ["Write a Python function that adds two numbers."]


def test_default_model_verifies_trees_and_matches_target_only(smollm2_gguf):
    # Default properties and no default tree: the CPU's u8 key cache is switched to per-token scales
    # anyway, so a request that asks for a tree (e.g. the server's draft_tree field) gets one.
    pipe = Pipeline(None, use_placement=False)
    assert pipe.engine.tree_drafter is not None and pipe.target_runner.supports_trees
    asked = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, draft_tree=TREE)
    assert pipe.generate(["def add(a, b):"], asked)[0].stats["tree_verifications"] > 0
    del pipe
    exact = Pipeline(None, properties=EXACT_PRESET, draft_tree=TREE, use_placement=False)
    alone = Pipeline(None, drafter="none", properties=EXACT_PRESET, use_placement=False)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        tree = exact.generate([messages], params)[0]
        assert tree.token_ids == alone.generate([messages], params)[0].token_ids
        assert tree.stats["tree_verifications"] > 0
