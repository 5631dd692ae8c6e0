"""Sampled speculative output follows the target's distribution, through the whole engine.

The sampler's own statistical tests (tests/spec_decode/test_rejection_sampler.py) use made-up
distributions; this one runs the real models: the first three tokens after a prompt, where the
first comes from the prefill and the next two through one speculative step with γ = 2 drafts
from the draft model. Their joint frequencies over many seeded requests are compared with the
exact target probabilities p(t1) p(t2|t1) p(t3|t1,t2), computed from the target's logits, by a
chi-square goodness-of-fit test. The test passes when p > 1e-3; a deliberately broken rule must
fail it (p < 1e-3) with the same samples budget.

Both verification rules are covered: unseeded requests go through the rejection sampler, seeded
ones through the coupled exponential race (noise keyed by seed and token position).
"""

from __future__ import annotations

import itertools

import pytest

from tests.conftest import F32
from tests.support.statistics import goodness_of_fit, sampling_engine_config, target_joint
from xpuspec import Pipeline, SamplingParams
from xpuspec.engine import drafting, verification
from xpuspec.spec_decode.rejection_sampler import RejectionSampler

PROMPT = "def add(a, b):"
NUM_SAMPLES = 6000
SIGNIFICANCE = 1e-3
# A small support keeps the table small enough for the sample count: 3 x 3 x 3 cells.
# max_tokens 4: the speculative step may emit 2 accepted drafts and a bonus token (t2, t3, t4).
PARAMS = dict(
    max_tokens=4, temperature=1.5, top_k=3, top_p=1.0, min_p=0.0, ignore_eos=True, num_draft_tokens=2
)


# Strong repetition penalties: a token drafted before a position weighs on that position's row.
PENALIZED = dict(PARAMS, presence_penalty=2.0, frequency_penalty=2.0, repeat_penalty=1.5, repeat_last_n=4)


# llama.cpp's DRY, strong and without breakers (the exact joint has no tokenizer to find them in): a
# token that repeats one before it makes the token that followed it there unlikely. It moves the
# third token's row, through the second while that is a draft, after a prompt whose tokens come back.
DRY = dict(PARAMS, dry_multiplier=3.0, dry_base=1.75, dry_allowed_length=1, dry_sequence_breakers=[])
DRY_PROMPT = "for i in range(10):\n    if i % 2 == 0:"


def joint_of(pair_bundle, fields: dict, prompt: str = PROMPT) -> dict[tuple[int, int, int], float]:
    """p(t1, t2, t3) of the target under the transform of ``fields`` (``target_joint``)."""
    return target_joint(pair_bundle, prompt, fields)


@pytest.fixture(scope="module")
def exact_joint(pair_bundle) -> dict[tuple[int, int, int], float]:
    """p(t1, t2, t3) of the target under the same top-k/temperature transform."""
    return joint_of(pair_bundle, PARAMS)


@pytest.fixture(scope="module")
def penalized_joint(pair_bundle) -> dict[tuple[int, int, int], float]:
    return joint_of(pair_bundle, PENALIZED)


def sample_triples(
    pair_bundle, seeded: bool, fields: dict = PARAMS, prompt: str = PROMPT
) -> list[tuple[int, ...]]:
    pipe = Pipeline(
        pair_bundle, drafter="draft", properties=F32, engine_config=sampling_engine_config(pair_bundle)
    )
    params = [SamplingParams(seed=seed if seeded else None, **fields) for seed in range(NUM_SAMPLES)]
    results = pipe.generate([prompt] * NUM_SAMPLES, params)
    # Every request's first speculative step drafted both t2 and t3.
    assert all(r.stats["per_position_acceptance"][1] is not None for r in results)
    return [tuple(r.token_ids[:3]) for r in results]


@pytest.mark.parametrize("seeded", [False, True], ids=["rejection", "coupled"])
def test_speculative_sampling_follows_target(pair_bundle, exact_joint, seeded):
    p_value = goodness_of_fit(sample_triples(pair_bundle, seeded), exact_joint)
    assert p_value > SIGNIFICANCE, f"chi-square p = {p_value:.2e}"


