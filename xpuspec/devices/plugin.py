"""The device-plugin protocol, and a base class for plugins of OpenVINO devices.

A plugin knows one kind of device: whether it is present, what it can do, which compile properties
each model role gets on it, which executor runs models there and which ``xpuspec prepare --for``
compression preset suits it. User properties always override a plugin's defaults.

Third-party packages add plugins through the entry-point group ``xpuspec.plugins`` (see
:mod:`xpuspec.devices.registry`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from xpuspec.devices.capabilities import (
    CoreLike,
    DeviceCapabilities,
    as_int,
    max_of_range,
    read_property,
)

Role = Literal["target", "draft"]
# "paged": xpuspec.executor.paged_runner.PagedModelRunner (PagedAttention, continuous batching);
# "stateful": xpuspec.executor.stateful_runner (static shapes, one KV state per request);
# "reference": the plugin builds its own runner with `create_runner` (e.g. PyTorch).
ExecutorKind = Literal["paged", "stateful", "reference"]
ROLES: tuple[Role, ...] = ("target", "draft")
DEFAULT_MAX_DRAFT_TOKENS = 8


def base_device_name(device: str) -> str:
    """``"GPU.1"`` -> ``"GPU"``: the device type without its index."""
    return device.split(".", 1)[0].upper()


def check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")


def merge_properties(defaults: Mapping[str, Any], user: Mapping[str, Any] | None) -> dict[str, Any]:
    """Plugin defaults overlaid by the user's properties (the user always wins, key by key)."""
    merged = dict(defaults)
    merged.update(user or {})
    return merged


@runtime_checkable
class DevicePlugin(Protocol):
    """What xpuspec needs to know about one kind of device."""

    name: str  # the device type it handles: "CPU", "GPU", "NPU", "TORCH"
    executor_kind: ExecutorKind
    compression_preset: str | None  # a key of xpuspec.prepare.presets.DEVICE_PRESETS, or None

    def matches(self, device: str) -> bool:
        """True when this plugin handles the device string (e.g. "GPU" and "GPU.1" for the GPU plugin)."""
        ...

    def is_present(self, core: CoreLike) -> bool: ...

    def capabilities(self, core: CoreLike, device: str | None = None) -> DeviceCapabilities: ...

    def compile_properties(
        self,
        role: Role,
        user_properties: Mapping[str, Any] | None = None,
        *,
        max_draft_tokens: int = DEFAULT_MAX_DRAFT_TOKENS,
    ) -> dict[str, Any]:
        """The OpenVINO compile properties for a model of ``role``: defaults, then the user's on top."""
        ...


@runtime_checkable
class RunnerFactory(Protocol):
    """Implemented by ``executor_kind == "reference"`` plugins, which build their own executor."""

    def create_runner(
        self,
        model_dir: Path,
        facts: Mapping[str, Any],
        properties: Mapping[str, Any],
        num_blocks: int | None,
        block_size: int | None,
    ) -> Any: ...


class OpenVINODevicePlugin:
    """Shared behaviour of the plugins for OpenVINO devices; subclasses set the class attributes and
    :meth:`default_properties`."""

    name: str = ""
    executor_kind: ExecutorKind = "paged"
    compression_preset: str | None = None
    paged_attention: bool = True
    dynamic_shapes: bool = True
    # Read-only properties with the device's memory and its parallel units, where the plugin has them.
    memory_property: str | None = None
    compute_units_property: str | None = None

    def matches(self, device: str) -> bool:
        return base_device_name(device) == self.name

    def present_devices(self, core: CoreLike) -> list[str]:
        """This plugin's devices among ``core.available_devices`` ("GPU.0", "GPU.1", ...)."""
        return [d for d in core.available_devices if self.matches(d)]

    def is_present(self, core: CoreLike) -> bool:
        return bool(self.present_devices(core))

    def capabilities(self, core: CoreLike, device: str | None = None) -> DeviceCapabilities:
        present = self.present_devices(core)
        device = device or (present[0] if present else self.name)
        is_present = device in present or (device == self.name and bool(present))
        if not is_present:
            return DeviceCapabilities(
                device=device,
                full_name="",
                present=False,
                paged_attention=self.paged_attention,
                dynamic_shapes=self.dynamic_shapes,
                executor_kind=self.executor_kind,
                compression_preset=self.compression_preset,
            )
        precisions = read_property(core, device, "OPTIMIZATION_CAPABILITIES", ()) or ()
        return DeviceCapabilities(
            device=device,
            full_name=str(read_property(core, device, "FULL_DEVICE_NAME", "") or ""),
            present=True,
            paged_attention=self.paged_attention,
            dynamic_shapes=self.dynamic_shapes,
            executor_kind=self.executor_kind,
            compression_preset=self.compression_preset,
            precisions=tuple(str(p) for p in precisions),
            memory_bytes=(
                as_int(read_property(core, device, self.memory_property)) if self.memory_property else None
            ),
            compute_units=self.compute_units(core, device),
            max_streams=max_of_range(read_property(core, device, "RANGE_FOR_STREAMS")),
        )

    def compute_units(self, core: CoreLike, device: str) -> int | None:
        if self.compute_units_property is None:
            return None
        return as_int(read_property(core, device, self.compute_units_property))

    def default_properties(self, role: Role, max_draft_tokens: int) -> dict[str, Any]:
        return {}

    def compile_properties(
        self,
        role: Role,
        user_properties: Mapping[str, Any] | None = None,
        *,
        max_draft_tokens: int = DEFAULT_MAX_DRAFT_TOKENS,
        weights: str | None = None,
    ) -> dict[str, Any]:
        """``weights``: the model's weight format as the manifest records it ("int8", "int4", "fp16";
        ``None`` when unknown), for plugins whose best settings depend on it (the CPU's)."""
        check_role(role)
        return merge_properties(self.default_properties(role, max_draft_tokens), user_properties)


class PassthroughPlugin(OpenVINODevicePlugin):
    """AUTO, HETERO:..., MULTI:..., BATCH:... and device types no plugin knows: OpenVINO resolves them,
    xpuspec adds no defaults and does not check presence."""

    executor_kind: ExecutorKind = "paged"

    def __init__(self, device: str):
        self.name = device

    def matches(self, device: str) -> bool:
        return device.upper() == self.name.upper()

    def is_present(self, core: CoreLike) -> bool:
        return True

    def capabilities(self, core: CoreLike, device: str | None = None) -> DeviceCapabilities:
        return DeviceCapabilities(
            device=device or self.name,
            full_name="resolved by OpenVINO",
            present=True,
            paged_attention=True,
            dynamic_shapes=True,
            executor_kind=self.executor_kind,
            compression_preset=None,
        )
