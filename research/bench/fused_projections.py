"""What fusing the projections that share an input saves on a target's pass:
``python -m research.bench.fused_projections [--bundle B] [--tokens 1,2,4,9]``.

Compiles the bundle's target twice in one process, with and without
:func:`xpuspec.executor.fused_projections.fuse_shared_input_projections`, and checks that both give
the same logits on one prompt under the given properties. Then each round, for each pass length, times
``--steps`` passes of that many tokens after a context of 300 on each compile, the order reversed every
other round, and prints the median per round and fused ÷ unfused over the rounds.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from research.bench import runner_timer

CONTEXT_TOKENS = 300
TOKEN_IDS = (100, 4000)  # inside the demo's vocabulary as well as real ones
VARIANTS = ("fused", "unfused")


def _runners(bundle_root: str | None, properties: dict) -> dict[str, Any]:
    import openvino as ov

    from xpuspec.executor.paged_compile import compile_paged
    from xpuspec.executor.paged_runner import PagedModelRunner
    from xpuspec.models.resolve import resolve_bundle

    path = resolve_bundle(bundle_root).target.path
    core = ov.Core()
    runners = {}
    for variant in VARIANTS:
        compiled = compile_paged(path, properties=properties, core=core, fuse_projections=variant == "fused")
        runners[variant] = PagedModelRunner(
            path, properties=properties, num_blocks=64, core=core, compiled=compiled
        )
    return runners


def largest_logit_difference(runners: dict[str, Any]) -> float:
    """The largest absolute difference between the two compiles' logits over a 68-token prompt."""
    from xpuspec.core.chunks import SequenceChunk

    prompt = np.random.default_rng(1).integers(*TOKEN_IDS, 68).tolist()
    logits = [
        runner.forward([SequenceChunk(prompt, 0, list(range(8)), num_logits=len(prompt))]).copy()
        for runner in runners.values()
    ]
    return float(np.max(np.abs(logits[0] - logits[1])))


def measure(
    runners: dict[str, Any], tokens: list[int], steps: int, rounds: int
) -> dict[int, dict[str, list[float]]]:
    """Median ms of a pass of each length, per variant, per round."""
    from xpuspec.core.chunks import SequenceChunk

    prompt = np.random.default_rng(0).integers(*TOKEN_IDS, CONTEXT_TOKENS).tolist()
    table = list(range(-(-(CONTEXT_TOKENS + max(tokens)) // runners["fused"].block_size)))
    for runner in runners.values():
        runner.forward([SequenceChunk(prompt, 0, table, 1)])
    results: dict[int, dict[str, list[float]]] = {n: {v: [] for v in VARIANTS} for n in tokens}
    for round_index in range(rounds):
        order = VARIANTS if round_index % 2 == 0 else VARIANTS[::-1]
        for count in tokens:
            chunk = SequenceChunk(list(range(5, 5 + count)), CONTEXT_TOKENS, table, count)
            for variant in order:
                times = []
                for _ in range(steps):
                    started = time.perf_counter()
                    runners[variant].forward([chunk])
                    times.append(time.perf_counter() - started)
                results[count][variant].append(statistics.median(times) * 1000)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = runner_timer.parser(__doc__, steps=30, rounds=10)
    parser.add_argument("--tokens", default="1,2,4,9", help="pass lengths to time")
    args = parser.parse_args(argv)
    tokens = runner_timer.integers(parser, args.tokens, "--tokens")
    if not tokens or min(tokens) < 1 or args.steps < 1 or args.rounds < 1:
        parser.error("--tokens needs integers >= 1, --steps and --rounds at least 1")
    properties = runner_timer.properties(parser, args)

    def run() -> tuple[float, dict[int, dict[str, list[float]]]]:
        runners = _runners(args.bundle, properties)
        return largest_logit_difference(runners), measure(runners, tokens, args.steps, args.rounds)

    difference, results = runner_timer.measure_or_usage_error(parser, run)
    print(f"largest logit difference, fused against unfused: {difference:.3g}")
    for count, per_variant in results.items():
        fused, unfused = (statistics.median(per_variant[v]) for v in VARIANTS)
        ratios = [f / u for f, u in zip(per_variant["fused"], per_variant["unfused"], strict=True)]
        print(
            f"{count} tokens: fused {fused:.3f} ms, unfused {unfused:.3f} ms (medians); "
            f"fused ÷ unfused {statistics.median(ratios):.3f} (median of {len(ratios)} rounds)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
