"""Speculation across tokenizers through the real engine (xpuspec/spec_decode/cross_tokenizer.py): a draft
with a tokenizer of its own drafts for a tiny target, and the output is the target's alone.

Greedy: token for token in exact mode, at fixed and adaptive γ, alone and in a batch. Sampled: the
proposals are target tokens without a distribution, verified with q one-hot, which keeps the target's
distribution exactly; the chi-square test of tests/engine/test_sampling_distribution.py checks the first
three tokens' joint frequencies against the target's own probabilities, and a broken rule must fail it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import F32
from tests.support.statistics import goodness_of_fit, sampling_engine_config, target_joint
from xpuspec import Pipeline, SamplingParams
from xpuspec.engine.engine import EngineConfig
from xpuspec.models.bundle import ModelBundle
from xpuspec.spec_decode.cross_tokenizer import CrossTokenizerDrafter
from xpuspec.spec_decode.rejection_sampler import RejectionSampler

PROMPTS = [
    "def add(a, b):",
    "class Point:\n    def __init__(self, x, y):",
    "The quick brown fox",
    "for i in range(10):\n",
    "import os\nimport sys\n\nprint(",
]
GREEDY = dict(max_tokens=40, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def target_alone(translating_bundle: Path) -> list[list[int]]:
    pipe = Pipeline(translating_bundle, drafter="none", properties=F32)
    return [r.token_ids for r in pipe.generate(PROMPTS, SamplingParams(**GREEDY))]


@pytest.fixture(scope="module")
def drafting_pipe(translating_bundle: Path) -> Pipeline:
    return Pipeline(translating_bundle, drafter="draft", properties=F32)


def test_the_pair_translates(translating_bundle: Path, drafting_pipe: Pipeline) -> None:
    bundle = ModelBundle.open(translating_bundle)
    assert bundle.translates_tokens
    assert "vocabularies differ" in bundle.manifest["pairing"]["difference"]
    assert isinstance(drafting_pipe.proposer, CrossTokenizerDrafter)
    assert drafting_pipe.drafter == "draft"


@pytest.mark.parametrize("gamma", [1, 3, 5, None], ids=["g1", "g3", "g5", "adaptive"])
def test_greedy_output_is_the_targets_alone(drafting_pipe: Pipeline, target_alone, gamma) -> None:
    params = SamplingParams(**GREEDY, num_draft_tokens=gamma)
    results = drafting_pipe.generate(PROMPTS, params)  # all five in one batch
    assert [r.token_ids for r in results] == target_alone
    if gamma is not None:
        drafted = sum(r.stats["drafted"] for r in results)
        accepted = sum(r.stats["accepted"] for r in results)
        assert drafted > 0 and 0 < accepted < drafted  # drafts were translated, some accepted, some not


def test_greedy_output_alone_and_without_prompt_lookup(translating_bundle: Path, target_alone) -> None:
    config = EngineConfig(max_model_len=ModelBundle.open(translating_bundle).max_context, prompt_lookup=False)
    pipe = Pipeline(translating_bundle, drafter="draft", properties=F32, engine_config=config)
    for prompt, want in zip(PROMPTS, target_alone, strict=True):
        result = pipe.generate(prompt, SamplingParams(**GREEDY, num_draft_tokens=4))[0]
        assert result.token_ids == want
        assert result.stats["lookup_drafted"] == 0  # every draft came from the draft model
    assert isinstance(pipe.proposer, CrossTokenizerDrafter)
    assert pipe.proposer._sequences == {}  # every finished request's draft state was released


# ------------------------------------------------------------------ sampling
SAMPLING_PROMPT = "def add(a, b):"
NUM_SAMPLES = 4000
SIGNIFICANCE = 1e-3
SAMPLED = dict(max_tokens=4, temperature=1.5, top_k=3, ignore_eos=True, num_draft_tokens=2)


@pytest.fixture(scope="module")
def exact_joint(translating_bundle: Path) -> dict[tuple[int, int, int], float]:
    """p(t1, t2, t3) of the target alone under the same top-k/temperature transform."""
    return target_joint(translating_bundle, SAMPLING_PROMPT, SAMPLED)


def sample_triples(translating_bundle: Path, seeded: bool) -> list[tuple[int, ...]]:
    config = sampling_engine_config(translating_bundle)
    pipe = Pipeline(translating_bundle, drafter="draft", properties=F32, engine_config=config)
    params = [SamplingParams(seed=seed if seeded else None, **SAMPLED) for seed in range(NUM_SAMPLES)]
    results = pipe.generate([SAMPLING_PROMPT] * NUM_SAMPLES, params)
    drafted = [r.stats["drafted"] - r.stats["lookup_drafted"] for r in results]
    # The draft model's translated drafts were verified in a good share of the requests (after a random
    # first token the tiny draft's text often translates to no whole target token before the last).
    assert sum(1 for count in drafted if count > 0) > NUM_SAMPLES // 4
    return [tuple(r.token_ids[:3]) for r in results]


@pytest.mark.slow
@pytest.mark.parametrize("seeded", [False, True], ids=["rejection", "coupled"])
def test_sampled_output_follows_the_targets_distribution(translating_bundle, exact_joint, seeded) -> None:
    p_value = goodness_of_fit(sample_triples(translating_bundle, seeded), exact_joint)
    assert p_value > SIGNIFICANCE, f"chi-square p = {p_value:.2e}"


@pytest.mark.slow
def test_a_broken_rule_is_caught_with_the_same_budget(translating_bundle, exact_joint, monkeypatch) -> None:
    monkeypatch.setattr(RejectionSampler, "acceptance_probability", staticmethod(lambda p, q: 1.0))
    p_value = goodness_of_fit(sample_triples(translating_bundle, seeded=False), exact_joint)
    assert p_value < SIGNIFICANCE, f"a broken rule passed: chi-square p = {p_value:.2e}"
