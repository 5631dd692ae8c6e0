"""PNG plots of a report. matplotlib is imported here only (the `bench` extra), on the Agg backend."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PLOTS = ("speedup_vs_draft_length", "throughput_vs_concurrency", "acceptance_per_position")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as pyplot

    return pyplot


def _speedup_vs_draft_length(pyplot: Any, latency: dict[str, Any], path: Path) -> None:
    figure, axes = pyplot.subplots(figsize=(6, 4))
    rows = [r for r in latency["configurations"] if r["status"] == "ok"]
    for engine in dict.fromkeys(r["engine"] for r in rows):
        fixed = sorted(
            (r["draft_length"], r["speedup"])
            for r in rows
            if r["engine"] == engine and isinstance(r["draft_length"], int) and r.get("speedup")
        )
        if not fixed:
            continue
        (line,) = axes.plot(*zip(*fixed, strict=True), marker="o", label=f"{engine} measured")
        predicted = sorted(
            (r["draft_length"], r["predicted_speedup"])
            for r in rows
            if r["engine"] == engine and isinstance(r["draft_length"], int) and r.get("predicted_speedup")
        )
        if predicted:
            axes.plot(
                *zip(*predicted, strict=True),
                marker="x",
                linestyle="--",
                color=line.get_color(),
                label=f"{engine} predicted (Leviathan et al.)",
            )
        adaptive = [r["speedup"] for r in rows if r["engine"] == engine and r["draft_length"] == "adaptive"]
        if adaptive and adaptive[0]:
            axes.axhline(adaptive[0], linestyle=":", color=line.get_color(), label=f"{engine} adaptive γ")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.set_xlabel("draft length γ")
    axes.set_ylabel("speed-up over target-only (batch 1)")
    _save(pyplot, figure, axes, path)


def _throughput_vs_concurrency(pyplot: Any, load: dict[str, Any], path: Path) -> None:
    figure, axes = pyplot.subplots(figsize=(6, 4))
    for row in load["configurations"]:
        if row["status"] == "ok":
            levels = row["levels"]
            axes.plot(
                [lv["concurrency"] for lv in levels],
                [lv["tokens_per_s"] for lv in levels],
                marker="o",
                label=row["name"],
            )
    axes.set_xscale("log", base=2)
    axes.set_xlabel("concurrent requests")
    axes.set_ylabel("output tokens/s")
    _save(pyplot, figure, axes, path)


def _acceptance_per_position(pyplot: Any, latency: dict[str, Any], path: Path) -> None:
    figure, axes = pyplot.subplots(figsize=(6, 4))
    for row in latency["configurations"]:
        values = row.get("acceptance_per_position") or []
        points = [(i + 1, v) for i, v in enumerate(values) if v is not None]
        if row["status"] == "ok" and points:
            axes.plot(*zip(*points, strict=True), marker="o", label=row["name"])
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.set_xlabel("draft position")
    axes.set_ylabel("fraction of drafts accepted")
    axes.set_ylim(0, 1.05)
    _save(pyplot, figure, axes, path)


def write_plots(report: dict[str, Any], out: Path) -> dict[str, dict[str, str]]:
    """Draw every plot the report has data for; return ``{plot: {"file": name} | {"reason": why}}``."""
    if importlib.util.find_spec("matplotlib") is None:
        reason = "matplotlib is not installed (pip install 'xpuspec[bench]')"
        return {name: {"reason": reason} for name in PLOTS}
    pyplot = _pyplot()
    drawers = {
        "speedup_vs_draft_length": ("latency", _speedup_vs_draft_length),
        "acceptance_per_position": ("latency", _acceptance_per_position),
        "throughput_vs_concurrency": ("load", _throughput_vs_concurrency),
    }
    plots: dict[str, dict[str, str]] = {}
    for name in PLOTS:
        section, draw = drawers[name]
        if section not in report:
            plots[name] = {"reason": f"mode {report['settings']['mode']} has no {section} figures"}
            continue
        draw(pyplot, report[section], out / f"{name}.png")
        plots[name] = {"file": f"{name}.png"}
    return plots


def _save(pyplot: Any, figure: Any, axes: Any, path: Path) -> None:
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
