"""Per-step cost and OpenVINO per-layer performance counters of compile-property variants.

    python -m research.bench.perf_counters [--bundle B] [--role target|draft] [--steps 48] [--rounds 6]
                                          [--variants bf16+u8kv,bf16+bf16kv,...] [--tokens 1,4]

Compiles one model of a bundle once per variant (with ``PERF_COUNT``), then steps the variants in
turn: every round each variant prefills the same ~300-token prompt and times ``--steps``
decode steps of each size in ``--tokens`` (1: plain decoding; n > 1: a verification pass over n
tokens, logits for all of them), the order reversed every other round. Prints per variant the median
step time (and the best round's, which machine noise affects least), and the median per-step time
of each node type from the performance counters (e.g. ``PagedAttentionExtension``, the attention
kernel whose cost depends on the KV-cache precision; ``FullyConnectedCompressed``, the int8/int4
matrix multiplications that dynamic quantisation speeds up). Counter times are per node and add up
across threads, so compare them between variants, not with the step time.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from typing import Any

VARIANTS: dict[str, dict[str, Any]] = {
    "bf16+u8kv": {"KV_CACHE_PRECISION": "u8"},
    "bf16+bf16kv": {"KV_CACHE_PRECISION": "bf16"},
    "f32+u8kv+g32": {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "u8"},
    "f32+u8kv+g128": {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "u8",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128,
    },
    "f32+f32kv+g128": {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "f32",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128,
    },
    "exact": {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "f32",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    },
}
PROMPT_TOKENS = 300


def measure(
    model_dir: Any,
    variants: dict[str, dict[str, Any]],
    steps: int,
    rounds: int,
    tokens: int = 1,
) -> dict[str, dict[str, Any]]:
    """``{variant: {"round_ms": [...], "nodes_ms": {node type: median ms per step}}}`` for steps of
    ``tokens`` tokens, or ``{variant: {"error": the plugin's message}}`` for a variant the plugin
    refuses to compile."""
    import numpy as np
    import openvino as ov

    from xpuspec.core.chunks import SequenceChunk
    from xpuspec.executor.paged_runner import PagedModelRunner

    core = ov.Core()
    prompt = [int(t) for t in np.random.default_rng(0).integers(5, 300, size=PROMPT_TOKENS)]
    runners, refused = {}, {}
    for name, properties in variants.items():
        try:
            runners[name] = PagedModelRunner(
                model_dir,
                properties={"PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": True, **properties},
                num_blocks=-(-(PROMPT_TOKENS + steps * tokens + 1) // 32) + 1,
                core=core,
            )
        except RuntimeError as error:  # e.g. a bf16 KV cache on a CPU without bf16 (AVX2 only)
            refused[name] = {"error": str(error).strip().splitlines()[-1]}
    round_ms: dict[str, list[float]] = collections.defaultdict(list)
    nodes: dict[str, dict[str, list[float]]] = {name: collections.defaultdict(list) for name in runners}
    # The costliest single nodes, by name: one matrix product (the logits) can weigh like many layers.
    named: dict[str, dict[str, list[float]]] = {name: collections.defaultdict(list) for name in runners}
    for round_index in range(rounds):
        order = list(runners.items())
        for name, runner in order if round_index % 2 == 0 else order[::-1]:
            table = list(range(runner.num_blocks))
            logits = runner.forward([SequenceChunk(prompt, 0, table, 1)])
            token, times = int(logits[0].argmax()), []
            for step in range(steps):
                # A verification pass: the last token and n - 1 drafts (their values do not change
                # the cost), with logits for every one of them.
                chunk = [token] + prompt[step % 50 : step % 50 + tokens - 1]
                started = time.perf_counter()
                logits = runner.forward([SequenceChunk(chunk, PROMPT_TOKENS + step * tokens, table, tokens)])
                times.append(time.perf_counter() - started)
                token = int(logits[-1].argmax())
                per_type: dict[str, float] = collections.defaultdict(float)
                for info in runner.request.profiling_info:
                    ms = info.real_time.total_seconds() * 1000
                    per_type[info.node_type] += ms
                    named[name][info.node_name].append(ms)
                for node_type, ms in per_type.items():
                    nodes[name][node_type].append(ms)
            round_ms[name].append(statistics.median(times) * 1000)
    measured = {
        name: {
            "round_ms": round_ms[name],
            "nodes_ms": {node: statistics.median(values) for node, values in nodes[name].items()},
            "named_ms": dict(
                sorted(
                    ((node, statistics.median(values)) for node, values in named[name].items()),
                    key=lambda item: -item[1],
                )[:3]
            ),
        }
        for name in runners
    }
    return {**measured, **refused}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundle", default=None, help="bundle folder (default: the embedded demo pair)")
    parser.add_argument("--role", choices=["target", "draft"], default="target")
    parser.add_argument("--steps", type=int, default=48, help="decode steps timed per variant and round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}"
    )
    parser.add_argument(
        "--tokens",
        default="1",
        help="comma-separated tokens per step: 1 is a decode step, n > 1 a verification pass of n",
    )
    args = parser.parse_args(argv)
    from xpuspec.models.bundle import BundleError
    from xpuspec.models.resolve import resolve_bundle

    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    try:
        bundle = resolve_bundle(args.bundle)
    except BundleError as error:
        parser.error(str(error))
    model = bundle.target if args.role == "target" else bundle.draft
    if model is None:
        parser.error(f"{bundle.root} has no {args.role} model")
    sizes = [int(size) for size in args.tokens.split(",") if size.strip()]
    if not sizes or min(sizes) < 1:
        parser.error(f"--tokens must list positive integers, got {args.tokens!r}")
    chosen = {name: VARIANTS[name] for name in names}
    status = 1
    for size in sizes:
        if len(sizes) > 1:
            print(f"{size} token{'s' if size > 1 else ''} per step:")
        results = measure(model.path, chosen, args.steps, args.rounds, tokens=size)
        status = min(status, report(results))
    return status


def report(results: dict[str, dict[str, Any]]) -> int:
    """Print one variant a line (step time, ratio to the first) and its costliest node types."""
    for name, result in results.items():
        if "error" in result:
            print(f"{name:16s} refused by the plugin: {result['error']}")
    results = {name: result for name, result in results.items() if "error" not in result}
    if not results:
        return 1
    base_name = next(iter(results))
    base = results[base_name]
    for name, result in results.items():
        median, best = statistics.median(result["round_ms"]), min(result["round_ms"])
        ratio = median / statistics.median(base["round_ms"])
        best_ratio = best / min(base["round_ms"])
        print(
            f"{name:16s} step {median:7.3f} ms median, {best:7.3f} ms best round; "
            f"x{ratio:.3f} / x{best_ratio:.3f} of {base_name}"
        )
        top = sorted(result["nodes_ms"].items(), key=lambda item: -item[1])[:4]
        print("    per step, by node type: " + ", ".join(f"{node} {ms:.3f} ms" for node, ms in top))
        print(
            "    costliest nodes: "
            + ", ".join(f"{node} {ms:.3f} ms" for node, ms in result["named_ms"].items())
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
