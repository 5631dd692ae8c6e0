"""Whether recorded default properties keep speculation from changing answers."""

from __future__ import annotations

import pytest

from xpuspec.prepare.default_properties import speculation_stable


@pytest.mark.parametrize(
    ("properties", "stable"),
    [
        ({"KV_CACHE_PRECISION": "u8", "KEY_CACHE_QUANT_MODE": "BY_TOKEN"}, True),
        ({"KV_CACHE_PRECISION": "u8", "KEY_CACHE_QUANT_MODE": "BY_CHANNEL"}, False),
        ({"KV_CACHE_PRECISION": "u8"}, False),  # the CPU's own key mode: per channel
        ({}, False),  # the CPU's own cache: u8
        ({"KV_CACHE_PRECISION": "f32"}, True),
        ({"KV_CACHE_PRECISION": "bf16", "KEY_CACHE_QUANT_MODE": "BY_CHANNEL"}, True),  # no scales at all
    ],
)
def test_a_quantised_cache_is_stable_only_with_per_token_key_scales(properties, stable):
    assert speculation_stable(properties) is stable
