"""How much any tree could gain over the best chain here: ``python -m research.bench.tree_bound``.

Trees pay when the draft's second and third choices are often right and verifying more tokens costs
little more than verifying one. Both are measured, and this prints what they allow at most:

- **acceptance per level and rank** ``a(j, r)``: greedy held-out chat requests verify wide fixed
  trees (``--tree``); at each level j their accepted path reached, the target's token was the
  draft's rank-r child with probability a(j, r) (the counts of
  :class:`~xpuspec.spec_decode.policy.tree_policy.RankAcceptance`, not decayed). Levels that the
  accepted paths reached fewer than 30 times, down to level 8, take the deepest measured level's
  rates;
- **costs**: the target's pass over 1 + n tokens and the draft's one-token pass, timed idle on the
  engine's own runners (each count repeated before it is timed, so no change of shape is timed;
  rounds interleaved, medians).

For every node budget n the best tree of any shape (Sequoia's dynamic program, Chen et al. 2024: a
node's budget split among its rank-ordered children) accepts ``T(n)`` drafts on average, so a step
emits ``1 + T(n)`` tokens and costs at least the target's pass over 1 + n tokens plus one draft
pass per level. The same program at width 1 is the best chain. The "bound" is the best tree's
tokens per second over the best chain's: what a perfect tree policy with free tree building,
mask filling and KV compaction would reach with this draft on this device. It assumes that a level's
acceptance does not depend on the ranks above it, which the measured per-level rates only partly
capture: read it as an estimate of the ceiling, not a guarantee.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from research.bench.acceptance_traces import HELDOUT_INSTRUCTIONS

logger = logging.getLogger(__name__)

COST_TOKENS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 17)  # target pass sizes timed (1 + nodes)
CONTEXT = 200  # past tokens of the timed passes: a chat answer's typical length
EXTRAPOLATED_LEVELS = 8  # levels the shapes may use; those below the measured trees' repeat the last
MIN_REACHED = 30  # a level's rates count as measured when the accepted paths reached it this often


def best_tree_accepted(rates: np.ndarray, nodes: int, max_depth: int, max_width: int | None = None) -> float:
    """Most expected accepted drafts of a tree of ``nodes`` nodes, at most ``max_depth`` levels
    and ``max_width`` children per node, when a level-j node's rank-r child is the target's token
    with probability ``rates[j, r]`` (``rates``: ``[levels, ranks]``, each row summing to <= 1).

    Greedy verification goes from a node to at most one child, the one holding the target's token,
    so a subtree whose root's children get budgets n_0, n_1, ... (each counting the child itself)
    accepts ``Σ_r a(j, r) (1 + best(j + 1, n_r - 1))``; the budgets split by a knapsack over ranks.
    """
    levels, ranks = rates.shape
    width = ranks if max_width is None else min(max_width, ranks)
    depth = min(max_depth, levels)
    # below[m]: best accepted drafts under a node whose children are one level deeper, m nodes.
    below = np.zeros(nodes + 1)
    for level in reversed(range(depth)):
        # split[m]: the best over the first ranks done so far with m nodes among them.
        split = np.zeros(nodes + 1)
        for rank in range(width):
            rate = rates[level, rank]
            gain = rate * (1.0 + below)  # a child with c nodes in its subtree: gain[c - 1]
            updated = split.copy()
            for total in range(1, nodes + 1):
                for child in range(1, total + 1):
                    updated[total] = max(updated[total], split[total - child] + gain[child - 1])
            split = updated
        below = np.maximum.accumulate(split)
    return float(below[nodes])


@dataclass(frozen=True)
class Option:
    """A shape's predicted figures: nodes, levels, accepted drafts and tokens per second."""

    nodes: int
    depth: int
    accepted: float
    tokens_per_second: float


