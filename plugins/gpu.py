"""The GPU plugin: PagedAttention on OpenVINO's GPU plugin (Intel integrated and discrete GPUs)."""

from __future__ import annotations

from typing import Any

from xpuspec.devices.plugin import ExecutorKind, OpenVINODevicePlugin, Role


class GpuPlugin(OpenVINODevicePlugin):
    """GPU defaults: f16 compute and an f16 KV cache kept in device memory.

    The GPU plugin's f16 kernels are its fast path; a u8 KV cache would add dequantization to every
    attention read, which costs more on the GPU than the memory it saves for short contexts.
    """

    name = "GPU"
    executor_kind: ExecutorKind = "paged"
    compression_preset: str | None = "gpu"
    memory_property = "GPU_DEVICE_TOTAL_MEM_SIZE"
    compute_units_property = "GPU_EXECUTION_UNITS_COUNT"

    def default_properties(self, role: Role, max_draft_tokens: int) -> dict[str, Any]:
        return {
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "f16",
            "KV_CACHE_PRECISION": "f16",
        }
