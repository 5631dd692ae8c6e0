"""Where a step's time goes: ``python -m research.bench.profile [--bundle B] [--http] [--layers]``.

Runs greedy requests one at a time through ``Pipeline.generate`` (the real path: engine step, text,
stop strings) with the pipeline's phase hooks (``Pipeline(phase_hooks=...)``) and timers wrapped around
the executors and the text path, then prints for each configuration (target-only and each fixed γ)
the time per target pass ("step") and per token of:

- ``target device`` / ``draft device``: waiting for the inference (``wait``); ``dispatch``: the
  ``start_async`` call; ``input binding``: writing the batch description into the bound tensors;
- ``schedule``, ``propose (Python)`` (the draft loop without its device time), ``verify/accept``
  (the engine's accept phase, decode bursts' passes included), ``other engine Python`` (the rest of
  ``LLMEngine.step``);
- ``text``: ``RequestText.push``, of which ``detokenize`` is the incremental detokenizer;
- ``outside the step``: the generate loop itself.

``--layers`` reruns with OpenVINO's ``PERF_COUNT`` and prints the target's device time by layer type
(the counters cost time themselves: read the shares, not the totals). ``--http`` streams the same
requests through a real ``xpuspec serve`` subprocess and prints the HTTP cost per token beside the
in-process rate. Timings on a shared machine are noisy: compare shares and ratios from one run.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuspec.bench.workloads import heldout_code_prompts
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.proposal import DraftModelProposer

logger = logging.getLogger(__name__)

TARGET_DEVICE, DRAFT_DEVICE = "target device", "draft device"
TARGET_DISPATCH, DRAFT_DISPATCH = "target dispatch", "draft dispatch"
TARGET_INPUTS, DRAFT_INPUTS = "target input binding", "draft input binding"
SCHEDULE, PROPOSE, ACCEPT, STEP = "schedule", "propose", "verify/accept", "step"
TEXT, DETOKENIZE = "text", "detokenize"
# Rows of the report, in order: (label, how to compute it from the timers).
ROWS = (
    TARGET_DEVICE,
    TARGET_DISPATCH,
    TARGET_INPUTS,
    DRAFT_DEVICE,
    DRAFT_DISPATCH,
    DRAFT_INPUTS,
    SCHEDULE,
    "propose (Python)",
    ACCEPT,
    "other engine Python",
    DETOKENIZE,
    "stop strings, text bookkeeping",
    "outside the step",
)


# The engine's phases (xpuspec.engine.strategy) that are rows, or parts of rows, of the report.
ENGINE_PHASES = {"step": STEP, "schedule": SCHEDULE, "propose": PROPOSE, "accept": ACCEPT}


class Timers:
    """Named running totals of wall time, filled by wrappers around methods and by the engine's
    phase hooks (:meth:`on_phase`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def clear(self) -> None:
        """Start the totals again (the phase hooks keep reporting while a pipeline runs untimed)."""
        self.seconds.clear()
        self.calls.clear()

    def on_phase(self, name: str, seconds: float) -> None:
        """The engine's phase hook: add the phases the report shows."""
        row = ENGINE_PHASES.get(name)
        if row is not None:
            self.seconds[row] += seconds
            self.calls[row] += 1

    def timed(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        seconds, calls, clock = self.seconds, self.calls, time.perf_counter

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[name] += clock() - started
                calls[name] += 1

        return wrapper


@contextlib.contextmanager
def _patched(owner: Any, attribute: str, timers: Timers, name: str) -> Iterator[None]:
    """Time ``owner.attribute`` (an instance's method, or a class's for all its instances)."""
    original = getattr(owner, attribute)
    own = vars(owner).get(attribute)  # None: looked up on the class (or a base class)
    setattr(owner, attribute, timers.timed(name, original))
    try:
        yield
    finally:
        if own is not None:
            setattr(owner, attribute, own)
        else:
            delattr(owner, attribute)


@contextlib.contextmanager
def instrumented(pipeline: Any, timers: Timers) -> Iterator[None]:
    """Start ``timers`` (``pipeline``'s phase hooks) afresh and wrap them around its executors and text
    path while the block runs."""
    from xpuspec.api.request_text import RequestText
    from xpuspec.text.detokenizer import IncrementalDetokenizer

    timers.clear()
    patches = [
        (RequestText, "push", TEXT),
        (IncrementalDetokenizer, "push", DETOKENIZE),
        (IncrementalDetokenizer, "flush", DETOKENIZE),
    ]
    runners = [(pipeline.target_runner, TARGET_DEVICE, TARGET_DISPATCH, TARGET_INPUTS)]
    if isinstance(pipeline.proposer, DraftModelProposer):
        runners.append((pipeline.proposer.runner, DRAFT_DEVICE, DRAFT_DISPATCH, DRAFT_INPUTS))
    for runner, device, dispatch, inputs in runners:
        patches.append((runner, "wait", device))
        if hasattr(runner, "_fill_inputs") and hasattr(runner, "request"):
            # start() = fill inputs + start_async: time the parts (the request is wrapped as a whole).
            patches.append((runner, "_fill_inputs", inputs))
            patches.append((runner, "start", dispatch))
    with contextlib.ExitStack() as stack:
        for owner, attribute, name in patches:
            stack.enter_context(_patched(owner, attribute, timers, name))
        yield


@dataclass
class StageProfile:
    """One configuration's run: wall time, counts and the time of each report row."""

    label: str
    wall_seconds: float
    num_tokens: int
    num_steps: int
    rows: dict[str, float] = field(default_factory=dict)
    layers: dict[str, float] = field(default_factory=dict)  # device ms by layer type (--layers)

    def table(self) -> str:
        per_step = 1e3 / max(1, self.num_steps)
        per_token = 1e3 / max(1, self.num_tokens)
        lines = [
            f"{self.label}: {self.num_tokens} tokens in {self.num_steps} target passes, "
            f"{self.wall_seconds:.3f} s, {self.num_tokens / self.wall_seconds:.1f} tokens/s, "
            f"{self.wall_seconds * per_step:.3f} ms/step",
            f"  {'stage':32s} {'ms/step':>8s} {'ms/token':>9s} {'share':>6s}",
        ]
        for name in ROWS:
            seconds = self.rows.get(name, 0.0)
            if seconds <= 0.0 and name.startswith("draft"):
                continue
            lines.append(
                f"  {name:32s} {seconds * per_step:8.3f} {seconds * per_token:9.3f} "
                f"{100 * seconds / self.wall_seconds:5.1f}%"
            )
        if self.layers:
            total = sum(self.layers.values())
            lines.append(
                f"  target device time by layer type (PERF_COUNT, {total / self.num_steps:.3f} ms/step):"
            )
            for kind, ms in sorted(self.layers.items(), key=lambda item: -item[1])[:12]:
                lines.append(f"    {kind:30s} {ms / self.num_steps:8.3f} ms/step {100 * ms / total:5.1f}%")
        return "\n".join(lines)


def stage_rows(timers: Timers, wall_seconds: float) -> dict[str, float]:
    """The report rows from the raw timers (nested timers are subtracted from their parents)."""
    seconds = timers.seconds
    target_start = seconds[TARGET_DISPATCH]
    draft_start = seconds[DRAFT_DISPATCH]
    draft_total = draft_start + seconds[DRAFT_DEVICE]
    target_forward = target_start + seconds[TARGET_DEVICE]
    text_other = seconds[TEXT] - seconds[DETOKENIZE]
    return {
        TARGET_DEVICE: seconds[TARGET_DEVICE],
        TARGET_DISPATCH: target_start - seconds[TARGET_INPUTS],
        TARGET_INPUTS: seconds[TARGET_INPUTS],
        DRAFT_DEVICE: seconds[DRAFT_DEVICE],
        DRAFT_DISPATCH: draft_start - seconds[DRAFT_INPUTS],
        DRAFT_INPUTS: seconds[DRAFT_INPUTS],
        SCHEDULE: seconds[SCHEDULE],
        "propose (Python)": seconds[PROPOSE] - draft_total,
        ACCEPT: seconds[ACCEPT],
        "other engine Python": seconds[STEP]
        - seconds[SCHEDULE]
        - seconds[PROPOSE]
        - target_forward
        - seconds[ACCEPT],
        DETOKENIZE: seconds[DETOKENIZE],
        "stop strings, text bookkeeping": text_other,
        "outside the step": wall_seconds - seconds[STEP] - seconds[TEXT],
    }


def profile_configuration(
    pipeline: Any,
    timers: Timers,
    prompts: list[str],
    max_tokens: int,
    num_draft_tokens: int | None,
    label: str,
) -> StageProfile:
    """Generate ``max_tokens`` greedy tokens for each prompt, one request at a time, under ``timers``
    (the phase hooks ``pipeline`` was built with)."""
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, num_draft_tokens=num_draft_tokens
    )
    pipeline.generate(prompts[:1], params)  # warm-up: first shapes compile kernels
    num_tokens = 0
    with instrumented(pipeline, timers):
        started = time.perf_counter()
        for prompt in prompts:
            num_tokens += len(pipeline.generate([prompt], params)[0].token_ids)
        wall = time.perf_counter() - started
    # Per target pass, not per step(): a target-only step may run a burst of passes (engine.bursts).
    return StageProfile(label, wall, num_tokens, timers.calls[TARGET_DEVICE], stage_rows(timers, wall))


def layer_times(
    pipeline: Any, prompts: list[str], max_tokens: int, num_draft_tokens: int | None
) -> dict[str, float]:
    """Target device ms by layer type, summed over a run (the pipeline must be compiled with PERF_COUNT)."""
    runner = pipeline.target_runner
    totals: dict[str, float] = defaultdict(float)
    original_wait = runner.wait

    def wait_and_count() -> Any:
        logits = original_wait()
        for info in runner.request.profiling_info:
            totals[info.node_type] += info.real_time.total_seconds() * 1e3
        return logits

    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, num_draft_tokens=num_draft_tokens
    )
    pipeline.generate(prompts[:1], params)
    runner.wait = wait_and_count
    try:
        for prompt in prompts:
            pipeline.generate([prompt], params)
    finally:
        del runner.wait
    return dict(totals)


