"""The full bench's rows at the quick sizes on the tiny pair: the report's structure, never its timings.

(`--quick` itself, which runs fewer rows, is tested in test_quick.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from xpuspec.bench.config import QUICK, BenchConfig
from xpuspec.bench.report import write_report
from xpuspec.bench.suite import run_bench

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LATENCY_NAMES = [
    "xpuspec target-only",
    "xpuspec speculative (γ=2)",
    "xpuspec speculative (γ=4)",
    "xpuspec speculative (adaptive γ)",
    "xpuspec speculative (tree, auto shape)",
    "xpuspec default target-only",
    "xpuspec default speculative (γ=2)",
    "xpuspec default speculative (γ=4)",
    "xpuspec default speculative (adaptive γ)",
    "xpuspec default speculative (tree, auto shape)",
    "xpuspec exact target-only",
    "OpenVINO GenAI target-only",
    "OpenVINO GenAI speculative (γ=2)",
    "OpenVINO GenAI speculative (γ=4)",
    "OpenVINO GenAI speculative (adaptive γ)",
    "OpenVINO GenAI default target-only",
    "OpenVINO GenAI default speculative (γ=2)",
    "OpenVINO GenAI default speculative (γ=4)",
    "OpenVINO GenAI default speculative (adaptive γ)",
    "OpenVINO GenAI prompt lookup speculative (γ=2)",
    "OpenVINO GenAI prompt lookup speculative (γ=4)",
    "transformers target-only",
    "transformers speculative (γ=2)",
    "transformers speculative (γ=4)",
    "transformers speculative (adaptive γ)",
    "llama.cpp target-only",
]
LOAD_NAMES = [
    "xpuspec server target-only",
    "xpuspec server speculative (adaptive γ)",
    "xpuspec server speculative (γ=4)",
    "OpenVINO GenAI CB target-only",
    "OpenVINO GenAI CB speculative (γ=4)",
]


@pytest.fixture(scope="module")
def bench_out(pair_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    # The pair's Hugging Face checkpoints sit beside the bundle: transformers runs as a peer too.
    hf_target, hf_draft = pair_bundle.parent / "target", pair_bundle.parent / "draft"
    hf = (hf_target / "config.json").is_file() and (hf_draft / "config.json").is_file()
    config = BenchConfig(
        out=out,
        bundle=pair_bundle,
        hf_target=hf_target if hf else None,
        hf_draft=hf_draft if hf else None,
        **QUICK,  # the quick sizes, every row of the full bench
    )
    write_report(run_bench(config), out)
    return out


@pytest.fixture(scope="module")
def report(bench_out: Path) -> dict[str, Any]:
    return json.loads((bench_out / "report.json").read_text(encoding="utf-8"))


def _by_name(section: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in section["configurations"]}


def test_report_records_settings_and_environment(report: dict[str, Any]) -> None:
    assert {"settings", "environment", "models", "prompts", "latency", "load", "plots"} <= report.keys()
    assert report["settings"]["draft_lengths"] == [2, 4]
    assert report["settings"]["concurrency"] == [1, 4]
    environment = report["environment"]
    assert environment["cpu"] and environment["cores"] >= 1
    assert environment["packages"]["openvino"] and environment["packages"]["xpuspec"]
    assert len(report["prompts"]) == 3 and all(p["prompt_tokens"] > 0 for p in report["prompts"])


def test_every_latency_configuration_is_measured_or_skipped_with_a_reason(report: dict[str, Any]) -> None:
    rows = _by_name(report["latency"])
    assert list(rows) == LATENCY_NAMES
    for name, row in rows.items():
        assert row["status"] in ("ok", "skipped"), name
        if row["status"] == "skipped":
            assert row["reason"], name
        else:
            assert row["requests"] == 3 and row["output_tokens"] == 3 * 16, name
            assert {"tokens_per_s", "ttft_ms", "tpot_ms", "speedup", "round_seconds"} <= row.keys(), name
    for name in LATENCY_NAMES[:11]:  # xpuspec itself is never skipped
        assert rows[name]["status"] == "ok", rows[name].get("reason")
    assert rows["llama.cpp target-only"]["status"] == "skipped"
    assert rows["OpenVINO GenAI speculative (adaptive γ)"]["status"] == "skipped"
    assert rows["OpenVINO GenAI default speculative (adaptive γ)"]["status"] == "skipped"
    for length in (2, 4):  # GenAI's prompt lookup: a peer of xpuspec's adaptive γ, which also looks up
        assert rows[f"OpenVINO GenAI prompt lookup speculative (γ={length})"]["status"] == "ok"


def test_rows_compare_with_the_exact_reference_and_the_right_peer(report: dict[str, Any]) -> None:
    latency = report["latency"]
    rows = _by_name(latency)
    assert latency["properties"]["xpuspec exact"] == "exact"
    # Both engines got the same properties: GenAI's CPU defaults made explicit (the CPU plugin's).
    same = latency["properties"]["same properties"]
    assert set(same) == {"INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE"}
    # Every measured row shows its greedy agreement with the exact reference; the reference agrees
    # with itself, and exact speculation is token-identical to it on this pair.
    for name, row in rows.items():
        if row["status"] == "ok":
            assert row["same_tokens_reference"] == "xpuspec exact target-only", name
            assert row["same_tokens_as_exact"].endswith("/3"), name
    assert rows["xpuspec exact target-only"]["same_tokens_as_exact"] == "3/3"
    for name in ("xpuspec target-only", "xpuspec default target-only", "xpuspec default speculative (γ=2)"):
        assert set(rows[name]["ratio_to_peers"]) >= {"OpenVINO GenAI"}, name
    # Every round compiles the engines afresh; the first round compiles xpuspec first.
    order = latency["compile_order"]
    assert len(order) == report["settings"]["rounds"] and order[0][0].startswith("xpuspec")


def test_speculative_rows_carry_acceptance_and_the_predicted_speedup(report: dict[str, Any]) -> None:
    latency = report["latency"]
    assert latency["step_costs"]["cost_ratio"] > 0
    rows = _by_name(latency)
    for gamma in (2, 4):
        row = rows[f"xpuspec speculative (γ={gamma})"]
        assert row["drafted"] > 0 and 0 <= row["accepted"] <= row["drafted"]
        assert 0 <= row["alpha"] <= 1 and row["predicted_speedup"] > 0
        assert len(row["acceptance_per_position"]) >= gamma
        # Every verification drafts position 0; fewer draft deeper positions near max_tokens.
        drafted = row["drafted_per_position"]
        assert drafted[0] == row["verification_steps"] and drafted == sorted(drafted, reverse=True)
        assert set(row["ratio_to_peers"]) == {"OpenVINO GenAI", "transformers"}
    assert rows["xpuspec target-only"]["drafted"] is None


def test_every_load_configuration_sweeps_each_level_or_is_skipped(report: dict[str, Any]) -> None:
    rows = _by_name(report["load"])
    assert sorted(rows) == sorted(LOAD_NAMES)
    for name, row in rows.items():
        if row["status"] == "skipped":
            assert row["reason"], name
            continue
        assert [level["concurrency"] for level in row["levels"]] == [1, 4], name
        for level in row["levels"]:
            assert level["requests"] == level["concurrency"] and level["errors"] == 0, name
            assert level["output_tokens"] == level["requests"] * 16, name
    for name in LOAD_NAMES[:3]:
        assert rows[name]["status"] == "ok", rows[name].get("reason")
    # A fixed γ always drafts: the server's /metrics figures reach the report.
    speculation = rows["xpuspec server speculative (γ=4)"]["levels"][0]["speculation"]
    assert speculation["drafted"] > 0 and len(speculation["acceptance_per_position"]) == 4


def test_markdown_has_a_row_for_every_configuration(bench_out: Path, report: dict[str, Any]) -> None:
    markdown = (bench_out / "report.md").read_text(encoding="utf-8")
    assert "## Batch-1 latency" in markdown and "## Throughput under load" in markdown
    lines = markdown.splitlines()
    for name in LATENCY_NAMES + LOAD_NAMES:
        assert any(line.startswith(f"| {name} |") for line in lines), name
    for row in report["latency"]["configurations"]:
        if row["status"] == "skipped":
            assert f"| {row['name']} | not run: {row['reason']} |" in markdown


def test_plots_are_png_files(bench_out: Path, report: dict[str, Any]) -> None:
    pytest.importorskip("matplotlib")
    assert set(report["plots"]) == {
        "tokens_per_s_vs_draft_length",
        "throughput_vs_concurrency",
        "acceptance_per_position",
    }
    for entry in report["plots"].values():
        data = (bench_out / entry["file"]).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and data[12:16] == b"IHDR"
        assert f"]({entry['file']})" in (bench_out / "report.md").read_text(encoding="utf-8")
