"""PrepareConfig validation and device presets (no conversion, fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xpuspec.prepare import DEVICE_PRESETS, PrepareConfig, WeightCompression


def config(**overrides) -> PrepareConfig:
    return PrepareConfig(**{"target": "model", "output": Path("out"), **overrides})


def test_presets_follow_the_device() -> None:
    assert config(device="cpu").target_compression() == WeightCompression(weights="int8", sym=False)
    assert config(device="gpu").target_compression() == WeightCompression(
        weights="int4", sym=True, group_size=128, ratio=1.0
    )
    npu = config(device="npu").target_compression()
    assert (npu.weights, npu.sym, npu.group_size, npu.ratio) == ("int4", True, -1, 1.0)
    assert config(device="cpu", weights="int4").target_compression().describe() == "int4 asym g128"
    assert set(DEVICE_PRESETS) == {"cpu", "gpu", "npu"}


def test_explicit_flags_override_the_preset() -> None:
    compression = config(device="npu", group_size=64, sym=False, ratio=0.8, awq=True).target_compression()
    assert compression.describe() == "int4 asym g64 r0.8 awq"
    assert compression.mode == "int4_asym"
    assert config(device="npu", weights="fp16").target_compression() == WeightCompression(weights="fp16")


def test_draft_weights_default_to_the_target() -> None:
    assert config(draft="d", weights="int4").draft_compression().weights == "int4"
    mixed = config(draft="d", weights="int4", draft_weights="fp16", group_size=32)
    assert mixed.draft_compression() == WeightCompression(weights="fp16")
    assert mixed.target_compression().group_size == 32


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"weights": "int3"}, "weights must be one of"),
        ({"device": "tpu"}, "device must be one of"),
        ({"weights": "int8", "group_size": 64}, "apply to int4 weights"),
        ({"weights": "fp16", "awq": True}, "apply to int4 weights"),
        ({"weights": "fp16", "sym": True}, "all models are fp16"),
        ({"weights": "int4", "ratio": 0.0}, "ratio must be in"),
        ({"weights": "int4", "group_size": 0}, "group_size must be"),
        ({"draft_weights": "int8"}, "without a draft"),
        ({"force_pair": True}, "without a draft"),
        ({"draft_vocab": 1000}, "without a draft"),
        ({"draft": "d", "draft_vocab": 0}, "positive number of ids"),
        ({"weights": "int4", "awq": True, "calibration_prompts": ()}, "calibration prompt"),
        ({"target": ""}, "target must name"),
    ],
)
def test_invalid_configs_raise_actionable_errors(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(**overrides)


def test_a_draft_vocabulary_is_recorded_within_the_drafts_own() -> None:
    from xpuspec.prepare.config import PrepareError, record_draft_vocab

    facts = {"vocab_size": 49152, "num_layers": 3}
    assert record_draft_vocab(facts, None) is facts
    assert record_draft_vocab(facts, 16384) == {**facts, "draft_vocab": 16384}
    with pytest.raises(PrepareError, match="exceeds the draft's vocabulary"):
        record_draft_vocab(facts, 50000)