def http_profile(
    pipeline: Any,
    bundle: Path | None,
    prompts: list[str],
    max_tokens: int,
    num_draft_tokens: int,
    rounds: int = 3,
) -> tuple[float, float]:
    """(in-process, HTTP) tokens/s of one client sending ``prompts`` in turn, best of ``rounds``.

    Rounds alternate between ``pipeline`` (no timers) and a real ``xpuspec serve`` subprocess with
    the same bundle and drafter, streaming, so that machine noise hits both alike.
    """
    import httpx

    from xpuspec.bench.server_process import ServerProcess, stream_completion

    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, num_draft_tokens=num_draft_tokens or None
    )
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    if pipeline.drafter != "none":
        body["num_draft_tokens"] = num_draft_tokens
    best_local = best_http = 0.0
    with (
        tempfile.TemporaryDirectory() as folder,
        # The server caches prompt prefixes exactly when the in-process engine does: the rounds
        # repeat their prompts, so a cache on one side only would skip that side's prefills.
        ServerProcess(
            bundle,
            Path(folder) / "server.log",
            pipeline.drafter,
            prefix_caching=pipeline.engine_config.enable_prefix_caching,
        ) as server,
        httpx.Client() as client,
    ):
        stream_completion(client, server, {**body, "prompt": prompts[0]})  # warm-up
        for _ in range(rounds):
            started = time.perf_counter()
            tokens = sum(len(pipeline.generate([prompt], params)[0].token_ids) for prompt in prompts)
            best_local = max(best_local, tokens / (time.perf_counter() - started))
            started = time.perf_counter()
            tokens = 0
            for prompt in prompts:
                result = stream_completion(client, server, {**body, "prompt": prompt})
                if result.error:
                    raise RuntimeError(f"streaming request failed: {result.error}")
                tokens += result.output_tokens
            best_http = max(best_http, tokens / (time.perf_counter() - started))
    return best_local, best_http


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m research.bench.profile", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--bundle",
        type=Path,
        default=None,
        help="bundle folder (default: the default model, SmolLM2-135M with its draft)",
    )
    parser.add_argument("--prompts", type=int, default=6, help="requests, run one at a time")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per request")
    parser.add_argument(
        "--draft-lengths", default="0,4", help="γ values to profile; 0 is target-only, a is adaptive γ"
    )
    parser.add_argument("--property", action="append", default=[], help="compile property KEY=VALUE")
    parser.add_argument("--layers", action="store_true", help="also OpenVINO per-layer counters (PERF_COUNT)")
    parser.add_argument("--http", action="store_true", help="also stream through a real `xpuspec serve`")
    return parser.parse_args(argv)


