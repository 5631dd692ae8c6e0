"""What a change of a step's token count costs the target: ``python -m research.bench.shape_change
[--bundle B] [--tokens 1,5] [--steps 12] [--rounds 10]``.

OpenVINO's CPU plugin re-prepares every node of the graph when an input's shape changes, and a
decode step's token count is part of its shapes. Each round times ``--steps`` target decode passes
in each of four patterns (five with ``a`` = 1), in an order reversed every other round, and keeps
each pattern's mean:

- ``a steady`` and ``b steady``: every pass the same count (``--tokens a,b``);
- ``a/b alternating``: the count changes every pass;
- ``a padded to b``: ``a`` tokens and ``b - a`` padding tokens (``SequenceChunk.padding``), which is
  what the engine runs instead of changing the count (``StepShape.keep``);
- ``1/b alternating, decode lane`` (when ``a`` is 1): the one-token passes run in a second compiled
  copy (``PagedModelRunner(decode_lane=True)``), as a draft's and a speculating target's do
  (docs/benchmarks.md, "A second compiled copy of the target for one-token steps").

It prints each pattern's median over the rounds and the change's cost, the alternating pattern's
mean minus the mean of the two steady ones.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from research.bench import runner_timer

PROMPT_TOKENS = 200


def measure(
    bundle_root: str | None, tokens: tuple[int, int], steps: int, rounds: int, properties: dict
) -> dict[str, list[float]]:
    """Per pattern, the mean ms of a pass in each round."""
    from xpuspec.core.chunks import SequenceChunk
    from xpuspec.executor.paged_runner import PagedModelRunner
    from xpuspec.models.resolve import resolve_bundle

    bundle = resolve_bundle(bundle_root)
    small, large = tokens
    target = PagedModelRunner(bundle.target.path, properties=properties, num_blocks=64)
    laned = (
        PagedModelRunner(bundle.target.path, properties=properties, num_blocks=64, decode_lane=True)
        if small == 1
        else None
    )
    table = list(range(-(-(PROMPT_TOKENS + large) // target.block_size)))
    prompt = np.random.default_rng(0).integers(100, 1000, PROMPT_TOKENS).tolist()
    for runner in (target, laned):
        if runner is not None:
            runner.forward([SequenceChunk(prompt, 0, table, 1)])

    def chunk(count: int, padding: int = 0) -> SequenceChunk:
        # Every pass at the same position: its keys and values are overwritten by the next.
        return SequenceChunk([5] * count, PROMPT_TOKENS, table, count, padding=padding)

    patterns = {
        f"{small} steady": (target, [chunk(small)]),
        f"{large} steady": (target, [chunk(large)]),
        f"{small}/{large} alternating": (target, [chunk(small), chunk(large)]),
        f"{small} padded to {large}": (target, [chunk(small, large - small)]),
    }
    if laned is not None:
        patterns[f"1/{large} alternating, decode lane"] = (laned, [chunk(1), chunk(large)])
    for runner, cycle in patterns.values():  # the first pass of each shape compiles kernels
        for passed in cycle:
            runner.forward([passed])
    results: dict[str, list[float]] = {name: [] for name in patterns}
    for round_index in range(rounds):
        order = list(patterns.items())
        for name, (runner, cycle) in order if round_index % 2 == 0 else order[::-1]:
            runner.forward([cycle[-1]])  # each pattern starts after another shape, as in a step
            times = []
            for step in range(steps):
                started = time.perf_counter()
                runner.forward([cycle[step % len(cycle)]])
                times.append(time.perf_counter() - started)
            results[name].append(statistics.fmean(times) * 1000)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = runner_timer.parser(__doc__, steps=12, rounds=10)
    parser.add_argument("--tokens", default="1,5", help="the two token counts a,b (a < b)")
    args = parser.parse_args(argv)
    counts = runner_timer.integers(parser, args.tokens, "--tokens")
    if len(counts) != 2:
        parser.error(f"--tokens must be two integers a,b, got {args.tokens!r}")
    small, large = counts
    if not 1 <= small < large or args.steps < 2 or args.rounds < 1:
        parser.error("--tokens needs 1 <= a < b, --steps at least 2, --rounds at least 1")
    properties = runner_timer.properties(parser, args)
    results = runner_timer.measure_or_usage_error(
        parser, lambda: measure(args.bundle, (small, large), args.steps, args.rounds, properties)
    )
    medians = {name: statistics.median(per_round) for name, per_round in results.items()}
    for name, per_round in results.items():
        rounds = " ".join(f"{value:.3f}" for value in per_round)
        print(f"{name:>24}: {medians[name]:.3f} ms a pass, median; per round {rounds}")
    steady = (medians[f"{small} steady"] + medians[f"{large} steady"]) / 2
    print(f"{'a change of count':>24}: {medians[f'{small}/{large} alternating'] - steady:.3f} ms")
    laned = medians.get(f"1/{large} alternating, decode lane")
    if laned is not None:
        print(f"{'with a decode lane':>24}: {laned - steady:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
