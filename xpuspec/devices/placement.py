"""Placement: which device runs the target, which runs the draft, with which drafter and γ.

Device strings: a plain device ("CPU", "GPU", "GPU.1", "NPU", "TORCH") is handled by its plugin and
must be present; AUTO, HETERO:..., MULTI:... and BATCH:... go to OpenVINO unchanged, which resolves
them itself. A bundle's manifest may carry the placement `xpuspec plan --write` measured as best;
``Pipeline`` uses it for every argument left at its default.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xpuspec.devices.capabilities import CoreLike
from xpuspec.devices.plugin import DevicePlugin, OpenVINODevicePlugin, PassthroughPlugin, base_device_name
from xpuspec.devices.registry import PluginRegistry
from xpuspec.models.bundle import MANIFEST_NAME, ModelBundle, write_manifest_field
from xpuspec.sample.sampling_params import MAX_DRAFT_TOKENS

logger = logging.getLogger(__name__)

DRAFTERS = ("auto", "draft", "ngram", "eagle3", "none")
# The drafters that can draft trees (SamplingParams.draft_tree); n-grams draft chains only.
TREE_DRAFTERS = ("draft", "eagle3")
DEFAULT_DEVICE = "CPU"
DEFAULT_DRAFTER = "auto"
# Device strings OpenVINO resolves itself (virtual devices over the physical ones).
PASSTHROUGH_DEVICES = ("AUTO", "HETERO", "MULTI", "BATCH")


def is_passthrough(device: str) -> bool:
    return device.split(":", 1)[0].split(".", 1)[0].upper() in PASSTHROUGH_DEVICES


@dataclass(frozen=True)
class ResolvedDevice:
    """A device string with the plugin that decides its properties and executor."""

    device: str
    plugin: DevicePlugin
    passthrough: bool = False


def present_devices(core: CoreLike, registry: PluginRegistry) -> list[str]:
    """Every device that could run a model here: OpenVINO's, then present non-OpenVINO plugins."""
    devices = list(core.available_devices)
    for plugin in registry.plugins:
        if not isinstance(plugin, OpenVINODevicePlugin) and plugin.is_present(core):
            devices.append(plugin.name)
    return devices


def _absent(device: str, core: CoreLike, registry: PluginRegistry) -> ValueError:
    return ValueError(
        f"device {device!r} is not present here; present devices: "
        f"{', '.join(present_devices(core, registry)) or 'none'} "
        "(AUTO, HETERO:... and MULTI:... are passed to OpenVINO as they are)"
    )


def _index_present(device: str, available: list[str]) -> bool:
    """ "GPU.1" must be listed; "GPU.0" also names a lone device that OpenVINO lists as "GPU"."""
    upper = [d.upper() for d in available]
    base, _, index = device.upper().partition(".")
    return device.upper() in upper or (index == "0" and base in upper)


def resolve_device(device: str, core: CoreLike, registry: PluginRegistry) -> ResolvedDevice:
    """The plugin for ``device``; raises ``ValueError`` naming the present devices when it is absent."""
    if not isinstance(device, str) or not device.strip():
        raise ValueError(f"a device is a non-empty string such as 'CPU' or 'GPU.1', got {device!r}")
    device = device.strip()
    if is_passthrough(device):
        return ResolvedDevice(device, PassthroughPlugin(device), passthrough=True)
    plugin = registry.plugin_for(device)
    available = list(core.available_devices)
    if plugin is None:
        # A device OpenVINO lists but no plugin describes: run it without plugin defaults.
        if base_device_name(device) in {base_device_name(d) for d in available}:
            return ResolvedDevice(device, PassthroughPlugin(device), passthrough=True)
        raise _absent(device, core, registry)
    if not plugin.is_present(core):
        raise _absent(device, core, registry)
    if isinstance(plugin, OpenVINODevicePlugin) and "." in device and not _index_present(device, available):
        raise _absent(device, core, registry)
    return ResolvedDevice(device, plugin)


@dataclass(frozen=True)
class Placement:
    """Devices, drafter and default speculation length (``None``: adaptive) of one pipeline."""

    target_device: str = DEFAULT_DEVICE
    draft_device: str = DEFAULT_DEVICE
    drafter: str = DEFAULT_DRAFTER
    num_draft_tokens: int | None = None

    def __post_init__(self) -> None:
        for label, device in (("target_device", self.target_device), ("draft_device", self.draft_device)):
            if not isinstance(device, str) or not device.strip():
                raise ValueError(f"{label} must be a device name such as 'CPU', got {device!r}")
        if self.drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {DRAFTERS}, got {self.drafter!r}")
        length = self.num_draft_tokens
        if length is not None and (
            not isinstance(length, int) or isinstance(length, bool) or not 0 <= length <= MAX_DRAFT_TOKENS
        ):
            raise ValueError(
                f"num_draft_tokens must be null (adaptive) or in [0, {MAX_DRAFT_TOKENS}], got {length!r}"
            )

    @classmethod
    def from_manifest(cls, field: Any) -> Placement:
        """Read the manifest's "placement" object; raises ``ValueError`` when it is malformed."""
        if not isinstance(field, dict):
            raise ValueError(f"placement must be an object, got {type(field).__name__}")
        missing = [key for key in ("target_device", "draft_device", "drafter") if key not in field]
        if missing:
            raise ValueError(f"placement lacks {', '.join(missing)}")
        return cls(
            target_device=field["target_device"],
            draft_device=field["draft_device"],
            drafter=field["drafter"],
            num_draft_tokens=field.get("num_draft_tokens"),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "target_device": self.target_device,
            "draft_device": self.draft_device,
            "drafter": self.drafter,
            "num_draft_tokens": self.num_draft_tokens,
        }


