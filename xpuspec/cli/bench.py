"""`xpuspec bench`: xpuspec beside its peers on the same models and prompts, with a report and plots.

Modes: latency (batch 1: target-only and speculative at each draft length and adaptive, beside
OpenVINO GenAI's LLMPipeline, transformers' assisted generation and llama.cpp where available),
load (a concurrency sweep against a real `xpuspec serve`, beside GenAI's continuous batching),
all (both). Writes report.json, report.md and PNG plots into --out. Every run first states its rough
time and memory estimate, and refuses to start when the machine's available memory cannot hold it
(--ignore-memory starts it anyway). multiturn, serve and categories (speculation per kind of task
through the real servers) write their own reports.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from xpuspec.api.errors import CommandError
from xpuspec.bench.config import QUICK, BenchConfig
from xpuspec.bench.report import write_report
from xpuspec.bench.suite import check_budget, quiet_third_parties, run_bench
from xpuspec.models.resolve import resolve_bundle


def _integers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``--mode serve`` and ``--mode categories``: llama.cpp's server."""
    parser.add_argument(
        "--llama-server",
        type=Path,
        default=None,
        help="serve, categories: the llama-server binary (default: $XPUSPEC_LLAMA_SERVER, the one "
        "scripts/build-llama-server.sh built into the cache, or llama-server on the PATH)",
    )
    parser.add_argument(
        "--llama-threads",
        type=_integers,
        default=None,
        help="serve, categories: llama.cpp's thread counts (default: 1,2 for serve, 2 for categories)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark against OpenVINO GenAI, transformers and llama.cpp; write a report with plots",
        description=__doc__,
    )
    defaults = BenchConfig(out=Path("bench-report"))

    def default(name: str) -> str:
        value = getattr(defaults, name)
        full = ",".join(map(str, value)) if isinstance(value, tuple) else value
        quick = QUICK.get(name)
        quick_text = ",".join(map(str, quick)) if isinstance(quick, tuple) else quick
        return f"(default: {full}; with --quick {quick_text})"

    parser.add_argument(
        "--bundle", type=Path, default=None, help="a prepared bundle, or demo (default: SmolLM2 + draft)"
    )
    parser.add_argument(
        "--workload", default="code", help="code, chat, or FILE.jsonl with 'prompt' or 'messages' per line"
    )
    parser.add_argument(
        "--mode",
        choices=["latency", "load", "all", "multiturn", "serve", "categories"],
        default="all",
        help="multiturn: TTFT per turn with and without prefix caching, beside GenAI's (not in all); "
        "serve: chats through `xpuspec serve` and llama.cpp's llama-server on the bundle's GGUF, "
        "one at a time or from --concurrency clients (not in all); categories: speculation per kind of "
        "task (chat, translation, summarization, QA, math, RAG, code editing) through the same servers, "
        "tokens/s and acceptance per category, with a plot (not in all; --prompts: per category; "
        "--workload FILE.jsonl: another prompt set of the same shape)",
    )
    _add_serve_arguments(parser)
    parser.add_argument("--turns", type=int, default=4, help="multiturn: turns of the conversation")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a quick look: xpuspec beside GenAI at the same properties (target-only, fixed and adaptive "
        "γ, the exact reference; one server), 3 short prompts, one round, engines compiled a pair at a "
        "time; about a minute on an idle 2-core CPU with the default model, under 2 GB (docs/bench-cost.md)",
    )
    parser.add_argument(
        "--ignore-memory",
        action="store_true",
        help="start even when the run's memory estimate exceeds the machine's available memory",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-report"), help="report folder")
    parser.add_argument(
        "--draft-lengths",
        type=_integers,
        default=None,
        help=f"fixed draft lengths {default('draft_lengths')}",
    )
    parser.add_argument(
        "--concurrency",
        type=_integers,
        default=None,
        help=f"client counts {default('concurrency')}; serve: clients sending chats back to back "
        "(default: 1)",
    )
    parser.add_argument(
        "--prompts",
        type=int,
        default=None,
        help=f"number of prompts {default('num_prompts')}; categories: per category (default: all of "
        "them; with --quick 2)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=None, help=f"new tokens per request {default('max_tokens')}"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help=f"batch-1 rounds, interleaved and paired {default('rounds')}"
    )
    _add_categories_arguments(parser)
    _add_transformers_arguments(parser)
    _add_precision_arguments(parser)
    parser.set_defaults(func=run)


def _add_categories_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``--mode categories`` alone."""
    parser.add_argument(
        "--same-lengths",
        action="store_true",
        help="categories: every row generates each prompt's target-only answer length (measured first at "
        "each client count; ignore_eos), so that rows whose answers part compare the same work",
    )


def _add_precision_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that change the engines' compute precision."""
    parser.add_argument("--f32", action="store_true", help="f32 compute and KV cache (default: CPU defaults)")
    parser.add_argument(
        "--exact",
        action="store_true",
        help="compare the engines in exact mode (f32 compute, f32 KV, no dynamic quantisation)",
    )


def _add_transformers_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that add transformers as a peer."""
    parser.add_argument(
        "--hf-target",
        type=Path,
        default=None,
        help="HF checkpoint of the target, to add transformers as a peer (default: none, no transformers)",
    )
    parser.add_argument(
        "--hf-draft", type=Path, default=None, help="HF checkpoint of the draft (default: none)"
    )


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
        exact=args.exact,
        quick=args.quick,
        **values,
    )


def run(args: argparse.Namespace) -> int:
    if args.mode == "multiturn":
        return _run_multiturn(args)
    if args.mode == "serve":
        return _run_serve(args)
    if args.mode == "categories":
        return _run_categories(args)
    try:
        config = config_from_args(args)
    except ValueError as error:
        raise CommandError(f"{error}; see `xpuspec bench --help`") from error
    bundle = resolve_bundle(config.bundle)  # a missing or damaged bundle fails here, in one line
    check_budget(config, bundle, args.ignore_memory)
    quiet_third_parties()
    report = run_bench(config)
    json_path, markdown_path = write_report(report, config.out)
    print(markdown_path.read_text(encoding="utf-8"))
    print(f"xpuspec bench: {wrote_line([json_path, markdown_path], report['plots'])}", file=sys.stderr)
    return 0


def wrote_line(paths: list[Path], plots: dict[str, dict[str, str]]) -> str:
    """What a run wrote: its report files and the plots it drew, or why it drew none (no matplotlib:
    the runtime install), never plots that are not there."""
    drawn = [entry["file"] for entry in plots.values() if "file" in entry]
    written = ", ".join(str(path) for path in paths)
    if drawn:
        return f"wrote {written} and {len(drawn)} plot{'s' if len(drawn) > 1 else ''} ({', '.join(drawn)})"
    reasons = sorted({entry["reason"] for entry in plots.values() if "reason" in entry})
    return f"wrote {written}; no plots: {'; '.join(reasons) or 'none drawn'}"


def _run_multiturn(args: argparse.Namespace) -> int:

    from xpuspec.bench.multiturn import MultiturnConfig, markdown, run_multiturn
    from xpuspec.executor.properties import EXACT_PROPERTIES

    try:
        config = MultiturnConfig(
            bundle=args.bundle,
            turns=args.turns,
            rounds=args.rounds or 3,
            properties=dict(EXACT_PROPERTIES) if args.exact else None,
        )
    except ValueError as error:
        raise CommandError(f"{error}; see `xpuspec bench --help`") from error
    resolve_bundle(config.bundle)
    result = run_multiturn(config)
    _write_report(args.out, "multiturn", result, markdown(result))
    print(f"xpuspec bench: wrote {args.out / 'multiturn.json'} and multiturn.md", file=sys.stderr)
    return 0


def _write_report(out: Path, name: str, result: dict[str, Any], text: str) -> None:
    """``out/NAME.json`` and ``out/NAME.md``; the Markdown goes to stdout too."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    (out / f"{name}.md").write_text(text, encoding="utf-8")
    print(text)


def _run_serve(args: argparse.Namespace) -> int:

    from xpuspec.bench.llama_cpp import markdown, run_serve_comparison, summarise
    from xpuspec.bench.workloads import load_workload

    if args.concurrency is not None and (not args.concurrency or min(args.concurrency) < 1):
        raise CommandError(f"client counts must be >= 1, got {list(args.concurrency)}")
    bundle = resolve_bundle(args.bundle)
    quiet_third_parties()
    # Chat instructions unless a workload is named: the single chat is what this mode measures.
    workload = "chat" if args.workload == "code" else args.workload
    count = args.prompts or (4 if args.quick else 12)
    prompts = [
        p.text if isinstance(p.text, list) else [{"role": "user", "content": p.text}]
        for p in load_workload(workload, count)
    ]
    comparison = run_serve_comparison(
        args.bundle,
        bundle,
        prompts,
        rounds=args.rounds or (1 if args.quick else 3),
        max_tokens=args.max_tokens or (64 if args.quick else 128),
        out=args.out,
        llama_server=args.llama_server,
        threads=args.llama_threads or (1, 2),
        clients=args.concurrency or (1,),
    )
    summary = summarise(comparison)
    _write_report(args.out, "serve", summary, markdown(summary))
    for peer, reason in summary["not_run"].items():
        print(f"xpuspec bench: {peer} not run: {reason}", file=sys.stderr)
    print(f"xpuspec bench: wrote {args.out / 'serve.json'} and {args.out / 'serve.md'}", file=sys.stderr)
    return 0


def _run_categories(args: argparse.Namespace) -> int:

    from xpuspec.bench.categories import category_groups, run_categories
    from xpuspec.bench.category_summary import markdown, summarise
    from xpuspec.bench.plots import write_category_plot

    if args.concurrency is not None and (not args.concurrency or min(args.concurrency) < 1):
        raise CommandError(f"client counts must be >= 1, got {list(args.concurrency)}")
    # The shipped prompt set unless a file is named (--workload's default, code, names none).
    path = None if args.workload == "code" else Path(args.workload)
    if path is not None and not path.is_file():
        raise CommandError(f"--workload for --mode categories is a JSONL file; {args.workload!r} is not one")
    bundle = resolve_bundle(args.bundle)
    quiet_third_parties()
    max_tokens = args.max_tokens or (64 if args.quick else 256)
    try:
        groups, left_out = category_groups(
            bundle, path, args.prompts or (2 if args.quick else None), max_tokens
        )
    except ValueError as error:
        raise CommandError(str(error)) from error
    run = run_categories(
        args.bundle,
        bundle,
        groups,
        rounds=args.rounds or (1 if args.quick else 3),
        max_tokens=max_tokens,
        out=args.out,
        llama_server=args.llama_server,
        threads=args.llama_threads or (2,),
        clients=args.concurrency or (1,),
        left_out=left_out,
        same_lengths=args.same_lengths,
    )
    summary = summarise(run)
    summary["plot"] = write_category_plot(summary, args.out)
    _write_report(args.out, "categories", summary, markdown(summary))
    for peer, reason in summary["not_run"].items():
        print(f"xpuspec bench: {peer} not run: {reason}", file=sys.stderr)
    files = [args.out / "categories.json", args.out / "categories.md"]
    print(f"xpuspec bench: {wrote_line(files, {'categories': summary['plot']})}", file=sys.stderr)
    return 0
