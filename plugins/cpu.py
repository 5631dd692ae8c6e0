"""The CPU plugin: PagedAttention on OpenVINO's CPU plugin."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from xpuspec.devices.capabilities import CoreLike
from xpuspec.devices.plugin import DEFAULT_MAX_DRAFT_TOKENS, ExecutorKind, OpenVINODevicePlugin, Role


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
            # A quantised cache (u8 with per-block scales) is the fast default; see compile_properties
            # for the f32 case.
            "KV_CACHE_PRECISION": "u8",
        }
        threads = self.threads[role]
        if threads is not None:
            properties["INFERENCE_NUM_THREADS"] = threads
            properties["ENABLE_CPU_PINNING"] = True
        return properties

    def compile_properties(
        self,
        role: Role,
        user_properties: Mapping[str, Any] | None = None,
        *,
        max_draft_tokens: int = DEFAULT_MAX_DRAFT_TOKENS,
    ) -> dict[str, Any]:
        properties = super().compile_properties(role, user_properties, max_draft_tokens=max_draft_tokens)
        user = user_properties or {}
        if (
            str(user.get("INFERENCE_PRECISION_HINT", "")).lower() == "f32"
            and "KV_CACHE_PRECISION" not in user
        ):
            # Asking for f32 compute asks for exact results; a quantised cache would undo that.
            properties["KV_CACHE_PRECISION"] = "f32"
        return properties
