"""Does drafting change the default's greedy answer? Speculative vs target-only, per compile-property set.

    python -m research.bench.spec_agreement agreement [--configs main,u8-by-token,...] [--prompts 24]
    python -m research.bench.spec_agreement speed [--configs ...] [--rounds 3] [--prompts 6]

``agreement``: for each configuration, the default model's target-only greedy text (``drafter="none"``,
the same properties) against the draft model (adaptive γ, prompt lookup beside it), the n-gram drafter,
EAGLE-3, trees, and the draft model with 8 requests in flight; with the prefix cache on, and the
target-only requests sent again, 8 in flight, with their prompts in the prefix cache.
``speed``: batch-1 tokens/s of one drafter (``--drafter``, default the draft model) under each
configuration in interleaved rounds (order reversed every other round), as a ratio to the first
configuration round by round (``main``: the properties Pipeline applies on main).
Instructions: the default model's 24 held-out chat instructions; EOS honoured.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from xpuspec import Pipeline
from xpuspec.planning.agreement import compare, greedy_token_ids

logger = logging.getLogger(__name__)

HELDOUT = Path(__file__).resolve().parents[2] / "xpuspec" / "models" / "demo" / "smollm2_heldout.jsonl"
F32_G128 = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128}
# None: the plugin's defaults as Pipeline applies them (on main: for the default model's GGUF weights
# bf16 compute and a u8 KV cache, keys per channel, per token only beside a drafter that can draft trees).
CONFIGS: dict[str, dict[str, Any] | str | None] = {
    "main": None,
    "u8-by-token": {**F32_G128, "KV_CACHE_PRECISION": "u8", "KEY_CACHE_QUANT_MODE": "BY_TOKEN"},
    "u8-by-token-g32": {
        **F32_G128,
        "KV_CACHE_PRECISION": "u8",
        "KEY_CACHE_QUANT_MODE": "BY_TOKEN",
        "KEY_CACHE_GROUP_SIZE": 32,
        "VALUE_CACHE_GROUP_SIZE": 32,
    },
    "u8-by-channel": {**F32_G128, "KV_CACHE_PRECISION": "u8", "KEY_CACHE_QUANT_MODE": "BY_CHANNEL"},
    # bf16 compute: what the CPU plugin compiles for the default model's GGUF weights when not told.
    "bf16-u8-by-token": {
        "INFERENCE_PRECISION_HINT": "bf16",
        "KV_CACHE_PRECISION": "u8",
        "KEY_CACHE_QUANT_MODE": "BY_TOKEN",
    },
    "bf16-u8-by-channel": {
        "INFERENCE_PRECISION_HINT": "bf16",
        "KV_CACHE_PRECISION": "u8",
        "KEY_CACHE_QUANT_MODE": "BY_CHANNEL",
    },
    "bf16-kv-bf16": {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "bf16"},
    "f32-kv": {**F32_G128, "KV_CACHE_PRECISION": "f32"},
    "f16-kv": {**F32_G128, "KV_CACHE_PRECISION": "f16"},
    "bf16-kv": {**F32_G128, "KV_CACHE_PRECISION": "bf16"},
    "exact": "exact",
    # The stable preset for the target only: the draft keeps its defaults (its cache changes no answer).
    "f32-kv-target": {**F32_G128, "KV_CACHE_PRECISION": "f32"},
}
# Configurations whose draft model keeps the plugin's defaults ({}); the others apply to both models.
DRAFT_DEFAULTS = {"f32-kv-target"}
TREE = {"depth": 4, "width": 2, "nodes": 8}
# (name, drafter, draft_tree, in_flight)
VARIANTS = (
    ("draft", "draft", None, 1),
    ("ngram", "ngram", None, 1),
    ("draft x8", "draft", None, 8),
    ("eagle3", "eagle3", None, 1),
    ("tree", "draft", TREE, 1),
)


def instructions(count: int) -> list[list[dict[str, str]]]:
    lines = HELDOUT.read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["messages"] for line in lines[:count]]


def _reason(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    telling = [line for line in lines if not line.startswith(("Exception from ", "Check "))]
    return (telling or lines or [type(error).__name__])[-1][:160]


def _pipe(config: str, drafter: str, prefix_cache: bool = True, draft_tree: Any = None) -> Pipeline:
    return Pipeline(
        None,
        drafter=drafter,
        properties=CONFIGS[config],
        use_placement=False,
        enable_prefix_caching=prefix_cache,
        draft_tree=draft_tree,
        draft_properties={} if config in DRAFT_DEFAULTS else None,
    )


def _describe(reference: list[list[int]], got: list[list[int]]) -> str:
    differing = [i for i, (r, g) in enumerate(zip(reference, got, strict=True)) if r != g]
    text = compare(reference, got).describe()
    return f"{text} differ: {differing}" if differing else text


def agreement(
    config: str, prompts: list[Any], max_tokens: int, variants: tuple[str, ...] | None = None
) -> dict[str, str]:
    row: dict[str, str] = {}
    try:
        pipe = _pipe(config, "none")
    except (RuntimeError, ValueError) as error:
        return {"error": _reason(error)}
    reference = greedy_token_ids(pipe, prompts, max_tokens)
    # The same requests again, 8 in flight, their prompts in the prefix cache.
    again = greedy_token_ids(pipe, prompts, max_tokens, in_flight=8)
    row["target again x8"] = _describe(reference, again)
    logger.info("%s / target again x8: %s", config, row["target again x8"])
    del pipe
    gc.collect()
    for name, drafter, tree, in_flight in VARIANTS:
        if variants is not None and name not in variants:
            continue
        started = time.perf_counter()
        try:
            pipe = _pipe(config, drafter, draft_tree=tree)
        except (RuntimeError, ValueError) as error:
            row[name] = "error: " + _reason(error)
            continue
        got = greedy_token_ids(pipe, prompts, max_tokens, in_flight=in_flight)
        row[name] = _describe(reference, got)
        logger.info("%s / %s: %s (%.0f s)", config, name, row[name], time.perf_counter() - started)
        del pipe
        gc.collect()
    return row


def speed(
    configs: list[str], prompts: list[Any], max_tokens: int, rounds: int, drafter: str = "draft"
) -> dict[str, list[float]]:
    pipes = {config: _pipe(config, drafter) for config in configs}
    for pipe in pipes.values():  # warm-up: first shapes compile kernels
        greedy_token_ids(pipe, prompts[:2], 16)
    rates: dict[str, list[float]] = {config: [] for config in configs}
    for index in range(rounds):
        order = configs if index % 2 == 0 else configs[::-1]
        for config in order:
            started = time.perf_counter()
            tokens = greedy_token_ids(pipes[config], prompts, max_tokens)
            rates[config].append(sum(map(len, tokens)) / (time.perf_counter() - started))
        logger.info("round %d: %s", index + 1, {c: round(r[-1], 1) for c, r in rates.items()})
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("agreement", "speed"))
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drafter", default="draft", help="speed: the drafter of every configuration")
    parser.add_argument(
        "--variants", default=None, help="agreement: only these drafter rows (comma-separated)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    prompts = instructions(args.prompts)
    if args.mode == "agreement":
        for config in configs:
            variants = tuple(v.strip() for v in args.variants.split(",")) if args.variants else None
            row = agreement(config, prompts, args.max_tokens, variants)
            print(json.dumps({"config": config, **row}), flush=True)
        return 0
    rates = speed(configs, prompts, args.max_tokens, args.rounds, args.drafter)
    base = rates[configs[0]]
    for config, values in rates.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        print(
            json.dumps(
                {
                    "config": config,
                    "tokens_per_s": [round(v, 1) for v in values],
                    "ratio_to_first": [round(r, 3) for r in ratios],
                    "median_ratio": round(statistics.median(ratios), 3),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
