"""Constrained decoding through the whole engine: outputs obey the constraint, and speculation
changes nothing (greedy: token-identical at the exact preset with the draft model, n-gram, an EAGLE-3
head and no drafting; sampled: the chi-square test against the constrained target's exact distribution)."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from tests.conftest import EXACT_PRESET
from tests.support.statistics import goodness_of_fit
from xpuspec import Pipeline, SamplingParams
from xpuspec.core.chunks import SequenceChunk
from xpuspec.engine import constraints as speculation
from xpuspec.sample.sampler import probabilities

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
CONSTRAINTS = {
    "json_object": dict(response_format={"type": "json_object"}),
    "json_schema": dict(
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    ),
    "regex": dict(guided_regex=r"(yes|no), because [a-z ]{1,30}\."),
    "lark": dict(guided_grammar='start: "add(" NUM ", " NUM ")"\nNUM: /[0-9]{1,3}/'),
}
PROMPTS = ["def add(a, b):", "The quick brown fox", "class Point:\n", "import os\n"]


def check_output(kind: str, text: str) -> None:
    if kind.startswith("json"):
        value = json.loads(text)
        assert isinstance(value, dict)
        if kind == "json_schema":
            jsonschema.validate(value, PERSON)
    elif kind == "regex":
        assert re.fullmatch(CONSTRAINTS["regex"]["guided_regex"], text), text
    else:
        assert re.fullmatch(r"add\([0-9]{1,3}, [0-9]{1,3}\)", text), text


@pytest.fixture(scope="module")
def pipelines(pair_bundle) -> dict[str, Pipeline]:
    return {d: Pipeline(pair_bundle, drafter=d, properties=EXACT_PRESET) for d in ("none", "draft", "ngram")}


@pytest.fixture(scope="module")
def eagle3_pipeline(pair_bundle, tmp_path_factory) -> Pipeline:
    """EAGLE-3 drafting with a random head on the pair's 2-layer target (taps named explicitly)."""
    pytest.importorskip("torch")
    from research.training.eagle3_torch import random_head, save_head
    from xpuspec.models.bundle import ModelBundle

    target_config = json.loads((ModelBundle.open(pair_bundle).target.path / "config.json").read_text())
    module, config = random_head(target_config, 96, seed=5, aux_layer_ids=(0, 1, 2))
    head_dir = save_head(module, config, tmp_path_factory.mktemp("eagle3") / "head")
    return Pipeline(pair_bundle, drafter="eagle3", eagle3_head=head_dir, properties=EXACT_PRESET)


@pytest.mark.parametrize("kind", sorted(CONSTRAINTS))
def test_greedy_constrained_output_is_identical_with_and_without_speculation(
    pipelines, eagle3_pipeline, kind
):
    outputs = {}
    for drafter, pipe in {**pipelines, "eagle3": eagle3_pipeline}.items():
        params = [
            SamplingParams(max_tokens=120, temperature=0.0, num_draft_tokens=gamma, **CONSTRAINTS[kind])
            for gamma in (None, 4, 2, 1)
        ]
        results = pipe.generate(PROMPTS, params)
        outputs[drafter] = [r.token_ids for r in results]
        if drafter in ("draft", "eagle3"):  # the identity below is not for want of drafts (the grammar
            # may leave none of a random head's 96 draft ids at a position, so not every request drafts)
            assert sum(r.stats["drafted"] for r in results) > 0, drafter
        for result in results:
            if kind == "json_object" and result.finish_reason == "length":
                continue  # unbounded: a random tiny model may write one long string
            assert result.finish_reason == "stop", (drafter, result.text)
            check_output(kind, result.text)
    assert outputs["draft"] == outputs["none"]
    assert outputs["ngram"] == outputs["none"]
    assert outputs["eagle3"] == outputs["none"]


@pytest.mark.parametrize("drafter", ["none", "draft", "ngram"])
def test_sampled_constrained_output_validates(pipelines, drafter):
    pipe = pipelines[drafter]
    params = [
        SamplingParams(max_tokens=150, temperature=1.0, seed=seed if seed % 2 else None, **CONSTRAINTS[kind])
        for kind in ("json_schema", "regex", "lark")
        for seed in range(6)
    ]
    results = pipe.generate(["Say:"] * len(params), params)
    kinds = [kind for kind in ("json_schema", "regex", "lark") for _ in range(6)]
    for kind, result in zip(kinds, results, strict=True):
        if result.finish_reason == "length":
            continue  # a random tiny model may ramble inside a string until max_tokens
        assert result.finish_reason == "stop"
        check_output(kind, result.text)
    assert sum(r.finish_reason == "stop" for r in results) >= len(results) // 2


def test_drafts_are_masked_and_forced_tokens_skip_the_drafter(pipelines):
    pipe = pipelines["draft"]
    params = SamplingParams(max_tokens=60, temperature=0.0, num_draft_tokens=4, **CONSTRAINTS["json_schema"])
    result = pipe.generate("Person:", params)[0]
    check_output("json_schema", result.text)
    # Forced stretches ('{"name": "', '", "age": ') are proposed without the draft and accepted whole.
    assert result.stats["acceptance_rate"] > 0.5


