"""The summary of `xpuspec bench --mode categories` (xpuspec.bench.categories), and its Markdown.

Per client count, category and row: tokens/s (each round's completion tokens over the category's wall
time, the median over rounds), TTFT p50 over every request, and the speculation counts pooled over the
rounds: acceptance (accepted / proposed drafts), accepted drafts per verifying target pass, and tokens
per target pass. Per category: xpuspec's default over its target-only, each llama.cpp n-gram row over
llama.cpp plain at the same threads, and the default over llama.cpp's best row, all ratios of medians.
The "overall" line takes, per round, each row's tokens summed over every category over its time summed
likewise, and the median of that over rounds; its counts pool every category.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from xpuspec.bench.categories import CategoriesRun, CategoryResult, Speculation
from xpuspec.bench.category_prompts import CATEGORIES
from xpuspec.bench.chat_clients import percentile
from xpuspec.bench.environment import cpu_line
from xpuspec.bench.llama_cpp import XPUSPEC_ROWS

DEFAULT, TARGET_ONLY = XPUSPEC_ROWS[0].label, XPUSPEC_ROWS[1].label
NGRAM = " n-gram"
OVERALL_METHOD = (
    "overall: per round, each row's tokens summed over every category over its time summed likewise, "
    "then the median over rounds; ratios are of those medians, counts pool every category and round"
)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def _total(speculations: Sequence[Speculation], name: str) -> int | None:
    values = [getattr(s, name) for s in speculations if getattr(s, name) is not None]
    return sum(values) if values else None


def pooled(speculations: Sequence[Speculation]) -> dict[str, Any]:
    """Counts summed, and the rates they give (None where a count is missing or zero)."""
    drafted, accepted = _total(speculations, "drafted"), _total(speculations, "accepted")
    steps, passes = _total(speculations, "verification_steps"), _total(speculations, "target_passes")
    return {
        "drafted": drafted,
        "accepted": accepted,
        "verification_steps": steps,
        "target_passes": passes,
        "acceptance": ratio(accepted, drafted),
        "accepted_per_verification": ratio(accepted, steps),
        "tokens_per_target_pass": ratio(_total(speculations, "generated"), passes),
    }


def row_figures(rounds: Sequence[Sequence[CategoryResult]]) -> dict[str, Any]:
    """One row over some categories, from each round's results for them: per round, tokens summed over
    time summed; the median over rounds; TTFT p50 over every request; the counts pooled."""
    per_round = [
        sum(sum(r.tokens for r in c.clients_round.results) for c in results)
        / max(sum(c.clients_round.wall_s for c in results), 1e-9)
        for results in rounds
    ]
    every = [c for results in rounds for c in results]
    ttfts = [1000 * r.ttft_s for c in every for r in c.clients_round.results if r.ttft_s is not None]
    return {
        "tokens_per_s": statistics.median(per_round),
        "tokens_per_s_by_round": [round(value, 2) for value in per_round],
        "ttft_p50_ms": percentile(ttfts, 50),
        "requests": sum(len(c.clients_round.results) for c in every),
        # Outside exact mode rows answer at different lengths: tokens/s compare equal work only where
        # these agree (``--same-lengths``).
        "completion_tokens": sum(r.tokens for c in every for r in c.clients_round.results),
        **pooled([c.speculation for c in every]),
    }


def ratios(rows: dict[str, dict[str, Any]], engines: dict[str, str]) -> dict[str, Any]:
    """The default over target-only, each n-gram row over its plain row, the default over llama.cpp's
    best row (and which that was)."""
    speed = {label: figures["tokens_per_s"] for label, figures in rows.items()}
    llama = [label for label in speed if engines.get(label) == "llama.cpp"]
    best = max(llama, key=lambda label: speed[label], default=None)
    return {
        "default_vs_target_only": ratio(speed.get(DEFAULT), speed.get(TARGET_ONLY)),
        "ngram_vs_plain": {
            label: ratio(speed[label], speed[label.removesuffix(NGRAM)])
            for label in llama
            if label.endswith(NGRAM) and label.removesuffix(NGRAM) in speed
        },
        "llama_cpp_best": best,
        "default_vs_llama_cpp_best": ratio(speed.get(DEFAULT), speed[best] if best else None),
    }


def _level(run: CategoriesRun, clients: int, engines: dict[str, str]) -> dict[str, Any]:
    sessions = {
        label: run.sessions[(label, clients)] for label in engines if run.sessions.get((label, clients))
    }
    categories = []
    for key, count in run.prompts.items():
        rows = {
            label: row_figures([[s.categories[key]] for s in mine if key in s.categories])
            for label, mine in sessions.items()
        }
        entry = {"category": key, "name": CATEGORIES.get(key, key), "prompts": count}
        entry |= {"in_flight": min(clients, count), "rows": rows, **ratios(rows, engines)}
        categories.append(entry)
    overall_rows = {
        label: row_figures([[s.categories[k] for k in run.prompts if k in s.categories] for s in mine])
        for label, mine in sessions.items()
    }
    overall = {"prompts": sum(run.prompts.values()), "rows": overall_rows, **ratios(overall_rows, engines)}
    return {"clients": clients, "categories": categories, "overall": overall}


def summarise(run: CategoriesRun) -> dict[str, Any]:
    engines = {row.label: row.engine for row in run.rows}
    return {
        "bundle": run.bundle,
        "environment": run.environment,
        "settings": {
            "rounds": run.rounds,
            "max_tokens": run.max_tokens,
            "clients": list(run.clients),
            "prompts": run.prompts,
            "greedy": True,
            # Per client count, each category's answer lengths every row generated (ignore_eos).
            "same_lengths": {str(count): lengths for count, lengths in run.lengths.items()} or None,
        },
        "rows": [{"row": row.label, "engine": row.engine, "args": list(row.args)} for row in run.rows],
        "levels": [_level(run, clients, engines) for clients in run.clients],
        "overall_method": OVERALL_METHOD,
        "not_run": run.not_run,
        "left_out": run.left_out,
    }


def _number(value: float | None, digits: int, suffix: str = "") -> str:
    return "" if value is None else f"{value:.{digits}f}{suffix}"


def _percent(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.0f}%"


def _speed_table(level: dict[str, Any], labels: list[str]) -> list[str]:
    lines = [
        "| category | prompts | " + " | ".join(labels) + " |",
        "|---|---:|" + "---:|" * len(labels),
    ]
    for entry in [*level["categories"], {"name": "**overall**", **level["overall"]}]:
        cells = []
        for label in labels:
            figures = entry["rows"].get(label)
            cells.append(
                ""
                if figures is None
                else f"{figures['tokens_per_s']:.1f} · {_number(figures['ttft_p50_ms'], 0, ' ms')}"
            )
        lines.append(f"| {entry['name']} | {entry['prompts']} | " + " | ".join(cells) + " |")
    return lines


def _ratio_table(level: dict[str, Any], labels: list[str], engines: dict[str, str]) -> list[str]:
    ngram = [label for label in labels if engines.get(label) == "llama.cpp" and label.endswith(NGRAM)]
    drafting = [
        label for label in labels if level["overall"]["rows"].get(label, {}).get("acceptance") is not None
    ]
    llama = any(engines.get(label) == "llama.cpp" for label in labels)
    header = ["category", "default ÷ target-only", *(f"{label} ÷ plain" for label in ngram)]
    header += ["default ÷ llama.cpp best"] * llama + [f"{label} acceptance" for label in drafting]
    header += ["default accepted per verifying pass", "default tokens per target pass"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for entry in [*level["categories"], {"name": "**overall**", **level["overall"]}]:
        default = entry["rows"].get(DEFAULT, {})
        cells = [_number(entry["default_vs_target_only"], 2)]
        cells += [_number(entry["ngram_vs_plain"].get(label), 2) for label in ngram]
        cells += [_number(entry["default_vs_llama_cpp_best"], 2)] * llama
        cells += [_percent(entry["rows"].get(label, {}).get("acceptance")) for label in drafting]
        cells += [
            _number(default.get("accepted_per_verification"), 2),
            _number(default.get("tokens_per_target_pass"), 2),
        ]
        lines.append(f"| {entry['name']} | " + " | ".join(cells) + " |")
    return lines


def markdown(summary: dict[str, Any]) -> str:
    """The report: the CPU and settings, then per client count a table of tokens/s and TTFT per category
    and row, and one of ratios and speculation figures; the rows not run and the prompts left out."""
    settings = summary["settings"]
    engines = {row["row"]: row["engine"] for row in summary["rows"]}
    lines = [
        "# Speculation per kind of task",
        "",
        cpu_line(summary["environment"]) + ".",
        f"Bundle: {summary['bundle']}; greedy, up to {settings['max_tokens']} new tokens a request; "
        f"{settings['rounds']} round(s), every server started afresh each round, rows in rotating order.",
    ]
    if settings.get("same_lengths"):
        lines.append(
            "Same lengths: every row generated each prompt's target-only answer length at that client "
            "count (measured before the rounds; `ignore_eos`), so every row did the same work."
        )
    for level in summary["levels"]:
        labels = [label for label in engines if level["overall"]["rows"].get(label)]
        clients = level["clients"]
        lines += ["", f"## {clients} client{'s' if clients != 1 else ''}", ""]
        lines += ["Tokens/s (median over rounds) · TTFT p50:", "", *_speed_table(level, labels), ""]
        lines += _ratio_table(level, labels, engines)
        capped = [entry["name"] for entry in level["categories"] if entry["in_flight"] < clients]
        if capped:
            lines.append(
                f"\nIn flight at most as many requests as the category has prompts (each is sent once "
                f"per server): {', '.join(capped)}."
            )
    lines += [
        "",
        f"Tokens/s: completion tokens over the category's wall time, first request sent to last answer "
        f"complete. {OVERALL_METHOD[0].upper() + OVERALL_METHOD[1:]}. Acceptance: accepted / proposed "
        "draft tokens; accepted per verifying pass: accepted drafts over the target passes that verified "
        "drafts; tokens per target pass: tokens over every target pass that gave a request tokens "
        "(1.00 without speculation). llama.cpp's acceptance is empty where its responses carry no draft "
        "counts.",
    ]
    for peer, reason in summary["not_run"].items():
        lines.append(f"\n{peer}: not run: {reason}")
    for category, count in summary["left_out"].items():
        name = CATEGORIES.get(category, category)
        lines.append(f"\n{name}: {count} prompt(s) left out, longer than the context with the new tokens.")
    return "\n".join(lines) + "\n"
