"""Greedy output with the default draft equals target-only output at the exact preset, on held-out prompts.

    python -m research.training.smollm2_exactness [--prompts 12] [--max-tokens 128] [--gamma 3]

Runs the default model (SmolLM2-135M-Instruct and the shipped draft, from the cache) on the first held-out
instructions at f32 compute, f32 KV cache and no dynamic quantisation, target-only and with the draft
(adaptive γ, and each fixed ``--gamma``), and reports how many outputs are identical. Exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import logging
import time

from research.training.smollm2_instructions import heldout_instructions
from xpuspec import Pipeline, SamplingParams

logger = logging.getLogger(__name__)

EXACT = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, action="append", default=[], help="fixed draft lengths to check")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    conversations = [[{"role": "user", "content": text}] for text in heldout_instructions()[: args.prompts]]
    outputs: dict[str, list[list[int]]] = {}
    for drafter, gamma in [("none", None), ("draft", None), *(("draft", g) for g in args.gamma)]:
        pipe = Pipeline(None, drafter=drafter, properties=EXACT, use_placement=False)
        params = SamplingParams(
            max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True, num_draft_tokens=gamma
        )
        started = time.perf_counter()
        results = [pipe.generate([conversation], params)[0] for conversation in conversations]
        seconds = time.perf_counter() - started
        name = (
            f"{drafter} (γ {'adaptive' if gamma is None else gamma})" if drafter != "none" else "target-only"
        )
        outputs[name] = [result.token_ids for result in results]
        drafted = sum(result.stats["drafted"] for result in results)
        accepted = sum(result.stats["accepted"] for result in results)
        logger.info(
            "%s: %.1f tokens/s, drafted %d, accepted %d",
            name,
            len(results) * args.max_tokens / seconds,
            drafted,
            accepted,
        )
    reference = outputs["target-only"]
    all_same = True
    for name, tokens in outputs.items():
        same = sum(a == b for a, b in zip(tokens, reference, strict=True))
        all_same &= same == len(reference)
        logger.info("%s: identical to target-only on %d / %d", name, same, len(reference))
    return 0 if all_same else 1


if __name__ == "__main__":
    raise SystemExit(main())
