"""Batch-1 latency mode: xpuspec target-only and speculative at each draft length, beside its peers.

Three groups of rows (four with an EAGLE-3 head in the bundle):

- **same properties**: xpuspec and OpenVINO GenAI compiled with the same OpenVINO properties (the
  user's, or GenAI's defaults made explicit: the CPU plugin's compute precision, a cache of that
  precision and its dynamic-quantisation group), so that ``÷ GenAI`` compares the engines alone;
- **default**: each engine as a user gets it: xpuspec with the properties `xpuspec plan` recorded in
  the bundle (or its CPU plugin's defaults), GenAI's ``LLMPipeline`` with none;
- **EAGLE-3**: xpuspec drafting with the bundle's EAGLE-3 head at each draft length and adaptive, with
  the same properties (its speed-ups are over the same-properties target-only row), beside OpenVINO
  GenAI's EAGLE-3 with the same head (converted by :mod:`xpuspec.bench.genai_eagle3`) at each draft
  length, same properties (its speed-ups are over GenAI's same-properties target-only row; ``÷ GenAI``
  of the xpuspec EAGLE-3 rows is over it);
- **exact**: xpuspec target-only in exact mode (f32 compute, f32 KV cache, no dynamic quantisation),
  the reference of every row's "same tokens" (greedy agreement: requests whose tokens equal it).

Methodology: rounds interleave the configurations prompt by prompt (every configuration runs a prompt
before any runs the next, the order reversed from one prompt to the next) so that machine noise hits
all alike, and every round compiles every engine afresh, each xpuspec engine beside the GenAI engine
it is compared with, which of the two first alternating from round to round (in one process an engine
compiled earlier in a round runs slower: see :func:`xpuspec.bench.latency_rows.compile_order`). Prefix
caching is off in both engines, so neither reuses the prompt's KV across rounds. Each configuration's
figures come from each prompt's fastest run over the rounds. Every configuration generates the same
prompt tokens, greedy, a fixed number of tokens (end-of-sequence ignored).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

from xpuspec.bench.config import BenchConfig
from xpuspec.bench.cost_curves import cost_curve, median_curve
from xpuspec.bench.figures import SKIPPED, RequestTiming, add_speedups
from xpuspec.bench.latency_labels import (
    BASELINE_OF,
    EAGLE3_KEY,
    GENAI,
    GENAI_DEFAULT,
    SAME,
    XPUSPEC,
    XPUSPEC_DEFAULT,
    XPUSPEC_EAGLE3,
    XPUSPEC_EXACT,
)
from xpuspec.bench.latency_ratios import compare_tokens, peer_ratios
from xpuspec.bench.latency_rows import BenchEngine, Row, adjacent_peers, compile_order, configurations
from xpuspec.bench.latency_runner import XpuspecLatencyRunner, measure_step_costs
from xpuspec.bench.peers import why_failed
from xpuspec.bench.progress import Progress
from xpuspec.bench.quick import engine_groups, quick_rows
from xpuspec.bench.report import not_run
from xpuspec.models.bundle import ModelBundle

__all__ = ["GENAI", "XPUSPEC", "XpuspecLatencyRunner", "genai_default_properties", "run_latency"]

logger = logging.getLogger(__name__)


def genai_default_properties() -> dict[str, Any]:
    """The CPU plugin's defaults as GenAI's LLMPipeline compiles with them, made explicit: the default
    compute precision, a KV cache of that precision (f16 at f32, which the CPU's PagedAttention takes)
    and the default dynamic-quantisation group."""
    import openvino as ov

    core = ov.Core()
    compute = str(core.get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name())
    hint = {"bf16": "bf16", "f16": "f16"}.get(compute, "f32")
    return {
        "INFERENCE_PRECISION_HINT": hint,
        "KV_CACHE_PRECISION": hint if hint != "f32" else "f16",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": int(core.get_property("CPU", "DYNAMIC_QUANTIZATION_GROUP_SIZE")),
    }


def run_latency(
    config: BenchConfig,
    bundle: ModelBundle,
    build_pipeline: Callable[[str, Any, Any], Any],
    prompts: list[list[int]],
    same_properties: dict[str, Any],
    default_properties: tuple[dict[str, Any] | None, dict[str, Any] | None] = (None, None),
) -> dict[str, Any]:
    """Every configuration over ``prompts`` (token ids); returns the report's ``latency`` section."""
    configs, engines = configurations(config, bundle, build_pipeline, same_properties, default_properties)
    if config.quick:
        configs, engines = quick_rows(configs, engines)
    _say_not_run(configs)
    active = adjacent_peers([c for c in configs if c.engine_key is not None])
    engine_of = {id(row): row.engine_key for row in active}  # as listed: a failure clears engine_key
    progress = Progress("latency", config.rounds * (len(engines) + len(active) * len(prompts)))
    costs: dict[str, float] | None = None
    curves: dict[str, list[dict[str, Any]]] = {}  # engine -> its cost curve, one per round
    kept: dict[str, Any] = {}  # engines built once (fresh_per_round False)
    compiled: list[list[str]] = []
    for round_index in range(config.rounds):
        # The full bench compiles every engine of the round before it runs any (a round's rows run
        # interleaved); --quick compiles a pair at a time and frees it before the next.
        groups = (
            engine_groups(engines, round_index) if config.quick else [compile_order(engines, round_index)]
        )
        compiled.append([])
        cost_models: dict[str, Any] = {}
        for group in groups:
            keys = {engine.key for engine in group}
            rows = [row for row in active if engine_of[id(row)] in keys]
            built, failed = _compile_round(
                group, rows, kept, prompts[0], config.max_tokens, round_index, progress
            )
            compiled[-1] += [e.key for e in group if e.key in built]
            if costs is None and f"{XPUSPEC}/draft" in built:
                costs = measure_step_costs(built[f"{XPUSPEC}/draft"].pipeline)
            running = _running(rows, failed, round_index, len(prompts), progress)
            _run_round(running, built, prompts, config, round_index, progress)
            cost_models.update(
                (key, runner.pipeline.cost_model)
                for key, runner in built.items()
                if isinstance(runner, XpuspecLatencyRunner)
            )
            # Free these engines before the next compile: pipelines hold reference cycles, which
            # wait for a full collection, and a round of the default model's engines takes much of
            # a small machine's memory (without this a third round was killed for memory; figures:
            # docs/experiments/code-comment-figures.md).
            del built
            gc.collect()
        _add_curves(curves, cost_models, config.draft_lengths)
    return _section(configs, curves, costs, compiled, same_properties, default_properties)


def _say_not_run(configs: list[Row]) -> None:
    """One line on stderr per reason rows cannot run here, naming its rows (the report has a row each)."""
    reasons: dict[str, list[str]] = {}
    for row in configs:
        if row.engine_key is None:
            reasons.setdefault(not_run(row.result.reason), []).append(row.result.name)
    for reason, names in reasons.items():
        logger.info("%s (%s)", reason, ", ".join(names))


def _compile_round(
    order: list[BenchEngine],
    active: list[Row],
    kept: dict[str, Any],
    warm_up_prompt: list[int],
    max_tokens: int,
    round_index: int,
    progress: Progress,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Build the round's engines in ``order``: those built, by key, and why each that failed to load did."""
    built: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for engine in order:
        if not engine.fresh_per_round and engine.key in kept:
            built[engine.key] = kept[engine.key]
            continue
        if not any(c.engine_key == engine.key and _wanted(c, round_index) for c in active):
            progress.advance(f"round {round_index + 1}: {engine.key} not needed")
            continue
        try:
            built[engine.key] = engine.build()
            # Warm-up: the first inferences compile kernels for new shapes.
            built[engine.key].generate(warm_up_prompt, min(8, max_tokens), None)
        except Exception as error:  # a peer that fails to load is reported, not fatal
            if engine.family == XPUSPEC:
                raise
            built.pop(engine.key, None)  # built, but its warm-up failed
            failed[engine.key] = f"failed to load: {why_failed(error)}"
            logger.warning("%s not run: %s", engine.key, failed[engine.key])
            logger.debug("%s failed to load", engine.key, exc_info=error)
        if not engine.fresh_per_round and engine.key in built:
            kept[engine.key] = built[engine.key]
        done = "compiled" if engine.key in built else "could not compile"
        progress.advance(f"round {round_index + 1}: {done} {engine.key}")
    return built, failed


def _running(
    active: list[Row], failed: dict[str, str], round_index: int, num_prompts: int, progress: Progress
) -> list[Row]:
    """The rows the round runs, in its order (reversed every other round); a row whose engine failed
    to load is marked skipped."""
    running: list[Row] = []
    for entry in active if round_index % 2 == 0 else active[::-1]:
        key = entry.engine_key
        if key is None or not _wanted(entry, round_index):
            progress.advance(f"{entry.result.name}: skipped", units=num_prompts)
        elif key in failed:
            entry.result.status, entry.result.reason, entry.engine_key = SKIPPED, failed[key], None
            progress.advance(f"{entry.result.name}: not run ({key} failed to load)", units=num_prompts)
        else:
            running.append(entry)
    return running


def _run_round(
    running: list[Row],
    built: dict[str, Any],
    prompts: list[list[int]],
    config: BenchConfig,
    round_index: int,
    progress: Progress,
) -> None:
    """Run the round's rows over every prompt, interleaved, and record each row's timings."""

    def prompt_done(index: int) -> None:
        progress.advance(
            f"round {round_index + 1}/{config.rounds}: prompt {index + 1}/{len(prompts)} by "
            f"{len(running)} configurations",
            units=len(running),
        )

    round_timings = _interleaved_round(running, built, prompts, config.max_tokens, prompt_done)
    for entry, timings in zip(running, round_timings, strict=True):
        if entry.engine_key is None:  # failed during the round
            progress.advance(f"{entry.result.name}: not run (see above)", units=0)
            continue
        entry.result.record_round(timings)
        seconds = entry.result.round_seconds[-1]
        progress.advance(
            f"round {round_index + 1}/{config.rounds} {entry.result.name}: {seconds:.2f} s", units=0
        )


def _add_curves(
    curves: dict[str, list[dict[str, Any]]], cost_models: dict[str, Any], draft_lengths: tuple[int, ...]
) -> None:
    """Append the round's cost curve of each speculative xpuspec engine to ``curves`` (by row group),
    from the cost models of the round's engines (by engine key)."""
    for label, key in (
        (XPUSPEC, f"{XPUSPEC}/draft"),
        (XPUSPEC_DEFAULT, f"{XPUSPEC_DEFAULT}/draft"),
        (XPUSPEC_EAGLE3, EAGLE3_KEY),
    ):
        if key in cost_models:
            plain = cost_models.get(f"{BASELINE_OF.get(label, label)}/none")
            curves.setdefault(label, []).append(
                cost_curve(cost_models[key], max(draft_lengths, default=0), plain)
            )


def _section(
    configs: list[Row],
    curves: dict[str, list[dict[str, Any]]],
    costs: dict[str, float] | None,
    compiled: list[list[str]],
    same_properties: dict[str, Any],
    default_properties: tuple[dict[str, Any] | None, dict[str, Any] | None],
) -> dict[str, Any]:
    """The report's ``latency`` section: every row's summary with its speed-ups and peer ratios."""
    results = [c.result for c in configs]
    summaries = {r.name: r.summary() for r in results}
    cost_model = {label: median_curve(rounds) for label, rounds in curves.items()}
    add_speedups(
        results,
        summaries,
        {
            label: {int(g): ms / 1000 for g, ms in curve["step_ms"].items()}
            for label, curve in cost_model.items()
        },
        BASELINE_OF,
    )
    compare_tokens(results, summaries)
    peer_ratios(results, summaries)
    section: dict[str, Any] = {
        "step_costs": costs,
        "properties": {
            SAME: same_properties,
            f"{XPUSPEC_DEFAULT} (target)": default_properties[0] or "CPU plugin defaults",
            f"{XPUSPEC_DEFAULT} (draft)": default_properties[1] or "CPU plugin defaults",
            GENAI_DEFAULT: "none (LLMPipeline defaults)",
            XPUSPEC_EXACT: "exact",
        },
        "compile_order": compiled,
        "configurations": [
            {"name": r.name, "engine": r.engine, "draft_length": r.draft_length, **summaries[r.name]}
            for r in results
        ],
    }
    if cost_model:
        section["engine_cost_model"] = cost_model
    return section


def _interleaved_round(
    entries: list[Row],
    built: dict[str, Any],
    prompts: list[list[int]],
    max_tokens: int,
    prompt_done: Callable[[int], None] = lambda index: None,
) -> list[list[RequestTiming]]:
    """One round: every configuration runs a prompt before any runs the next; the timings of each
    configuration, in the order of ``entries``.

    So a prompt's runs lie within a second or so of each other, and a slow spell of a shared machine
    (they last seconds) falls on every configuration alike; a configuration's whole round at a time
    let a swing in machine speed between rows decide their ratio. The order reverses from one
    prompt to the next, so no configuration always runs right after the same other one. A
    configuration that fails is marked skipped (a peer) or raises (xpuspec), as in :func:`_guarded`.
    """
    timings: list[list[RequestTiming]] = [[] for _ in entries]
    indexed = list(enumerate(entries))
    for prompt_index, token_ids in enumerate(prompts):
        for index, entry in indexed if prompt_index % 2 == 0 else indexed[::-1]:
            if entry.engine_key is None:
                continue
            runner, length = built[entry.engine_key], entry.draft_length

            def one_prompt(
                e: Row,
                runner: Any = runner,
                length: Any = length,
                token_ids: list[int] = token_ids,
                kept: list[RequestTiming] = timings[index],
            ) -> None:
                kept.append(runner.generate(token_ids, max_tokens, length))

            _guarded(entry, one_prompt)
        prompt_done(prompt_index)
    return timings


def _wanted(entry: Row, round_index: int) -> bool:
    return round_index == 0 or not entry.reference_only


def _guarded(entry: Row, action: Callable[[Row], None]) -> None:
    """Run a configuration; a peer that fails is marked skipped with the error, the run goes on."""
    try:
        action(entry)
    except Exception as error:
        if entry.result.engine == XPUSPEC:
            raise
        entry.result.status, entry.result.reason, entry.engine_key = (
            SKIPPED,
            f"failed: {why_failed(error)}",
            None,
        )
        logger.warning("%s not run: %s", entry.result.name, entry.result.reason)
