"""Device strings, the absent-device error, and the manifest placement (reading, fallback, writing)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.devices.fake_core import FakeCore, laptop_core
from xpuspec.devices.placement import (
    Placement,
    choose_placement,
    is_passthrough,
    resolve_device,
    write_placement,
)
from xpuspec.devices.registry import PluginRegistry
from xpuspec.models.bundle import FORMAT_VERSION, MANIFEST_NAME, ModelBundle, hash_tree
from xpuspec_plugins import builtin_plugins

CPU_ONLY = FakeCore({"CPU": {}})


@pytest.fixture
def registry() -> PluginRegistry:
    return PluginRegistry(builtin_plugins())


@pytest.mark.parametrize(
    "device", ["AUTO", "AUTO:GPU,CPU", "HETERO:GPU,CPU", "MULTI:GPU.0,GPU.1", "BATCH:GPU(4)"]
)
def test_virtual_devices_pass_through_to_openvino(device, registry):
    assert is_passthrough(device)
    resolved = resolve_device(device, CPU_ONLY, registry)  # not checked here: OpenVINO resolves them
    assert resolved.passthrough and resolved.device == device
    assert resolved.plugin.compile_properties("target", {"A": 1}) == {"A": 1}


@pytest.mark.parametrize("device", ["CPU", "GPU", "GPU.0", "GPU.1", "gpu.1", "NPU", "TORCH"])
def test_present_devices_resolve_to_their_plugin(device, registry):
    resolved = resolve_device(device, laptop_core(), registry)
    assert not resolved.passthrough
    assert resolved.plugin.name == device.split(".")[0].upper()


@pytest.mark.parametrize("device", ["GPU", "NPU", "GPU.1", "FPGA"])
def test_absent_device_error_names_the_present_ones(device, registry):
    with pytest.raises(ValueError) as error:
        resolve_device(device, CPU_ONLY, registry)
    message = str(error.value)
    assert f"{device!r} is not present" in message
    assert "present devices: CPU, TORCH" in message


def test_a_missing_gpu_index_is_absent(registry):
    core = FakeCore({"CPU": {}, "GPU": {}})
    assert resolve_device("GPU.0", core, registry).plugin.name == "GPU"  # a lone GPU is also GPU.0
    with pytest.raises(ValueError, match="'GPU.2' is not present"):
        resolve_device("GPU.2", core, registry)


def test_a_device_only_openvino_knows_runs_without_defaults(registry):
    resolved = resolve_device("VPUX", FakeCore({"CPU": {}, "VPUX": {}}), registry)
    assert resolved.passthrough and resolved.plugin.compile_properties("draft") == {}


@pytest.mark.parametrize("device", ["", "  ", None])
def test_empty_device_strings_are_refused(device, registry):
    with pytest.raises(ValueError, match="non-empty string"):
        resolve_device(device, CPU_ONLY, registry)  # type: ignore[arg-type]


# ------------------------------------------------------------------- manifest placement
def fake_bundle(tmp_path: Path, placement: object, with_draft: bool = True) -> ModelBundle:
    models = {"target": {"path": "target", "vocab_size": 10}}
    if with_draft:
        models["draft"] = {"path": "draft", "vocab_size": 10}
    manifest = {"format_version": FORMAT_VERSION, "models": models, "placement": placement}
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    return ModelBundle.open(tmp_path)


GPU_NPU = {
    "target_device": "GPU.1",
    "draft_device": "NPU",
    "drafter": "draft",
    "num_draft_tokens": 4,
    "openvino_version": "2026.4.1",
}


def test_defaults_take_the_recorded_placement(tmp_path, registry):
    bundle = fake_bundle(tmp_path, GPU_NPU)
    chosen = choose_placement(bundle, Placement(), laptop_core(), registry)
    assert chosen == Placement("GPU.1", "NPU", "draft", 4)


def test_explicit_arguments_win_field_by_field(tmp_path, registry):
    bundle = fake_bundle(tmp_path, GPU_NPU)
    chosen = choose_placement(
        bundle, Placement(target_device="NPU", drafter="ngram"), laptop_core(), registry
    )
    assert chosen == Placement("NPU", "NPU", "ngram", 4)
    chosen = choose_placement(bundle, Placement(num_draft_tokens=0), laptop_core(), registry)
    assert chosen.num_draft_tokens == 0


@pytest.mark.parametrize(
    "placement, reason",
    [
        (GPU_NPU, "'GPU.1' is not present"),  # measured on another machine
        ({**GPU_NPU, "target_device": "CPU", "draft_device": "NPU"}, "'NPU' is not present"),
        ({**GPU_NPU, "target_device": "CPU", "drafter": "medusa"}, "drafter must be one of"),
        (
            {**GPU_NPU, "target_device": "CPU", "draft_device": "CPU", "num_draft_tokens": 99},
            "num_draft_tokens",
        ),
        ({"target_device": "CPU"}, "lacks draft_device, drafter"),
        ("GPU", "must be an object"),
        ([], "must be an object"),
        ({**GPU_NPU, "target_device": 7}, "target_device must be a device name"),
    ],
)
def test_a_broken_or_stale_placement_falls_back_with_a_warning(tmp_path, registry, caplog, placement, reason):
    bundle = fake_bundle(tmp_path, placement)
    with caplog.at_level(logging.WARNING, logger="xpuspec.devices.placement"):
        chosen = choose_placement(bundle, Placement(), CPU_ONLY, registry)
    assert chosen == Placement()
    assert "ignoring the placement" in caplog.text and reason in caplog.text


def test_a_draft_placement_for_a_bundle_without_draft_falls_back(tmp_path, registry, caplog):
    bundle = fake_bundle(
        tmp_path, {**GPU_NPU, "target_device": "CPU", "draft_device": "CPU"}, with_draft=False
    )
    with caplog.at_level(logging.WARNING):
        assert choose_placement(bundle, Placement(), CPU_ONLY, registry) == Placement()
    assert "the bundle has none" in caplog.text


def test_no_placement_keeps_the_request(tmp_path, registry, caplog):
    bundle = fake_bundle(tmp_path, None)
    with caplog.at_level(logging.WARNING):
        assert choose_placement(bundle, Placement(drafter="ngram"), CPU_ONLY, registry) == Placement(
            drafter="ngram"
        )
    assert caplog.text == ""


def test_write_placement_replaces_only_that_field(tmp_path):
    fake_bundle(tmp_path, None)
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "weights.bin").write_bytes(b"123")
    before = json.loads((tmp_path / MANIFEST_NAME).read_text())
    files_before = hash_tree(tmp_path)
    write_placement(tmp_path, {"target_device": "CPU", "draft_device": "CPU", "drafter": "ngram"})
    after = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert after["placement"]["drafter"] == "ngram"
    assert {k: v for k, v in after.items() if k != "placement"} == {
        k: v for k, v in before.items() if k != "placement"
    }
    assert hash_tree(tmp_path) == files_before  # no temporary file left beside the manifest


def test_placement_validation():
    with pytest.raises(ValueError, match="drafter"):
        Placement(drafter="eagle")
    with pytest.raises(ValueError, match="num_draft_tokens"):
        Placement(num_draft_tokens=True)
    assert Placement("GPU", "NPU", "draft", None).as_dict()["num_draft_tokens"] is None
