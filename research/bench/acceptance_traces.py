"""Greedy acceptance traces: where a draft agrees with the target's own greedy continuation.

For each prompt, the target's greedy continuation (``max_tokens`` tokens, eos ignored) is the
reference, and one draft pass over prompt + continuation gives the draft's teacher-forced greedy
choice at every position. ``match[i]``: the draft's argmax before continuation token i equals it.
Greedy speculative decoding then accepts, from a chain of γ drafts started at token i, exactly
``min(γ, run of matches from i)`` drafts, whatever γ was chosen before (drafts after a match are
teacher-forced on the target's own tokens). :mod:`research.bench.policy_replay` replays the
adaptive-γ policy over these traces.

Run: ``python -m research.bench.acceptance_traces --bundle default --out /tmp/traces_default.json``
(``--bundle demo`` takes held-out code prompts; a JSONL workload takes chat instructions).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from xpuspec.bench.workloads import encode_prompts, load_workload
from xpuspec.core.chunks import SequenceChunk
from xpuspec.models.demo import SMOLLM2_HELDOUT
from xpuspec.sample.sampling_params import SamplingParams

HELDOUT_INSTRUCTIONS = SMOLLM2_HELDOUT


def draft_choices(runner: Any, token_ids: list[int], first: int, chunk_tokens: int = 64) -> list[int]:
    """The draft's greedy choice for every token of ``token_ids`` from index ``first`` on, each given
    the tokens before it (teacher-forced), by causal passes of at most ``chunk_tokens`` tokens.

    Writes the draft's KV into the first blocks: run it with no request in flight."""
    block_size = getattr(runner, "block_size", 16)
    block_table = list(range(-(-len(token_ids) // block_size)))
    choices: list[int] = []
    for start in range(0, len(token_ids) - 1, chunk_tokens):
        end = min(start + chunk_tokens, len(token_ids) - 1)  # the last token predicts nothing needed
        logits = runner.forward(
            [
                SequenceChunk(
                    token_ids=token_ids[start:end],
                    past_length=start,
                    block_table=block_table,
                    num_logits=end - start,
                    sequence_id="acceptance-trace",
                )
            ]
        )  # [end - start, draft vocab]: row j predicts token start + j + 1
        choices += [int(token) for token in np.argmax(logits, axis=-1)]
    release = getattr(runner, "release", None)
    if release is not None:
        release("acceptance-trace")
    return choices[first - 1 :]


def greedy_continuation(pipeline: Any, ids: list[int], params: SamplingParams) -> list[int]:
    """The tokens ``pipeline`` generates for ``ids`` (``params`` as given, no stop strings)."""
    tokens: list[int] = []
    for step in pipeline.steps([pipeline.add_request(ids, params)]):
        tokens += step.output.new_token_ids
    return tokens


def collect(bundle: str | None, workload: str, count: int, max_tokens: int) -> dict[str, Any]:
    from xpuspec.api.pipeline import Pipeline

    pipe = Pipeline(bundle, drafter="draft", properties="exact", draft_properties="exact")
    prompts = load_workload(workload, count)
    max_prompt_tokens = pipe.bundle.max_context - max_tokens - pipe.engine_config.max_draft_tokens - 1
    encoded = encode_prompts(pipe, prompts, max_prompt_tokens)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, num_draft_tokens=0)
    runner = pipe.proposer.runner  # type: ignore[union-attr]
    traces = []
    for prompt, ids in zip(prompts, encoded, strict=True):
        continuation = greedy_continuation(pipe, list(ids), params)
        choices = draft_choices(runner, list(ids) + list(continuation), len(ids))
        match = [int(a == b) for a, b in zip(choices, continuation, strict=True)]
        traces.append({"source": prompt.source, "prompt_tokens": len(ids), "match": match})
        pipe.reset_prefix_cache()
    matches = sum(sum(t["match"]) for t in traces)
    total = sum(len(t["match"]) for t in traces)
    return {
        "bundle": bundle or "default",
        "workload": workload,
        "max_tokens": max_tokens,
        "greedy_match_rate": matches / total,
        "traces": traces,
    }


def add_bundle_arguments(parser: argparse.ArgumentParser) -> None:
    """``--bundle`` and ``--workload``, read back by :func:`bundle_and_workload`."""
    parser.add_argument("--bundle", default="default", help="default (SmolLM2) or demo, or a bundle path")
    parser.add_argument("--workload", default=None, help="code, chat or FILE.jsonl (default by bundle)")


def bundle_and_workload(args: argparse.Namespace) -> tuple[str | None, str]:
    """The bundle (None: the default model) and the workload: held-out code for the demo pair,
    the held-out instructions otherwise."""
    bundle = None if args.bundle == "default" else args.bundle
    return bundle, args.workload or ("code" if args.bundle == "demo" else str(HELDOUT_INSTRUCTIONS))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_bundle_arguments(parser)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    bundle, workload = bundle_and_workload(args)
    report = collect(bundle, workload, args.prompts, args.max_tokens)
    args.out.write_text(json.dumps(report) + "\n", encoding="utf-8")
    print(
        f"{len(report['traces'])} traces, greedy match rate {report['greedy_match_rate']:.3f} -> {args.out}"
    )


if __name__ == "__main__":
    main()
