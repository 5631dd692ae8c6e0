"""The CPU plugin: PagedAttention on OpenVINO's CPU plugin."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from xpuspec.devices.capabilities import CoreLike
from xpuspec.devices.plugin import (
    DEFAULT_MAX_DRAFT_TOKENS,
    ExecutorKind,
    OpenVINODevicePlugin,
    Role,
    check_role,
    merge_properties,
)
from xpuspec.executor.properties import PER_TOKEN_KEYS

# Weight formats whose matrix multiplications the CPU can run on int8 activations (dynamic quantisation).
COMPRESSED_WEIGHTS = ("int8", "int4")
# Defaults for int8/int4-weight models, from per-step measurements on an AVX-512 BF16 CPU
# (OpenVINO 2026.4; /work/shared/notes/cpu-performance.md and the plan's own step timings):
# dynamic int8 quantisation of activations applies only at f32 inference, and with groups of 128 a
# decode step takes clearly less time than with the plugin's bf16 defaults, with higher greedy
# agreement with the exact reference (figures: docs/experiments/benchmark-history.md and
# docs/experiments/code-comment-figures.md). At f32 the CPU's
# PagedAttention takes an f32, f16 or u8 cache (not bf16); u8 is the one of equal speed that keeps
# four times the sequences in the same memory.
COMPRESSED_DEFAULTS: dict[str, Any] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128,
    "KV_CACHE_PRECISION": "u8",
}


class CpuPlugin(OpenVINODevicePlugin):
    """CPU defaults: latency hint, the target's key cache quantised per token; for int8/int4 weights
    f32 compute with dynamic int8 activations (groups of 128) and a u8 KV cache; otherwise the plugin's
    own precisions (bf16 compute and a bf16 cache where the CPU has bf16: a u8 cache made the
    PagedAttention node costlier there; figure in docs/experiments/code-comment-figures.md).
    Thread counts per role only when asked for.

    Draft and target run one after the other on the same cores, so by default both get every core.
    When they overlap (one model on another device, or the overlapped executor), ``target_threads``
    / ``draft_threads`` split the cores and pin each model's threads so they do not migrate.
    """

    name = "CPU"
    executor_kind: ExecutorKind = "paged"
    compression_preset: str | None = "cpu"

    def __init__(self, target_threads: int | None = None, draft_threads: int | None = None):
        for label, threads in (("target_threads", target_threads), ("draft_threads", draft_threads)):
            if threads is not None and threads < 1:
                raise ValueError(f"{label} must be None (all cores) or >= 1, got {threads}")
        self.threads: dict[str, int | None] = {"target": target_threads, "draft": draft_threads}

    def compute_units(self, core: CoreLike, device: str) -> int | None:
        return os.cpu_count()

    def default_properties(
        self, role: Role, max_draft_tokens: int, weights: str | None = None
    ) -> dict[str, Any]:
        properties: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
        if role == "target":
            # The target's keys quantised per token whatever the weights: a cache block holds the same
            # bytes however it was filled, so verification passes and cut prefills write what decoding
            # would (xpuspec.executor.properties.PER_TOKEN_KEYS; docs/exactness.md). Not the draft's:
            # its cache changes no answer, and its one-token passes were slower so.
            properties.update(PER_TOKEN_KEYS)
        if weights in COMPRESSED_WEIGHTS:
            properties.update(COMPRESSED_DEFAULTS)
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
        weights: str | None = None,
    ) -> dict[str, Any]:
        check_role(role)
        properties = merge_properties(
            self.default_properties(role, max_draft_tokens, weights), user_properties
        )
        user = user_properties or {}
        if str(user.get("INFERENCE_PRECISION_HINT", "")).lower() == "f32":
            # Asking for f32 compute asks for exact results; a quantised cache or quantised activations
            # would undo that (the "exact" preset sets all three).
            if "KV_CACHE_PRECISION" not in user:
                properties["KV_CACHE_PRECISION"] = "f32"
            if "DYNAMIC_QUANTIZATION_GROUP_SIZE" not in user:
                properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
        return properties
