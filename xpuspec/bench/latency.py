"""Batch-1 latency mode: xpuspec target-only and speculative at each draft length, beside its peers.

Rounds interleave the configurations so that machine noise hits all alike; each configuration keeps
its best round. Every configuration generates the same prompt tokens, greedy, a fixed number of
tokens (end-of-sequence ignored).
"""

from __future__ import annotations

import itertools
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xpuspec.bench.config import BenchConfig
from xpuspec.bench.figures import SKIPPED, LatencyResult, RequestTiming, add_speedups
from xpuspec.bench.peers import (
    GenaiLatencyRunner,
    TransformersLatencyRunner,
    genai_unavailable,
    llama_cpp_unavailable,
    transformers_unavailable,
)
from xpuspec.bench.progress import Progress
from xpuspec.engine.model_runner import SequenceChunk
from xpuspec.model_bundle import ModelBundle
from xpuspec.sample.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

XPUSPEC, GENAI, TRANSFORMERS, LLAMA_CPP = "xpuspec", "OpenVINO GenAI", "transformers", "llama.cpp"
ADAPTIVE = "adaptive"

Generate = Callable[[list[int], int], RequestTiming]


class XpuspecLatencyRunner:
    """Drives a Pipeline's engine directly, one request at a time, reading its per-step counts."""

    def __init__(self, pipeline: Any) -> None:
        self.engine = pipeline.engine
        self._ids = itertools.count()

    def generate(
        self, token_ids: list[int], max_tokens: int, draft_length: int | str | None
    ) -> RequestTiming:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            num_draft_tokens=draft_length if isinstance(draft_length, int) else None,
        )
        request_id = f"bench-{next(self._ids)}"
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
    target, draft = statistics.median(target_seconds), statistics.median(draft_seconds)
    return {"target_step_ms": target * 1000, "draft_step_ms": draft * 1000, "cost_ratio": draft / target}


@dataclass
class _Config:
    result: LatencyResult
    generate: Generate | None  # None when skipped


def _label(engine: str, draft_length: int | str | None) -> str:
    if draft_length is None:
        return f"{engine} target-only"
    if draft_length == ADAPTIVE:
        return f"{engine} speculative (adaptive γ)"
    return f"{engine} speculative (γ={draft_length})"


def _configurations(
    config: BenchConfig, bundle: ModelBundle, target_pipe: Any, draft_pipe: Any | None
) -> list[_Config]:
    lengths: list[int | str] = [*config.draft_lengths, ADAPTIVE]
    configs: list[_Config] = []

    def add(
        engine: str, draft_length: int | str | None, generate: Generate | None, reason: str | None
    ) -> None:
        result = LatencyResult(_label(engine, draft_length), engine, draft_length)
        if generate is None:
            result.status, result.reason = SKIPPED, reason
        configs.append(_Config(result, generate))

    def bind(runner: Any, draft_length: int | str | None) -> Generate:
        return lambda ids, max_tokens: runner.generate(ids, max_tokens, draft_length)

    target_runner = XpuspecLatencyRunner(target_pipe)
    add(XPUSPEC, None, bind(target_runner, None), None)
    draft_runner = XpuspecLatencyRunner(draft_pipe) if draft_pipe is not None else None
    for length in lengths:
        add(
            XPUSPEC,
            length,
            bind(draft_runner, length) if draft_runner else None,
            "the bundle has no draft model",
        )

    genai_lengths: list[int | str | None] = [None, *config.draft_lengths]
    reason = genai_unavailable()
    runners: dict[bool, Any] = {}
    if reason is None:
        try:
            runners[False] = GenaiLatencyRunner(bundle.target.path, None, config.properties)
            if bundle.draft is not None:
                runners[True] = GenaiLatencyRunner(bundle.target.path, bundle.draft.path, config.properties)
        except Exception as error:  # a peer that fails to load is reported, not fatal
            reason = f"failed to load: {error}"
    for length in genai_lengths:
        runner = runners.get(length is not None)
        why = reason or ("the bundle has no draft model" if runner is None else None)
        add(GENAI, length, bind(runner, length) if runner and not why else None, why)
    # GenAI's LLMPipeline has no adaptive draft length; say so rather than leave the row out.
    add(GENAI, ADAPTIVE, None, "LLMPipeline has no adaptive draft length (num_assistant_tokens is fixed)")

    reason = transformers_unavailable(config.hf_target, config.hf_draft)
    hf_runner = None
    if reason is None:
        try:
            hf_runner = TransformersLatencyRunner(config.hf_target, config.hf_draft)  # type: ignore[arg-type]
        except Exception as error:
            reason = f"failed to load: {error}"
    for length in [None, *lengths]:
        add(TRANSFORMERS, length, bind(hf_runner, length) if hf_runner else None, reason)

    add(LLAMA_CPP, None, None, llama_cpp_unavailable())
    return configs


