"""`xpuspec devices`: the devices xpuspec can run models on, what each supports, which can run a bundle."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from xpuspec.cli.tables import print_table
from xpuspec.devices.capabilities import CoreLike, DeviceCapabilities
from xpuspec.devices.plugin import PassthroughPlugin
from xpuspec.devices.registry import PluginRegistry
from xpuspec.models.bundle import ModelBundle


def register(subparsers: argparse._SubParsersAction) -> None:
    devices = subparsers.add_parser(
        "devices",
        help="list the devices xpuspec can run models on, and what each supports",
        description="List every known device plugin: present devices with their capabilities, then "
        "known devices that are absent here.",
    )
    devices.add_argument("--json", action="store_true", help="print the list as JSON")
    devices.add_argument(
        "--bundle",
        default=None,
        help="list the executors that can run this bundle: a folder, or demo "
        "(default: the default model, SmolLM2-135M-Instruct + its draft)",
    )
    devices.set_defaults(func=run_devices)


def device_report(core: CoreLike, registry: PluginRegistry) -> list[DeviceCapabilities]:
    """Present devices first (one entry per OpenVINO device index), then absent known devices."""
    present: list[DeviceCapabilities] = []
    absent: list[DeviceCapabilities] = []
    claimed: set[str] = set()
    for plugin in registry.plugins:
        devices = [d for d in core.available_devices if plugin.matches(d)]
        claimed.update(devices)
        if devices:
            present += [plugin.capabilities(core, device) for device in devices]
        else:
            capabilities = plugin.capabilities(core)
            (present if capabilities.present else absent).append(capabilities)
    for device in core.available_devices:
        if device not in claimed:  # a device OpenVINO has and no plugin describes
            present.append(PassthroughPlugin(device).capabilities(core, device))
    return present + absent


def _format_memory(memory_bytes: int | None) -> str:
    return f"{memory_bytes / 2**30:.1f} GiB" if memory_bytes else "-"


def system_memory_bytes() -> int | None:
    """Physical memory of this machine: what host executors (CPU, TORCH) allocate from."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def with_host_memory(capabilities: DeviceCapabilities) -> DeviceCapabilities:
    """The CPU plugin reports no memory size; host executors use the machine's memory."""
    host = capabilities.device.split(".")[0].upper() in ("CPU", "TORCH")
    if capabilities.memory_bytes or not capabilities.present or not host:
        return capabilities
    return dataclasses.replace(capabilities, memory_bytes=system_memory_bytes())


@runtime_checkable
class ChecksModels(Protocol):
    """A plugin whose executor runs only some models (the PyTorch reference: only some architectures)."""

    def cannot_run(self, model_dir: Path, facts: Mapping[str, Any]) -> str | None: ...


def cannot_run_reason(registry: PluginRegistry, device: str, bundle: ModelBundle) -> str | None:
    """Why the executor of ``device`` cannot run ``bundle``; ``None`` when it can, or cannot tell."""
    plugin = registry.plugin_for(device)
    if not isinstance(plugin, ChecksModels):
        return None
    for info in (bundle.target, bundle.draft):
        if info is not None and (reason := plugin.cannot_run(info.path, info.facts)):
            return reason
    return None


def run_devices(args: argparse.Namespace) -> int:
    import openvino as ov

    from xpuspec.devices.placement import openvino_version
    from xpuspec.devices.registry import default_registry
    from xpuspec.models.resolve import resolve_bundle

    bundle = resolve_bundle(args.bundle)
    registry = default_registry()
    report = [with_host_memory(c) for c in device_report(ov.Core(), registry)]
    reasons = {c.device: cannot_run_reason(registry, c.device, bundle) if c.present else None for c in report}
    if args.json:
        entries = [
            {
                **c.as_dict(),
                "runs_bundle": c.present and reasons[c.device] is None,
                "cannot_run": reasons[c.device],
            }
            for c in report
        ]
        print(
            json.dumps(
                {"openvino_version": openvino_version(), "bundle": str(bundle.root), "devices": entries},
                indent=2,
            )
        )
        return 0
    unusable = [c for c in report if reasons[c.device]]
    report = [c for c in report if not reasons[c.device]]
    header = (
        "DEVICE",
        "PRESENT",
        "EXECUTOR",
        "PAGED",
        "SHAPES",
        "PRECISIONS",
        "MEMORY",
        "UNITS",
        "PRESET",
        "NAME",
    )
    rows = [
        (
            c.device,
            "yes" if c.present else "no",
            c.executor_kind,
            "yes" if c.paged_attention else "no",
            "static" if c.static_only else "dynamic",
            ",".join(c.precisions) or "-",
            _format_memory(c.memory_bytes),
            str(c.compute_units or "-"),
            c.compression_preset or "-",
            c.full_name or "-",
        )
        for c in report
    ]
    print_table(header, rows)
    for capabilities in unusable:
        print(
            f"{capabilities.device} is present but cannot run {bundle.root}: {reasons[capabilities.device]}"
        )
    return 0
