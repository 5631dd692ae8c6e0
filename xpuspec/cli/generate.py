"""`xpuspec generate`: stream one completion, then the speculation figures."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xpuspec.api.errors import CommandError, warn_if_draft_is_target
from xpuspec.cli import remote
from xpuspec.cli.parser import add_precision_flags, draft_precision, precision_preset
from xpuspec.devices.placement import add_drafter_argument
from xpuspec.sample.defaults import DEFAULT_MAX_TOKENS
from xpuspec.sample.draft_tree import TreeShape, parse_draft_tree_text
from xpuspec.sample.sampling_params import SamplingParams

if TYPE_CHECKING:
    from xpuspec.api.pipeline import Pipeline
    from xpuspec.models.bundle import ModelBundle


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate text from a prompt with speculative decoding",
        description="Stream an answer, then the drafter and γ policy, tokens/s, time to first token, "
        "drafted/accepted tokens and acceptance rate. The prompt goes in as a chat user message where the "
        "model is a chat model (its bundle has a chat template), as it is otherwise (the demo pair).",
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
        "--raw", action="store_true", help="send the prompt as it is (default for models without chat)"
    )
    mode.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as a chat user message (default for chat models, those with a chat template)",
    )
    add_sampling_arguments(parser)
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
    add_precision_flags(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of streaming")
    remote.add_server_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from xpuspec.api.pipeline import Pipeline
    from xpuspec.executor.properties import parse_properties, with_preset
    from xpuspec.models.resolve import resolve_bundle

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        draft_tree = parse_draft_tree_text(args.draft_tree) if args.draft_tree else None
        params = SamplingParams(
            **sampling_fields(args),
            seed=args.seed,
            stop=args.stop,
            ignore_eos=args.ignore_eos,
            num_draft_tokens=args.num_draft_tokens,
            draft_tree=draft_tree,
        )
        properties = with_preset(precision_preset(args), parse_properties(args.property))
    except ValueError as error:
        raise CommandError(str(error).replace("\n", "; ")) from error
    started = time.perf_counter()
    # The default model's first use converts it here, saying so stage by stage.
    bundle = resolve_bundle(args.bundle)  # a missing or damaged bundle: one line, exit 2
    warn_if_draft_is_target(bundle)
    # The manifest is enough to refuse what cannot fit, before any model is compiled.
    if params.max_tokens is not None:
        check_max_tokens(params.max_tokens, bundle.max_context)
    chat = prompt_is_chat(args, bundle)
    if remote.wants_server(args):
        from xpuspec.models.resolve import model_names

        served = remote.serving(args.server, model_names(args.bundle))
        if served is not None:  # a running server has the model loaded: no load here
            body = remote.request_body(args, served, prompt, chat, sampling_fields(args))
            return remote.stream_from(args.server, body, prompt if not chat else None)
    # Compiling the models takes seconds: say so before it starts.
    print(f"xpuspec generate: loading {bundle_label(args.bundle)} ...", file=sys.stderr, flush=True)
    try:
        pipe = Pipeline(
            bundle,
            target_device=args.target_device,
            draft_device=args.draft_device,
            drafter="none" if args.no_draft else args.drafter,
            properties=properties,
            draft_properties=draft_precision(args),
            draft_tree=draft_tree,
            # One reply: compiling the target's second copy for one-token steps takes longer than
            # it saves (docs/benchmarks.md, "A second compiled copy of the target").
            target_decode_lane=False,
        )
    except ValueError as error:
        raise CommandError(str(error).replace("\n", "; ")) from error
    loading_s = time.perf_counter() - started
    if loading_s > READY_LINE_AFTER_S:
        print(f"xpuspec generate: ready in {loading_s:.1f} s", file=sys.stderr, flush=True)
    if pipe.drafter == "none" and args.drafter == "auto" and not args.no_draft:
        if (pipe.bundle.placement or {}).get("drafter") == "none":
            print(
                "xpuspec generate: the recorded plan turns drafting off (`xpuspec inspect` shows why; "
                "--drafter draft overrides it)",
                file=sys.stderr,
            )
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
    return stream(pipe, request, prompt if not chat else None, params)


def boolean(text: str) -> bool:
    """A flag's true or false (argparse's ``type``)."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


