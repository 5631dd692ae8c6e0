"""Greedy speculative output is token-identical to the target alone, and to OpenVINO GenAI.

Compared in exact mode (the ``properties="exact"`` preset: f32 compute, f32 KV cache, dynamic
quantisation off), as OpenVINO GenAI's own speculative-decoding tests compare at f32.
"""

from __future__ import annotations

import pytest

from tests.conftest import EXACT_PRESET, F32
from xpuspec import Pipeline, SamplingParams

# Mixed lengths: one token up to a few hundred, code and prose, repeats for the n-gram drafter.
PROMPTS = [
    "def",
    "def add(a, b):",
    "import os\nimport sys\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    "The quick brown fox jumps over the lazy dog. " * 6,
    "for i in range(10):\n    if i % 2 == 0:\n        continue\n",
    "print(os.path.join('a', 'b'))",
    "x = 1\ny = 2\nz = x + y\n" * 8,
    "return a + b",
    "yield i\n" * 20,
    "The",
    "class",
    "lazy dog " * 30,
    "def __init__(self):\n    self.items = []\n",
    "import sys; print(sys.argv)",
    "fox jumps",
    "if __name__ == '__main__':\n    main()\n",
    "continue\n" * 12,
    "a + b + c + d",
    "self.y = y\n",
]
MAX_TOKENS = 32
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


def target_only_outputs(pair_bundle, params: SamplingParams) -> list[list[int]]:
    """The target alone's tokens for every prompt, in exact mode."""
    pipe = Pipeline(pair_bundle, drafter="none", properties=EXACT_PRESET)
    return [pipe.generate(prompt, params)[0].token_ids for prompt in PROMPTS]


@pytest.fixture(scope="module")
def target_only(pair_bundle) -> list[list[int]]:
    return target_only_outputs(pair_bundle, GREEDY)


@pytest.fixture(scope="module", params=["draft", "ngram"])
def speculative(request, pair_bundle) -> Pipeline:
    return Pipeline(pair_bundle, drafter=request.param, properties=EXACT_PRESET)


def _mismatches(expected: list[list[int]], results) -> list[int]:
    return [
        i for i, (ids, result) in enumerate(zip(expected, results, strict=True)) if ids != result.token_ids
    ]


@pytest.mark.parametrize("num_draft_tokens", [None, 1, 4])
def test_one_request_at_a_time(speculative, target_only, num_draft_tokens):
    params = SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=num_draft_tokens
    )
    results = [speculative.generate(prompt, params)[0] for prompt in PROMPTS]
    assert _mismatches(target_only, results) == []
    if num_draft_tokens:
        # Adaptive γ may rightly choose 0 here: this tiny draft costs as much as its target.
        drafted = sum(r.stats["drafted"] for r in results)
        assert drafted > 0, "the drafter proposed nothing: the comparison would not test speculation"


def test_sixteen_in_flight(speculative, target_only):
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=4)
    results = speculative.generate(PROMPTS[:16], params)
    assert _mismatches(target_only[:16], results) == []


def test_fixed_gamma_keeps_the_step_shape(pair_bundle, target_only):
    """A fixed-γ step verifies 1 + γ tokens even when the n-gram drafter proposes fewer, as GenAI's
    prompt lookup does: the missing drafts are padding, so the plugin never re-prepares its graph
    between decode steps. The output stays the target's."""
    pipe = Pipeline(pair_bundle, drafter="ngram", properties=EXACT_PRESET)
    runner = pipe.engine.target
    steps: list[tuple[int, int]] = []  # (tokens with padding, padding) of each decode step
    fill_inputs = runner._fill_inputs

    def recording(chunks, lane=None):
        if all(chunk.num_logits == len(chunk.token_ids) for chunk in chunks):
            steps.append((sum(len(c.token_ids) + c.padding for c in chunks), sum(c.padding for c in chunks)))
        return fill_inputs(chunks, lane)

    runner._fill_inputs = recording
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=4)
    results = [pipe.generate(prompt, params)[0] for prompt in PROMPTS[:8]]
    assert _mismatches(target_only[:8], results) == []
    assert {tokens for tokens, _ in steps} == {5}
    assert any(padding for _, padding in steps), "the drafter always proposed 4: padding did not run"
    assert sum(r.stats["drafted"] for r in results) > 0


def test_draft_model_accepts_and_rejects(pair_bundle, target_only):
    """The perturbed draft must both accept and reject, so both paths of the comparison ran."""
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    results = pipe.generate(
        PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=4)
    )
    assert _mismatches(target_only, results) == []
    drafted = sum(r.stats["drafted"] for r in results)
    accepted = sum(r.stats["accepted"] for r in results)
    assert 0 < accepted < drafted


