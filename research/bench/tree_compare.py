"""Trees against chains, per drafter: ``python -m research.bench.tree_compare [--bundle B] [--prompts 6]``.

Runs the held-out chat instructions (greedy, ``--max-tokens`` each, end-of-sequence ignored) through one
``Pipeline``'s engine under each configuration: target-only, chains of fixed γ, adaptive γ, fixed tree
shapes and ``draft_tree="auto"``. The configurations alternate prompt by prompt (the order reversed every
other prompt), ``--rounds`` times. Per configuration it prints the tokens per target pass (output tokens
over the engine steps that gave the request tokens: deterministic for greedy requests at batch 1), the
nodes per tree, and the median over prompts of target-only seconds over this configuration's (noisy).
``--concurrency N`` runs N requests at once instead (the prompts cycled to fill the batch), the
configurations alternating batch by batch: the ratio is then of aggregate throughput.

All configurations share the engine's cost model, so adaptive γ and ``"auto"`` also see the steps of the
fixed shapes: this compares shapes, it does not show what adaptive γ reaches alone (``xpuspec bench``).

``--drafters draft,eagle3`` runs every configuration with each drafter (one ``Pipeline`` each, on the
bundle's one target, rows named ``"<drafter> <configuration>"``), interleaved the same way: the bundle's
draft model against its EAGLE-3 head. Target-only runs once, on the first drafter's pipeline.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from research.bench.acceptance_traces import HELDOUT_INSTRUCTIONS

logger = logging.getLogger(__name__)

DRAFTERS = ("draft", "eagle3")

CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "target-only": {"num_draft_tokens": 0},
    "chain γ=1": {"num_draft_tokens": 1},
    "chain γ=2": {"num_draft_tokens": 2},
    "chain γ=3": {"num_draft_tokens": 3},
    "chain γ=4": {"num_draft_tokens": 4},
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


def _run_batch(pipeline: Any, prompts: list[list[int]], params: Any) -> tuple[float, int, list[Any]]:
    """Seconds, request-passes that gave tokens (summed over the requests), and each request's final
    stats, of ``prompts`` run at once."""
    started = time.perf_counter()
    request_ids = [pipeline.add_request(token_ids, params) for token_ids in prompts]
    stats = {}
    for step in pipeline.steps(request_ids):
        if step.output.finished:
            stats[step.output.request_id] = step.output.stats
    finals = [stats[request_id] for request_id in request_ids]
    # Counted by the requests, not by step(): a target-only step may run a burst of passes.
    return time.perf_counter() - started, sum(s.target_passes for s in finals), finals


def compare(
    pipelines: Mapping[str, Any],
    prompts: list[list[int]],
    max_tokens: int,
    rounds: int,
    concurrency: int = 1,
    names: list[str] | None = None,
) -> dict[str, Tally]:
    """The configurations ``names`` (default: all) with each drafter's pipeline of ``pipelines`` (rows
    named by the configuration alone when there is one drafter) over ``prompts`` in batches of
    ``concurrency`` (1: one request at a time)."""
    from xpuspec import SamplingParams

    runs: dict[str, tuple[Any, SamplingParams]] = {}
    for drafter_index, (drafter, pipeline) in enumerate(pipelines.items()):
        for name in names or CONFIGURATIONS:
            if name == "target-only" and drafter_index:
                continue
            row = name if len(pipelines) == 1 or name == "target-only" else f"{drafter} {name}"
            fields = CONFIGURATIONS[name]
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **fields)
            runs[row] = pipeline, params
    tallies = {row: Tally() for row in runs}
    # One batch per prompt: that prompt and the next ones, cycled, `concurrency` in all.
    batches = [
        [prompts[(first + offset) % len(prompts)] for offset in range(concurrency)]
        for first in range(len(prompts))
    ]
    for batch in batches[:2]:  # warm-up: every shape compiles its kernels once
        for pipeline, params in runs.values():
            _run_batch(pipeline, batch, params)
    for round_index in range(rounds):
        for batch_index, batch in enumerate(batches):
            order = list(runs)
            if (round_index + batch_index) % 2:
                order.reverse()
            for row in order:
                pipeline, params = runs[row]
                seconds, passes, stats = _run_batch(pipeline, batch, params)
                tally = tallies[row]
                tally.seconds.append(seconds)
                tally.tokens += sum(request.num_output_tokens for request in stats)
                tally.passes += passes
                tally.trees += sum(request.tree_verifications for request in stats)
                tally.nodes += sum(request.tree_nodes_verified for request in stats)
    return tallies


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m research.bench.tree_compare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bundle", default=None, help="bundle folder or demo (default: the default model)")
    parser.add_argument("--prompts", type=int, default=6, help="held-out chat instructions (default: 6)")
    parser.add_argument("--max-tokens", type=int, default=96, help="new tokens per request (default: 96)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the prompts (default: 2)")
    parser.add_argument(
        "--concurrency", type=int, default=1, help="requests run at once (default: 1, batch 1)"
    )
    parser.add_argument(
        "--drafters",
        default="draft",
        help="drafters to compare, separated by ',': draft, eagle3 (default: draft)",
    )
    parser.add_argument(
        "--configurations",
        default=";".join(CONFIGURATIONS),
        help="names to run, separated by ';' (target-only always runs: the ratios' baseline; "
        "default: all of " + "; ".join(CONFIGURATIONS) + ")",
    )
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.max_tokens < 1 or args.rounds < 1 or args.concurrency < 1:
        parser.error("--prompts, --max-tokens, --rounds and --concurrency must be >= 1")
    names = [name.strip() for name in args.configurations.split(";") if name.strip()]
    unknown = [name for name in names if name not in CONFIGURATIONS]
    if unknown:
        parser.error(f"unknown configurations {unknown}; choose from {list(CONFIGURATIONS)}")
    args.configurations = ["target-only"] + [name for name in names if name != "target-only"]
    args.drafters = list(dict.fromkeys(name.strip() for name in args.drafters.split(",") if name.strip()))
    if not args.drafters or any(name not in DRAFTERS for name in args.drafters):
        parser.error(f"--drafters takes names among {list(DRAFTERS)}, got {args.drafters}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from xpuspec import Pipeline

    pipelines = {drafter: Pipeline(args.bundle, drafter=drafter) for drafter in args.drafters}
    pipeline = next(iter(pipelines.values()))
    with open(HELDOUT_INSTRUCTIONS, encoding="utf-8") as lines:
        conversations = [json.loads(line)["messages"] for line in lines if line.strip()]
    prompts = [
        pipeline.encode(pipeline.apply_chat_template(messages)) for messages in conversations[: args.prompts]
    ]
    tallies = compare(pipelines, prompts, args.max_tokens, args.rounds, args.concurrency, args.configurations)
    baseline = tallies["target-only"].seconds
    width = max(14, *(len(row) for row in tallies))
    print(f"{'configuration':{width}s}  tokens/pass  nodes/tree  ÷ target-only  tokens/s")
    for row, tally in tallies.items():
        ratio = statistics.median(base / ours for base, ours in zip(baseline, tally.seconds, strict=True))
        nodes = tally.nodes / tally.trees if tally.trees else 0.0
        print(
            f"{row:{width}s}  {tally.tokens / max(tally.passes, 1):11.3f}  {nodes:10.2f}  {ratio:13.3f}  "
            f"{tally.tokens / sum(tally.seconds):8.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