# --flag -> SamplingParams field; each left out takes the model's default (xpuspec.sample.defaults).
SAMPLING_FLAGS: dict[str, tuple[Callable[[str], Any], str]] = {
    "max_tokens": (int, f"the reply cap (default {DEFAULT_MAX_TOKENS}; the context bounds it)"),
    "temperature": (float, "0 is greedy (default: the model's generation config, else llama.cpp's 0.8)"),
    "top_p": (float, "nucleus cut (default: the model's, else 0.95)"),
    "top_k": (int, "keep the k most likely tokens, 0 all (default: the model's, else 40)"),
    "min_p": (float, "keep tokens at least this fraction of the most likely one's (default: else 0.05)"),
    "repeat_penalty": (float, "llama.cpp's repetition penalty, 1 off (default: the model's, else 1)"),
    "repeat_last_n": (int, "tokens the repeat penalty looks back over, -1 all, 0 off (default 64)"),
    "presence_penalty": (float, "OpenAI's presence penalty in [-2, 2] (default 0)"),
    "frequency_penalty": (float, "OpenAI's frequency penalty in [-2, 2] (default 0)"),
    "dry_multiplier": (float, "llama.cpp's DRY repeat penalty, 0 off (default: the model's, else 0)"),
    "dry_base": (float, "DRY's base: a repeat n tokens long costs multiplier * base^(n - allowed) (1.75)"),
    "dry_allowed_length": (int, "the longest repeat DRY lets pass free (default 2)"),
    "dry_penalty_last_n": (int, "tokens DRY looks back over, -1 all, 0 off (default -1)"),
    "dry_include_prompt": (boolean, "false: DRY looks back over the reply alone (default: the model's)"),
}


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    for name, (kind, help_text) in SAMPLING_FLAGS.items():
        metavar = "true|false" if kind is boolean else None
        parser.add_argument(
            "--" + name.replace("_", "-"), type=kind, default=None, help=help_text, metavar=metavar
        )


