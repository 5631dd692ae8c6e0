"""`xpuspec bench --mode multiturn`: time to first token when prompts repeat a long prefix.

Two workloads, on token ids (so every engine sees exactly the same prompts):

* **conversation**: N turns of one chat; turn 1 is a system prompt plus a question (at least 300
  tokens), each later turn appends a replayed assistant answer and a new question;
* **shared system prompt**: 16 users, one after another, each with its own question after the same
  500-token system prompt.

Each request generates one token, so its wall time is its TTFT. Engines: xpuspec with prefix
caching, xpuspec without, and OpenVINO GenAI's ``LLMPipeline`` with ``SchedulerConfig.enable_prefix_caching``
(all target-only: the first token comes from the target's prefill in every engine), with the same
compile properties. Rounds are interleaved: each round compiles every engine afresh, in an order that
rotates with the rounds (the first model compiled in a process runs a few percent slower) and runs
them in that order; each round starts its prompts with a marker of its own so no round reuses another's
cache. Figures are medians over rounds.
"""

from __future__ import annotations

import gc
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

SYSTEM_TEXT = (
    "You are a coding assistant. Follow the style guide: four-space indents, type hints, docstrings "
    "that say why, and tests for every function. Example:\n"
    'def mean(values: list[float]) -> float:\n    """The arithmetic mean; empty input is an error."""\n'
    "    if not values:\n        raise ValueError('mean of nothing')\n"
    "    return sum(values) / len(values)\n\n"
)
QUESTION_TEXT = "Question {index}: write a function that {task}.\n"
TASKS = [
    "reverses a string",
    "counts the words in a text",
    "merges two sorted lists",
    "checks whether a number is prime",
    "parses a CSV line",
    "computes a factorial",
    "flattens a nested list",
    "finds the longest common prefix",
]
ANSWER_TEXT = "Answer: here is the function, with a docstring and a test.\ndef f(x):\n    return x\n\n"

ENGINES = ("xpuspec prefix caching", "xpuspec no prefix caching", "GenAI prefix caching")


