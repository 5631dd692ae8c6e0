"""The `xpuspec bench` suite: encode the workload once, then run the configured modes beside the peers."""

from __future__ import annotations

import logging
from typing import Any

from xpuspec.bench.config import BenchConfig
from xpuspec.bench.environment import environment
from xpuspec.bench.workloads import encode_prompts, load_workload

logger = logging.getLogger(__name__)


def run_bench(config: BenchConfig) -> dict[str, Any]:
    """Run the configured modes; return the report (plots are written into ``config.out`` already)."""
    from xpuspec.bench.latency import genai_default_properties, run_latency
    from xpuspec.bench.load import run_load
    from xpuspec.bench.plots import write_plots
    from xpuspec.bundles import resolve_bundle
    from xpuspec.devices.placement import recorded_properties
    from xpuspec.engine.engine import EngineConfig
    from xpuspec.pipeline import Pipeline

    bundle = resolve_bundle(config.bundle)
    config.out.mkdir(parents=True, exist_ok=True)
    prompts = load_workload(config.workload, config.num_prompts, config.prompt_chars)
    # GenAI runs with prefix caching off here and rounds repeat prompts: xpuspec too (see multiturn).
    engine_config = EngineConfig(max_model_len=bundle.max_context, enable_prefix_caching=False)
    # Batch 1 needs one sequence's KV: a small cache keeps memory low beside the peers.
    num_kv_blocks = 4 * -(-bundle.max_context // 16)

    def pipeline(drafter: str, properties: Any = None, draft_properties: Any = None) -> Pipeline:
        return Pipeline(
            config.bundle,
            drafter=drafter,
            properties=properties,
            draft_properties=draft_properties,
            engine_config=engine_config,
            num_kv_blocks=num_kv_blocks,
            use_placement=False,  # the bench sets every choice itself
        )

    # Same properties for both engines: the user's, or GenAI's CPU defaults made explicit.
    same_properties = dict(config.properties) or genai_default_properties()
    # xpuspec as it comes: the compile properties `xpuspec plan --write` recorded, else the plugin's.
    default_properties = (
        recorded_properties(bundle, "target", "CPU"),
        recorded_properties(bundle, "draft", "CPU"),
    )
    logger.info("loading xpuspec to encode the prompts, from %s", bundle.root)
    encoder = pipeline("none", same_properties)
    max_prompt_tokens = bundle.max_context - config.max_tokens - engine_config.max_draft_tokens - 1
    token_prompts = encode_prompts(encoder, prompts, max_prompt_tokens)
    del encoder
    report: dict[str, Any] = {
        "settings": config.settings(),
        "environment": environment(),
        "models": {
            "target": bundle.target.architecture,
            "draft": bundle.draft.architecture if bundle.draft is not None else None,
            "eagle3": bundle.eagle3.facts.get("source") if bundle.eagle3 is not None else None,
            "root": str(bundle.root),
        },
        "prompts": [
            {"source": p.source, "prompt_tokens": len(ids)}
            for p, ids in zip(prompts, token_prompts, strict=True)
        ],
    }
    if config.runs_latency:
        report["latency"] = run_latency(
            config, bundle, pipeline, token_prompts, same_properties, default_properties
        )
    if config.runs_latency:
        from xpuspec.bench.structured import run_structured

        report["structured"] = run_structured(
            lambda drafter: pipeline(drafter, *default_properties),
            token_prompts,
            config.max_tokens,
            config.rounds,
        )
    if config.runs_load:
        report["load"] = run_load(config, bundle, token_prompts)
    report["plots"] = write_plots(report, config.out)
    return report