def sampling_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling flags given (the others stay unset: the model's defaults)."""
    return {name: getattr(args, name) for name in SAMPLING_FLAGS if getattr(args, name) is not None}


# Loading faster than this needs no "ready" line: the text follows at once.
READY_LINE_AFTER_S = 1.0


def bundle_label(spec: str | None) -> str:
    """How the loading line names the bundle."""
    from xpuspec.models.resolve import is_demo

    if spec is None:
        from xpuspec.models.default_model import SMOLLM2

        return f"the default model {SMOLLM2.name}"
    return "the demo pair" if is_demo(spec) else str(spec)


def check_max_tokens(max_tokens: int, context: int) -> None:
    """--max-tokens must leave the prompt at least one token of the bundle's context."""
    if max_tokens >= context:
        raise CommandError(
            f"--max-tokens {max_tokens} leaves no room for the prompt in the model's context of {context} "
            f"tokens; use at most {context - 1}"
        )


def prompt_is_chat(args: argparse.Namespace, bundle: ModelBundle) -> bool:
    """A chat user message only for a chat model (or with --chat); otherwise the prompt as it is, said
    once on stderr unless --raw asked for it."""
    from xpuspec.api.request_text import chat_by_default

    if args.raw:
        return False
    if args.chat:
        if bundle.chat_template is None:
            raise CommandError(f"{bundle.root} has no chat template; drop --chat")
        return True
    if chat_by_default(bundle):
        return True
    why = "has no chat template" if bundle.chat_template is None else "was trained on plain text, not chat"
    print(
        f"xpuspec generate: {bundle_label(args.bundle)} {why}: the prompt goes in as it is (--raw)",
        file=sys.stderr,
        flush=True,
    )
    return False


def stream(
    pipe: Pipeline, request: str | list[dict[str, str]], echo: str | None, params: SamplingParams
) -> int:
    """Stream the text (after ``echo``, a raw prompt), end it with a newline, then the summary on
    stderr: every figure in it from this one clock, started when the request is sent."""
    if echo is not None:
        print(echo, end="", flush=True)
    text_end = echo[-1:] if echo else ""
    first_token_s = None
    started = time.perf_counter()
    for piece in pipe.stream(request, params):
        if first_token_s is None:
            first_token_s = time.perf_counter() - started
        print(piece, end="", flush=True)
        text_end = piece[-1:]
    elapsed = time.perf_counter() - started
    if text_end != "\n":
        print(flush=True)
    print(summary_line(pipe, pipe.last_stats or {}, params, elapsed, first_token_s), file=sys.stderr)
    return 0


def summary_line(
    pipe: Pipeline, stats: dict, params: SamplingParams, elapsed: float, first_token_s: float | None
) -> str:
    """Drafter and γ policy, tokens, time, tokens/s and time to first token (all from the caller's one
    clock: ``elapsed`` and ``first_token_s``), drafted/accepted; why drafting was off."""
    rate = stats.get("acceptance_rate")
    tokens = stats.get("num_output_tokens", 0)
    if pipe.drafter == "none":
        policy = "target only"
    elif params.num_draft_tokens is not None:
        policy = f"γ = {params.num_draft_tokens}"
    else:
        policy = f"adaptive γ <= {pipe.length_policy.max_draft_tokens}"
        if pipe.prompt_lookup is not None:
            policy += " + prompt lookup"
    if params.draft_tree is not None:
        tree = params.draft_tree
        shape = f"{tree.depth},{tree.width},{tree.nodes}" if isinstance(tree, TreeShape) else tree
        policy += f", tree {shape}"
    line = (
        f"[{pipe.drafter} drafter, {policy}] {tokens} tokens in {elapsed:.2f}s "
        f"({tokens / max(elapsed, 1e-9):.1f} tokens/s, first token "
        + (f"{first_token_s * 1000:.0f} ms" if first_token_s is not None else "n/a")
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
        line += " | " + drafting_off_reason(pipe, rate, stats.get("drafting_decisions") or {})
    return line


def drafting_off_reason(pipe: Pipeline, acceptance: float | None, decisions: dict[str, int]) -> str:
    """Why nothing was drafted: the request's most frequent drafting decision (``decisions``, as its
    stats count them) where it says, else the cost model's case: measured step costs and the acceptance
    it used."""
    from xpuspec.spec_decode.policy import SHORT_REPLY_TOKENS, AcceptanceTracker, DraftDecision

    reason = max(decisions, key=decisions.__getitem__) if decisions else None
    if reason == DraftDecision.OFF_SHORT.value:
        return (
            f"drafting off: a reply of at most {SHORT_REPLY_TOKENS} tokens runs no draft model "
            "(prompt lookups only, and none matched)"
        )
    if reason == DraftDecision.OFF_MEASURED.value:
        return "adaptive γ kept drafting off: whole steps with drafts were measured slower than without here"
    policy = pipe.length_policy
    costs = policy.cost_model
    target_s, draft_s = costs.target_cost(1, num_sequences=1), costs.draft_cost(1)
    alpha = acceptance if acceptance is not None else AcceptanceTracker().prior
    gamma = max(range(1, policy.max_draft_tokens + 1), key=lambda g: costs.predicted_speedup(alpha, g))
    best = costs.predicted_speedup(alpha, gamma)
    verify_s = costs.target_cost(1 + gamma, num_sequences=1)
    verdict = (
        f"< {policy.min_speedup:.2f}x needed"
        if best < policy.min_speedup
        # Steady steps' prediction; each step's own also prices the change of its shape.
        else "on steady steps, less once a change of the step's shape is priced"
    )
    return (
        f"adaptive γ kept drafting off: draft step {draft_s * 1000:.2f} ms / target step "
        f"{target_s * 1000:.2f} ms = cost ratio {draft_s / max(target_s, 1e-12):.2f} "
        f"({verify_s * 1000:.2f} ms verifying {gamma + 1} tokens), acceptance {alpha:.2f}, best predicted "
        f"speed-up {best:.2f}x {verdict}"
    )
