"""Device plugins and placement: which devices exist, what they support, where each model runs.

See :mod:`xpuspec.devices.plugin` (the plugin protocol), :mod:`xpuspec.devices.registry` (built-ins,
entry points, ``register``) and :mod:`xpuspec.devices.placement` (device strings, manifest placement).
"""

from __future__ import annotations

from xpuspec.devices.capabilities import CoreLike, DeviceCapabilities
from xpuspec.devices.placement import (
    Placement,
    ResolvedDevice,
    choose_placement,
    resolve_device,
    write_placement,
)
from xpuspec.devices.plugin import DevicePlugin, ExecutorKind, OpenVINODevicePlugin, Role
from xpuspec.devices.registry import ENTRY_POINT_GROUP, PluginRegistry, default_registry, register

__all__ = [
    "ENTRY_POINT_GROUP",
    "CoreLike",
    "DeviceCapabilities",
    "DevicePlugin",
    "ExecutorKind",
    "OpenVINODevicePlugin",
    "Placement",
    "PluginRegistry",
    "ResolvedDevice",
    "Role",
    "choose_placement",
    "default_registry",
    "register",
    "resolve_device",
    "write_placement",
]
