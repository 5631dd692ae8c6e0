"""The latency bench's own driver of an xpuspec engine: one request at a time, its per-step counts read."""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Any

from xpuspec.bench.figures import RequestTiming
from xpuspec.bench.latency_labels import TREE_AUTO
from xpuspec.core.chunks import SequenceChunk
from xpuspec.executor.eagle3_head import Eagle3Head
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.eagle3.proposer import Eagle3Proposer


class XpuspecLatencyRunner:
    """Drives a Pipeline's engine directly, one request at a time, reading its per-step counts."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self.engine = pipeline.engine
        self._ids = itertools.count()
        # An EAGLE-3 head compiles a graph per chain length on first use, in the background; compiled
        # here instead, untimed, as GenAI compiles its models before it is timed.
        proposer = self.engine.proposer
        self._prepare_chains = (
            proposer.head.prepare_chains
            if isinstance(proposer, Eagle3Proposer) and isinstance(proposer.head, Eagle3Head)
            else None
        )

    def generate(
        self, token_ids: list[int], max_tokens: int, draft_length: int | str | None
    ) -> RequestTiming:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            num_draft_tokens=draft_length if isinstance(draft_length, int) else None,
            draft_tree="auto" if draft_length == TREE_AUTO else None,
        )
        request_id = f"bench-{next(self._ids)}"
        if self._prepare_chains is not None and isinstance(draft_length, int) and draft_length >= 2:
            self._prepare_chains(draft_length, len(token_ids) + max_tokens)
        started = time.perf_counter()
        self.engine.add_request(request_id, token_ids, params)
        output: list[int] = []
        drafted = accepted = tested = 0
        while True:
            for step in self.engine.step():
                output.extend(step.new_token_ids)
                stats = step.stats
                step_drafted, step_accepted = stats.drafted - drafted, stats.accepted - accepted
                if step_drafted:
                    tested += step_accepted + (1 if step_accepted < step_drafted else 0)
                drafted, accepted = stats.drafted, stats.accepted
                if step.finished:
                    return _timing(token_ids, output, time.perf_counter() - started, stats, tested)


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


def measure_step_costs(pipeline: Any, repeats: int = 7) -> dict[str, float]:
    """Median seconds of one single-token forward of the target and of the draft (engine idle).

    Like ``LLMEngine.calibrate``, the dummy token is written into block 0, which no request holds.
    """
    chunk = SequenceChunk(token_ids=[0], past_length=0, block_table=[0], num_logits=1)
    target_seconds, draft_seconds = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        pipeline.target_runner.forward([chunk])
        target_seconds.append(time.perf_counter() - started)
        draft_seconds.append(pipeline.engine.proposer.measure_step_seconds())
    pipeline.engine.reset_prefix_cache()  # block 0 may have named a cached prefix
    target, draft = statistics.median(target_seconds), statistics.median(draft_seconds)
    return {"target_step_ms": target * 1000, "draft_step_ms": draft * 1000, "cost_ratio": draft / target}
