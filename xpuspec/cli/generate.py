"""`xpuspec generate`: stream one completion, then the speculation figures."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from xpuspec.devices.placement import add_drafter_argument
from xpuspec.errors import CommandError
from xpuspec.sample.draft_tree import parse_draft_tree_text
from xpuspec.sample.sampling_params import SamplingParams

if TYPE_CHECKING:
    from xpuspec.pipeline import Pipeline


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate text from a prompt with speculative decoding",
        description="Stream an answer (the prompt as a chat user message; --raw: as it is), then the "
        "drafter and γ policy, tokens/s, time to first token, drafted/accepted tokens and acceptance rate.",
    )
    parser.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    parser.add_argument(
        "--bundle",
        default=None,
        help="a prepared bundle folder, or 'demo' for the embedded demo pair "
        "(default: SmolLM2-135M-Instruct and its draft, converted into ~/.cache/xpuspec on first use)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--raw", action="store_true", help="send the prompt as it is (default: as a chat user message)"
    )
    mode.add_argument("--chat", action="store_true", help=argparse.SUPPRESS)  # the default now
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
    parser.add_argument(
        "--draft-tree",
        default=None,
        help='tree speculation: "auto" (the cost model picks the shape), DEPTH,WIDTH,NODES such as 4,2,8, '
        'or "none" (chains, the default)',
    )
    add_drafter_argument(parser)
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


def run(args: argparse.Namespace) -> int:
    from xpuspec.executor.properties import parse_properties, with_preset
    from xpuspec.model_bundle import BundleError
    from xpuspec.pipeline import Pipeline

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        draft_tree = parse_draft_tree_text(args.draft_tree) if args.draft_tree else None
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            stop=args.stop,
            ignore_eos=args.ignore_eos,
            num_draft_tokens=args.num_draft_tokens,
            draft_tree=draft_tree,
        )
        pipe = Pipeline(
            args.bundle,
            target_device=args.target_device,
            draft_device=args.draft_device,
            drafter="none" if args.no_draft else args.drafter,
            properties=with_preset("exact" if args.exact else None, parse_properties(args.property)),
            draft_tree=draft_tree,
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
    chat = not args.raw and pipe.bundle.chat_template is not None
    if args.chat and not chat:
        raise CommandError(f"{pipe.bundle.root} has no chat template; drop --chat")
    request = [{"role": "user", "content": prompt}] if chat else prompt
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
    if not chat:
        print(prompt, end="", flush=True)
    for piece in pipe.stream(request, params):
        print(piece, end="", flush=True)
    elapsed = time.perf_counter() - started
    print(file=sys.stderr)
    print("\n" + summary_line(pipe, pipe.last_stats or {}, params, elapsed), file=sys.stderr)
    return 0


def summary_line(pipe: Pipeline, stats: dict, params: SamplingParams, elapsed: float) -> str:
    """Drafter and γ policy, tokens/s, time to first token, drafted/accepted; why drafting was off."""
    rate = stats.get("acceptance_rate")
    ttft = stats.get("ttft_s")
    if pipe.drafter == "none":
        policy = "target only"
    elif params.num_draft_tokens is not None:
        policy = f"γ = {params.num_draft_tokens}"
    else:
        policy = f"adaptive γ <= {pipe.engine.length_policy.max_draft_tokens}"
        if pipe.engine.prompt_lookup is not None:
            policy += " + prompt lookup"
    if params.draft_tree is not None:
        tree = params.draft_tree
        policy += f", tree {tree if isinstance(tree, str) else f'{tree.depth},{tree.width},{tree.nodes}'}"
    line = (
        f"[{pipe.drafter} drafter, {policy}] {stats.get('num_output_tokens', 0)} tokens in {elapsed:.2f}s "
        f"({stats.get('tokens_per_s') or 0:.1f} tokens/s, first token "
        + (f"{ttft * 1000:.0f} ms" if ttft is not None else "n/a")
        + f") | drafted {stats.get('drafted', 0)}, accepted {stats.get('accepted', 0)}, acceptance rate "
        + (f"{rate:.1%}" if rate is not None else "n/a")
    )
    if stats.get("lookup_drafted"):
        line += f" (by prompt lookup: drafted {stats['lookup_drafted']}, accepted {stats['lookup_accepted']})"
    if stats.get("tree_verifications"):
        nodes_per_tree = stats["tree_nodes_verified"] / stats["tree_verifications"]
        line += (
            f" | {stats['tree_verifications']} trees of {nodes_per_tree:.1f} nodes, "
            f"{stats['accepted_per_target_pass']:.2f} tokens per target pass"
        )
    if pipe.drafter != "none" and params.num_draft_tokens is None and not stats.get("drafted"):
        line += " | " + drafting_off_reason(pipe, rate)
    return line


def drafting_off_reason(pipe: Pipeline, acceptance: float | None) -> str:
    """The cost model's case against drafting: measured step costs and the acceptance it used."""
    from xpuspec.spec_decode.acceptance import AcceptanceTracker

    policy = pipe.engine.length_policy
    costs = policy.cost_model
    target_s, draft_s = costs.target_cost(1, num_sequences=1), costs.draft_cost(1)
    alpha = acceptance if acceptance is not None else AcceptanceTracker().prior
    gamma = max(range(1, policy.max_draft_tokens + 1), key=lambda g: costs.predicted_speedup(alpha, g))
    best = costs.predicted_speedup(alpha, gamma)
    verify_s = costs.target_cost(1 + gamma, num_sequences=1)
    return (
        f"adaptive γ kept drafting off: draft step {draft_s * 1000:.2f} ms / target step "
        f"{target_s * 1000:.2f} ms = cost ratio {draft_s / max(target_s, 1e-12):.2f} "
        f"({verify_s * 1000:.2f} ms verifying {gamma + 1} tokens), acceptance {alpha:.2f}, best predicted "
        f"speed-up {best:.2f}x < {policy.min_speedup:.2f}x needed"
    )
