"""`xpuspec bench`: xpuspec beside its peers on the same models and prompts, with a report and plots.

Modes: ``latency`` (batch 1: target-only and speculative at each draft length and adaptive, beside
OpenVINO GenAI's LLMPipeline, transformers' assisted generation and llama.cpp where available),
``load`` (a concurrency sweep against a real ``xpuspec serve``, beside GenAI's continuous batching),
``all`` (both). Writes report.json, report.md and PNG plots into --out.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from xpuspec.bench.config import QUICK, BenchConfig
from xpuspec.bench.environment import environment
from xpuspec.bench.report import write_report
from xpuspec.bench.workloads import encode_prompts, load_workload

logger = logging.getLogger(__name__)


def _integers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark against OpenVINO GenAI, transformers and llama.cpp; write a report with plots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--bundle", type=Path, default=None, help="a prepared bundle, or demo (default: SmolLM2 + draft)"
    )
    parser.add_argument(
        "--workload", default="code", help="code | chat | FILE.jsonl ('prompt' or 'messages')"
    )
    parser.add_argument("--mode", choices=["latency", "load", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="a short run (about a minute on the demo pair)")
    parser.add_argument("--out", type=Path, default=Path("bench-report"), help="report folder")
    parser.add_argument("--draft-lengths", type=_integers, default=None, help="fixed γ values, e.g. 1,2,4,6")
    parser.add_argument("--concurrency", type=_integers, default=None, help="client counts, e.g. 1,2,4,8,16")
    parser.add_argument("--prompts", type=int, default=None, help="number of prompts")
    parser.add_argument("--max-tokens", type=int, default=None, help="new tokens per request")
    parser.add_argument("--rounds", type=int, default=None, help="batch-1 rounds (best kept)")
    parser.add_argument(
        "--hf-target", type=Path, default=None, help="HF checkpoint of the target (transformers)"
    )
    parser.add_argument(
        "--hf-draft", type=Path, default=None, help="HF checkpoint of the draft (transformers)"
    )
    parser.add_argument("--f32", action="store_true", help="f32 compute and KV cache (default: CPU defaults)")
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    values: dict[str, Any] = dict(QUICK) if args.quick else {}
    explicit = {
        "draft_lengths": args.draft_lengths,
        "concurrency": args.concurrency,
        "num_prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
    }
    values.update({key: value for key, value in explicit.items() if value is not None})
    return BenchConfig(
        out=args.out,
        bundle=args.bundle,
        workload=args.workload,
        mode=args.mode,
        hf_target=args.hf_target,
        hf_draft=args.hf_draft,
        f32=args.f32,
        **values,
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as error:
        print(f"xpuspec bench: {error}", file=sys.stderr)
        return 2
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress
    report = run_bench(config)
    json_path, markdown_path = write_report(report, config.out)
    print(markdown_path.read_text(encoding="utf-8"))
    print(f"xpuspec bench: wrote {json_path}, {markdown_path} and plots to {config.out}", file=sys.stderr)
    return 0


def run_bench(config: BenchConfig) -> dict[str, Any]:
    """Run the configured modes; return the report (plots are written into ``config.out`` already)."""
    from xpuspec.bench.latency import run_latency
    from xpuspec.bench.load import run_load
    from xpuspec.bench.plots import write_plots
    from xpuspec.engine.engine import EngineConfig
    from xpuspec.model_bundle import ModelBundle
    from xpuspec.pipeline import Pipeline

    bundle = ModelBundle.open(config.bundle)
    config.out.mkdir(parents=True, exist_ok=True)
    prompts = load_workload(config.workload, config.num_prompts, config.prompt_chars)
    engine_config = EngineConfig(max_model_len=bundle.max_context)
    # Batch 1 needs one sequence's KV: a small cache keeps memory low beside the peers.
    num_kv_blocks = 4 * -(-bundle.max_context // 16)

    def pipeline(drafter: str) -> Pipeline:
        return Pipeline(
            config.bundle,
            drafter=drafter,
            properties=config.properties or None,
            engine_config=engine_config,
            num_kv_blocks=num_kv_blocks,
            use_placement=False,  # the bench sets every choice itself
        )

    logger.info("loading xpuspec target-only and speculative pipelines from %s", bundle.root)
    target_pipe = pipeline("none")
    max_prompt_tokens = bundle.max_context - config.max_tokens - engine_config.max_draft_tokens - 1
    token_prompts = encode_prompts(target_pipe, prompts, max_prompt_tokens)
    report: dict[str, Any] = {
        "settings": config.settings(),
        "environment": environment(),
        "models": {
            "target": bundle.target.architecture,
            "draft": bundle.draft.architecture if bundle.draft is not None else None,
            "root": str(bundle.root),
        },
        "prompts": [
            {"source": p.source, "prompt_tokens": len(ids)}
            for p, ids in zip(prompts, token_prompts, strict=True)
        ],
    }
    if config.runs_latency:
        draft_pipe = pipeline("draft") if bundle.draft is not None else None
        report["latency"] = run_latency(config, bundle, target_pipe, draft_pipe, token_prompts)
        del draft_pipe
    del target_pipe  # the load mode's server loads its own copy
    if config.runs_load:
        report["load"] = run_load(config, bundle, token_prompts)
    report["plots"] = write_plots(report, config.out)
    return report
