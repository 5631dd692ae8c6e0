"""Trees against chains in one engine: ``python -m xpuspec.bench.tree_compare [--bundle B] [--prompts 6]``.

Runs the held-out chat instructions (greedy, ``--max-tokens`` each, end-of-sequence ignored) through one
``Pipeline``'s engine under each configuration: target-only, chains of fixed γ, adaptive γ, fixed tree
shapes and ``draft_tree="auto"``. The configurations alternate prompt by prompt (the order reversed every
other prompt), ``--rounds`` times. Per configuration it prints the tokens per target pass (output tokens
over the engine steps that gave the request tokens: deterministic for greedy requests), the nodes per
tree, and the median over prompts of target-only seconds over this configuration's (noisy).

All configurations share the engine's cost model, so adaptive γ and ``"auto"`` also see the steps of the
fixed shapes: this compares shapes, it does not show what adaptive γ reaches alone (``xpuspec bench``).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from xpuspec.bench.acceptance_traces import HELDOUT_INSTRUCTIONS

logger = logging.getLogger(__name__)

CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "target-only": {"num_draft_tokens": 0},
    "chain γ=1": {"num_draft_tokens": 1},
    "chain γ=2": {"num_draft_tokens": 2},
    "adaptive γ": {},
    "tree 2,2,3": {"draft_tree": {"depth": 2, "width": 2, "nodes": 3}},
    "tree 3,2,6": {"draft_tree": {"depth": 3, "width": 2, "nodes": 6}},
    "tree 4,3,10": {"draft_tree": {"depth": 4, "width": 3, "nodes": 10}},
    "tree auto": {"draft_tree": "auto"},
}


@dataclass
class Tally:
    """One configuration's sums over its requests."""

    seconds: list[float] = field(default_factory=list)  # one per request, in prompt order per round
    tokens: int = 0
    passes: int = 0
    trees: int = 0
    nodes: int = 0


def _run_request(engine: Any, request_id: str, token_ids: list[int], params: Any) -> tuple[float, int, Any]:
    """Seconds, target passes that gave tokens, and the final stats of one request run alone."""
    started = time.perf_counter()
    engine.add_request(request_id, token_ids, params)
    passes, stats = 0, None
    while engine.has_unfinished():
        for output in engine.step():
            passes += bool(output.new_token_ids)
            stats = output.stats
    return time.perf_counter() - started, passes, stats


def compare(pipeline: Any, prompts: list[list[int]], max_tokens: int, rounds: int) -> dict[str, Tally]:
    from xpuspec import SamplingParams

    engine = pipeline.engine
    params = {
        name: SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **fields)
        for name, fields in CONFIGURATIONS.items()
    }
    tallies = {name: Tally() for name in CONFIGURATIONS}
    request_ids = iter(range(1 << 62))
    for token_ids in prompts[:2]:  # warm-up: every shape compiles its kernels once
        for name in CONFIGURATIONS:
            _run_request(engine, f"warm-{next(request_ids)}", token_ids, params[name])
    for round_index in range(rounds):
        for prompt_index, token_ids in enumerate(prompts):
            names = list(CONFIGURATIONS)
            if (round_index + prompt_index) % 2:
                names.reverse()
            for name in names:
                request_id = f"r-{next(request_ids)}"
                seconds, passes, stats = _run_request(engine, request_id, token_ids, params[name])
                tally = tallies[name]
                tally.seconds.append(seconds)
                tally.tokens += stats.num_output_tokens
                tally.passes += passes
                tally.trees += stats.tree_verifications
                tally.nodes += stats.tree_nodes_verified
    return tallies


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m xpuspec.bench.tree_compare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bundle", default=None, help="bundle folder or demo (default: the default model)")
    parser.add_argument("--prompts", type=int, default=6, help="held-out chat instructions (default: 6)")
    parser.add_argument("--max-tokens", type=int, default=96, help="new tokens per request (default: 96)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the prompts (default: 2)")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.max_tokens < 1 or args.rounds < 1:
        parser.error("--prompts, --max-tokens and --rounds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from xpuspec import Pipeline

    pipeline = Pipeline(args.bundle, drafter="draft")
    with open(HELDOUT_INSTRUCTIONS, encoding="utf-8") as lines:
        conversations = [json.loads(line)["messages"] for line in lines if line.strip()]
    prompts = [
        pipeline.encode(pipeline.apply_chat_template(messages)) for messages in conversations[: args.prompts]
    ]
    tallies = compare(pipeline, prompts, args.max_tokens, args.rounds)
    baseline = tallies["target-only"].seconds
    print(f"{'configuration':14s}  tokens/pass  nodes/tree  ÷ target-only  tokens/s")
    for name, tally in tallies.items():
        ratio = statistics.median(base / ours for base, ours in zip(baseline, tally.seconds, strict=True))
        nodes = tally.nodes / tally.trees if tally.trees else 0.0
        print(
            f"{name:14s}  {tally.tokens / max(tally.passes, 1):11.3f}  {nodes:10.2f}  {ratio:13.3f}  "
            f"{tally.tokens / sum(tally.seconds):8.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
