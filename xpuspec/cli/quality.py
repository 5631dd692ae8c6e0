"""`xpuspec quality`: KL divergence, top-1 agreement and perplexity against the same weights in exact mode."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from xpuspec.api.errors import EXIT_USAGE, report_error


def register(subparsers: argparse._SubParsersAction) -> None:
    quality = subparsers.add_parser(
        "quality",
        help="how far the bundle's target, as it runs, is from the same weights in exact mode",
        description="Runs the bundle's target over a held-out text set shipped with xpuspec (prose, code, "
        "dialogue, numbers, non-Latin scripts; docs/quality.md), one prefill per chunk, and compares its "
        "next-token distributions with the same weights in exact mode (f32 compute, f32 KV cache, no "
        "dynamic quantisation): KL divergence (mean, 99th percentile), top-1 agreement, perplexity. "
        "For a bundle prepared from a GGUF, llama.cpp on the same file too, through llama-server's "
        "top-n token probabilities, when a llama-server is at hand. The budget: llama.cpp's deviation "
        "(measured, else its arithmetic emulated in OpenVINO); each row says whether it is within.",
    )
    quality.add_argument(
        "bundle", nargs="?", default=None, help="bundle folder, or demo (default: SmolLM2 + draft)"
    )
    quality.add_argument(
        "--properties",
        action="store_true",
        help="also compare other compile-property sets (bf16 KV cache, f32 compute with dynamic "
        "quantisation, the stable preset) with the defaults",
    )
    quality.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="BUNDLE",
        help="another bundle of the same weights in another format (e.g. prepared with --weight-format "
        "gguf+head_int4_asym_g64): its target at its defaults is one more row (repeatable)",
    )
    quality.add_argument("--chunk-tokens", type=int, default=512, help="tokens per prefill (default 512)")
    quality.add_argument("--max-chunks", type=int, default=None, help="measure only the first N chunks")
    quality.add_argument(
        "--top-n", type=int, default=20, help="llama-server's n_probs, and every row's lumped KL (default 20)"
    )
    quality.add_argument(
        "--speed-rounds",
        type=int,
        default=3,
        help="interleaved rounds of a short greedy decode per row, for tokens/s (default 3; 0: none)",
    )
    quality.add_argument("--llama-server", type=Path, default=None, help="the llama-server binary")
    quality.add_argument(
        "--llama-threads",
        type=int,
        default=1,
        help="llama-server -t (default 1: ggml gives each output row to one thread, so the count "
        "changes its speed, not its numbers)",
    )
    quality.add_argument("--no-llama-cpp", action="store_true", help="do not run llama.cpp")
    quality.add_argument("--json", action="store_true", help="print the record as JSON")
    quality.add_argument(
        "--write", action="store_true", help="record the figures in the bundle's manifest (quality)"
    )
    quality.set_defaults(func=run_quality_command)


def run_quality_command(args: argparse.Namespace) -> int:
    from xpuspec.bench.quality import QualityConfig
    from xpuspec.models.bundle import BundleError

    try:
        config = QualityConfig(
            chunk_tokens=args.chunk_tokens,
            top_n=args.top_n,
            max_chunks=args.max_chunks,
            speed_rounds=args.speed_rounds,
        )
        report = measure(
            args.bundle,
            config,
            args.properties,
            args.against,
            args.llama_server,
            args.llama_threads,
            args.no_llama_cpp,
        )
    except (ValueError, BundleError) as error:
        report_error(str(error))
        return EXIT_USAGE
    show(report, as_json=args.json)
    if args.write:
        from xpuspec.bench.quality_report import write_quality

        write_quality(report)
        print(f"recorded the quality figures in {report.bundle}", file=sys.stderr)
    return 0


def measure(
    bundle_spec: str | None,
    config: Any,
    property_sets: bool = False,
    against: list[str] | None = None,
    llama_server: Path | None = None,
    llama_threads: int = 1,
    no_llama_cpp: bool = False,
) -> Any:
    """The quality report of ``bundle_spec``'s target (``prepare --quality`` and ``plan --quality`` too)."""
    from xpuspec.bench.quality import bundle_candidates
    from xpuspec.bench.quality_run import LlamaChoice, run_quality
    from xpuspec.models.bundle import cache_dir
    from xpuspec.models.resolve import resolve_bundle

    bundle = resolve_bundle(bundle_spec)
    others = [(Path(path).name, resolve_bundle(path)) for path in against or []]
    llama = LlamaChoice(binary=llama_server, threads=llama_threads, off=no_llama_cpp)
    candidates = bundle_candidates(bundle, others, property_sets)
    return run_quality(bundle, candidates, config, llama=llama, logs=cache_dir() / "quality-logs")


def show(report: Any, *, as_json: bool = False) -> None:
    from xpuspec.bench.quality_report import as_dict, table

    print(
        json.dumps(as_dict(report), indent=2) if as_json else table(report), end="" if not as_json else "\n"
    )