def run_latency(
    config: BenchConfig,
    bundle: ModelBundle,
    target_pipe: Any,
    draft_pipe: Any | None,
    prompts: list[list[int]],
) -> dict[str, Any]:
    """Every configuration over ``prompts`` (token ids); returns the report's ``latency`` section."""
    configs = _configurations(config, bundle, target_pipe, draft_pipe)
    costs = measure_step_costs(draft_pipe) if draft_pipe is not None else None
    active = [c for c in configs if c.generate is not None]
    progress = Progress("latency", len(active) * (config.rounds + 1))
    for entry in active:  # warm-up: the first inferences compile kernels
        _guarded(entry, lambda e: e.generate(prompts[0], min(8, config.max_tokens)))  # type: ignore[misc]
        progress.advance(f"warm-up {entry.result.name}")
    for round_index in range(config.rounds):
        for entry in active:
            if entry.generate is None:  # failed in an earlier round
                progress.advance(f"{entry.result.name}: skipped")
                continue

            def one_round(e: _Config) -> None:
                e.result.record_round([e.generate(ids, config.max_tokens) for ids in prompts])  # type: ignore[misc]

            _guarded(entry, one_round)
            seconds = entry.result.round_seconds[-1] if entry.generate else float("nan")
            progress.advance(f"round {round_index + 1}/{config.rounds} {entry.result.name}: {seconds:.2f} s")

    results = [c.result for c in configs]
    summaries = {r.name: r.summary() for r in results}
    add_speedups(results, summaries, costs["cost_ratio"] if costs else None)
    _compare_tokens(results, summaries)
    _peer_ratios(results, summaries)
    section: dict[str, Any] = {
        "step_costs": costs,
        "configurations": [
            {"name": r.name, "engine": r.engine, "draft_length": r.draft_length, **summaries[r.name]}
            for r in results
        ],
    }
    if draft_pipe is not None:
        cost_model = draft_pipe.engine.cost_model
        section["engine_cost_model"] = {
            "target_step_ms": cost_model.target_cost(1) * 1000,
            "draft_step_ms": cost_model.draft_cost(1) * 1000,
        }
    return section


def _guarded(entry: _Config, action: Callable[[_Config], None]) -> None:
    """Run a configuration; a peer that fails is marked skipped with the error, the run goes on."""
    try:
        action(entry)
    except Exception as error:
        if entry.result.engine == XPUSPEC:
            raise
        logger.warning("%s failed: %s", entry.result.name, error)
        entry.result.status, entry.result.reason, entry.generate = SKIPPED, f"failed: {error}", None


def _compare_tokens(results: list[LatencyResult], summaries: dict[str, dict[str, Any]]) -> None:
    """How many requests gave the same tokens as xpuspec target-only (greedy: all, at f32)."""
    reference = next((r for r in results if r.engine == XPUSPEC and r.draft_length is None), None)
    if reference is None or not reference.requests:
        return
    expected = [t.token_ids for t in reference.requests]
    for result in results:
        if result.requests:
            same = sum(t.token_ids == e for t, e in zip(result.requests, expected, strict=True))
            summaries[result.name]["same_tokens_as_target_only"] = f"{same}/{len(expected)}"


def _peer_ratios(results: list[LatencyResult], summaries: dict[str, dict[str, Any]]) -> None:
    """xpuspec tokens/s over each peer's at the same draft length (>1: xpuspec is faster)."""
    rate = {(r.engine, r.draft_length): summaries[r.name].get("tokens_per_s") for r in results}
    for result in results:
        if result.engine != XPUSPEC:
            continue
        ratios = {}
        for peer in (GENAI, TRANSFORMERS):
            ours, theirs = rate.get((XPUSPEC, result.draft_length)), rate.get((peer, result.draft_length))
            ratios[peer] = ours / theirs if ours and theirs else None
        summaries[result.name]["ratio_to_peers"] = ratios
