"""Whether recorded default properties keep speculation from changing answers."""

from __future__ import annotations

import pytest

from xpuspec.prepare.default_properties import speculation_stable

F32 = {"INFERENCE_PRECISION_HINT": "f32"}


@pytest.mark.parametrize(
    ("properties", "stable"),
    [
        ({**F32, "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128}, True),
        ({**F32, "KV_CACHE_PRECISION": "u8", "KEY_CACHE_QUANT_MODE": "BY_TOKEN"}, False),
        ({**F32, "KV_CACHE_PRECISION": "u8", "KEY_CACHE_QUANT_MODE": "BY_CHANNEL"}, False),
        ({**F32, "KV_CACHE_PRECISION": "f16"}, False),
        ({"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "bf16"}, False),
        ({}, False),
    ],
)
def test_only_f32_compute_with_an_f32_cache_counts_as_stable(properties, stable):
    assert speculation_stable(properties) is stable
