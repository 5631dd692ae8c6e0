"""PNG plots of a report. matplotlib is imported here only (the `bench` extra), on the Agg backend.

Every plot shows absolute figures (speed-ups stay in report.md's tables, where each is next to the
baseline it divides by), puts its legend outside the data, and has x ticks only at measured points,
labelled as plain numbers.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PLOTS = ("tokens_per_s_vs_draft_length", "throughput_vs_concurrency", "acceptance_per_position")
TARGET_ONLY_X = 0  # the target-only run sits at γ = 0 on the draft-length axis


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as pyplot

    return pyplot


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "ok"]


def _measured_ticks(axes: Any, positions: list[int], labels: dict[int, str] | None = None) -> None:
    """Ticks only where something was measured, labelled as plain numbers (never 2^0)."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    ticks = sorted(set(positions))
    axes.xaxis.set_major_locator(FixedLocator(ticks))
    axes.xaxis.set_major_formatter(FixedFormatter([(labels or {}).get(t, str(t)) for t in ticks]))
    axes.xaxis.set_minor_locator(NullLocator())


def tokens_per_s_vs_draft_length(pyplot: Any, latency: dict[str, Any]) -> Any:
    """Absolute tokens/s of every engine against γ on one axis: target-only at γ = 0."""
    figure, axes = pyplot.subplots(figsize=(7.5, 4))
    rows = _ok(latency["configurations"])
    positions: list[int] = []
    for engine in dict.fromkeys(r["engine"] for r in rows):
        mine = [r for r in rows if r["engine"] == engine and r.get("tokens_per_s")]
        baseline = next((r["tokens_per_s"] for r in mine if r["draft_length"] is None), None)
        points = sorted(
            ([(TARGET_ONLY_X, baseline)] if baseline else [])
            + [(r["draft_length"], r["tokens_per_s"]) for r in mine if isinstance(r["draft_length"], int)]
        )
        if not points:
            continue
        positions += [x for x, _ in points]
        (line,) = axes.plot(*zip(*points, strict=True), marker="o", label=f"{engine} measured")
        predicted = sorted(
            (r["draft_length"], r["predicted_speedup"] * baseline)
            for r in mine
            if isinstance(r["draft_length"], int) and r.get("predicted_speedup") and baseline
        )
        if predicted:
            axes.plot(
                *zip(*predicted, strict=True),
                marker="x",
                linestyle="--",
                color=line.get_color(),
                label=f"{engine} predicted (Leviathan et al.)",
            )
        adaptive = [r["tokens_per_s"] for r in mine if r["draft_length"] == "adaptive"]
        if adaptive:
            axes.axhline(adaptive[0], linestyle=":", color=line.get_color(), label=f"{engine} adaptive γ")
    _measured_ticks(axes, positions, {TARGET_ONLY_X: "0\n(target only)"})
    axes.set_ylim(bottom=0)
    axes.set_xlabel("draft length γ")
    axes.set_ylabel("output tokens/s (batch 1)")
    axes.set_title("Batch-1 speed by draft length")
    return figure


def throughput_vs_concurrency(pyplot: Any, load: dict[str, Any]) -> Any:
    figure, axes = pyplot.subplots(figsize=(7.5, 4))
    positions: list[int] = []
    for row in _ok(load["configurations"]):
        levels = row["levels"]
        positions += [lv["concurrency"] for lv in levels]
        axes.plot(
            [lv["concurrency"] for lv in levels],
            [lv["tokens_per_s"] for lv in levels],
            marker="o",
            label=row["name"],
        )
    axes.set_xscale("log", base=2)  # levels double; plain labels set below
    _measured_ticks(axes, positions)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("concurrent requests")
    axes.set_ylabel("output tokens/s")
    axes.set_title("Throughput under load")
    return figure


# (offset in points, (horizontal, vertical) alignment) of a point's "n=" label, per series in turn.
_COUNT_PLACES = (((0, 5), ("center", "bottom")), ((0, -6), ("center", "top")), ((6, 0), ("left", "center")))


