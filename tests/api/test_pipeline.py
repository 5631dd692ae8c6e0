"""The Python API contract: Pipeline, SamplingParams, generate, stream, chat, stop strings, errors."""

from __future__ import annotations

import pytest

from tests.conftest import F32
from xpuspec import Pipeline, SamplingParams


@pytest.fixture(scope="module")
def pipe(pair_bundle) -> Pipeline:
    return Pipeline(pair_bundle, drafter="draft", properties=F32)


def test_stream_pieces_join_to_the_generated_text(pipe):
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, num_draft_tokens=3)
    result = pipe.generate("def add(a, b):", params)[0]
    assert "".join(pipe.stream("def add(a, b):", params)) == result.text
    assert result.finish_reason == "length" and len(result.token_ids) == 24
    stats = result.stats
    assert {
        "drafted",
        "accepted",
        "acceptance_rate",
        "per_position_acceptance",
        "ttft_s",
        "tokens_per_s",
    } <= set(stats)
    assert stats["ttft_s"] > 0 and stats["drafted"] > 0


def test_a_stop_string_ends_the_text_before_it(pipe):
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    text = pipe.generate("import os\n", greedy)[0].text
    stop = text[5:9]  # some text from the middle of the output, wherever its tokens split
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop])
    result = pipe.generate("import os\n", params)[0]
    assert result.finish_reason == "stop"
    assert result.text == text[: text.index(stop)]
    assert "".join(pipe.stream("import os\n", params)) == result.text


def test_chat_messages_go_through_the_chat_template(pipe):
    messages = [{"role": "user", "content": "hello"}]
    rendered = pipe.apply_chat_template(messages)
    assert rendered.endswith("<|assistant|>\n") and "hello" in rendered
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    assert len(pipe.generate([messages], params)[0].token_ids) == 8
    assert pipe.encode(messages) == pipe.tokenizer.encode(rendered, add_special_tokens=False)


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", 0),
        ("temperature", -0.5),
        ("top_p", 0.0),
        ("top_k", -1),
        ("num_draft_tokens", 99),
        ("stop", [""]),
    ],
)
def test_bad_sampling_parameters_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_a_prompt_beyond_the_context_is_rejected_before_it_runs(pipe):
    too_long = "lazy dog " * 2000
    with pytest.raises(ValueError, match="context"):
        pipe.generate(["def", too_long], SamplingParams(max_tokens=8))
    assert pipe.engine.num_requests == 0 and pipe.engine.block_manager.num_used_blocks == 0
    assert pipe.generate("def", SamplingParams(max_tokens=4, temperature=0.0))[0].token_ids


def test_unknown_drafter_and_absent_device_are_clear_errors(pair_bundle):
    with pytest.raises(ValueError, match="drafter"):
        Pipeline(pair_bundle, drafter="magic")
    with pytest.raises(ValueError, match="CPU"):  # the message names the devices that exist
        Pipeline(pair_bundle, target_device="GPU.7")


def test_a_kv_budget_is_split_between_the_target_and_the_draft_model(pair_bundle):
    from xpuspec.api.memory_budget import target_share

    budget = 1 << 20
    pipe = Pipeline(pair_bundle, drafter="draft", properties=F32, kv_cache_bytes=budget)
    target, draft = pipe.kv_cache_sizes()
    assert (target.role, draft.role) == ("target", "draft") and target.num_blocks == draft.num_blocks
    assert target.cache_bytes <= budget * target_share(pipe.bundle.target.facts, pipe.bundle.draft.facts)
    assert target.cache_bytes + draft.cache_bytes <= budget


def test_a_draft_cache_wider_than_its_share_leaves_blocks_unused_to_stay_within_the_budget(pair_bundle):
    # The split by KV width assumes one element type; a target's f16 cache beside a draft's f32 one
    # would overrun it, so the engine uses fewer blocks than the target's cache holds.
    budget = 1 << 20
    target_f16 = {**F32, "KV_CACHE_PRECISION": "f16"}
    pipe = Pipeline(
        pair_bundle, drafter="draft", properties=target_f16, draft_properties=F32, kv_cache_bytes=budget
    )
    sizes = pipe.kv_cache_sizes()
    assert sum(size.cache_bytes for size in sizes) <= budget
    used = pipe.engine.block_manager.num_blocks
    assert used == sizes[0].num_blocks < pipe.target_runner.num_blocks
    result = pipe.generate("import os\n", SamplingParams(max_tokens=8, temperature=0))[0]
    assert result.token_ids


def test_a_speculating_target_on_cpu_gets_a_decode_lane_and_a_target_alone_none(pair_bundle, pipe):
    """Verifications alternate with one-token steps only where something drafts: the target's second
    compiled copy is built for those, on the CPU alone, and the engine's policy knows it."""
    from xpuspec.api.target_build import target_decode_lane

    assert pipe.target_runner.caps.decode_lane and pipe.target_runner.has_decode_lane
    assert pipe.engine.policy.step_shape.decode_lane and pipe.engine.cost_model.decode_lane
    alone = Pipeline(pair_bundle, drafter="none", properties=F32)
    assert not alone.target_runner.caps.decode_lane and not alone.target_runner.has_decode_lane
    assert target_decode_lane("ngram", "CPU") and not target_decode_lane("draft", "GPU")
