"""Engine parity with one compile: ``python -m xpuspec.bench.parity [--bundle B] [--draft-lengths 0,4]``.

``xpuspec bench`` compiles every engine afresh in each round, so each round also carries a first-run
cost (buffers growing, kernels prepared for new shapes), and on a machine whose rounds of one
configuration vary by 20-50% its best-of-N ratios need many rounds. This command compiles each engine
once (xpuspec's ``Pipeline`` and GenAI's ``LLMPipeline``, same properties, GenAI's prefix caching off),
warms both on every prompt, then runs ``--rounds`` rounds interleaved (which engine goes first
alternates) over the same token ids, and reports per draft length the best round of each engine, their
ratio, and the median of the per-round ratios (GenAI seconds over xpuspec seconds: above 1 means
xpuspec is faster). ``--default`` compiles each engine as it comes instead (xpuspec's plan-recorded or
plugin properties and adaptive γ beside GenAI with no properties).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from typing import Any

from xpuspec.bench.latency import XpuspecLatencyRunner, genai_default_properties
from xpuspec.bench.peers import GenaiLatencyRunner
from xpuspec.bench.workloads import heldout_code_prompts

logger = logging.getLogger(__name__)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m xpuspec.bench.parity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bundle", default="demo", help="bundle folder or demo (default: demo)")
    parser.add_argument(
        "--draft-lengths", default="0,4", help="fixed γ values; 0 is target-only (default: 0,4)"
    )
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default: 6)")
    parser.add_argument("--prompts", type=int, default=8, help="held-out code prompts (default: 8)")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default: 64)")
    parser.add_argument(
        "--default",
        action="store_true",
        help="each engine as it comes: xpuspec adaptive γ with its own properties, GenAI with none",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.prompts < 1 or args.max_tokens < 1:
        parser.error("--rounds, --prompts and --max-tokens must be >= 1")
    return args


def _time_round(engine: Any, prompts: list[list[int]], max_tokens: int, draft_length: Any) -> float:
    started = time.perf_counter()
    for token_ids in prompts:
        engine.generate(token_ids, max_tokens, draft_length)
    return time.perf_counter() - started


def compare(
    xpuspec_engine: Any,
    genai_engine: Any,
    prompts: list[list[int]],
    max_tokens: int,
    rounds: int,
    xpuspec_length: Any,
    genai_length: int | None,
) -> dict[str, Any]:
    """Interleaved rounds of the two engines; seconds per round and the ratios."""
    engines = {"xpuspec": (xpuspec_engine, xpuspec_length), "genai": (genai_engine, genai_length)}
    for engine, length in engines.values():  # warm-up: every prompt once, not timed
        _time_round(engine, prompts, max_tokens, length)
    seconds: dict[str, list[float]] = {"xpuspec": [], "genai": []}
    for index in range(rounds):
        order = ["xpuspec", "genai"] if index % 2 == 0 else ["genai", "xpuspec"]
        for name in order:
            engine, length = engines[name]
            seconds[name].append(_time_round(engine, prompts, max_tokens, length))
    ratios = [genai / ours for ours, genai in zip(seconds["xpuspec"], seconds["genai"], strict=True)]
    return {
        "seconds": seconds,
        "best_ratio": min(seconds["genai"]) / min(seconds["xpuspec"]),
        "median_ratio": statistics.median(ratios),
        "tokens": len(prompts) * max_tokens,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from xpuspec import Pipeline

    lengths = [int(value) for value in args.draft_lengths.split(",") if value.strip()]
    # Same properties: GenAI's CPU defaults made explicit, read off this CPU's plugin (bf16 compute and
    # KV where the CPU has bf16; an AVX2-only CPU refuses a bf16 KV cache in PagedAttention).
    same_properties = genai_default_properties()
    properties = None if args.default else same_properties
    needs_draft = args.default or any(length > 0 for length in lengths)
    pipeline = Pipeline(
        args.bundle,
        drafter="auto" if needs_draft else "none",
        properties=properties,
        draft_properties=properties,
    )
    prompts = [pipeline.encode(prompt.text) for prompt in heldout_code_prompts(args.prompts)]
    ours = XpuspecLatencyRunner(pipeline)
    target, draft = pipeline.bundle.target.path, pipeline.bundle.draft
    genai_properties = {} if args.default else same_properties
    if args.default:
        # xpuspec adaptive against GenAI target-only and GenAI with its draft at each fixed γ.
        configurations = [("xpuspec adaptive vs GenAI target-only", None, None)]
        configurations += [(f"xpuspec adaptive vs GenAI γ={g}", None, g) for g in lengths if g > 0]
    else:
        configurations = [(f"γ={g}" if g else "target-only", g, g or None) for g in lengths]
    for label, our_length, genai_length in configurations:
        genai = GenaiLatencyRunner(
            target, draft.path if genai_length and draft is not None else None, genai_properties
        )
        result = compare(ours, genai, prompts, args.max_tokens, args.rounds, our_length, genai_length)
        best = {name: min(values) for name, values in result["seconds"].items()}
        print(
            f"{label}: xpuspec {result['tokens'] / best['xpuspec']:.1f} tokens/s, GenAI "
            f"{result['tokens'] / best['genai']:.1f} (best of {args.rounds}); ÷ GenAI best "
            f"{result['best_ratio']:.3f}, median round {result['median_ratio']:.3f}",
            flush=True,
        )
        del genai
    return 0


if __name__ == "__main__":
    sys.exit(main())
