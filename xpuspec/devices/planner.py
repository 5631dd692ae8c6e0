"""`xpuspec plan`: measure the placements the present devices allow and pick the fastest.

A candidate is (target device, draft device, drafter, γ). Each (target, draft, drafter) triple is
loaded once and runs a short greedy workload for every γ: 0 (the target alone), a few fixed lengths
and adaptive (``None``). Tokens per second over the whole batch decide.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuspec.devices.capabilities import CoreLike
from xpuspec.devices.placement import Placement, openvino_version
from xpuspec.devices.registry import PluginRegistry
from xpuspec.model_bundle import ModelBundle
from xpuspec.sample.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

WORKLOAD_PROMPTS = (
    "def fibonacci(n):\n",
    "The history of the printing press begins",
    "import numpy as np\n\ndef normalize(x):\n",
    "Here is a list of the planets of the solar system:",
)


@dataclass(frozen=True)
class PlanConfig:
    """The workload and candidates of one planning run."""

    num_prompts: int = 4
    max_tokens: int = 32
    draft_lengths: tuple[int, ...] = (2, 4, 6)
    adaptive: bool = True
    repeats: int = 2  # runs per candidate; the fastest counts (a shared machine's noise only slows)
    devices: tuple[str, ...] | None = None  # None: every present device that can run the bundle
    properties: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not 1 <= length <= 16 for length in self.draft_lengths):
            raise ValueError(f"draft lengths must be in [1, 16], got {self.draft_lengths}")

    @property
    def prompts(self) -> list[str]:
        return [WORKLOAD_PROMPTS[i % len(WORKLOAD_PROMPTS)] for i in range(self.num_prompts)]


@dataclass(frozen=True)
class Measurement:
    placement: Placement
    tokens_per_s: float
    num_tokens: int
    seconds: float
    acceptance_rate: float | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.placement.as_dict(),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "num_tokens": self.num_tokens,
            "seconds": round(self.seconds, 4),
            "acceptance_rate": None if self.acceptance_rate is None else round(self.acceptance_rate, 4),
            "error": self.error,
        }


def plannable_devices(core: CoreLike, registry: PluginRegistry) -> list[str]:
    """Present devices whose executor runs an OpenVINO bundle (the reference TORCH executor does not
    compete: it needs the source checkpoint and is not meant to be fast)."""
    devices = []
    for device in core.available_devices:
        plugin = registry.plugin_for(device)
        if plugin is None or plugin.executor_kind != "reference":
            devices.append(device)
    return devices


def candidate_placements(bundle: ModelBundle, devices: Sequence[str], config: PlanConfig) -> list[Placement]:
    drafter = "draft" if bundle.draft is not None else "ngram"
    lengths: list[int | None] = list(config.draft_lengths) + ([None] if config.adaptive else [])
    candidates = []
    for target in devices:
        candidates.append(Placement(target, target, "none", 0))
        # The n-gram drafter runs on the host: its "draft device" is just the target's.
        for draft in devices if drafter == "draft" else [target]:
            candidates += [Placement(target, draft, drafter, length) for length in lengths]
    return candidates


def measure_placements(
    bundle_path: str | Path | None,
    candidates: Sequence[Placement],
    config: PlanConfig,
    progress: Callable[[Measurement], None] = lambda measurement: None,
) -> list[Measurement]:
    """Run the workload once per candidate; a placement that fails to load is recorded with its error."""
    from xpuspec.pipeline import Pipeline

    groups: dict[tuple[str, str, str], list[Placement]] = {}
    for candidate in candidates:
        groups.setdefault((candidate.target_device, candidate.draft_device, candidate.drafter), []).append(
            candidate
        )
    prompts = config.prompts
    measurements = []
    for (target, draft, drafter), placements in groups.items():
        try:
            pipe = Pipeline(
                bundle_path,
                target_device=target,
                draft_device=draft,
                drafter=drafter,
                properties=dict(config.properties) or None,
                use_placement=False,
            )
            # Warm-up: first inferences allocate and compile kernels for new shapes.
            pipe.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        except (ValueError, RuntimeError) as error:
            logger.warning("placement %s / %s / %s failed to load: %s", target, draft, drafter, error)
            for placement in placements:
                measurement = Measurement(placement, 0.0, 0, 0.0, error=f"{type(error).__name__}: {error}")
                measurements.append(measurement)
                progress(measurement)
            continue
        for placement in placements:
            runs = [_run_workload(pipe, placement, prompts, config.max_tokens) for _ in range(config.repeats)]
            measurement = max(runs, key=lambda run: run.tokens_per_s)
            measurements.append(measurement)
            progress(measurement)
        del pipe
    return measurements


def _run_workload(pipe: Any, placement: Placement, prompts: list[str], max_tokens: int) -> Measurement:
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, num_draft_tokens=placement.num_draft_tokens
    )
    started = time.perf_counter()
    results = pipe.generate(prompts, params)
    seconds = time.perf_counter() - started
    num_tokens = sum(len(result.token_ids) for result in results)
    drafted = sum(result.stats.get("drafted", 0) for result in results)
    accepted = sum(result.stats.get("accepted", 0) for result in results)
    return Measurement(
        placement,
        tokens_per_s=num_tokens / seconds if seconds > 0 else 0.0,
        num_tokens=num_tokens,
        seconds=seconds,
        acceptance_rate=accepted / drafted if drafted else None,
    )


def best_measurement(measurements: Sequence[Measurement]) -> Measurement:
    usable = [m for m in measurements if m.error is None and m.num_tokens > 0]
    if not usable:
        raise ValueError(
            "no placement ran: " + "; ".join(sorted({m.error or "no tokens" for m in measurements}))
        )
    return max(usable, key=lambda m: m.tokens_per_s)


def placement_record(
    best: Measurement, measurements: Sequence[Measurement], config: PlanConfig, devices_seen: Sequence[str]
) -> dict[str, Any]:
    """The manifest's "placement" object for the best measurement."""
    return {
        **best.placement.as_dict(),
        "measured": {
            "tokens_per_s": round(best.tokens_per_s, 2),
            "workload": {
                "num_prompts": config.num_prompts,
                "max_tokens": config.max_tokens,
                "greedy": True,
                "repeats": config.repeats,
            },
            "properties": dict(config.properties),
            "candidates": [m.as_dict() for m in measurements],
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "openvino_version": openvino_version(),
        "devices_seen": list(devices_seen),
    }