def _draft_length(value: str) -> int | None:
    """A --draft-lengths entry: an integer γ (0: target-only) or "a"/"adaptive" (None)."""
    value = value.strip()
    if value in ("a", "adaptive"):
        return None
    if not value.isdigit():
        raise SystemExit(f"--draft-lengths takes integers and 'a' (adaptive), got {value!r}")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    from xpuspec.api.errors import describe_error

    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        return _profile(args)
    except Exception as error:  # a missing bundle, a bad --property, properties this CPU refuses
        described = describe_error(error)
        if described is None:
            raise
        print(f"python -m research.bench.profile: error: {described[0]}", file=sys.stderr)
        return described[1]


def _profile(args: argparse.Namespace) -> int:
    from xpuspec.api.pipeline import Pipeline
    from xpuspec.executor.properties import parse_properties

    properties = parse_properties(args.property) or None
    prompts = [prompt.text for prompt in heldout_code_prompts(args.prompts)]
    gammas = [_draft_length(value) for value in args.draft_lengths.split(",") if value.strip()]
    pipelines: dict[str, Any] = {}
    timers: dict[str, Timers] = {}
    for gamma in gammas:
        drafter = "none" if gamma == 0 else "draft"
        if drafter not in pipelines:
            # No prefix cache: the prompts repeat (rounds, the HTTP comparison), and each request
            # should pay its prefill as a new one does.
            timers[drafter] = Timers()
            pipelines[drafter] = Pipeline(
                args.bundle,
                drafter=drafter,
                properties=properties,
                enable_prefix_caching=False,
                phase_hooks=timers[drafter],
            )
        label = {0: "target-only", None: "adaptive γ"}.get(gamma, f"γ = {gamma}")
        profile = profile_configuration(
            pipelines[drafter], timers[drafter], prompts, args.max_tokens, gamma or None, label
        )
        if args.layers:
            counted = Pipeline(
                args.bundle,
                drafter=drafter,
                properties={**(properties or {}), "PERF_COUNT": True},
                enable_prefix_caching=False,
            )
            profile.layers = layer_times(counted, prompts, args.max_tokens, gamma or None)
            del counted
        print(profile.table())
        if args.http and gamma is None:
            print("  HTTP: not measured for adaptive γ (the comparison fixes γ)")
        elif args.http:
            local, http = http_profile(pipelines[drafter], args.bundle, prompts, args.max_tokens, gamma)
            print(
                f"  HTTP, one streaming client (best of 3 rounds alternating with in-process): "
                f"{http:.1f} vs {local:.1f} tokens/s in-process = {100 * http / local:.0f}%, "
                f"{1e3 * (1 / http - 1 / local):.3f} ms/token added"
            )
        print()
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
