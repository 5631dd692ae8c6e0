"""The embedded demo pair: shipped, verified, sound for OpenVINO GenAI, and exact under speculation."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import F32
from xpuspec import Pipeline, SamplingParams
from xpuspec.bench.workloads import heldout_code_prompts
from xpuspec.models.demo import demo_bundle_path
from xpuspec.models.resolve import resolve_bundle

MAX_BUNDLE_BYTES = 20 * 1024 * 1024
GREEDY = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return [p.text for p in heldout_code_prompts(6, prompt_chars=300)]  # type: ignore[misc]


@pytest.fixture(scope="module")
def target_only(prompts) -> list[list[int]]:
    pipe = Pipeline("demo", drafter="none", properties=F32, use_placement=False)
    return [r.token_ids for r in pipe.generate(prompts, GREEDY)]


def test_demo_bundle_is_shipped_verified_and_small():
    bundle = resolve_bundle("demo", verify=True)
    assert bundle.draft is not None
    assert bundle.target.facts["architecture"] == "LlamaForCausalLM"
    for role in ("target", "draft"):
        assert bundle.model(role).facts["compression"]["mode"].startswith("int8")
        assert bundle.model(role).facts["compression"]["int8_constants"] > 0
    size = sum(p.stat().st_size for p in demo_bundle_path().rglob("*") if p.is_file())
    assert size <= MAX_BUNDLE_BYTES


def test_openvino_genai_loads_the_target_and_agrees(prompts, target_only):
    openvino_genai = pytest.importorskip("openvino_genai")
    import openvino as ov

    genai = openvino_genai.LLMPipeline(str(demo_bundle_path() / "target"), "CPU", **F32)
    assert genai.generate("def main():", max_new_tokens=8)  # text, through GenAI's own tokenizer
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = GREEDY.max_tokens
    config.ignore_eos = True
    tokenizer = Pipeline("demo", drafter="none", properties=F32, use_placement=False).tokenizer
    for prompt, expected in zip(prompts, target_only, strict=True):
        ids = np.array([tokenizer.encode(prompt)], dtype=np.int64)
        inputs = openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        assert list(genai.generate(inputs, config).tokens[0]) == expected


@pytest.mark.parametrize("drafter", ["draft", "ngram"])
def test_speculation_is_exact_and_accepts(prompts, target_only, drafter):
    pipe = Pipeline("demo", drafter=drafter, properties=F32, use_placement=False)
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True, num_draft_tokens=4)
    results = pipe.generate(prompts, params)
    assert [r.token_ids for r in results] == target_only
    if drafter == "draft":
        accepted = sum(r.stats["accepted"] for r in results)
        drafted = sum(r.stats["drafted"] for r in results)
        assert accepted / drafted > 0.2  # a trained pair agrees far more often than chance
