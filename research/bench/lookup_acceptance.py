"""How often prompt lookup finds a draft in the target's own greedy output, and how much of it holds.

For each prompt the target's greedy continuation is the reference (EOS honoured unless
``--ignore-eos``: past its answer a small model loops, which lookups predict too well). At every
position, the lookup over prompt + continuation so far (:class:`~xpuspec.spec_decode.ngram_proposer.
NgramProposer`, n-grams of ``min_ngram`` to ``max_ngram`` tokens, as
:mod:`xpuspec.spec_decode.policy.prompt_lookup` runs it) proposes up to γ tokens; greedy verification accepts
them up to the first that differs from the continuation. Reported per ``min_ngram``: the share of
positions with a lookup, its first token's acceptance, and the tokens accepted per lookup of γ.

Run: ``python -m research.bench.lookup_acceptance --bundle default`` (the held-out instructions) or
``--bundle demo`` (held-out code).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from research.bench.acceptance_traces import add_bundle_arguments, bundle_and_workload, greedy_continuation
from xpuspec.bench.workloads import encode_prompts, load_workload
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.ngram_proposer import NgramProposer
from xpuspec.spec_decode.policy import MAX_NGRAM


@dataclass
class LookupAcceptance:
    positions: int = 0  # continuation positions looked at
    lookups: int = 0  # positions with a lookup draft
    first_accepted: int = 0  # lookups whose first token was accepted
    accepted: int = 0  # tokens accepted over every lookup (at most γ each)

    @property
    def coverage(self) -> float:
        return self.lookups / self.positions if self.positions else 0.0

    @property
    def first_token_rate(self) -> float:
        return self.first_accepted / self.lookups if self.lookups else 0.0

    @property
    def accepted_per_lookup(self) -> float:
        return self.accepted / self.lookups if self.lookups else 0.0


def measure(
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    min_ngram: int,
    max_ngram: int = MAX_NGRAM,
    gamma: int = 4,
) -> LookupAcceptance:
    """Lookup drafts of up to ``gamma`` tokens at every position of each continuation, checked against it."""
    lookup = NgramProposer(max_ngram=max(max_ngram, min_ngram), min_ngram=min_ngram)
    result = LookupAcceptance()
    for prompt, continuation in zip(prompts, continuations, strict=True):
        tokens = list(prompt)
        for position, token in enumerate(continuation):
            result.positions += 1
            draft = lookup.propose(tokens, gamma)
            tokens.append(token)
            if not draft:
                continue
            result.lookups += 1
            run = 0
            while (
                run < len(draft)
                and position + run < len(continuation)
                and draft[run] == continuation[position + run]
            ):
                run += 1
            result.first_accepted += run > 0
            result.accepted += run
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bundle_arguments(parser)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--ignore-eos", action="store_true")
    args = parser.parse_args(argv)
    from xpuspec.api.pipeline import Pipeline

    bundle, workload = bundle_and_workload(args)
    pipe = Pipeline(bundle, drafter="none", properties="exact")
    max_prompt_tokens = pipe.bundle.max_context - args.max_tokens - 1
    prompts = encode_prompts(pipe, load_workload(workload, args.prompts), max_prompt_tokens)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=args.ignore_eos)
    continuations = [greedy_continuation(pipe, list(ids), params) for ids in prompts]
    print(
        f"{len(prompts)} prompts, {sum(map(len, continuations))} greedy tokens, lookups of up to {args.gamma}"
    )
    print("min n-gram | positions with a lookup | first token accepted | accepted per lookup")
    for min_ngram in (1, 2, 3, 4):
        result = measure(prompts, continuations, min_ngram, gamma=args.gamma)
        print(
            f"{min_ngram:10d} | {result.coverage:23.2f} | {result.first_token_rate:20.2f} | "
            f"{result.accepted_per_lookup:.2f}"
        )


if __name__ == "__main__":
    main()
