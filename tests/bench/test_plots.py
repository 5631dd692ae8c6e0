"""The bench figures as objects: absolute tokens/s on one axis, plain ticks at measured points only,
legends outside the data, sample counts on acceptance points; and the PNG files they become."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from xpuspec.bench.plots import PLOTS, _pyplot, draw_figures, write_plots  # noqa: E402

GAMMAS = (1, 2, 4)  # γ = 3 is not measured: no tick may sit there


def _latency_row(engine: str, gamma: int | str | None, tokens_per_s: float, **extra: Any) -> dict[str, Any]:
    name = f"{engine} target-only" if gamma is None else f"{engine} speculative (γ={gamma})"
    return {
        "name": name,
        "engine": engine,
        "draft_length": gamma,
        "status": "ok",
        "tokens_per_s": tokens_per_s,
        **extra,
    }


def _speculative(engine: str, gamma: int, tokens_per_s: float) -> dict[str, Any]:
    drafted = [40 - 5 * i for i in range(gamma)] + [0] * (8 - gamma)
    accepted = [int(d * 0.8) for d in drafted]
    return _latency_row(
        engine,
        gamma,
        tokens_per_s,
        speedup=None,
        predicted_speedup=1.0 + 0.1 * gamma,
        drafted_per_position=drafted,
        acceptance_per_position=[a / d if d else None for a, d in zip(accepted, drafted, strict=True)],
    )


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    rows = [_latency_row("xpuspec", None, 700.0), _latency_row("OpenVINO GenAI", None, 800.0)]
    rows += [_speculative("xpuspec", g, 700.0 + 50 * g) for g in GAMMAS]
    rows += [_speculative("OpenVINO GenAI", g, 800.0 + 40 * g) for g in GAMMAS]
    rows.append(_latency_row("xpuspec", "adaptive", 790.0))
    rows.append({"name": "llama.cpp", "engine": "llama.cpp", "draft_length": None, "status": "skipped"})
    load = [
        {
            "name": name,
            "engine": name,
            "status": "ok",
            "levels": [{"concurrency": c, "tokens_per_s": base * c**0.5} for c in (1, 2, 4, 8, 16)],
        }
        for name, base in (("xpuspec target-only", 300.0), ("OpenVINO GenAI CB", 400.0))
    ]
    return {
        "settings": {"mode": "all"},
        "latency": {"configurations": rows},
        "load": {"configurations": load},
    }


@pytest.fixture(scope="module")
def figures(report: dict[str, Any]) -> dict[str, Any]:
    drawn = draw_figures(report)
    yield drawn
    for figure in drawn.values():
        _pyplot().close(figure)


def _tick_labels(axes: Any) -> list[str]:
    axes.figure.canvas.draw()
    return [label.get_text() for label in axes.get_xticklabels()]


def test_every_engine_in_absolute_tokens_per_s(figures: dict[str, Any]) -> None:
    axes = figures["tokens_per_s_vs_draft_length"].axes[0]
    assert axes.get_ylabel() == "output tokens/s (batch 1)"
    assert axes.get_xlabel() == "draft length γ"
    lines = {line.get_label(): line for line in axes.get_lines()}
    xpuspec, genai = lines["xpuspec measured"], lines["OpenVINO GenAI measured"]
    # target-only at γ = 0 with its own absolute rate: a slower target-only stays visible
    assert list(xpuspec.get_xdata()) == [0, *GAMMAS] and xpuspec.get_ydata()[0] == 700.0
    assert list(genai.get_xdata()) == [0, *GAMMAS] and genai.get_ydata()[0] == 800.0
    # the prediction is drawn in tokens/s too: predicted speed-up x that engine's target-only rate
    predicted = lines["xpuspec predicted (Leviathan et al.)"]
    assert list(predicted.get_ydata()) == pytest.approx([700.0 * (1.0 + 0.1 * g) for g in GAMMAS])
    assert lines["xpuspec adaptive γ"].get_ydata()[0] == 790.0
    assert not any("llama.cpp" in label for label in lines)  # skipped rows are not drawn


def test_ticks_only_at_measured_points_with_plain_labels(figures: dict[str, Any]) -> None:
    gamma_axes = figures["tokens_per_s_vs_draft_length"].axes[0]
    assert list(gamma_axes.get_xticks()) == [0, *GAMMAS]
    assert _tick_labels(gamma_axes) == ["0\n(target only)", "1", "2", "4"]
    load_axes = figures["throughput_vs_concurrency"].axes[0]
    assert load_axes.get_xscale() == "log"
    assert list(load_axes.get_xticks()) == [1, 2, 4, 8, 16]
    assert _tick_labels(load_axes) == ["1", "2", "4", "8", "16"]  # not 2^0, 2^1
    assert list(load_axes.get_xticks(minor=True)) == []
    assert load_axes.get_xlabel() == "concurrent requests" and load_axes.get_ylabel() == "output tokens/s"
    position_axes = figures["acceptance_per_position"].axes[0]
    assert list(position_axes.get_xticks()) == [1, 2, 3, 4]  # positions 1..4 exist (γ = 4)


@pytest.mark.parametrize("name", PLOTS)
def test_legend_sits_outside_the_data(figures: dict[str, Any], name: str) -> None:
    figure = figures[name]
    axes = figure.axes[0]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    legend_box = axes.get_legend().get_window_extent(renderer)
    axes_box = axes.get_window_extent(renderer)
    assert legend_box.x0 >= axes_box.x1  # entirely to the right of the plotting area


def test_acceptance_points_carry_sample_counts(figures: dict[str, Any]) -> None:
    axes = figures["acceptance_per_position"].axes[0]
    labels = [text.get_text() for text in axes.texts]
    # xpuspec and GenAI at γ = 1, 2, 4: position 1 was tested 40 times in each configuration
    assert labels.count("n=40") == 2 * len(GAMMAS)
    assert "n=25" in labels  # position 4 of γ = 4
    assert axes.get_ylabel() == "fraction of drafts accepted"


def test_write_plots_saves_every_png(report: dict[str, Any], tmp_path: Path) -> None:
    plots = write_plots(report, tmp_path)
    assert set(plots) == set(PLOTS)
    for entry in plots.values():
        assert (tmp_path / entry["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    latency_only = write_plots({k: v for k, v in report.items() if k != "load"}, tmp_path)
    assert latency_only["throughput_vs_concurrency"] == {"reason": "mode all has no load figures"}