def best_options(
    rates: np.ndarray,
    target_seconds: dict[int, float],
    draft_seconds: float,
    max_nodes: int,
    width: int | None,
) -> list[Option]:
    """For each node budget 1..``max_nodes``, the depth that gives the most tokens per second
    (``width`` 1: chains; None: any tree)."""
    options = []
    for nodes in range(1, max_nodes + 1):
        if 1 + nodes not in target_seconds:
            continue
        best: Option | None = None
        for depth in range(1, min(nodes, rates.shape[0]) + 1):
            if width == 1 and depth != nodes:
                continue
            accepted = best_tree_accepted(rates, nodes, depth, width)
            seconds = target_seconds[1 + nodes] + depth * draft_seconds
            option = Option(nodes, depth, accepted, (1.0 + accepted) / seconds)
            if best is None or option.tokens_per_second > best.tokens_per_second:
                best = option
        if best is not None:
            options.append(best)
    return options


def _measure_rates(pipeline: Any, prompts: list[str], max_tokens: int, tree: dict[str, int]) -> np.ndarray:
    """``a(level, rank)`` from greedy requests verifying ``tree``-shaped trees (raw counts), for
    the levels that the accepted paths reached at least ``MIN_REACHED`` times; the levels below
    take the deepest of those levels' rates, down to ``EXTRAPOLATED_LEVELS``."""
    from xpuspec import SamplingParams
    from xpuspec.spec_decode.policy import MAX_RANK

    levels = tree["depth"]
    reached = np.zeros((levels, MAX_RANK))
    hits = np.zeros((levels, MAX_RANK))
    policy = pipeline.tree_policy
    record = policy.record

    def counting(num_children_on_path: list[int], accepted_ranks: list[int]) -> None:
        for level, children in enumerate(num_children_on_path[:levels]):
            reached[level, : min(children, MAX_RANK)] += 1
            if level < len(accepted_ranks) and accepted_ranks[level] < MAX_RANK:
                hits[level, accepted_ranks[level]] += 1
        record(num_children_on_path, accepted_ranks)

    policy.record = counting
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, draft_tree=tree)
        for prompt in prompts:
            pipeline.generate([prompt], params)
    finally:
        del policy.record
    measured = max(1, int(np.sum(reached[:, 0] >= MIN_REACHED)))
    rates = hits[:measured] / np.maximum(reached[:measured], 1.0)
    # A rank's rate is over the paths whose node had that many children, so a row's estimates may
    # add up past 1 though its events are disjoint (as in RankAcceptance.rates).
    rates /= np.maximum(rates.sum(axis=1, keepdims=True), 1.0)
    logger.info("levels reached: %s", reached[:, 0].astype(int).tolist())
    extra = max(0, EXTRAPOLATED_LEVELS - measured)
    return np.vstack([rates, np.repeat(rates[-1:], extra, axis=0)])


