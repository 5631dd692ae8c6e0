"""Repetition penalties are exact under speculation: greedy speculative output with penalties is the
target alone's with the same penalties, with chains and trees (exact preset). Each verified row is
penalised with the history before its position, the drafts before it included; a rule that forgets
the drafts must fail these comparisons. The same holds for llama.cpp's DRY, checked on its own."""

from __future__ import annotations

import pytest

from tests.conftest import EXACT_PRESET
from xpuspec import Pipeline, SamplingParams
from xpuspec.engine import verification

PROMPTS = [
    "def add(a, b):",
    "x = 1\ny = 2\nz = x + y\n" * 4,
    "lazy dog " * 12,
    "for i in range(10):\n    if i % 2 == 0:\n        continue\n",
    "yield i\n" * 8,
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
]
PENALTIES = dict(repeat_penalty=1.6, repeat_last_n=16, presence_penalty=0.7, frequency_penalty=0.4)
# DRY alone, strong enough to turn the tiny target's greedy loops; the newline breaks a repeat.
DRY = dict(dry_multiplier=2.0, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=-1,
           dry_sequence_breakers=["\n"])  # fmt: skip
CONTROLS = {"penalties": PENALTIES, "dry": DRY, "dry over the reply": {**DRY, "dry_include_prompt": False}}
MAX_TOKENS = 32


def _params(controls: str = "penalties", **extra: object) -> SamplingParams:
    fields = {**CONTROLS[controls], **extra}
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=list(CONTROLS))
def controls(request) -> str:
    """Which repetition controls a test runs with: the repeat and OpenAI penalties, or DRY."""
    return request.param


@pytest.fixture(scope="module")
def target_only(pair_bundle, controls) -> list[list[int]]:
    pipe = Pipeline(pair_bundle, drafter="none", properties=EXACT_PRESET)
    return [pipe.generate(prompt, _params(controls))[0].token_ids for prompt in PROMPTS]


def test_the_penalties_change_the_greedy_text(pair_bundle, target_only):
    pipe = Pipeline(pair_bundle, drafter="none", properties=EXACT_PRESET)
    plain = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    unpenalized = [pipe.generate(prompt, plain)[0].token_ids for prompt in PROMPTS]
    assert sum(a != b for a, b in zip(unpenalized, target_only, strict=True)) >= len(PROMPTS) // 2


@pytest.mark.parametrize(
    ("drafter", "extra"),
    [
        ("draft", {"num_draft_tokens": 4}),
        ("ngram", {"num_draft_tokens": 4}),
        ("draft", {"draft_tree": {"depth": 3, "width": 2, "nodes": 6}}),
    ],
    ids=["draft-chain", "ngram-chain", "draft-tree"],
)
def test_greedy_with_penalties_equals_the_target_alone(pair_bundle, target_only, controls, drafter, extra):
    pipe = Pipeline(pair_bundle, drafter=drafter, properties=EXACT_PRESET)
    results = [pipe.generate(prompt, _params(controls, **extra))[0] for prompt in PROMPTS]
    assert [r.token_ids for r in results] == target_only
    assert sum(r.stats["accepted"] for r in results) > 0, "no draft was accepted: speculation did not run"


def test_all_in_flight(pair_bundle, target_only, controls):
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    results = pipe.generate(PROMPTS, _params(controls, num_draft_tokens=4))
    assert [r.token_ids for r in results] == target_only


def test_a_rule_that_forgets_the_drafts_is_caught(pair_bundle, target_only, controls, monkeypatch):
    monkeypatch.setattr(verification, "chain_prefixes", lambda drafts: [[] for _ in range(len(drafts) + 1)])
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    results = [pipe.generate(prompt, _params(controls, num_draft_tokens=4))[0] for prompt in PROMPTS]
    assert [r.token_ids for r in results] != target_only


@pytest.fixture(scope="module")
def self_pair(pair_bundle, tmp_path_factory) -> Pipeline:
    """The pair's target drafting for itself: with penalties applied alike on both sides, every draft
    is the target's own choice."""
    from xpuspec.prepare import PrepareConfig, prepare_bundle

    target = pair_bundle.parent / "target"  # the pair's Hugging Face checkpoint
    out = tmp_path_factory.mktemp("self_pair") / "bundle"
    bundle = prepare_bundle(PrepareConfig(target=str(target), draft=str(target), output=out, weights="fp16"))
    return Pipeline(bundle, drafter="draft", properties=EXACT_PRESET, draft_properties=EXACT_PRESET)


def test_the_draft_is_penalised_as_the_target_is(self_pair, target_only, controls):
    """Drafts proposed from rows penalised like the target's are accepted; from unpenalised rows, the
    drafts the penalty turns away are rejected (the control)."""
    params = _params(controls, num_draft_tokens=4)
    proposer = self_pair.engine.proposer
    proposer.set_draft_mask(self_pair.engine.drafting.constrain_draft_logits)

    def acceptance() -> float:
        results = [self_pair.generate(prompt, params)[0] for prompt in PROMPTS]
        assert [r.token_ids for r in results] == target_only
        return sum(r.stats["accepted"] for r in results) / sum(r.stats["drafted"] for r in results)

    assert acceptance() >= 0.95
    proposer.set_draft_mask(lambda request_id, drafted, logits: logits)  # the draft's rows unpenalised
    assert acceptance() < 0.8
