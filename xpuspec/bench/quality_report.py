"""The quality measure's table, its JSON record and the manifest's ``quality`` field."""

from __future__ import annotations

from typing import Any

from xpuspec.bench.quality_run import QualityReport
from xpuspec.models.bundle import write_manifest_field

MANIFEST_FIELD = "quality"
HEADER = (
    "| row | weights | properties | KL mean | KL p99 | KL top-n mean | top-1 | PPL | decode tok/s | budget |",
    "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
)


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def as_dict(report: QualityReport) -> dict[str, Any]:
    """The report as plain data: text, budget, one entry per row, rows not run."""
    rows = []
    for row in report.rows:
        figures = row.deviation.figures()
        rows.append(
            {
                "row": row.label,
                "weights": row.weights,
                "properties": row.properties,
                **{key: None if value is None else round(value, 6) for key, value in figures.items()},
                "decode_tokens_per_s": None
                if row.decode_tokens_per_s is None
                else round(row.decode_tokens_per_s, 2),
                "decode_rounds": len(row.decode_rounds),
                "within_budget": report.budget.within(figures) if report.budget else None,
            }
        )
    return {
        "bundle": report.bundle,
        "reference": "the same weights in exact mode (f32 compute, f32 KV cache, no dynamic quantisation)",
        "text": report.text,
        "budget": report.budget.as_dict() if report.budget else None,
        "rows": rows,
        "not_run": dict(report.not_run),
    }


def table(report: QualityReport) -> str:
    """The figures as a Markdown table, with the text, the reference and the budget named above it."""
    record = as_dict(report)
    text = record["text"]
    lines = [
        f"text: {text['passages']} passages, {text['positions']} positions in {text['chunks']} chunks of at "
        f"most {text['chunk_tokens']} tokens; KL top-n: lumped on each row's top {text['top_n']} and the "
        "actual token",
        f"reference: {record['reference']}",
        "budget: "
        + (report.budget.describe() if report.budget else "none (neither llama.cpp nor its emulation ran)"),
        "",
        *HEADER,
    ]
    for row in record["rows"]:
        within = row["within_budget"]
        verdict = "-" if within is None else "within" if within else "over"
        lines.append(
            f"| {row['row']} | {row['weights'] or '-'} | {row['properties'] or '-'} | "
            f"{_number(row['kl_mean'], 5)} | {_number(row['kl_p99'], 5)} | "
            f"{_number(row['kl_top_n_mean'], 5)} | "
            f"{_number(row['top1'], 4)} | {_number(row['perplexity'], 2)} | "
            f"{_number(row['decode_tokens_per_s'], 1)} | {verdict} |"
        )
    for label, reason in record["not_run"].items():
        lines.append(f"\n{label}: not run: {reason}")
    return "\n".join(lines) + "\n"


def manifest_record(report: QualityReport) -> dict[str, Any]:
    """What the manifest keeps: the text's size, the budget and each row's figures (no speeds: those
    belong to the machine that measured them)."""
    record = as_dict(report)
    for row in record["rows"]:
        row.pop("decode_tokens_per_s", None)
        row.pop("decode_rounds", None)
    record.pop("bundle", None)
    return record


def write_quality(report: QualityReport) -> None:
    """Record the report in the bundle's manifest (``quality``), replacing an earlier one."""
    from pathlib import Path

    write_manifest_field(Path(report.bundle), MANIFEST_FIELD, manifest_record(report))