def _measure_costs(pipeline: Any, rounds: int, repeats: int = 8) -> tuple[dict[int, float], float]:
    """Idle seconds of the target's pass by tokens, and of the draft's one-token pass."""
    from xpuspec.core.chunks import SequenceChunk

    target, draft = pipeline.target_runner, pipeline.proposer.runner
    table = list(range(1, 1 + -(-(CONTEXT + max(COST_TOKENS)) // target.block_size)))
    draft_table = list(range(1, 1 + -(-(CONTEXT + 1) // draft.block_size)))

    def timed(runner: Any, chunk: SequenceChunk) -> float:
        for _ in range(3):  # the shape's first passes re-prepare the graph
            runner.forward([chunk])
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            runner.forward([chunk])
            samples.append(time.perf_counter() - started)
        return statistics.median(samples)

    target_samples: dict[int, list[float]] = {tokens: [] for tokens in COST_TOKENS}
    draft_samples: list[float] = []
    for round_index in range(rounds):
        order = COST_TOKENS if round_index % 2 == 0 else COST_TOKENS[::-1]
        for tokens in order:
            chunk = SequenceChunk([100] * tokens, CONTEXT, table, num_logits=tokens)
            target_samples[tokens].append(timed(target, chunk))
        draft_samples.append(timed(draft, SequenceChunk([100], CONTEXT, draft_table, num_logits=1)))
    return (
        {tokens: statistics.median(samples) for tokens, samples in target_samples.items()},
        statistics.median(draft_samples),
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m research.bench.tree_bound", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--bundle", default=None, help="bundle folder or demo (default: the default model)")
    parser.add_argument("--prompts", type=int, default=12, help="held-out chat instructions (default: 12)")
    parser.add_argument("--max-tokens", type=int, default=96, help="new tokens per request (default: 96)")
    parser.add_argument(
        "--tree", default="4,4,16", help="depth,width,nodes of the measured trees (default: 4,4,16)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the cost timings (default: 3)")
    args = parser.parse_args(argv)
    try:
        depth, width, nodes = (int(part) for part in args.tree.split(","))
    except ValueError:
        parser.error(f"--tree must be depth,width,nodes (three integers), got {args.tree!r}")
    args.tree = {"depth": depth, "width": width, "nodes": nodes}
    if args.prompts < 1 or args.max_tokens < 1 or args.rounds < 1:
        parser.error("--prompts, --max-tokens and --rounds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from xpuspec import Pipeline
    from xpuspec.sample.draft_tree import TreeShape

    TreeShape(**args.tree)  # checks the shape with the engine's own message
    pipeline = Pipeline(args.bundle, drafter="draft")
    with open(HELDOUT_INSTRUCTIONS, encoding="utf-8") as lines:
        conversations = [json.loads(line)["messages"] for line in lines if line.strip()]
    prompts = [pipeline.apply_chat_template(messages) for messages in conversations[: args.prompts]]
    rates = _measure_rates(pipeline, prompts, args.max_tokens, args.tree)
    target_seconds, draft_seconds = _measure_costs(pipeline, args.rounds)
    print("acceptance a(level, rank), measured:")
    for level, row in enumerate(rates):
        print(f"  level {level}: " + "  ".join(f"{rate:.3f}" for rate in row))
    one = target_seconds[1]
    print(
        f"target pass by tokens (one token: {one * 1e3:.2f} ms; ÷ one token): "
        + ", ".join(f"{tokens}: {seconds / one:.2f}" for tokens, seconds in target_seconds.items())
        + f"; draft pass ÷ target pass: {draft_seconds / one:.3f}"
    )
    max_nodes = max(COST_TOKENS) - 1
    chains = best_options(rates, target_seconds, draft_seconds, max_nodes, width=1)
    trees = best_options(rates, target_seconds, draft_seconds, max_nodes, width=None)
    print(
        f"{'nodes':>5s}  {'chain tokens/pass':>17s}  {'÷ target-only':>13s}  "
        f"{'tree tokens/pass':>16s}  {'÷ target-only':>13s}"
    )
    chain_by_nodes = {option.nodes: option for option in chains}
    for tree in trees:
        chain = chain_by_nodes.get(tree.nodes)
        chain_text = (
            f"{1 + chain.accepted:17.3f}  {chain.tokens_per_second * one:13.3f}"
            if chain
            else f"{'-':>17s}  {'-':>13s}"
        )
        print(
            f"{tree.nodes:5d}  {chain_text}  {1 + tree.accepted:16.3f}  {tree.tokens_per_second * one:13.3f}"
        )
    best_chain = max(chains, key=lambda option: option.tokens_per_second)
    best_tree = max(trees, key=lambda option: option.tokens_per_second)
    most = max(trees, key=lambda option: option.accepted)
    print(
        f"best chain: {best_chain.nodes} drafts, {1 + best_chain.accepted:.3f} tokens/pass, "
        f"{best_chain.tokens_per_second * one:.3f}x target-only; best tree: {best_tree.nodes} nodes, "
        f"{best_tree.depth} levels, {1 + best_tree.accepted:.3f} tokens/pass, "
        f"{best_tree.tokens_per_second * one:.3f}x target-only"
    )
    print(
        f"bound: the best tree at {best_tree.tokens_per_second / best_chain.tokens_per_second:.3f}x "
        f"the best chain's tokens/s; the most tokens per pass any tree of <= {max_nodes} nodes "
        f"gives: {1 + most.accepted:.3f} "
        f"({(1 + most.accepted) / (1 + best_chain.accepted):.3f}x the fastest chain's, at "
        f"{most.tokens_per_second * one:.3f}x target-only)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
