"""The Python API: a request without max_tokens ends at the default reply cap (or the room the
context leaves, whichever is smaller), with finish_reason "length"; unset fields take the model's defaults."""

from __future__ import annotations

from tests.conftest import F32
from xpuspec import Pipeline, SamplingParams
from xpuspec.sample.defaults import DEFAULT_MAX_TOKENS


def test_no_max_tokens_ends_at_the_cap(pair_bundle):
    pipe = Pipeline(pair_bundle, drafter="draft", properties=F32, max_tokens_default=20)
    result = pipe.generate("def add(a, b):", SamplingParams(temperature=0.0, ignore_eos=True))[0]
    assert (len(result.token_ids), result.finish_reason) == (20, "length")


def test_the_cap_stays_within_the_context_and_unset_fields_take_the_models_defaults(pair_bundle):
    pipe = Pipeline(pair_bundle, drafter="none", properties=F32)
    context = pipe.engine.config.max_model_len
    resolved = pipe.engine.with_defaults(SamplingParams(top_k=7), 10)
    assert resolved.max_tokens == min(DEFAULT_MAX_TOKENS, context - 10)
    defaults = pipe.bundle.sampling_defaults
    assert (resolved.top_k, resolved.temperature, resolved.min_p) == (7, defaults.temperature, defaults.min_p)
