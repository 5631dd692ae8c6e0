"""A Pipeline with its target on the TORCH reference executor and its draft on the CPU."""

from __future__ import annotations

from tests.conftest import F32
from xpuspec import Pipeline, SamplingParams
from xpuspec_plugins.torch_runner import TorchModelRunner

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
PROMPTS = ["def add(a, b):", "The quick brown fox", "import os\n"]


def test_torch_target_with_an_openvino_draft_is_exact(pair_bundle):
    alone = Pipeline(pair_bundle, target_device="TORCH", drafter="none")
    assert isinstance(alone.target_runner, TorchModelRunner)
    expected = [result.token_ids for result in alone.generate(PROMPTS, GREEDY)]

    speculative = Pipeline(
        pair_bundle, target_device="TORCH", draft_device="CPU", drafter="draft", properties=F32
    )
    assert speculative.draft_device.device == "CPU"
    # A fixed γ: adaptive γ may rightly decline to draft for a target this small.
    results = speculative.generate(
        PROMPTS, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, num_draft_tokens=3)
    )
    assert [result.token_ids for result in results] == expected
    assert sum(result.stats["drafted"] for result in results) > 0
