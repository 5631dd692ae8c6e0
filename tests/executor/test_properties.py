"""Compile-property presets and the layering of plan-tuned properties under the user's."""

from __future__ import annotations

import pytest

from xpuspec.executor.properties import (
    EXACT_PROPERTIES,
    is_exact,
    layer_tuned,
    readable,
    resolve_properties,
    with_preset,
)


def test_exact_preset_turns_off_every_approximation():
    exact = resolve_properties("exact")
    assert exact == {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "f32",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    }
    assert is_exact(exact) and resolve_properties(" EXACT ") == exact
    exact["KV_CACHE_PRECISION"] = "u8"  # a copy: the preset itself stays put
    assert EXACT_PROPERTIES["KV_CACHE_PRECISION"] == "f32" and not is_exact(exact)
    assert not is_exact({"INFERENCE_PRECISION_HINT": "f32"}) and not is_exact(None)


def test_unknown_presets_and_types_are_refused():
    with pytest.raises(ValueError, match="presets: exact"):
        resolve_properties("fast")
    with pytest.raises(ValueError, match="got int"):
        resolve_properties(3)  # type: ignore[arg-type]
    assert resolve_properties(None) is None
    assert resolve_properties({"A": 1}) == {"A": 1}


def test_explicit_properties_go_on_top_of_a_preset():
    assert with_preset("exact", {"PERFORMANCE_HINT": "THROUGHPUT"}) == {
        **EXACT_PROPERTIES,
        "PERFORMANCE_HINT": "THROUGHPUT",
    }
    assert with_preset("exact", {"KV_CACHE_PRECISION": "u8"})["KV_CACHE_PRECISION"] == "u8"
    assert with_preset(None, {}) is None and with_preset(None, {"A": "1"}) == {"A": "1"}


def test_tuned_properties_yield_to_a_user_who_sets_precision():
    tuned = {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "u8",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128,
    }
    assert layer_tuned(tuned, None) == tuned
    assert layer_tuned(tuned, {"PERFORMANCE_HINT": "LATENCY"}) == {**tuned, "PERFORMANCE_HINT": "LATENCY"}
    # Any precision key of the user's own replaces all the tuned ones (they were chosen together).
    assert layer_tuned(tuned, {"INFERENCE_PRECISION_HINT": "f32"}) == {"INFERENCE_PRECISION_HINT": "f32"}
    assert layer_tuned(tuned, dict(EXACT_PROPERTIES)) == EXACT_PROPERTIES
    assert layer_tuned(None, None) is None
    assert readable(tuned) == "compute=f32, kv=u8, dq_group=128"
