"""The CPU plugin: PagedAttention on OpenVINO's CPU plugin."""

from __future__ import annotations

import os
from typing import Any

from xpuspec.devices.capabilities import CoreLike
from xpuspec.devices.plugin import ExecutorKind, OpenVINODevicePlugin, Role


class CpuPlugin(OpenVINODevicePlugin):
    """CPU defaults: latency hint, u8 KV cache; thread counts per role only when asked for.

    Draft and target run one after the other on the same cores, so by default both get every core.
    When they overlap (one model on another device, or the overlapped executor), ``target_threads``
    / ``draft_threads`` split the cores and pin each model's threads so they do not migrate.
    """

    name = "CPU"
    executor_kind: ExecutorKind = "paged"
    compression_preset = "cpu"

    def __init__(self, target_threads: int | None = None, draft_threads: int | None = None):
        for label, threads in (("target_threads", target_threads), ("draft_threads", draft_threads)):
            if threads is not None and threads < 1:
                raise ValueError(f"{label} must be None (all cores) or >= 1, got {threads}")
        self.threads: dict[str, int | None] = {"target": target_threads, "draft": draft_threads}

    def compute_units(self, core: CoreLike, device: str) -> int | None:
        return os.cpu_count()

    def default_properties(self, role: Role, max_draft_tokens: int) -> dict[str, Any]:
        properties: dict[str, Any] = {
            "PERFORMANCE_HINT": "LATENCY",
            # The CPU plugin's own default (u8 with per-block scales) made explicit, so a manifest or
            # a log shows what ran; exact comparisons override it with f32.
            "KV_CACHE_PRECISION": "u8",
        }
        threads = self.threads[role]
        if threads is not None:
            properties["INFERENCE_NUM_THREADS"] = threads
            properties["ENABLE_CPU_PINNING"] = True
        return properties
