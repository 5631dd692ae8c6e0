"""Engine parity with one compile: ``python -m research.bench.parity [--bundle B] [--draft-lengths 0,4]``.

``xpuspec bench`` compiles every engine afresh in each round, so each round also carries a first-run
cost (buffers growing, kernels prepared for new shapes), and on a machine whose rounds of one
configuration vary by 20-50% its best-of-N ratios need many rounds. This command compiles each engine
once (xpuspec's ``Pipeline`` and GenAI's ``LLMPipeline``, same properties, prefix caching off in both),
warms both on every prompt, then runs ``--rounds`` rounds over the same token ids, the engines
alternating prompt by prompt (which goes first alternates), and reports per draft length the best
round of each engine, their ratio, the median of the per-round ratios and the ratio of per-prompt
bests (GenAI seconds over xpuspec seconds: above 1 means xpuspec is faster). ``--default`` compiles
each engine as it comes instead (xpuspec's plan-recorded or plugin properties and adaptive γ beside
GenAI with no properties). ``--drafter eagle3`` drafts on both sides with the bundle's EAGLE-3 head
(GenAI's after :func:`~xpuspec.bench.genai_eagle3.convert_head`) instead of its draft model;
``--workload`` picks the prompts (``xpuspec bench``'s: code, chat or a JSONL file).
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
from xpuspec.bench.workloads import encode_prompts, load_workload

logger = logging.getLogger(__name__)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m research.bench.parity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bundle", default="demo", help="bundle folder or demo (default: demo)")
    parser.add_argument(
        "--draft-lengths", default="0,4", help="fixed γ values; 0 is target-only (default: 0,4)"
    )
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default: 6)")
    parser.add_argument("--prompts", type=int, default=8, help="number of prompts (default: 8)")
    parser.add_argument(
        "--workload", default="code", help="code, chat, or FILE.jsonl (default: code, held-out code prompts)"
    )
    parser.add_argument(
        "--drafter",
        choices=("draft", "eagle3"),
        default="draft",
        help="draft with the bundle's draft model or its EAGLE-3 head, on both sides (default: draft)",
    )
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


def _time_prompt(engine: Any, token_ids: list[int], max_tokens: int, draft_length: Any) -> float:
    started = time.perf_counter()
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
    """Interleaved rounds of the two engines; seconds per round and the ratios.

    The engines alternate prompt by prompt (which goes first alternates too), so the two runs of a
    prompt are a fraction of a second apart: a shared machine's slow spells, which last longer,
    then fall on both. Besides the per-round ratios this gives a per-prompt best: each prompt's
    fastest run over the rounds, summed (interference only ever slows a run down).
    """
    engines = {"xpuspec": (xpuspec_engine, xpuspec_length), "genai": (genai_engine, genai_length)}
    for engine, length in engines.values():  # warm-up: every prompt once, not timed
        for token_ids in prompts:
            _time_prompt(engine, token_ids, max_tokens, length)
    # seconds[name][round][prompt]
    seconds: dict[str, list[list[float]]] = {"xpuspec": [], "genai": []}
    for index in range(rounds):
        for name in seconds:
            seconds[name].append([])
        for prompt_index, token_ids in enumerate(prompts):
            first = ["xpuspec", "genai"] if (index + prompt_index) % 2 == 0 else ["genai", "xpuspec"]
            for name in first:
                engine, length = engines[name]
                seconds[name][index].append(_time_prompt(engine, token_ids, max_tokens, length))
    per_round = {name: [sum(values) for values in rounds_] for name, rounds_ in seconds.items()}
    per_prompt_best = {
        name: sum(min(column) for column in zip(*rounds_, strict=True)) for name, rounds_ in seconds.items()
    }
    ratios = [genai / ours for ours, genai in zip(per_round["xpuspec"], per_round["genai"], strict=True)]
    return {
        "seconds": per_round,
        "best_ratio": min(per_round["genai"]) / min(per_round["xpuspec"]),
        "median_ratio": statistics.median(ratios),
        "per_prompt_best_ratio": per_prompt_best["genai"] / per_prompt_best["xpuspec"],
        "tokens": len(prompts) * max_tokens,
    }


def xpuspec_pipeline(
    bundle: str, properties: dict[str, Any] | None, needs_draft: bool, drafter: str = "draft"
) -> Any:
    """xpuspec's side: the same properties for target and draft, and prefix caching off like GenAI's.

    Every prompt repeats (the warm-up, then each round), so a cache on one side only would time that
    side without most of its prefills.
    """
    from xpuspec import Pipeline

    return Pipeline(
        bundle,
        drafter=("eagle3" if drafter == "eagle3" else "auto") if needs_draft else "none",
        properties=properties,
        draft_properties=properties,
        enable_prefix_caching=False,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    lengths = [int(value) for value in args.draft_lengths.split(",") if value.strip()]
    # Same properties: GenAI's CPU defaults made explicit, read off this CPU's plugin (bf16 compute and
    # KV where the CPU has bf16; an AVX2-only CPU refuses a bf16 KV cache in PagedAttention).
    same_properties = genai_default_properties()
    properties = None if args.default else same_properties
    needs_draft = args.default or any(length > 0 for length in lengths)
    try:  # before anything compiles: a bad --workload should cost nothing
        workload = load_workload(args.workload, args.prompts)
    except ValueError as error:
        raise SystemExit(f"python -m research.bench.parity: {error}") from None
    pipeline = xpuspec_pipeline(args.bundle, properties, needs_draft, args.drafter)
    max_prompt_tokens = (
        pipeline.bundle.max_context - args.max_tokens - pipeline.engine_config.max_draft_tokens - 1
    )
    prompts = encode_prompts(pipeline, workload, max_prompt_tokens)
    ours = XpuspecLatencyRunner(pipeline)
    target = pipeline.bundle.target.path
    draft_dir = None
    if needs_draft and args.drafter == "eagle3":
        from xpuspec.bench.genai_eagle3 import convert_head, genai_eagle3_unavailable

        reason = genai_eagle3_unavailable(pipeline.bundle)
        if reason is not None:
            raise SystemExit(f"python -m research.bench.parity: GenAI cannot run the EAGLE-3 head: {reason}")
        draft_dir = convert_head(pipeline.bundle)
    elif needs_draft and pipeline.bundle.draft is not None:
        draft_dir = pipeline.bundle.draft.path
    genai_properties = {} if args.default else same_properties
    if args.default:
        # xpuspec adaptive against GenAI target-only and GenAI with its draft at each fixed γ.
        configurations = [("xpuspec adaptive vs GenAI target-only", None, None)]
        configurations += [(f"xpuspec adaptive vs GenAI γ={g}", None, g) for g in lengths if g > 0]
    else:
        configurations = [(f"γ={g}" if g else "target-only", g, g or None) for g in lengths]
    for label, our_length, genai_length in configurations:
        genai = GenaiLatencyRunner(target, draft_dir if genai_length else None, genai_properties)
        result = compare(ours, genai, prompts, args.max_tokens, args.rounds, our_length, genai_length)
        best = {name: min(values) for name, values in result["seconds"].items()}
        print(
            f"{label}: xpuspec {result['tokens'] / best['xpuspec']:.1f} tokens/s, GenAI "
            f"{result['tokens'] / best['genai']:.1f} (best of {args.rounds}); ÷ GenAI best "
            f"{result['best_ratio']:.3f}, median round {result['median_ratio']:.3f}, per-prompt best "
            f"{result['per_prompt_best_ratio']:.3f}",
            flush=True,
        )
        del genai
    return 0


if __name__ == "__main__":
    sys.exit(main())
