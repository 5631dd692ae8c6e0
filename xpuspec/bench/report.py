"""The benchmark report: report.json with every raw figure, report.md with the tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LATENCY_COLUMNS = (
    "configuration",
    "TTFT ms",
    "TPOT ms",
    "tokens/s",
    "acceptance",
    "α",
    "accepted/step",
    "speed-up",
    "decode speed-up",
    "predicted",
    "÷ predicted",
    "÷ GenAI",
    "÷ GenAI by round",
    "÷ GenAI, same text",
    "÷ transformers",
    "= exact",
    "= target-only",
)
LOAD_COLUMNS = (
    "configuration",
    "clients",
    "requests",
    "tokens/s",
    "TTFT ms",
    "TPOT ms",
    "acceptance",
    "errors",
)


def _number(value: Any, digits: int = 1, suffix: str = "") -> str:
    return "" if value is None else f"{value:.{digits}f}{suffix}"


def _percent(value: Any) -> str:
    return "" if value is None else f"{value:.0%}"


def _spread(values: list[float] | None) -> str:
    """The lowest and highest of the per-round ratios; nothing for a single round."""
    return f"{min(values):.2f}-{max(values):.2f}" if values and len(values) > 1 else ""


def _same_text(row: dict[str, Any]) -> str:
    """÷ GenAI over the prompts where both wrote the same tokens, and how many those were."""
    equal = row.get("equal_outputs_with_genai")
    if equal is None:
        return ""
    ratio = row.get("ratio_to_genai_on_equal_outputs")
    return f"{_number(ratio, 2)} ({equal})" if ratio is not None else f"({equal})"


def _cell(text: str) -> str:
    """A Markdown table cell: on one line, its pipes escaped (an error message may hold either)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _header(columns: tuple[str, ...]) -> list[str]:
    return [_row(list(columns)), _row(["---"] + ["---:"] * (len(columns) - 1))]


def not_run(reason: str | None) -> str:
    """A row that did not run, as its one cell says it: ``not run: <reason>``."""
    text = (reason or "no reason given").strip()
    return text if text.startswith("not run: ") else f"not run: {text}"


def _skipped_row(name: str, reason: str | None, width: int) -> str:
    return _row([name, not_run(reason)] + [""] * (width - 2))


def latency_table(section: dict[str, Any]) -> list[str]:
    lines = _header(LATENCY_COLUMNS)
    for row in section["configurations"]:
        if row["status"] != "ok":
            lines.append(_skipped_row(row["name"], row.get("reason"), len(LATENCY_COLUMNS)))
            continue
        ratios = row.get("ratio_to_peers") or {}
        lines.append(
            _row(
                [
                    row["name"],
                    _number(row.get("ttft_ms")),
                    _number(row.get("tpot_ms"), 2),
                    _number(row.get("tokens_per_s")),
                    _percent(row.get("acceptance_rate")),
                    _number(row.get("alpha"), 2),
                    _number(row.get("mean_accepted_per_step"), 2),
                    _number(row.get("speedup"), 2, "×"),
                    _number(row.get("decode_speedup"), 2, "×"),
                    _number(row.get("predicted_speedup"), 2, "×"),
                    _number(row.get("measured_over_predicted"), 2),
                    _number(ratios.get("OpenVINO GenAI"), 2),
                    _spread(row.get("round_ratios_to_genai")),
                    _same_text(row),
                    _number(ratios.get("transformers"), 2),
                    row.get("same_tokens_as_exact", ""),
                    row.get("same_tokens_as_target_only", ""),
                ]
            )
        )
    return lines


def load_table(section: dict[str, Any]) -> list[str]:
    lines = _header(LOAD_COLUMNS)
    for row in section["configurations"]:
        if row["status"] != "ok":
            lines.append(_skipped_row(row["name"], row.get("reason"), len(LOAD_COLUMNS)))
            continue
        for level in row["levels"]:
            speculation = level.get("speculation") or {}
            lines.append(
                _row(
                    [
                        row["name"],
                        str(level["concurrency"]),
                        str(level["requests"]),
                        _number(level["tokens_per_s"]),
                        _number(level.get("ttft_ms")),
                        _number(level.get("tpot_ms"), 2),
                        _percent(speculation.get("acceptance_rate")),
                        str(level.get("errors", 0)),
                    ]
                )
            )
    return lines


