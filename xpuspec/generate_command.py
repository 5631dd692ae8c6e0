"""`xpuspec generate`: stream one completion, then the speculation figures."""

from __future__ import annotations

import argparse
import json
import sys
import time

from xpuspec.sample.sampling_params import SamplingParams


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate text from a prompt with speculative decoding",
        description="Stream a completion, then print acceptance rate, drafted/accepted tokens and tokens/s.",
    )
    parser.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    parser.add_argument(
        "--bundle", default=None, help="a prepared bundle folder (default: the embedded demo pair)"
    )
    parser.add_argument(
        "--chat", action="store_true", help="wrap the prompt as a user message in the chat template"
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument(
        "--num-draft-tokens", type=int, default=None, help="fixed speculation length (default: adaptive)"
    )
    parser.add_argument("--drafter", choices=["auto", "draft", "ngram", "none"], default="auto")
    parser.add_argument(
        "--no-draft", action="store_true", help="run the target alone (same as --drafter none)"
    )
    parser.add_argument("--target-device", default="CPU")
    parser.add_argument("--draft-device", default="CPU")
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an OpenVINO compile property for both models, e.g. INFERENCE_PRECISION_HINT=f32 (repeatable)",
    )
    parser.add_argument(
        "--exact",
        action="store_true",
        help="exact mode: f32 compute, f32 KV cache, no dynamic quantisation (the 'exact' properties "
        "preset); --property values still apply on top",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of streaming")
    parser.set_defaults(func=run)


def parse_properties(items: list[str]) -> dict[str, str]:
    properties = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--property takes KEY=VALUE, got {item!r}; e.g. INFERENCE_PRECISION_HINT=f32")
        properties[key.strip()] = value.strip()
    return properties


def run(args: argparse.Namespace) -> int:
    from xpuspec.cli import CommandError
    from xpuspec.devices.properties import with_preset
    from xpuspec.model_bundle import BundleError
    from xpuspec.pipeline import Pipeline

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            stop=args.stop,
            ignore_eos=args.ignore_eos,
            num_draft_tokens=args.num_draft_tokens,
        )
        pipe = Pipeline(
            args.bundle,
            target_device=args.target_device,
            draft_device=args.draft_device,
            drafter="none" if args.no_draft else args.drafter,
            properties=with_preset("exact" if args.exact else None, parse_properties(args.property)),
        )
    except (ValueError, BundleError) as error:
        raise CommandError(str(error).replace("\n", "; ")) from error
    if pipe.drafter == "none" and args.drafter == "auto" and not args.no_draft:
        if (pipe.bundle.placement or {}).get("drafter") == "none":
            print(
                "xpuspec generate: the recorded plan turns drafting off (`xpuspec inspect` shows why; "
                "--drafter draft overrides it)",
                file=sys.stderr,
            )
    request = [{"role": "user", "content": prompt}] if args.chat else prompt
    if args.json:
        result = pipe.generate([request], params)[0]
        print(
            json.dumps(
                {
                    "text": result.text,
                    "token_ids": result.token_ids,
                    "finish_reason": result.finish_reason,
                    "stats": result.stats,
                },
                indent=2,
            )
        )
        return 0
    started = time.perf_counter()
    if not args.chat:
        print(prompt, end="", flush=True)
    for piece in pipe.stream(request, params):
        print(piece, end="", flush=True)
    elapsed = time.perf_counter() - started
    stats = pipe.last_stats or {}
    rate = stats.get("acceptance_rate")
    print(file=sys.stderr)
    print(
        f"\n[{pipe.drafter} drafter] {stats.get('num_output_tokens', 0)} tokens in {elapsed:.2f}s "
        f"({stats.get('tokens_per_s') or 0:.1f} tokens/s) | drafted {stats.get('drafted', 0)}, "
        f"accepted {stats.get('accepted', 0)}, acceptance rate "
        + (f"{rate:.1%}" if rate is not None else "n/a"),
        file=sys.stderr,
    )
    return 0
