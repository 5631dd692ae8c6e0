"""Which runners get a decode lane: a second compiled copy for steps of one token per sequence."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugins.cpu import CpuPlugin
from plugins.gpu import GpuPlugin
from xpuspec.devices.executors import wants_decode_lane
from xpuspec.model_bundle import ModelInfo


def _model(tmp_path: Path, weight_bytes: int) -> ModelInfo:
    folder = tmp_path / f"model-{weight_bytes}"
    folder.mkdir()
    with open(folder / "openvino_model.bin", "wb") as weights:
        weights.truncate(weight_bytes)  # sparse: only its size is read
    return ModelInfo(role="target", path=folder, facts={})


def test_a_speculating_cpu_target_of_modest_size_gets_a_decode_lane(tmp_path: Path) -> None:
    cpu = CpuPlugin()
    small, large = _model(tmp_path, 92 << 20), _model(tmp_path, (1 << 30) + 1)
    assert wants_decode_lane(cpu, small, "target", speculative=True)
    assert not wants_decode_lane(cpu, small, "target", speculative=False)  # nothing to switch between
    assert not wants_decode_lane(cpu, large, "target", speculative=True)  # the copy costs too much memory
    assert wants_decode_lane(cpu, large, "draft", speculative=True)  # a draft always has one


@pytest.mark.parametrize("plugin", [GpuPlugin()], ids=["GPU"])
def test_plugins_that_do_not_price_changes_of_shape_keep_one_copy(tmp_path: Path, plugin) -> None:
    assert not wants_decode_lane(plugin, _model(tmp_path, 1 << 20), "target", speculative=True)


def test_a_model_without_an_ir_weights_file_gets_no_lane(tmp_path: Path) -> None:
    model = ModelInfo(role="target", path=tmp_path, facts={})
    assert not wants_decode_lane(CpuPlugin(), model, "target", speculative=True)
