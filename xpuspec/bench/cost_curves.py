"""An engine's measured cost curves over the rounds of the latency bench (step, verification, drafting)."""

from __future__ import annotations

import statistics
from typing import Any

from xpuspec.spec_decode.policy import CostModel


def cost_curve(model: CostModel, max_gamma: int, target_only: CostModel | None = None) -> dict[str, Any]:
    """An engine's measured costs after a round, in ms: the mean decode step by γ (drafting plus
    verification, what Leviathan's prediction divides by), the verification step by tokens per
    sequence with its number of steps, and a drafting pass (device and the loop's Python).

    A speculative engine rarely verifies one token alone, so its own γ = 0 step is mostly the load-time
    calibration; the mean step of ``target_only`` (the target-only run's engine), where it measured
    one, is taken instead, so that both ends of the prediction are means over the same rounds."""
    verify = model.verify.table(1)
    drafts = model.draft_passes.table(1).get(1, {})
    steps = {gamma: 1000 * model.mean_step_cost(gamma) for gamma in range(max_gamma + 1)}
    if target_only is not None and target_only.verify.table(1).get(1, {}).get("mean"):
        steps[0] = 1000 * target_only.mean_step_cost(0)
    return {
        "step_ms": steps,
        "verify_ms": {n: _ms(cell["mean"]) for n, cell in verify.items() if cell["steps"]},
        "verify_steps": {n: cell["steps"] for n, cell in verify.items() if cell["steps"]},
        "verify_calibrated_ms": {
            n: _ms(cell["calibrated"]) for n, cell in verify.items() if cell["calibrated"]
        },
        "draft_pass_ms": _ms(drafts.get("mean") or drafts.get("calibrated")),
        "draft_python_ms": 1000 * model.draft_python,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def median_curve(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over rounds of every figure of :func:`cost_curve`."""
    merged: dict[str, Any] = {}
    for key, first in rounds[0].items():
        if isinstance(first, dict):
            cells = {k for curve in rounds for k in curve[key]}
            merged[key] = {
                k: statistics.median(v)
                for k in sorted(cells)
                if (v := [curve[key][k] for curve in rounds if curve[key].get(k) is not None])
            }
        else:
            values = [curve[key] for curve in rounds if curve[key] is not None]
            merged[key] = statistics.median(values) if values else None
    return merged
