"""The latency bench's xpuspec runner: one request at a time through the Pipeline's steps, its per-step
counts read."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

from xpuspec.bench.figures import RequestTiming
from xpuspec.bench.latency_labels import TREE_AUTO
from xpuspec.core.chunks import SequenceChunk
from xpuspec.executor.eagle3_head import Eagle3Head
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.eagle3.proposer import Eagle3Proposer

if TYPE_CHECKING:
    from xpuspec.api.pipeline import Pipeline


class XpuspecLatencyRunner:
    """Runs one request at a time through a Pipeline's steps (``Pipeline.steps``), reading each
    step's counts."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        # An EAGLE-3 head compiles a graph per chain length on first use, in the background; compiled
        # here instead, untimed, as GenAI compiles its models before it is timed.
        proposer = pipeline.proposer
        self._prepare_chains = (
            proposer.head.prepare_chains
            if isinstance(proposer, Eagle3Proposer) and isinstance(proposer.head, Eagle3Head)
            else None
        )

    def generate(
        self, token_ids: list[int], max_tokens: int, draft_length: int | str | None
    ) -> RequestTiming:
        # Plain greedy, as GenAI's rows decode: no repetition control, whatever the model's defaults.
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            repeat_penalty=1.0,
            dry_multiplier=0.0,
            ignore_eos=True,
            num_draft_tokens=draft_length if isinstance(draft_length, int) else None,
            draft_tree="auto" if draft_length == TREE_AUTO else None,
        )
        if self._prepare_chains is not None and isinstance(draft_length, int) and draft_length >= 2:
            self._prepare_chains(draft_length, len(token_ids) + max_tokens)
        started = time.perf_counter()
        request_id = self.pipeline.add_request(token_ids, params)
        output: list[int] = []
        drafted = accepted = tested = 0
        for step in self.pipeline.steps([request_id]):
            output.extend(step.output.new_token_ids)
            stats = step.output.stats
            step_drafted, step_accepted = stats.drafted - drafted, stats.accepted - accepted
            if step_drafted:
                tested += step_accepted + (1 if step_accepted < step_drafted else 0)
            drafted, accepted = stats.drafted, stats.accepted
            if step.output.finished:
                return _timing(token_ids, output, step.time - started, stats, tested)
        raise RuntimeError(f"{request_id} ended without a final output")


def _timing(prompt: list[int], output: list[int], seconds: float, stats: Any, tested: int) -> RequestTiming:
    gaps = None
    if stats.first_token_time is not None and stats.num_output_tokens > 1:
        gaps = (stats.last_token_time - stats.first_token_time) / (stats.num_output_tokens - 1)
    speculative = stats.drafted > 0
    return RequestTiming(
        prompt_tokens=len(prompt),
        token_ids=output,
        seconds=seconds,
        ttft_s=stats.ttft_s,
        tpot_s=gaps,
        drafted=stats.drafted if speculative else None,
        accepted=stats.accepted if speculative else None,
        tested=tested if speculative else None,
        verification_steps=stats.verification_steps if speculative else None,
        drafted_per_position=list(stats.drafted_per_position) if speculative else [],
        accepted_per_position=list(stats.accepted_per_position) if speculative else [],
    )


def measure_step_costs(pipeline: Pipeline, repeats: int = 7) -> dict[str, float]:
    """Median seconds of one single-token forward of the target and of the draft (engine idle).

    Like ``LLMEngine.calibrate``, the dummy token is written into block 0, which no request holds.
    """
    proposer = pipeline.proposer
    if proposer is None:
        raise ValueError("the draft's step cost needs a pipeline with a drafter")
    chunk = SequenceChunk(token_ids=[0], past_length=0, block_table=[0], num_logits=1)
    target_seconds, draft_seconds = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        pipeline.target_runner.forward([chunk])
        target_seconds.append(time.perf_counter() - started)
        draft_seconds.append(proposer.measure_step_seconds())
    pipeline.reset_prefix_cache()  # block 0 may have named a cached prefix
    target, draft = statistics.median(target_seconds), statistics.median(draft_seconds)
    return {"target_step_ms": target * 1000, "draft_step_ms": draft * 1000, "cost_ratio": draft / target}