def _checked_manifest_placement(
    bundle: ModelBundle, core: CoreLike, registry: PluginRegistry
) -> Placement | None:
    """The bundle's recorded placement if it still applies here; ``None`` (with a warning) otherwise."""
    field = bundle.placement
    if field is None:
        return None
    try:
        placement = Placement.from_manifest(field)
        resolve_device(placement.target_device, core, registry)
        if placement.drafter == "draft":
            if bundle.draft is None:
                raise ValueError("it names the draft model, but the bundle has none")
            resolve_device(placement.draft_device, core, registry)
        if placement.drafter == "eagle3":
            if bundle.eagle3 is None:
                raise ValueError("it names the EAGLE-3 head, but the bundle has none")
            resolve_device(placement.draft_device, core, registry)
    except ValueError as error:
        logger.warning(
            "ignoring the placement in %s (%s); using the defaults: target and draft on %s, drafter %s",
            bundle.root / MANIFEST_NAME,
            error,
            DEFAULT_DEVICE,
            DEFAULT_DRAFTER,
        )
        return None
    recorded_version = field.get("openvino_version")
    current_version = openvino_version()
    if recorded_version and current_version and recorded_version != current_version:
        logger.info(
            "the placement of %s was measured with OpenVINO %s, this is %s: `xpuspec plan --write` "
            "measures it again",
            bundle.root,
            recorded_version,
            current_version,
        )
    return placement


def choose_placement(
    bundle: ModelBundle, requested: Placement, core: CoreLike, registry: PluginRegistry
) -> Placement:
    """``requested`` with every field left at its default taken from the bundle's recorded placement.

    A field differing from the default counts as chosen and wins over the manifest.
    """
    recorded = _checked_manifest_placement(bundle, core, registry)
    if recorded is None:
        return requested
    placement = Placement(
        target_device=(
            recorded.target_device if requested.target_device == DEFAULT_DEVICE else requested.target_device
        ),
        draft_device=recorded.draft_device
        if requested.draft_device == DEFAULT_DEVICE
        else requested.draft_device,
        drafter=recorded.drafter if requested.drafter == DEFAULT_DRAFTER else requested.drafter,
        num_draft_tokens=(
            recorded.num_draft_tokens if requested.num_draft_tokens is None else requested.num_draft_tokens
        ),
    )
    logger.info("placement from %s: %s", bundle.root / MANIFEST_NAME, placement.as_dict())
    return placement


def recorded_properties(bundle: ModelBundle, role: str, device: str) -> dict[str, Any] | None:
    """The compile properties `xpuspec plan --write` chose for ``role`` on ``device``, or ``None``.

    They apply only on the device they were measured on (the record's device for that role).
    """
    field = bundle.placement
    if not isinstance(field, dict):
        return None
    properties = field.get(f"{role}_properties")
    measured_on = field.get("target_device" if role == "target" else "draft_device")
    if not isinstance(properties, dict) or not properties or not isinstance(measured_on, str):
        return None
    if measured_on.strip().upper() != device.strip().upper():
        return None
    return dict(properties)


def openvino_version() -> str | None:
    try:
        import openvino

        return str(openvino.__version__)
    except ImportError:
        return None


def write_placement(bundle_root: Path, placement: dict[str, Any]) -> None:
    """Set the manifest's "placement" field (see :func:`~xpuspec.models.bundle.write_manifest_field`)."""
    write_manifest_field(Path(bundle_root), "placement", placement)


def add_drafter_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--drafter`` option of ``generate`` and ``serve``: one list of choices, one help text."""
    parser.add_argument(
        "--drafter",
        choices=DRAFTERS,
        default="auto",
        help="auto: the bundle's draft model, else n-grams (or what `xpuspec plan --write` recorded); "
        "eagle3: the bundle's EAGLE-3 head (`xpuspec prepare --eagle3`)",
    )


def requested_drafter(drafter: str, eagle3_head: object) -> str:
    """The drafter asked for: one of :data:`DRAFTERS`, and EAGLE-3 where a head is given with "auto"."""
    if drafter not in DRAFTERS:
        raise ValueError(f"drafter must be one of {DRAFTERS}, got {drafter!r}")
    return "eagle3" if eagle3_head is not None and drafter == "auto" else drafter