def _latency_lines(latency: dict[str, Any], rounds: int) -> list[str]:
    """The batch-1 latency section: its table, the row groups' properties, how it was measured and
    each speculative engine's cost curve."""
    costs = latency.get("step_costs") or {}
    lines = ["", "## Batch-1 latency", ""]
    lines += latency_table(latency)
    properties = latency.get("properties") or {}
    lines += ["", "Compile properties of each row group:", ""]
    lines += [f"- {group}: {value}" for group, value in properties.items()]
    lines += [
        "",
        f"{rounds} rounds, interleaved prompt by prompt (every row runs a prompt before any "
        "runs the next, the order reversed from one prompt to the next, each xpuspec row beside the "
        "GenAI row it is divided by); each row's figures are each prompt's fastest run over the rounds, "
        "summed. Every round compiles every engine afresh, each xpuspec engine beside its GenAI "
        "peer, which of the two first alternating from round to round; prefix caching is off in "
        "both engines. Rows "
        "without a suffix compile both engines with the same properties; "
        "*default* rows run each engine as it comes (xpuspec with the properties `xpuspec plan` "
        "recorded, else its CPU plugin's; GenAI with none). *= exact* is greedy agreement: requests "
        "whose tokens equal those of xpuspec target-only in exact mode (f32 compute, f32 KV cache, "
        "no dynamic quantisation); *= target-only*: requests whose tokens equal the same engine's "
        "target-only row's (same properties: drafting should change none). "
        "TTFT/TPOT are medians over prompts. "
        "α is Leviathan et al.'s per-token acceptance (accepted / tested drafts); acceptance is "
        "accepted / drafted. Speed-up is tokens/s over the same engine's target-only run; *decode "
        "speed-up* is its TPOT over this row's (prefill left out); *predicted* is Leviathan et al.'s "
        "(1 − α^(γ+1)) / (1 − α) × step(0) / step(γ) at the row's measured α, where "
        "step(γ) = γ·c_draft + c_verify(γ + 1) is the engine's measured mean decode step at γ (its "
        "cost curve below: the draft's passes and the verification of γ + 1 tokens, the engine's "
        "Python included); *÷ predicted* is decode speed-up over predicted. ÷ GenAI compares with "
        "GenAI's row at the same draft length and properties (the adaptive and tree rows: GenAI's "
        "best row by tokens/s, target-only included): the median, over every prompt of every "
        "round, of GenAI's seconds for the prompt over xpuspec's in the same round; "
        "*÷ GenAI by round* is the lowest and highest of the rounds' total seconds in the same ratio, "
        "which shows how much the machine's noise moves it; *÷ GenAI, same text* "
        "is the median over the prompts where both engines wrote the same tokens (how many in "
        "brackets): time per token depends on the text, and speculative runs at bf16 depart from "
        "target-only's text where chunk sizes differ. *xpuspec "
        "EAGLE-3* rows, when the bundle has a head, draft with "
        "it at the same properties; their speed-ups are over xpuspec target-only.",
    ]
    for engine, curve in (latency.get("engine_cost_model") or {}).items():
        steps = ", ".join(f"γ={g}: {_number(ms, 3)}" for g, ms in curve.get("step_ms", {}).items())
        verify = ", ".join(f"{n}: {_number(ms, 3)}" for n, ms in curve.get("verify_ms", {}).items())
        lines += [
            "",
            f"{engine} cost curve (ms, median over rounds): decode step by γ {steps} (γ=0: the "
            f"target-only run's); verification "
            f"by tokens per sequence {verify}; drafting pass {_number(curve.get('draft_pass_ms'), 3)} "
            f"+ {_number(curve.get('draft_python_ms'), 3)} Python. Single-token forwards at idle: "
            f"target {_number(costs.get('target_step_ms'), 3)}, "
            f"draft {_number(costs.get('draft_step_ms'), 3)}.",
        ]
    return lines


def markdown(report: dict[str, Any]) -> str:
    environment, settings = report["environment"], report["settings"]
    packages = ", ".join(f"{name} {version}" for name, version in environment["packages"].items() if version)
    lines = [
        "# xpuspec bench",
        "",
        f"- bundle: {settings['bundle']} "
        f"(target {report['models']['target']}, draft {report['models']['draft']})",
        f"- CPU: {environment['cpu']}, {environment['cores']} cores; {packages}",
        f"- workload: {settings['workload']}, {settings['prompts']} prompts, {settings['max_tokens']} new "
        f"tokens each, greedy, end-of-sequence ignored; properties: {settings['properties']}",
    ]
    if settings.get("quick"):
        lines.append(
            "- --quick: a quick look (xpuspec and GenAI at the same properties, the exact reference, one "
            "round); the full bench adds the default-properties rows, tree drafting, EAGLE-3, GenAI's "
            "prompt lookup, structured output and more rounds"
        )
    if "latency" in report:
        lines += _latency_lines(report["latency"], settings["rounds"])
    if "structured" in report:
        from xpuspec.bench.structured import structured_table

        lines += ["", "## Structured output (batch 1, JSON Schema vs unconstrained)", ""]
        lines += structured_table(report["structured"])
    if "load" in report:
        lines += ["", "## Throughput under load", ""]
        lines += load_table(report["load"])
        lines += [
            "",
            f"N clients each send {settings['requests_per_client']} streaming requests in turn to "
            "`xpuspec serve` (acceptance from its /metrics); GenAI CB generates lists of N prompts.",
        ]
    if report.get("plots"):
        lines += ["", "## Plots", ""]
        for name, entry in report["plots"].items():
            if entry.get("file"):
                lines.append(f"![{name}]({entry['file']})")
            else:
                lines.append(f"- {name}: skipped: {entry.get('reason')}")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, markdown_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    markdown_path.write_text(markdown(report), encoding="utf-8")
    return json_path, markdown_path
