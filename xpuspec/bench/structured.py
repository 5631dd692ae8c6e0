"""Structured output in `xpuspec bench`: the grammar masks' cost per token, and constrained decoding
with speculation beside unconstrained decoding.

Batch 1, greedy, one pipeline: each round runs every prompt unconstrained and then constrained to a
JSON Schema (order swapped every other round), and keeps the best tokens/s of each over the rounds.
Constrained replies end when the JSON is complete, so they are compared by tokens/s, not by time.
The masks of verified positions are computed while the target runs (``xpuspec.engine.verification``); the
draft's masks are computed between its passes. The mask cost is the time in the grammar engine
(mask computation and unpacking) over the tokens emitted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "maxLength": 160},
        "language": {"enum": ["python", "c", "javascript", "other"]},
        "lines": {"type": "integer", "minimum": 0, "maximum": 10000},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 6},
    },
    "required": ["summary", "language", "lines", "keywords"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "code_summary", "schema": SCHEMA}}


def run_structured(
    pipeline: Callable[[str], Any], prompts: list[list[int]], max_tokens: int, rounds: int
) -> dict[str, Any]:
    """{"masks": {...}, "rows": [{"mode", "tokens_per_s", ...}], "constrained_over_unconstrained"}."""
    from xpuspec.sample.sampling_params import SamplingParams

    pipe = pipeline("auto")
    grammar = pipe.requests.grammar
    if grammar is None:
        return {"skipped": "the bundle has no tokenizer.json: structured output is off"}
    modes = {
        "unconstrained": SamplingParams(max_tokens=max_tokens, temperature=0.0),
        "json_schema": SamplingParams(
            max_tokens=max_tokens, temperature=0.0, response_format=RESPONSE_FORMAT
        ),
    }
    texts = [pipe.tokenizer.decode(ids) for ids in prompts]
    pipe.generate(texts[0], modes["json_schema"])  # compiles the grammar and warms its lexer up
    best = {mode: 0.0 for mode in modes}
    totals = {mode: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0} for mode in modes}
    mask_seconds = num_masks = constrained_tokens = 0.0
    for round_index in range(rounds):
        order = list(modes) if round_index % 2 == 0 else list(reversed(modes))
        for mode in order:
            tokens = 0
            started = time.perf_counter()
            masks_before, mask_seconds_before = grammar.num_masks, grammar.mask_seconds
            for text in texts:
                result = pipe.generate(text, modes[mode])[0]
                tokens += len(result.token_ids)
                totals[mode]["drafted"] += result.stats.get("drafted", 0) or 0
                totals[mode]["accepted"] += result.stats.get("accepted", 0) or 0
            seconds = time.perf_counter() - started
            best[mode] = max(best[mode], tokens / seconds)
            totals[mode]["tokens"] += tokens
            totals[mode]["seconds"] += seconds
            if mode == "json_schema":
                num_masks += grammar.num_masks - masks_before
                mask_seconds += grammar.mask_seconds - mask_seconds_before
                constrained_tokens += tokens
    rows = [
        {
            "mode": mode,
            "tokens_per_s": best[mode],
            "tokens": totals[mode]["tokens"],
            "acceptance": totals[mode]["accepted"] / totals[mode]["drafted"]
            if totals[mode]["drafted"]
            else None,
        }
        for mode in modes
    ]
    return {
        "drafter": pipe.drafter,
        "rows": rows,
        "constrained_over_unconstrained": best["json_schema"] / best["unconstrained"]
        if best["unconstrained"]
        else None,
        "masks": {
            "us_per_token": 1e6 * mask_seconds / constrained_tokens if constrained_tokens else None,
            "us_per_mask": 1e6 * mask_seconds / num_masks if num_masks else None,
            "masks_per_token": num_masks / constrained_tokens if constrained_tokens else None,
            "vocab_size": grammar.vocab_size,
        },
    }


def structured_table(section: dict[str, Any]) -> list[str]:
    if "skipped" in section:
        return [f"Skipped: {section['skipped']}"]
    masks = section["masks"]

    def number(value: Any, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = ["| mode | tokens/s | tokens | acceptance |", "|---|---|---|---|"]
    for row in section["rows"]:
        cells = [row["mode"], number(row["tokens_per_s"]), str(row["tokens"]), number(row["acceptance"], 2)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Drafter {section['drafter']}; constrained / unconstrained tokens/s: "
        f"{number(section['constrained_over_unconstrained'], 3)}. Grammar masks (llguidance, vocabulary "
        f"{masks['vocab_size']}): {number(masks['us_per_token'])} µs per emitted token, "
        f"{number(masks['us_per_mask'])} µs per mask, {number(masks['masks_per_token'], 2)} masks per token.",
    ]
    return lines
