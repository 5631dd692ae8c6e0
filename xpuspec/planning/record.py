"""The manifest's "placement" record of one `xpuspec plan` run: the decision, the chosen compile
properties and every measurement behind them (:func:`xpuspec.devices.placement.write_placement` writes it)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from xpuspec.devices.placement import openvino_version
from xpuspec.planning.planner import Decision, Measurement, PlanConfig
from xpuspec.planning.tuning import TuneResult


def placement_record(
    decision: Decision,
    measurements: Sequence[Measurement],
    config: PlanConfig,
    devices_seen: Sequence[str],
    tuned: dict[tuple[str, str], TuneResult] | None = None,
) -> dict[str, Any]:
    """The manifest's "placement" object: the decision, the chosen properties and every measurement."""
    tuned = tuned or {}
    placement = decision.chosen.placement
    target_result = tuned.get(("target", placement.target_device))
    draft_result = tuned.get(("draft", placement.draft_device)) if placement.drafter == "draft" else None
    record: dict[str, Any] = {
        **placement.as_dict(),
        "decision": decision.reason,
        "within_noise": not decision.clear,
        "target_properties": dict(target_result.chosen) if target_result else {},
        "target_properties_why": target_result.summary() if target_result else "not tuned",
        "draft_properties": dict(draft_result.chosen) if draft_result else {},
        "draft_properties_why": draft_result.summary() if draft_result else "not tuned",
        "same_as_target_only": (
            None if decision.chosen.agreement is None else decision.chosen.agreement.describe()
        ),
        "measured": {
            "tokens_per_s": round(decision.chosen.tokens_per_s, 2),
            "spread": None if decision.chosen.spread is None else round(decision.chosen.spread, 3),
            "workload": {
                "num_prompts": config.num_prompts,
                "max_tokens": config.max_tokens,
                "greedy": True,
                "rounds": [config.min_rounds, config.max_rounds],
                "min_round_seconds": config.min_round_seconds,
            },
            "same_as_target_only": "each drafting candidate's greedy tokens (first round, every prompt) "
            "against the target-only candidate's on the same target device and compile properties",
            "properties": dict(config.properties),
            "candidates": [m.as_dict() for m in measurements],
            "compile_properties": {f"{role}@{device}": r.as_dict() for (role, device), r in tuned.items()},
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "openvino_version": openvino_version(),
        "devices_seen": list(devices_seen),
    }
    return record
