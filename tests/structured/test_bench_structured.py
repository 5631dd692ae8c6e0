"""The structured-output section of `xpuspec bench`: its structure and mask accounting, not timings."""

from __future__ import annotations

from tests.conftest import F32
from xpuspec import Pipeline
from xpuspec.bench.structured import run_structured, structured_table


def test_structured_section_reports_masks_and_both_modes(pair_bundle):
    def pipeline(drafter: str) -> Pipeline:
        return Pipeline(pair_bundle, drafter=drafter, properties=F32)

    encoder = pipeline("none")
    prompts = [encoder.tokenizer.encode(text) for text in ("def add(a, b):", "class Point:")]
    section = run_structured(pipeline, prompts, max_tokens=24, rounds=2)
    assert [row["mode"] for row in section["rows"]] == ["unconstrained", "json_schema"]
    assert all(row["tokens"] > 0 and row["tokens_per_s"] > 0 for row in section["rows"])
    masks = section["masks"]
    # One mask per sampled position at least (verified rows, plus the draft's and forced tokens' masks).
    assert masks["masks_per_token"] >= 1.0 and masks["us_per_mask"] > 0
    assert masks["vocab_size"] == encoder.vocab_size
    assert section["constrained_over_unconstrained"] > 0
    text = "\n".join(structured_table(section))
    assert "json_schema" in text and "µs per emitted token" in text