@dataclass
class MultiturnConfig:
    bundle: Path | None = None  # None: the default model (SmolLM2)
    turns: int = 4
    history_tokens: int = 320  # turn 1's prompt
    users: int = 16
    system_tokens: int = 500
    rounds: int = 3
    properties: dict[str, Any] | None = None  # None: GenAI's CPU defaults, for every engine

    def __post_init__(self) -> None:
        for name in ("turns", "history_tokens", "users", "system_tokens", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _tokens_of(encode: Any, text: str, count: int) -> list[int]:
    """Exactly ``count`` token ids: ``text`` repeated until long enough, then cut."""
    ids: list[int] = []
    while len(ids) < count:
        ids += encode(text)
    return ids[:count]


def build_prompts(encode: Any, config: MultiturnConfig, round_index: int) -> dict[str, list[list[int]]]:
    """The conversation's turns and the users' prompts of one round (its marker first)."""
    marker = encode(f"Session {round_index}.\n")
    system = marker + _tokens_of(encode, SYSTEM_TEXT, config.history_tokens)
    turns = []
    prompt = system + encode(QUESTION_TEXT.format(index=1, task=TASKS[0]))
    for turn in range(config.turns):
        turns.append(list(prompt))
        task = TASKS[(turn + 1) % len(TASKS)]
        prompt = prompt + encode(ANSWER_TEXT) + encode(QUESTION_TEXT.format(index=turn + 2, task=task))
    shared = marker + _tokens_of(encode, SYSTEM_TEXT, config.system_tokens)
    users = [
        shared + encode(QUESTION_TEXT.format(index=user, task=TASKS[user % len(TASKS)]))
        for user in range(config.users)
    ]
    return {"conversation": turns, "users": users}


class _XpuspecRunner:
    def __init__(self, bundle: Path | None, properties: dict[str, Any], prefix_caching: bool) -> None:
        from xpuspec.api.pipeline import Pipeline
        from xpuspec.engine.engine import EngineConfig
        from xpuspec.models.resolve import resolve_bundle

        max_context = resolve_bundle(bundle).max_context
        self.pipeline = Pipeline(
            bundle,
            drafter="none",
            properties=properties,
            engine_config=EngineConfig(max_model_len=max_context, enable_prefix_caching=prefix_caching),
            use_placement=False,
        )

    def first_token_seconds(self, token_ids: list[int]) -> float:
        from xpuspec.sample.sampling_params import SamplingParams

        started = time.perf_counter()
        request_id = self.pipeline.add_request(token_ids, SamplingParams(max_tokens=1, temperature=0.0))
        for _ in self.pipeline.steps([request_id]):
            pass
        return time.perf_counter() - started


class _GenaiRunner:
    def __init__(self, bundle: Path | None, properties: dict[str, Any]) -> None:
        import openvino_genai

        from xpuspec.models.resolve import resolve_bundle

        scheduler = openvino_genai.SchedulerConfig()
        scheduler.cache_size = 1
        scheduler.enable_prefix_caching = True
        target = resolve_bundle(bundle).target.path
        self.genai = openvino_genai
        self.pipe = openvino_genai.LLMPipeline(str(target), "CPU", scheduler_config=scheduler, **properties)
        self.config = openvino_genai.GenerationConfig()
        self.config.max_new_tokens = 1
        self.config.do_sample = False

    def first_token_seconds(self, token_ids: list[int]) -> float:
        import openvino as ov

        ids = np.array([token_ids], dtype=np.int64)  # [1, prompt_tokens]
        inputs = self.genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        started = time.perf_counter()
        self.pipe.generate(inputs, self.config)
        return time.perf_counter() - started


def _open_engines(config: MultiturnConfig, properties: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """The engines compiled in ``order`` (in one process the model compiled first runs a few percent
    slower, so the order rotates with the rounds, as in the latency bench)."""
    factories = {
        ENGINES[0]: lambda: _XpuspecRunner(config.bundle, properties, prefix_caching=True),
        ENGINES[1]: lambda: _XpuspecRunner(config.bundle, properties, prefix_caching=False),
        ENGINES[2]: lambda: _GenaiRunner(config.bundle, properties),
    }
    return {name: factories[name]() for name in order}


def run_multiturn(config: MultiturnConfig) -> dict[str, Any]:
    """Run both workloads on every engine, interleaved; return per-turn TTFTs and the ratios."""
    from xpuspec.bench.latency import genai_default_properties
    from xpuspec.models.resolve import resolve_bundle
    from xpuspec.text import Tokenizer

    properties = dict(config.properties) if config.properties else genai_default_properties()
    names = list(ENGINES)
    try:
        import openvino_genai  # noqa: F401
    except ImportError:
        logger.warning("openvino_genai is not installed: no GenAI column")
        names.remove(ENGINES[2])
    bundle = resolve_bundle(config.bundle)
    tokenizer = Tokenizer(bundle.target.path)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    _fit_context(config, encode, bundle.max_context)
    turn_seconds, user_seconds, block_size = _run_rounds(config, encode, properties, names)
    prompts = build_prompts(encode, config, 0)
    settings = {
        "bundle": str(config.bundle) if config.bundle is not None else "default (SmolLM2)",
        "turns": config.turns,
        "turn_prompt_tokens": [len(p) for p in prompts["conversation"]],
        "users": config.users,
        "user_prompt_tokens": [len(p) for p in prompts["users"]],
        "system_tokens": config.system_tokens,
        "rounds": config.rounds,
        "properties": properties,
        "block_size": block_size,
    }
    return _summary(settings, config.turns, turn_seconds, user_seconds)


def _fit_context(config: MultiturnConfig, encode: Callable[[str], list[int]], max_context: int) -> None:
    """Shorten ``config``'s history and system prompt so that every prompt fits the model's context."""
    # A small model's context (the demo pair: 512) bounds the prompts: keep 32 tokens of room.
    room = max_context - 32
    probe = build_prompts(encode, config, config.rounds)
    config.history_tokens -= max(0, len(probe["conversation"][-1]) - room)
    config.system_tokens -= max(0, max(len(p) for p in probe["users"]) - room)
    if min(config.history_tokens, config.system_tokens) < 1:
        raise ValueError(f"the model's context ({room + 32} tokens) is too short for {config.turns} turns")


Seconds = dict[str, list[list[float]]]  # engine -> [round][turn or user]


def _run_rounds(
    config: MultiturnConfig, encode: Callable[[str], list[int]], properties: dict[str, Any], names: list[str]
) -> tuple[Seconds, Seconds, int]:
    """Every round on every engine, compiled afresh in rotating order: the TTFT of each turn and of
    each user, and the target's block size."""
    warm = build_prompts(encode, config, -1)
    turn_seconds: Seconds = {name: [] for name in names}  # [round][turn]
    user_seconds: Seconds = {name: [] for name in names}  # [round][user]
    block_size = 0
    for round_index in range(config.rounds):
        prompts = build_prompts(encode, config, round_index)
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        runners = _open_engines(config, properties, order)
        block_size = runners[ENGINES[0]].pipeline.target_runner.block_size
        # Warm-up: the first inference of a kind compiles kernels (a prefill that continues cached
        # blocks cost far more the first time in both engines: docs/benchmarks.md, prefix caching),
        # so each kind runs once untimed.
        for runner in runners.values():
            for prompt in [*warm["conversation"][:2], *warm["users"][:2]]:
                runner.first_token_seconds(prompt)
        for name in order:
            runner = runners[name]
            turn_seconds[name].append([runner.first_token_seconds(p) for p in prompts["conversation"]])
            user_seconds[name].append([runner.first_token_seconds(p) for p in prompts["users"]])
            logger.info(
                "round %d %s: turns %s ms, users total %.0f ms",
                round_index,
                name,
                [round(s * 1000) for s in turn_seconds[name][-1]],
                sum(user_seconds[name][-1]) * 1000,
            )
        del runners, runner
        gc.collect()
    return turn_seconds, user_seconds, block_size


def _summary(
    settings: dict[str, Any], turns: int, turn_seconds: Seconds, user_seconds: Seconds
) -> dict[str, Any]:
    """The medians over rounds per engine, and the ratios between engines."""
    result: dict[str, Any] = {"settings": settings, "engines": {}}
    for name in turn_seconds:
        per_turn_ms = [
            statistics.median(seconds[turn] for seconds in turn_seconds[name]) * 1000 for turn in range(turns)
        ]
        users_total_ms = statistics.median(sum(seconds) for seconds in user_seconds[name]) * 1000
        result["engines"][name] = {
            "turn_ttft_ms": per_turn_ms,
            "second_over_first_turn": per_turn_ms[1] / per_turn_ms[0] if turns > 1 else None,
            "users_total_ttft_ms": users_total_ms,
        }
    cached, uncached = result["engines"][ENGINES[0]], result["engines"][ENGINES[1]]
    result["users_ttft_drop"] = uncached["users_total_ttft_ms"] / cached["users_total_ttft_ms"]
    if ENGINES[2] in result["engines"]:
        genai = result["engines"][ENGINES[2]]
        result["xpuspec_over_genai_turns"] = [
            x / g for x, g in zip(cached["turn_ttft_ms"], genai["turn_ttft_ms"], strict=True)
        ]
        result["xpuspec_over_genai_users"] = cached["users_total_ttft_ms"] / genai["users_total_ttft_ms"]
    return result


def markdown(result: dict[str, Any]) -> str:
    settings = result["settings"]
    lines = [
        "## Multi-turn and shared-prefix TTFT",
        "",
        f"Bundle: {settings['bundle']}; block size {settings['block_size']}; median of "
        f"{settings['rounds']} interleaved rounds; one generated token per request (its time is the TTFT).",
        f"Conversation turn prompts: {settings['turn_prompt_tokens']} tokens. "
        f"{settings['users']} users, one after another, prompts of "
        f"{settings['user_prompt_tokens'][0]} tokens "
        f"({settings['system_tokens']} shared).",
        "",
        "| engine | "
        + " | ".join(f"turn {i + 1} ms" for i in range(settings["turns"]))
        + " | turn 2 / turn 1 | 16 users total ms |",
        "|---|" + "---|" * settings["turns"] + "---|---|",
    ]
    for name, figures in result["engines"].items():
        turns = " | ".join(f"{ms:.1f}" for ms in figures["turn_ttft_ms"])
        ratio = figures["second_over_first_turn"]
        lines.append(
            f"| {name} | {turns} | {ratio:.2f} | {figures['users_total_ttft_ms']:.0f} |"
            if ratio is not None
            else f"| {name} | {turns} | - | {figures['users_total_ttft_ms']:.0f} |"
        )
    lines += ["", f"16-user aggregate TTFT drop with prefix caching: {result['users_ttft_drop']:.2f}x."]
    if "xpuspec_over_genai_turns" in result:
        per_turn = ", ".join(f"{r:.2f}" for r in result["xpuspec_over_genai_turns"])
        lines.append(
            f"xpuspec / GenAI TTFT (both caching): turns {per_turn}; "
            f"16 users {result['xpuspec_over_genai_users']:.2f}."
        )
    return "\n".join(lines) + "\n"