def test_invalid_constraints_are_refused_with_the_engine_message(pipelines):
    pipe = pipelines["none"]
    with pytest.raises(ValueError, match="at most one"):
        SamplingParams(response_format={"type": "json_object"}, guided_regex="a")
    with pytest.raises(ValueError, match="invalid regular expression"):
        pipe.generate("x", SamplingParams(guided_regex="(unclosed"))
    with pytest.raises(ValueError, match="invalid Lark grammar"):
        pipe.generate("x", SamplingParams(guided_grammar="start: missing_rule"))
    with pytest.raises(ValueError, match="invalid JSON schema"):
        schema = {"type": "object", "properties": {"a": {"type": "strnig"}}}
        pipe.generate(
            "x", SamplingParams(response_format={"type": "json_schema", "json_schema": {"schema": schema}})
        )
    assert pipe.engine.num_requests == 0


def test_unsatisfiable_within_max_tokens_ends_with_length(pipelines):
    result = pipelines["draft"].generate(
        "x", SamplingParams(max_tokens=5, temperature=0.0, **CONSTRAINTS["json_schema"])
    )[0]
    assert result.finish_reason == "length"
    assert len(result.token_ids) == 5
    assert '{"name": "'.startswith(result.text) or result.text.startswith('{"name": "')


# ----------------------------------------------------------------- distribution
REGEX = r"[a-z]{1,8}"
STAT_PARAMS = dict(
    max_tokens=4,
    temperature=1.5,
    top_k=3,
    top_p=1.0,
    min_p=0.0,
    ignore_eos=True,
    num_draft_tokens=2,
    guided_regex=REGEX,
)
NUM_SAMPLES = 1200  # <= 27 cells (top-k 3, three positions)
SIGNIFICANCE = 1e-3


@pytest.fixture(scope="module")
def constrained_joint(pipelines) -> dict[tuple[int, int, int], float]:
    """p(t1, t2, t3) of the target, masked by the regex, under the same top-k/temperature transform."""
    pipe = pipelines["none"]
    runner, params = pipe.target_runner, SamplingParams(**STAT_PARAMS)
    prompt_ids = pipe.tokenizer.encode("def add(a, b):")
    blocks = list(range(runner.num_blocks))

    def next_probs(prefix: list[int]) -> np.ndarray:
        guide = pipe.engine.grammar.compile(params.constraint())
        guide.advance(prefix)
        logits = np.array(runner.forward([SequenceChunk(prompt_ids + prefix, 0, blocks, 1)]))
        return probabilities(speculation.mask_target_rows(logits, guide, []), params)[0]

    joint = {}
    first = next_probs([])
    for t1 in np.flatnonzero(first):
        second = next_probs([int(t1)])
        for t2 in np.flatnonzero(second):
            third = next_probs([int(t1), int(t2)])
            for t3 in np.flatnonzero(third):
                joint[(int(t1), int(t2), int(t3))] = first[t1] * second[t2] * third[t3]
    return joint


def p_value_of(pipe: Pipeline, joint, seeded: bool, num_samples: int = NUM_SAMPLES) -> float:
    params = [SamplingParams(seed=s if seeded else None, **STAT_PARAMS) for s in range(num_samples)]
    results = pipe.generate(["def add(a, b):"] * num_samples, params)
    return goodness_of_fit([tuple(r.token_ids[:3]) for r in results], joint)


@pytest.mark.parametrize("seeded", [False, True], ids=["rejection", "coupled"])
def test_sampled_constrained_speculation_follows_the_constrained_target(pipelines, constrained_joint, seeded):
    assert len(constrained_joint) > 3  # the mask leaves a real choice at each position
    p_value = p_value_of(pipelines["draft"], constrained_joint, seeded)
    assert p_value > SIGNIFICANCE, f"chi-square p = {p_value:.2e}"


def test_unmasked_target_is_caught(pipelines, constrained_joint, monkeypatch):
    monkeypatch.setattr(speculation, "mask_target_rows", lambda rows, guide, draft_ids: rows)
    # Tokens outside the constraint: certain to be caught with few samples.
    p_value = p_value_of(pipelines["draft"], constrained_joint, seeded=False, num_samples=200)
    assert p_value < SIGNIFICANCE, f"an unmasked target passed: chi-square p = {p_value:.2e}"


def test_prompt_lookup_drafts_for_constrained_requests_and_stays_exact(pipelines):
    """Beside the draft model, adaptive γ drafts by prompt lookup for constrained requests too; the
    lookup's drafts are cut at the first token the grammar forbids, and the output is target-only's."""
    repeated = "alpha beta gamma delta " * 6
    params = SamplingParams(max_tokens=60, temperature=0.0, guided_regex=r"[a-z ]{1,80}")
    prompts = [repeated + "alpha", "say " + repeated]
    with_lookup = pipelines["draft"].generate(prompts, [params] * len(prompts))
    target_only = pipelines["none"].generate(prompts, [params] * len(prompts))
    assert [r.token_ids for r in with_lookup] == [r.token_ids for r in target_only]
    assert sum(r.stats["lookup_drafted"] for r in with_lookup) > 0