def test_preemption_keeps_output_exact(pair_bundle, target_only):
    """A KV cache too small for all requests forces recompute-preemption; the output must not change."""
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET, num_kv_blocks=12)
    results = pipe.generate(
        PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=3)
    )
    assert _mismatches(target_only, results) == []
    assert sum(r.stats["num_preemptions"] for r in results) > 0
    assert pipe.engine.block_manager.num_used_blocks == 0


def test_matches_openvino_genai(pair_bundle, target_only):
    openvino_genai = pytest.importorskip("openvino_genai")
    import numpy as np
    import openvino as ov

    genai = openvino_genai.LLMPipeline(str(pair_bundle / "target"), "CPU", **F32)
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = MAX_TOKENS
    config.ignore_eos = True
    config.do_sample = False
    tokenizer = Pipeline(pair_bundle, drafter="none", properties=EXACT_PRESET).tokenizer
    mismatches = []
    for index, prompt in enumerate(PROMPTS):
        ids = np.array([tokenizer.encode(prompt)], dtype=np.int64)
        inputs = openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        tokens = list(genai.generate(inputs, config).tokens[0])
        if tokens != target_only[index]:
            mismatches.append(index)
    assert mismatches == []


def _make_drafting_hopeless(engine) -> None:
    """Pessimistic drafting costs (10 s a phase at every γ): γ = 0 from now on. A probe's phase is a
    long catch-up, which the drafting curve leaves out, so the probes do not undo it. Prompt lookup,
    whose drafts cost nothing, is turned off: these tiny models repeat themselves."""
    from xpuspec.spec_decode.policy.cost_model import MAX_TOKENS_PER_SEQUENCE
    from xpuspec.spec_decode.policy.verify_costs import VerifyCostCurve

    engine.policy.draft_choice.prompt_lookup = None

    engine.cost_model.drafting = VerifyCostCurve(MAX_TOKENS_PER_SEQUENCE)
    for gamma in range(1, engine.config.max_draft_tokens + 1):
        engine.cost_model.calibrate_drafting(1, gamma, 10.0)


def test_adaptive_length_probes_the_draft_while_gamma_is_zero(pair_bundle, target_only):
    """This pair's draft costs as much as its target, so adaptive γ settles at 0; now and then it
    must still draft one token, or a draft cost measured on a busy moment would never be revisited."""
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    _make_drafting_hopeless(pipe.engine)
    result = pipe.generate(PROMPTS[0], SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))[0]
    assert result.token_ids[:MAX_TOKENS] == target_only[0]
    assert 1 <= result.stats["drafted"] < 20


def test_probes_that_find_no_gain_come_ever_more_rarely(pair_bundle):
    """A probe changes the target's step shape twice and catches the draft up over every token since
    the last one. While probes keep finding γ = 0, the interval doubles (64, 128, 256 steps ...): over
    ~480 steps that is 3 probes, where a fixed interval of 64 steps would have probed 7 times."""
    from xpuspec.spec_decode.policy.draft_choice import PROBE_INTERVAL_STEPS

    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    _make_drafting_hopeless(pipe.engine)  # γ = 0 from now on, except for the probes
    params = SamplingParams(max_tokens=480, temperature=0.0, ignore_eos=True)
    result = pipe.generate(PROMPTS[0], params)[0]
    assert 2 <= result.stats["drafted"] <= 4
    assert pipe.engine.policy.draft_choice.probe_interval >= 4 * PROBE_INTERVAL_STEPS


def test_a_draft_with_a_cut_vocabulary_keeps_output_exact(pair_bundle, target_only):
    """``draft_vocab``: the draft proposes only the lower half of the ids; greedy output is unchanged
    (one at a time and 16 in flight, chains and a tree), and sampled requests run (q padded with zeros)."""
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    half = pipe.target_runner.vocab_size // 2
    del pipe
    cut = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET, draft_vocab=half)
    assert cut.engine.proposer.runner.vocab_size == half
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=4)
    results = [cut.generate(prompt, params)[0] for prompt in PROMPTS]
    assert _mismatches(target_only, results) == []
    assert sum(r.stats["accepted"] for r in results) > 0
    assert _mismatches(target_only[:16], cut.generate(PROMPTS[:16], params)) == []
    tree = SamplingParams(
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        ignore_eos=True,
        draft_tree={"depth": 3, "width": 2, "nodes": 6},
    )
    assert _mismatches(target_only[:4], cut.generate(PROMPTS[:4], tree)) == []
    sampled = SamplingParams(
        max_tokens=MAX_TOKENS, temperature=1.0, ignore_eos=True, num_draft_tokens=3, seed=None
    )
    for result in cut.generate(PROMPTS[:4], sampled):
        assert len(result.token_ids) == MAX_TOKENS and max(result.token_ids) < cut.target_runner.vocab_size
