"""Plugin registration: at run time, through entry points, and the lookup of a device string."""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Any

import pytest

from tests.devices.fake_core import FakeCore
from xpuspec.devices import registry as registry_module
from xpuspec.devices.capabilities import DeviceCapabilities
from xpuspec.devices.placement import resolve_device
from xpuspec.devices.plugin import OpenVINODevicePlugin, Role
from xpuspec.devices.registry import ENTRY_POINT_GROUP, PluginRegistry
from xpuspec_plugins.cpu import CpuPlugin


class FpgaPlugin(OpenVINODevicePlugin):
    """A third party's accelerator, known to OpenVINO as "FPGA"."""

    name = "FPGA"
    compression_preset = None

    def default_properties(self, role: Role, max_draft_tokens: int) -> dict[str, Any]:
        return {"FPGA_BITSTREAM": f"llm-{role}"}


class FakeEntryPoint:
    def __init__(self, name: str, loaded: Any):
        self.name = name
        self.value = f"fake_package:{name}"
        self._loaded = loaded

    def load(self) -> Any:
        if isinstance(self._loaded, Exception):
            raise self._loaded
        return self._loaded


@pytest.fixture
def fresh_default_registry():
    registry_module.reset_default_registry()
    yield
    registry_module.reset_default_registry()


def test_runtime_registration(fresh_default_registry):
    registry_module.register(FpgaPlugin())
    registry = registry_module.default_registry()
    assert isinstance(registry.plugin_for("FPGA.1"), FpgaPlugin)
    core = FakeCore({"CPU": {}, "FPGA": {"FULL_DEVICE_NAME": "Fake FPGA"}})
    resolved = resolve_device("FPGA", core, registry)
    assert not resolved.passthrough
    assert resolved.plugin.compile_properties("draft", {"X": 1}) == {"FPGA_BITSTREAM": "llm-draft", "X": 1}
    assert resolved.plugin.capabilities(core).full_name == "Fake FPGA"


def test_a_second_plugin_of_one_name_needs_replace():
    registry = PluginRegistry([CpuPlugin()])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(CpuPlugin())
    pinned = CpuPlugin(target_threads=1)
    registry.register(pinned, replace=True)
    assert registry.get("cpu") is pinned


def test_entry_points_register_classes_instances_and_factories(monkeypatch):
    class NullPlugin(FpgaPlugin):
        name = "NULL"

    def factory() -> OpenVINODevicePlugin:
        plugin = FpgaPlugin()
        plugin.name = "FACTORY"
        return plugin

    points = [
        FakeEntryPoint("fpga", FpgaPlugin),
        FakeEntryPoint("null", NullPlugin()),
        FakeEntryPoint("f", factory),
    ]
    seen_groups = []

    def entry_points(**selection: Any) -> list[FakeEntryPoint]:
        seen_groups.append(selection.get("group"))
        return points

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    registry = PluginRegistry()
    registry.load_entry_points()
    assert seen_groups == [ENTRY_POINT_GROUP]
    assert sorted(p.name for p in registry.plugins) == ["FACTORY", "FPGA", "NULL"]


def test_broken_entry_points_are_skipped_with_a_warning(monkeypatch, caplog):
    points = [
        FakeEntryPoint("crash", ImportError("no module named fpga_sdk")),
        FakeEntryPoint("junk", object()),
        FakeEntryPoint("fpga", FpgaPlugin),
    ]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **selection: points)
    registry = PluginRegistry([CpuPlugin()])
    with caplog.at_level(logging.WARNING, logger="xpuspec.devices.registry"):
        registry.load_entry_points()
    assert [p.name for p in registry.plugins] == ["CPU", "FPGA"]
    assert "crash" in caplog.text and "fpga_sdk" in caplog.text and "junk" in caplog.text


def test_entry_point_of_a_builtin_name_keeps_the_builtin(monkeypatch):
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda **selection: [FakeEntryPoint("cpu", CpuPlugin)]
    )
    builtin = CpuPlugin()
    registry = PluginRegistry([builtin])
    registry.load_entry_points()
    assert registry.plugins == [builtin]


def test_default_registry_has_the_builtins_and_the_entry_points(monkeypatch, fresh_default_registry):
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda **selection: [FakeEntryPoint("fpga", FpgaPlugin)]
    )
    names = [p.name for p in registry_module.default_registry().plugins]
    assert names == ["CPU", "GPU", "NPU", "TORCH", "FPGA"]


def test_capabilities_dict_is_json_ready():
    facts = CpuPlugin().capabilities(FakeCore({"CPU": {"OPTIMIZATION_CAPABILITIES": ["FP32"]}})).as_dict()
    assert facts["precisions"] == ["FP32"] and facts["static_only"] is False
    assert set(facts) >= {f for f in DeviceCapabilities.__dataclass_fields__}