def acceptance_per_position(pyplot: Any, latency: dict[str, Any]) -> Any:
    """Share of drafts accepted at each draft position, each point labelled with its sample count."""
    figure, axes = pyplot.subplots(figsize=(7.5, 4))
    positions: list[int] = []
    for row in _ok(latency["configurations"]):
        values = row.get("acceptance_per_position") or []
        counts = row.get("drafted_per_position") or []
        points = [
            (i + 1, value, counts[i] if i < len(counts) else None)
            for i, value in enumerate(values)
            if value is not None
        ]
        if not points:
            continue
        positions += [x for x, _, _ in points]
        (line,) = axes.plot(
            [x for x, _, _ in points], [y for _, y, _ in points], marker="o", label=row["name"]
        )
        # Series take turns above, below and right of their points, so close points stay legible.
        offset, align = _COUNT_PLACES[(len(axes.get_lines()) - 1) % len(_COUNT_PLACES)]
        for x, y, count in points:
            if count is not None:
                axes.annotate(
                    f"n={count}",
                    (x, y),
                    textcoords="offset points",
                    xytext=offset,
                    ha=align[0],
                    va=align[1],
                    fontsize="x-small",
                    color=line.get_color(),
                    bbox={
                        "boxstyle": "square,pad=0.1",
                        "facecolor": "white",
                        "edgecolor": "none",
                        "alpha": 0.8,
                    },
                )
    _measured_ticks(axes, positions)
    axes.set_xlabel("draft position")
    axes.set_ylabel("fraction of drafts accepted")
    axes.set_ylim(0, 1.12)
    axes.set_title("Acceptance by draft position (n = drafts proposed there)")
    return figure


DRAWERS = {
    "tokens_per_s_vs_draft_length": ("latency", tokens_per_s_vs_draft_length),
    "acceptance_per_position": ("latency", acceptance_per_position),
    "throughput_vs_concurrency": ("load", throughput_vs_concurrency),
}


def draw_figures(report: dict[str, Any], pyplot: Any | None = None) -> dict[str, Any]:
    """Every figure the report has data for, legends placed, not saved: ``{plot: Figure}``."""
    pyplot = pyplot or _pyplot()
    figures = {}
    for name in PLOTS:
        section, draw = DRAWERS[name]
        if section in report:
            figure = draw(pyplot, report[section])
            place_legend(figure)
            figures[name] = figure
    return figures


def place_legend(figure: Any) -> None:
    """The legend to the right of the axes, outside the data."""
    axes = figure.axes[0]
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small")
    figure.tight_layout()


def write_plots(report: dict[str, Any], out: Path) -> dict[str, dict[str, str]]:
    """Draw every plot the report has data for; return ``{plot: {"file": name} | {"reason": why}}``."""
    if importlib.util.find_spec("matplotlib") is None:
        reason = "matplotlib is not installed (pip install 'xpuspec[bench]')"
        return {name: {"reason": reason} for name in PLOTS}
    pyplot = _pyplot()
    figures = draw_figures(report, pyplot)
    plots: dict[str, dict[str, str]] = {}
    for name in PLOTS:
        figure = figures.get(name)
        if figure is None:
            section = DRAWERS[name][0]
            plots[name] = {"reason": f"mode {report['settings']['mode']} has no {section} figures"}
            continue
        figure.savefig(out / f"{name}.png", dpi=100, bbox_inches="tight")  # keeps the outside legend
        pyplot.close(figure)
        plots[name] = {"file": f"{name}.png"}
    return plots


CATEGORY_PLOT = "categories.png"


def category_bars(pyplot: Any, summary: dict[str, Any]) -> Any:
    """Tokens/s per category, a bar per row side by side; one panel per client count."""
    levels = summary["levels"]
    figure, panels = pyplot.subplots(len(levels), 1, figsize=(9, 3.6 * len(levels)), squeeze=False)
    labels = [row["row"] for row in summary["rows"]]
    for axes, level in zip(panels[:, 0], levels, strict=True):
        entries = [*level["categories"], {"name": "overall", **level["overall"]}]
        present = [label for label in labels if level["overall"]["rows"].get(label)]
        width = 0.8 / max(1, len(present))
        for index, label in enumerate(present):
            speeds = [(entry["rows"].get(label) or {}).get("tokens_per_s", 0.0) for entry in entries]
            positions = [x + (index - (len(present) - 1) / 2) * width for x in range(len(entries))]
            axes.bar(positions, speeds, width, label=label)
        axes.set_xticks(range(len(entries)), [entry["name"] for entry in entries], rotation=20, ha="right")
        axes.set_ylabel("output tokens/s")
        clients = level["clients"]
        axes.set_title(f"Tokens/s per kind of task, {clients} client{'s' if clients != 1 else ''}")
    place_legend(figure)
    return figure


def write_category_plot(summary: dict[str, Any], out: Path) -> dict[str, str]:
    """``out/categories.png``; ``{"file": name}``, or ``{"reason": why}`` where none was drawn."""
    if importlib.util.find_spec("matplotlib") is None:
        return {"reason": "matplotlib is not installed (pip install 'xpuspec[bench]')"}
    if not summary["levels"] or not any(level["overall"]["rows"] for level in summary["levels"]):
        return {"reason": "no row was measured"}
    pyplot = _pyplot()
    figure = category_bars(pyplot, summary)
    out.mkdir(parents=True, exist_ok=True)
    figure.savefig(out / CATEGORY_PLOT, dpi=100, bbox_inches="tight")
    pyplot.close(figure)
    return {"file": CATEGORY_PLOT}
