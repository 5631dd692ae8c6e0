"""The sampling defaults: the model's generation config first, llama.cpp's for the rest, one cap."""

from __future__ import annotations

from xpuspec.sample.defaults import (
    DEFAULT_MAX_TOKENS,
    LLAMA_CPP_MIN_P,
    LLAMA_CPP_REPEAT_LAST_N,
    LLAMA_CPP_TEMPERATURE,
    LLAMA_CPP_TOP_K,
    LLAMA_CPP_TOP_P,
    SamplingDefaults,
    from_generation_config,
)
from xpuspec.sample.sampling_params import SamplingParams


def test_a_config_without_sampling_gets_llama_cpps_defaults():
    defaults = from_generation_config({"bos_token_id": 1, "eos_token_id": [2]})
    assert (defaults.temperature, defaults.top_k, defaults.top_p, defaults.min_p) == (
        LLAMA_CPP_TEMPERATURE,
        LLAMA_CPP_TOP_K,
        LLAMA_CPP_TOP_P,
        LLAMA_CPP_MIN_P,
    )
    assert (defaults.repeat_penalty, defaults.repeat_last_n) == (1.0, LLAMA_CPP_REPEAT_LAST_N)
    assert defaults.max_tokens == DEFAULT_MAX_TOKENS
    assert defaults.source("temperature") == "llama.cpp"


def test_the_models_own_values_come_first_and_say_so():
    defaults = from_generation_config(
        {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05, "do_sample": True}
    )
    assert (defaults.temperature, defaults.top_p, defaults.top_k, defaults.repeat_penalty) == (
        0.6,
        0.9,
        20,
        1.05,
    )
    assert defaults.min_p == LLAMA_CPP_MIN_P  # not in the file: llama.cpp's
    assert defaults.source("top_k") == "generation_config.json"
    assert defaults.source("min_p") == "llama.cpp"


def test_do_sample_false_is_greedy():
    assert from_generation_config({"do_sample": False, "temperature": 0.7}).temperature == 0.0


def test_values_out_of_range_or_of_the_wrong_type_are_ignored():
    defaults = from_generation_config(
        {"temperature": "hot", "top_p": 0, "top_k": 2.5, "repetition_penalty": True}
    )
    assert defaults == SamplingDefaults()


def test_params_left_unset_take_the_defaults_and_set_ones_stay():
    defaults = from_generation_config({"temperature": 0.3}).with_max_tokens(77, "--max-tokens")
    params = SamplingParams(top_k=5).with_defaults(defaults)
    assert (params.temperature, params.top_k, params.max_tokens) == (0.3, 5, 77)
    assert params.resolved and not SamplingParams().resolved
    assert defaults.source("max_tokens") == "--max-tokens"


def test_dry_is_off_by_default_and_a_recommendation_turns_it_on():
    defaults = from_generation_config({})
    assert defaults.dry_multiplier == 0.0 and not SamplingParams().with_defaults(defaults).penalized
    assert (defaults.dry_base, defaults.dry_allowed_length, defaults.dry_penalty_last_n) == (1.75, 2, -1)
    assert defaults.dry_sequence_breakers == ("\n", ":", '"', "*")
    recommended = from_generation_config({}, {"dry_multiplier": 0.8, "dry_allowed_length": 3}, "us")
    assert (recommended.dry_multiplier, recommended.dry_allowed_length) == (0.8, 3)
    assert recommended.source("dry_multiplier") == "us"
    params = SamplingParams().with_defaults(recommended)
    assert params.dry and params.dry_sequence_breakers == ["\n", ":", '"', "*"]
    # Out of range: ignored, the next source's value stands.
    assert from_generation_config({}, {"dry_multiplier": -1, "dry_base": 0.5}, "us") == SamplingDefaults()


def test_dry_looks_back_over_the_prompt_unless_a_recommendation_says_otherwise():
    assert SamplingDefaults().dry_include_prompt is True  # llama-server's sampler sees the prompt
    recommended = from_generation_config({}, {"dry_include_prompt": False}, "us")
    assert recommended.dry_include_prompt is False and recommended.source("dry_include_prompt") == "us"
    assert SamplingParams().with_defaults(recommended).dry_include_prompt is False
    assert from_generation_config({}, {"dry_include_prompt": 0}, "us").dry_include_prompt is True
