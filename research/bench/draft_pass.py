"""What a drafting pass costs inside a step: ``python -m research.bench.draft_pass [--bundle B]
[--vocab 0,16384,8192]``.

Alone, a small draft's pass runs from the caches; in a real step it follows the target's pass, whose
weights have pushed the draft's out. Each round, for each draft vocabulary (0: the whole LM head; N:
cut to its first N ids, :func:`xpuspec.executor.graph_edits.cut_logits_vocab`), this times ``--steps``
times a target decode pass followed by the draft's two passes of a γ = 2 drafting phase (the catch-up of
2 tokens, whose logits give the first draft, then 1 token for the second), and prints the median of the
two passes per round and over the rounds.
The order of the variants is reversed every other round.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from research.bench import runner_timer

PROMPT_TOKENS = 300


def measure(bundle_root: str | None, vocabs: list[int], steps: int, rounds: int, properties: dict) -> dict:
    """Median ms of a γ = 2 drafting phase (two passes) after a target pass, per vocabulary: per round."""
    import openvino as ov

    from xpuspec.core.chunks import SequenceChunk
    from xpuspec.executor.paged_runner import PagedModelRunner
    from xpuspec.models.resolve import resolve_bundle

    bundle = resolve_bundle(bundle_root)
    if bundle.draft is None:
        raise ValueError(f"{bundle.root} has no draft model")
    core = ov.Core()
    blocks = 64
    target = PagedModelRunner(bundle.target.path, properties=properties, num_blocks=blocks, core=core)
    drafts = {
        vocab: PagedModelRunner(
            bundle.draft.path,
            properties=properties,
            num_blocks=blocks,
            core=core,
            decode_lane=True,  # as the engine builds a draft
            logits_vocab=vocab or None,
        )
        for vocab in vocabs
    }
    prompt = np.random.default_rng(0).integers(100, 8000, PROMPT_TOKENS).tolist()
    table = list(range(-(-(PROMPT_TOKENS + steps + 3) // target.block_size)))
    for runner in (target, *drafts.values()):
        runner.forward([SequenceChunk(prompt, 0, table, 1)])
    results: dict[int, list[float]] = {vocab: [] for vocab in vocabs}
    for round_index in range(rounds):
        order = list(drafts.items())
        for vocab, draft in order if round_index % 2 == 0 else order[::-1]:
            times = []
            for step in range(steps):
                position = PROMPT_TOKENS + step
                target.forward([SequenceChunk([5], position, table, 1)])
                started = time.perf_counter()
                draft.forward([SequenceChunk([5, 6], position, table, 1)])
                draft.forward([SequenceChunk([7], position + 2, table, 1)])
                times.append(time.perf_counter() - started)
            results[vocab].append(statistics.median(times) * 1000)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = runner_timer.parser(__doc__, steps=40, rounds=6)
    parser.add_argument("--vocab", default="0,16384,8192", help="draft vocabularies; 0 is the whole LM head")
    args = parser.parse_args(argv)
    vocabs = runner_timer.integers(parser, args.vocab, "--vocab")
    if not vocabs or min(vocabs) < 0 or args.steps < 1 or args.rounds < 1:
        parser.error("--vocab needs integers >= 0, --steps and --rounds at least 1")
    properties = runner_timer.properties(parser, args)
    results = runner_timer.measure_or_usage_error(
        parser, lambda: measure(args.bundle, vocabs, args.steps, args.rounds, properties)
    )
    for vocab, per_round in results.items():
        label = "whole vocabulary" if vocab == 0 else f"ids below {vocab}"
        rounds = " ".join(f"{value:.3f}" for value in per_round)
        print(
            f"{label:>20}: drafting (2 passes) {statistics.median(per_round):.3f} ms median; rounds {rounds}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
