"""Per-device weight-compression defaults for `xpuspec prepare --for DEVICE`.

The table follows the OpenVINO weight-compression and GenAI device guides: CPU runs asymmetric
int8/int4 kernels best, GPU prefers symmetric group-wise int4, and the NPU compiler wants symmetric
int4 with full ratio (channel-wise for most models). Explicit flags always override a preset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

WeightFormat = Literal["fp16", "int8", "int4"]
TargetDevice = Literal["cpu", "gpu", "npu"]
WEIGHT_FORMATS: tuple[str, ...] = get_args(WeightFormat)
TARGET_DEVICES: tuple[str, ...] = get_args(TargetDevice)

CHANNEL_WISE = -1  # group_size value meaning one scale per output channel


@dataclass(frozen=True)
class QuantizationScheme:
    """How one integer precision is applied: symmetry, group size (int4 only) and int4 ratio."""

    sym: bool
    group_size: int | None = None
    ratio: float = 1.0


@dataclass(frozen=True)
class DevicePreset:
    default_weights: WeightFormat
    int8: QuantizationScheme
    int4: QuantizationScheme

    def scheme(self, weights: WeightFormat) -> QuantizationScheme | None:
        """The scheme for ``weights``; ``None`` for fp16, which is not quantized."""
        if weights == "int8":
            return self.int8
        if weights == "int4":
            return self.int4
        return None


DEVICE_PRESETS: dict[TargetDevice, DevicePreset] = {
    "cpu": DevicePreset(
        default_weights="int8",
        int8=QuantizationScheme(sym=False),
        int4=QuantizationScheme(sym=False, group_size=128, ratio=1.0),
    ),
    "gpu": DevicePreset(
        default_weights="int4",
        int8=QuantizationScheme(sym=False),
        int4=QuantizationScheme(sym=True, group_size=128, ratio=1.0),
    ),
    "npu": DevicePreset(
        default_weights="int4",
        int8=QuantizationScheme(sym=True),
        int4=QuantizationScheme(sym=True, group_size=CHANNEL_WISE, ratio=1.0),
    ),
}
