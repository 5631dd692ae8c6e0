"""What a device reports about itself, read through OpenVINO's ``Core`` (or a stub of it in tests)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class CoreLike(Protocol):
    """The part of ``openvino.Core`` the device layer reads; tests pass a stub with the same two members."""

    @property
    def available_devices(self) -> list[str]: ...

    def get_property(self, device_name: str, name: str) -> Any: ...


@dataclass(frozen=True)
class DeviceCapabilities:
    """The facts about one device that placement decisions use.

    ``paged_attention``: the plugin runs OpenVINO's PagedAttention op (continuous batching);
    ``dynamic_shapes``: one compiled model accepts any batch/sequence length; ``static_only`` is its
    negation, kept as its own field because it is what an NPU user looks for in ``xpuspec devices``.
    """

    device: str  # as OpenVINO names it: "CPU", "GPU.0", "NPU", "TORCH"
    full_name: str
    present: bool
    paged_attention: bool
    dynamic_shapes: bool
    executor_kind: str
    compression_preset: str | None
    precisions: tuple[str, ...] = ()  # OPTIMIZATION_CAPABILITIES, e.g. ("FP32", "BF16", "INT8")
    memory_bytes: int | None = None  # GPU_DEVICE_TOTAL_MEM_SIZE where the plugin reports it
    compute_units: int | None = None  # CPU threads, GPU execution units, NPU tiles
    max_streams: int | None = None  # upper end of RANGE_FOR_STREAMS
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def static_only(self) -> bool:
        return not self.dynamic_shapes

    def as_dict(self) -> dict[str, Any]:
        facts = asdict(self)
        facts["precisions"] = list(self.precisions)
        facts["static_only"] = self.static_only
        return facts


def read_property(core: CoreLike, device: str, name: str, default: Any = None) -> Any:
    """One device property, or ``default`` when this plugin or driver version does not report it."""
    try:
        return core.get_property(device, name)
    except Exception as error:  # OpenVINO raises RuntimeError; stubs may raise KeyError
        logger.debug("%s does not report %s (%s)", device, name, error)
        return default


def as_int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def max_of_range(value: Any) -> int | None:
    """The upper end of a RANGE_FOR_* property, reported as a tuple (min, max[, step])."""
    if isinstance(value, (tuple, list)) and len(value) >= 2:
        return as_int(value[1])
    return None