@pytest.mark.parametrize("seeded", [False, True], ids=["rejection", "coupled"])
def test_speculative_sampling_with_penalties_follows_target(pair_bundle, penalized_joint, seeded):
    p_value = goodness_of_fit(sample_triples(pair_bundle, seeded, PENALIZED), penalized_joint)
    assert p_value > SIGNIFICANCE, f"chi-square p = {p_value:.2e}"


def test_penalties_that_forget_the_drafts_are_caught(pair_bundle, penalized_joint, monkeypatch):
    """Rows penalised with the sequence's history alone, not the drafts before them: t3's row misses
    t2 while t2 is still a draft."""
    monkeypatch.setattr(verification, "chain_prefixes", lambda drafts: [[] for _ in range(len(drafts) + 1)])
    p_value = goodness_of_fit(sample_triples(pair_bundle, False, PENALIZED), penalized_joint)
    assert p_value < SIGNIFICANCE, f"a broken rule passed: chi-square p = {p_value:.2e}"


@pytest.fixture(scope="module")
def dry_joint(pair_bundle) -> dict[tuple[int, int, int], float]:
    joint = joint_of(pair_bundle, DRY, DRY_PROMPT)
    # DRY moves this distribution: a test against it could tell a rule that ignored DRY.
    plain = joint_of(pair_bundle, PARAMS, DRY_PROMPT)
    cells = set(joint) | set(plain)
    assert sum(abs(joint.get(c, 0.0) - plain.get(c, 0.0)) for c in cells) / 2 > 0.05
    return joint


@pytest.mark.parametrize("seeded", [False, True], ids=["rejection", "coupled"])
def test_speculative_sampling_with_dry_follows_target(pair_bundle, dry_joint, seeded):
    p_value = goodness_of_fit(sample_triples(pair_bundle, seeded, DRY, DRY_PROMPT), dry_joint)
    assert p_value > SIGNIFICANCE, f"chi-square p = {p_value:.2e}"


def test_dry_that_forgets_the_drafts_is_caught(pair_bundle, dry_joint, monkeypatch):
    monkeypatch.setattr(verification, "chain_prefixes", lambda drafts: [[] for _ in range(len(drafts) + 1)])
    p_value = goodness_of_fit(sample_triples(pair_bundle, False, DRY, DRY_PROMPT), dry_joint)
    assert p_value < SIGNIFICANCE, f"a broken rule passed: chi-square p = {p_value:.2e}"


@pytest.mark.parametrize("broken", ["always_accept", "recover_from_target"])
def test_broken_rejection_rule_is_caught(pair_bundle, exact_joint, monkeypatch, broken):
    if broken == "always_accept":
        monkeypatch.setattr(RejectionSampler, "acceptance_probability", staticmethod(lambda p, q: 1.0))
    else:
        monkeypatch.setattr(
            RejectionSampler, "recovery_distribution", staticmethod(lambda target, draft, token: target)
        )
    p_value = goodness_of_fit(sample_triples(pair_bundle, seeded=False), exact_joint)
    assert p_value < SIGNIFICANCE, f"a broken rule passed: chi-square p = {p_value:.2e}"


@pytest.mark.parametrize("broken", ["always_accept", "noise_not_by_position"])
def test_broken_coupled_rule_is_caught(pair_bundle, exact_joint, monkeypatch, broken):
    if broken == "always_accept":
        monkeypatch.setattr(RejectionSampler, "coupled_acceptance", staticmethod(lambda draft, target: True))
    else:
        # Every position of a request races the same noise: marginals stay right, the joint does not.
        # Drafting draws and verification races read the noise from the engine's two phases.
        exponentials = verification.position_exponentials
        for phase in (drafting, verification):
            monkeypatch.setattr(
                phase,
                "position_exponentials",
                lambda seed, position, vocab: exponentials(seed, 0, vocab),
            )
    p_value = goodness_of_fit(sample_triples(pair_bundle, seeded=True), exact_joint)
    assert p_value < SIGNIFICANCE, f"a broken rule passed: chi-square p = {p_value:.2e}"


def test_table_covers_the_support(exact_joint):
    assert len(exact_joint) == 27
    assert sum(exact_joint.values()) == pytest.approx(1.0)
    assert len({t1 for t1, _, _ in itertools.islice(exact_joint, None)}) == 3
