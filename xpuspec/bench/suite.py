"""The `xpuspec bench` suite: encode the workload once, then run the configured modes beside the peers."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

from xpuspec.api.errors import EXIT_FAILED, CommandError
from xpuspec.bench.budget import GIB, Estimate, estimate, kv_blocks, kv_tokens, mem_available
from xpuspec.bench.config import BenchConfig
from xpuspec.bench.environment import environment
from xpuspec.bench.workloads import PromptEncoder, encode_prompts, load_workload
from xpuspec.models.bundle import ModelBundle

logger = logging.getLogger(__name__)


def run_estimate(config: BenchConfig, bundle: ModelBundle) -> Estimate:
    """The rough time and peak memory of ``config`` on ``bundle`` (:mod:`xpuspec.bench.budget`), from
    the engines its rows would compile; nothing is compiled."""
    from xpuspec.bench.latency_rows import compile_order, configurations
    from xpuspec.bench.quick import engine_groups, quick_rows

    configs, engines = configurations(config, bundle, lambda *args: None, {}, (None, None))
    if config.quick:
        configs, engines = quick_rows(configs, engines)
    groups = engine_groups(engines, 0) if config.quick else [compile_order(engines, 0)]
    pairs = [[(engine.key, engine.family) for engine in group] for group in groups]
    return estimate(config, bundle, pairs, sum(1 for row in configs if row.engine_key is not None))


def check_budget(
    config: BenchConfig, bundle: ModelBundle, ignore_memory: bool = False, available: int | None = None
) -> Estimate:
    """State the run's estimate on stderr; refuse (CommandError) when the machine's available memory
    (``available`` bytes, default MemAvailable) cannot hold its peak, unless ``ignore_memory``."""
    cost = run_estimate(config, bundle)
    available = mem_available() if available is None else available
    free = f"; {available / GIB:.1f} GB available" if available is not None else ""
    print(f"xpuspec bench: this run takes {cost.describe()} (a rough estimate){free}", file=sys.stderr)
    if available is not None and cost.peak_bytes > available and not ignore_memory:
        raise CommandError(
            f"this run needs about {cost.peak_bytes / GIB:.1f} GB and the machine has "
            f"{available / GIB:.1f} GB available; try --quick, fewer --draft-lengths or --mode latency, "
            "free some memory, or pass --ignore-memory to run anyway",
            EXIT_FAILED,
        )
    return cost


def quiet_third_parties() -> None:
    """Keep the bench's output to its progress and report: one line per HTTP request (httpx) and the
    deprecation chatter of transformers, optimum and torch (the GenAI EAGLE-3 conversion and the
    transformers peer import them) say nothing about the measurement."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("transformers", "optimum", "torch", "nncf", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", module=rf"{name}(\.|$)")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def run_bench(config: BenchConfig) -> dict[str, Any]:
    """Run the configured modes; return the report (plots are written into ``config.out`` already)."""
    from xpuspec.api.pipeline import Pipeline
    from xpuspec.bench.latency import genai_default_properties, run_latency
    from xpuspec.bench.load import run_load
    from xpuspec.bench.plots import write_plots
    from xpuspec.devices.placement import recorded_properties
    from xpuspec.engine.engine import EngineConfig
    from xpuspec.models.resolve import resolve_bundle

    bundle = resolve_bundle(config.bundle)
    config.out.mkdir(parents=True, exist_ok=True)
    prompts = load_workload(config.workload, config.num_prompts, config.prompt_chars)
    max_draft = EngineConfig().max_draft_tokens
    logger.info("encoding %d prompts with the tokenizer of %s", len(prompts), bundle.root)
    max_prompt_tokens = bundle.max_context - config.max_tokens - max_draft - 1
    token_prompts = encode_prompts(PromptEncoder(bundle), prompts, max_prompt_tokens)
    # Batch 1 holds one sequence: the engines' context and KV cache sized to the longest request, not to
    # the model's context. A cache for 4x the default model's 8192 tokens took most of each engine's
    # memory, and a round holds many engines.
    max_model_len = kv_tokens(token_prompts, config.max_tokens, max_draft, bundle.max_context)
    # GenAI runs with prefix caching off here and rounds repeat prompts: xpuspec too (see multiturn).
    engine_config = EngineConfig(max_model_len=max_model_len, enable_prefix_caching=False)
    num_kv_blocks = kv_blocks(max_model_len)

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
    if config.runs_latency and not config.quick:  # a quick look leaves structured output out
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
