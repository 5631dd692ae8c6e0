"""Target-only decode bursts (``xpuspec.engine.bursts``): several decode passes per ``step()``, same tokens.

Compared in exact mode against the same engine with bursts off (``decode_burst_steps=1``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import EXACT_PRESET
from tests.engine.test_exactness import PROMPTS, _make_drafting_hopeless
from xpuspec import Pipeline, SamplingParams
from xpuspec.engine.engine import EngineConfig

MAX_TOKENS = 40
# A budget no pass on this machine comes near, so that whether a burst runs never depends on timing.
ALWAYS = dict(decode_burst_steps=16, decode_burst_seconds=60.0)
NEVER = dict(decode_burst_steps=1)


def make_pipe(pair_bundle, drafter: str = "none", **config) -> Pipeline:
    engine_config = EngineConfig(max_model_len=512, **config)
    return Pipeline(pair_bundle, drafter=drafter, properties=EXACT_PRESET, engine_config=engine_config)


@pytest.fixture(scope="module")
def unbursted(pair_bundle) -> Pipeline:
    return make_pipe(pair_bundle, **NEVER)


@pytest.fixture(scope="module")
def bursted(pair_bundle) -> Pipeline:
    return make_pipe(pair_bundle, **ALWAYS)


def tokens_per_step(
    pipe: Pipeline, prompt: str, params: SamplingParams, interrupt: Callable[[], bool] | None = None
) -> list[int]:
    """The new tokens each ``step(interrupt)`` gave one request."""
    engine = pipe.engine
    engine.add_request("probe", pipe.encode(prompt), params)
    counts = []
    while engine.has_unfinished():
        counts += [len(output.new_token_ids) for output in engine.step(interrupt=interrupt)]
    return counts


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


def test_a_burst_gives_several_tokens_per_step_and_bursts_off_one(bursted, unbursted):
    counts = tokens_per_step(bursted, PROMPTS[3], GREEDY)
    assert counts[:2] == [1, 16]  # the prefill's token alone, then a burst
    assert max(counts) == 16 and sum(counts) == MAX_TOKENS
    assert tokens_per_step(unbursted, PROMPTS[3], GREEDY) == [1] * MAX_TOKENS


def test_the_first_token_is_never_held_back_by_a_burst(bursted):
    """A one-token prompt's prefill is a one-token step too: its token still comes alone."""
    assert len(bursted.encode(PROMPTS[0])) == 1
    counts = tokens_per_step(bursted, PROMPTS[0], GREEDY)
    assert counts[:2] == [1, 16]


@pytest.mark.parametrize(
    "params",
    [
        GREEDY,
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),  # may end at EOS inside a burst
        SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True),  # ends inside the first burst
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.9, seed=11, ignore_eos=True),
    ],
    ids=["greedy", "eos", "short", "seeded"],
)
def test_bursts_change_no_token_alone_or_sixteen_in_flight(bursted, unbursted, params):
    for prompts in ([PROMPTS[0]], [PROMPTS[4]], PROMPTS[:16]):
        expected = [r.token_ids for r in unbursted.generate(prompts, params)]
        results = bursted.generate(prompts, params)
        assert [r.token_ids for r in results] == expected
        assert all(r.stats["num_output_tokens"] == len(r.token_ids) for r in results)


def test_a_fixed_gamma_of_zero_bursts_beside_a_drafter_and_drafting_requests_do_not(pair_bundle, unbursted):
    pipe = make_pipe(pair_bundle, drafter="draft", **ALWAYS)
    target_only = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=0)
    assert max(tokens_per_step(pipe, PROMPTS[3], target_only)) == 16
    drafting = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=2)
    assert max(tokens_per_step(pipe, PROMPTS[3], drafting)) <= 3  # one verification: γ + 1 at most
    expected = [r.token_ids for r in unbursted.generate(PROMPTS[:8], GREEDY)]
    assert [r.token_ids for r in pipe.generate(PROMPTS[:8], target_only)] == expected


def test_every_burst_pass_is_a_one_token_cost_for_the_choice_of_gamma(pair_bundle):
    """Each pass is recorded like a one-token step, so adaptive γ weighs drafting against a pass."""
    pipe = make_pipe(pair_bundle, drafter="draft", **ALWAYS)
    target_only = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=0)
    before = pipe.engine.cost_model.version
    counts = tokens_per_step(pipe, PROMPTS[3], target_only)
    assert max(counts) == 16
    assert pipe.engine.cost_model.version - before >= MAX_TOKENS  # one record per target pass


def test_adaptive_gamma_at_zero_bursts_and_still_probes_on_time(pair_bundle, unbursted):
    """While the policy says γ = 0 a step bursts; each pass counts as a step without drafting, so the
    probes come after as many tokens as without bursts (64, then 128 more: 2 probes in 240 tokens)."""
    pipe = make_pipe(pair_bundle, drafter="draft", **ALWAYS)
    _make_drafting_hopeless(pipe.engine)
    params = SamplingParams(max_tokens=240, temperature=0.0, ignore_eos=True)
    engine = pipe.engine
    engine.add_request("adaptive", pipe.encode(PROMPTS[0]), params)
    counts, drafted_after = [], []
    while engine.has_unfinished():
        for output in engine.step():
            counts.append(len(output.new_token_ids))
            drafted_after.append(output.stats.drafted)
    assert max(counts) == 16  # bursts ran
    assert drafted_after[-1] == 2  # and the two probes: one drafted token each
    expected = unbursted.generate(PROMPTS[0], params)[0].token_ids
    assert pipe.generate(PROMPTS[0], params)[0].token_ids == expected


def test_a_waiting_request_or_the_interrupt_ends_a_burst(bursted, pair_bundle):
    assert tokens_per_step(bursted, PROMPTS[3], GREEDY, interrupt=lambda: True) == [1] * MAX_TOKENS
    # Two requests, one sequence slot: the second waits while the first decodes, so no bursts then.
    pipe = make_pipe(pair_bundle, max_num_seqs=1, **ALWAYS)
    for name in ("a", "b"):
        pipe.engine.add_request(name, pipe.encode(PROMPTS[3]), GREEDY)
    counts: dict[str, list[int]] = {"a": [], "b": []}
    while pipe.engine.has_unfinished():
        for output in pipe.engine.step():
            counts[output.request_id].append(len(output.new_token_ids))
    assert counts["a"] == [1] * MAX_TOKENS  # "b" waited all along
    assert max(counts["b"]) == 16  # alone, it bursts


def test_a_burst_ends_where_blocks_run_out_and_preemption_keeps_output_exact(pair_bundle, unbursted):
    pipe = Pipeline(
        pair_bundle,
        drafter="none",
        properties=EXACT_PRESET,
        engine_config=EngineConfig(max_model_len=512, **ALWAYS),
        num_kv_blocks=12,
    )
    expected = [r.token_ids for r in unbursted.generate(PROMPTS, GREEDY)]
    results = pipe.generate(PROMPTS, GREEDY)
    assert [r.token_ids for r in results] == expected
    assert sum(r.stats["num_preemptions"] for r in results) > 0
    assert pipe.engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("field, value", [("decode_burst_steps", 0), ("decode_burst_seconds", -1.0)])
def test_bad_burst_settings_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})
