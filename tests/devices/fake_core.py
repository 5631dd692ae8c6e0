"""A stub of ``openvino.Core``: the two members the device layer reads, for hardware this machine lacks."""

from __future__ import annotations

from typing import Any


class FakeCore:
    """``available_devices`` and ``get_property`` over a dict {device: {property: value}}."""

    def __init__(self, devices: dict[str, dict[str, Any]]):
        self.devices = devices

    @property
    def available_devices(self) -> list[str]:
        return list(self.devices)

    def get_property(self, device_name: str, name: str) -> Any:
        try:
            return self.devices[device_name][name]
        except KeyError:
            raise RuntimeError(f"{device_name} has no property {name}") from None


CPU_PROPERTIES = {
    "FULL_DEVICE_NAME": "Fake Xeon",
    "OPTIMIZATION_CAPABILITIES": ["FP32", "BF16", "INT8"],
    "RANGE_FOR_STREAMS": (1, 8),
}
GPU_PROPERTIES = {
    "FULL_DEVICE_NAME": "Fake Arc A770 (dGPU)",
    "OPTIMIZATION_CAPABILITIES": ["FP32", "FP16", "INT8", "GPU_HW_MATMUL"],
    "GPU_DEVICE_TOTAL_MEM_SIZE": 16 * 2**30,
    "GPU_EXECUTION_UNITS_COUNT": 512,
    "RANGE_FOR_STREAMS": (1, 2),
}
NPU_PROPERTIES = {
    "FULL_DEVICE_NAME": "Fake AI Boost",
    "OPTIMIZATION_CAPABILITIES": ["FP16", "INT8"],
    "NPU_DEVICE_TOTAL_MEM_SIZE": 4 * 2**30,
    "NPU_MAX_TILES": 6,
}


def laptop_core() -> FakeCore:
    """A Core Ultra laptop: CPU, two GPUs (integrated and discrete) and an NPU."""
    return FakeCore(
        {"CPU": CPU_PROPERTIES, "GPU.0": GPU_PROPERTIES, "GPU.1": GPU_PROPERTIES, "NPU": NPU_PROPERTIES}
    )
