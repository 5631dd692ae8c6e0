"""The engine's settings for a pipeline: the caller's ``EngineConfig`` (or one sized to the bundle's
context) with the model's sampling defaults and the pipeline's switches applied."""

from __future__ import annotations

import dataclasses

from xpuspec.engine.outputs import EngineConfig
from xpuspec.models.bundle import ModelBundle


def engine_settings(
    bundle: ModelBundle,
    engine_config: EngineConfig | None,
    max_tokens_default: int | None,
    enable_prefix_caching: bool,
    shared_lookup_tokens: int | None,
) -> EngineConfig:
    """``engine_config`` (default: one holding the bundle's whole context) with the bundle's sampling
    defaults and reply cap (``max_tokens_default``; None: the default cap), prefix caching off where
    either switch turns it off, and the cross-request lookup's bound where given (0: off)."""
    config = engine_config or EngineConfig(max_model_len=bundle.max_context)
    # One definition of the defaults: the model's generation config, else llama.cpp's (sample.defaults).
    defaults = bundle.sampling_defaults.with_max_tokens(max_tokens_default, "max_tokens_default")
    config = dataclasses.replace(config, sampling_defaults=defaults)
    if not enable_prefix_caching:
        config = dataclasses.replace(config, enable_prefix_caching=False)
    if shared_lookup_tokens is not None:
        config = dataclasses.replace(config, shared_lookup_tokens=shared_lookup_tokens)
    return config
