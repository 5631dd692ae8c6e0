"""A pair across tokenizers (a bundle `xpuspec prepare` made from two models whose tokenizers differ)
against its target alone.

python -m research.bench.cross_tokenizer --bundle PAIR [--rounds 3] [--prompts 4] [--max-tokens 64]
    [--num-draft-tokens 0] [--exact] [--no-prompt-lookup]

Generates the same greedy requests (held-out Python code prompts, all in flight) in interleaved rounds,
target alone and drafted across tokenizers, compares every round's tokens with the target's, and prints
tokens/s, acceptance (the draft model's apart from prompt lookup's), and the cost model's terms at one
sequence: the target's step at 1 and 1 + γ tokens, the drafting phase at γ, the translation's share of
it, and the acceptance at which drafting would break even. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from xpuspec.api.pipeline import Pipeline
from xpuspec.bench.workloads import heldout_code_prompts
from xpuspec.engine.engine import EngineConfig
from xpuspec.models.bundle import ModelBundle
from xpuspec.sample.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def first_difference(token_ids: list[list[int]], reference: list[list[int]]) -> list[int]:
    """Per prompt whose tokens differ from the reference's, the index of the first differing token."""
    found = []
    for ids, want in zip(token_ids, reference, strict=True):
        if ids != want:
            found.append(
                next(
                    (i for i, (a, b) in enumerate(zip(ids, want, strict=False)) if a != b),
                    min(len(ids), len(want)),
                )
            )
    return found


def run_round(pipe: Pipeline, prompts: list[str], params: SamplingParams) -> dict[str, Any]:
    started = time.perf_counter()
    results = pipe.generate(prompts, params)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "tokens": sum(len(r.token_ids) for r in results),
        "drafted": sum(r.stats["drafted"] for r in results),
        "accepted": sum(r.stats["accepted"] for r in results),
        "lookup_drafted": sum(r.stats["lookup_drafted"] for r in results),
        "lookup_accepted": sum(r.stats["lookup_accepted"] for r in results),
        "token_ids": [r.token_ids for r in results],
    }


def cost_terms(pipe: Pipeline, gamma: int) -> dict[str, float]:
    """The cost model's terms at one sequence: c_verify(1), c_verify(1 + γ), c_drafting(γ)."""
    cost = pipe.cost_model
    return {
        "verify_1": cost.target_cost(1, 1),
        "verify_gamma": cost.target_cost(1 + gamma, 1),
        "drafting_gamma": cost.drafting_cost(gamma, 1),
    }


def break_even_acceptance(terms: dict[str, float], gamma: int) -> float | None:
    """The per-token acceptance α at which E(α, γ) / (c_drafting + c_verify(1 + γ)) = 1 / c_verify(1)."""
    needed = (terms["drafting_gamma"] + terms["verify_gamma"]) / terms["verify_1"]
    if needed > gamma + 1:
        return None  # no acceptance pays: even γ + 1 tokens per step are too few
    low, high = 0.0, 1.0
    for _ in range(50):
        alpha = (low + high) / 2
        expected = sum(alpha**k for k in range(gamma + 1))
        low, high = (alpha, high) if expected < needed else (low, alpha)
    return (low + high) / 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True, help="a pair whose tokenizers differ")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-draft-tokens", type=int, default=0, help="fixed γ; 0: adaptive")
    parser.add_argument("--exact", action="store_true", help="exact mode (f32): greedy text must not change")
    parser.add_argument("--no-prompt-lookup", action="store_true", help="the draft model alone drafts")
    parser.add_argument("--gamma-for-costs", type=int, default=3, help="γ of the cost terms printed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    pair = args.bundle
    prompts = [p.text for p in heldout_code_prompts(args.prompts, prompt_chars=300)]
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=0.0,
        ignore_eos=True,
        num_draft_tokens=args.num_draft_tokens or None,
    )
    properties = "exact" if args.exact else None
    drafting_config = None
    if args.no_prompt_lookup:
        drafting_config = EngineConfig(max_model_len=ModelBundle.open(pair).max_context, prompt_lookup=False)
    pipes = {
        "target only": Pipeline(pair, drafter="none", properties=properties),
        "across tokenizers": Pipeline(
            pair, drafter="draft", properties=properties, engine_config=drafting_config
        ),
    }
    for pipe in pipes.values():
        run_round(pipe, prompts[:1], SamplingParams(max_tokens=8, temperature=0.0))  # warm-up
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in pipes}
    for _ in range(args.rounds):  # interleaved: a busy moment of the shared machine hits both
        for name, pipe in pipes.items():
            rounds[name].append(run_round(pipe, prompts, params))
    reference = rounds["target only"][0]["token_ids"]
    differing = [first_difference(r["token_ids"], reference) for runs in rounds.values() for r in runs]
    same = not any(differing)
    report: dict[str, Any] = {
        "pair": str(pair),
        "same_tokens": same,
        # Per round (target-only rounds first), the first differing token of each prompt that differs.
        "first_differences": differing,
        "workload": vars(args) | {"bundle": str(args.bundle)},
    }
    for name, runs in rounds.items():
        rates = [r["tokens"] / r["seconds"] for r in runs]
        drafted, accepted = sum(r["drafted"] for r in runs), sum(r["accepted"] for r in runs)
        lookup_drafted = sum(r["lookup_drafted"] for r in runs)
        lookup_accepted = sum(r["lookup_accepted"] for r in runs)
        report[name] = {
            "tokens_per_s_median": statistics.median(rates),
            "tokens_per_s": [round(rate, 1) for rate in rates],
            "drafted": drafted,
            "accepted": accepted,
            "acceptance": accepted / drafted if drafted else None,
            "prompt_lookup_drafted": lookup_drafted,
            "prompt_lookup_accepted": lookup_accepted,
            "draft_model_acceptance": (accepted - lookup_accepted) / (drafted - lookup_drafted)
            if drafted > lookup_drafted
            else None,
        }
    drafter = pipes["across tokenizers"]
    terms = cost_terms(drafter, args.gamma_for_costs)
    proposer: Any = drafter.proposer
    report["cost_model"] = {
        **{key: round(value * 1000, 3) for key, value in terms.items()},
        "translation_ms": round(proposer.translation_seconds() * 1000, 3),
        "draft_tokens_per_target_token": round(proposer.tokens_per_target_token, 2),
        "gamma": args.gamma_for_costs,
        "break_even_acceptance": break_even_acceptance(terms, args.gamma_for_costs),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
