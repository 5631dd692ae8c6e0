"""One model's compile-property candidates: each compiled as a paged runner, its greedy continuations
(one token at a time, and verified in chunks) and its decode-step timings (:mod:`xpuspec.planning.tuning`
chooses among them)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from xpuspec.executor.properties import readable


@dataclass
class PropertyCandidate:
    """One setting of the tuned keys, with what was measured of it."""

    properties: dict[str, Any]  # the tuned keys; {} is the plugin's default
    is_default: bool = False
    round_ms: list[float] = field(default_factory=list)  # median step time of each round
    agreement: int | None = None  # prompts whose greedy tokens equal the exact reference's
    verified: int | None = None  # prompts whose tokens verified in chunks equal its own decoded tokens
    error: str | None = None

    @property
    def label(self) -> str:
        return "plugin default" if self.is_default else readable(self.properties)

    @property
    def step_ms(self) -> float | None:
        return statistics.median(self.round_ms) if self.round_ms else None

    @property
    def spread(self) -> float | None:
        """(slowest - fastest round) / median: how noisy the measurement was."""
        if len(self.round_ms) < 2 or not self.step_ms:
            return None
        return (max(self.round_ms) - min(self.round_ms)) / self.step_ms

    def as_dict(self) -> dict[str, Any]:
        return {
            "properties": self.label,
            "step_ms": None if self.step_ms is None else round(self.step_ms, 3),
            "spread": None if self.spread is None else round(self.spread, 3),
            "rounds": len(self.round_ms),
            "agreement": self.agreement,
            "verified_equals_decoded": self.verified,
            "error": self.error,
        }


class Subject:
    """One compiled candidate: a paged runner, its greedy continuations and its step timings."""

    def __init__(self, runner: Any, block_table: list[int]) -> None:
        self.runner = runner
        self.block_table = block_table

    def greedy(self, prompt: list[int], max_tokens: int) -> list[int]:
        from xpuspec.core.chunks import SequenceChunk

        logits = self.runner.forward([SequenceChunk(prompt, 0, self.block_table, 1)])
        tokens = [int(logits[0].argmax())]
        while len(tokens) < max_tokens:
            position = len(prompt) + len(tokens) - 1
            logits = self.runner.forward([SequenceChunk([tokens[-1]], position, self.block_table, 1)])
            tokens.append(int(logits[0].argmax()))
        return tokens

    def verified(self, prompt: list[int], decoded: list[int], chunk: int) -> list[int]:
        """The greedy tokens of speculative verification: each pass holds the last token and the next
        ``chunk - 1`` of ``decoded`` as drafts, the last of them wrong (so a rejected draft's KV is
        written and then overwritten, as in real speculation); accepted as the greedy rule accepts."""
        from xpuspec.core.chunks import SequenceChunk

        logits = self.runner.forward([SequenceChunk(prompt, 0, self.block_table, 1)])
        tokens = [int(logits[0].argmax())]
        vocab = logits.shape[-1]
        while len(tokens) < len(decoded):
            drafts = list(decoded[len(tokens) : len(tokens) + chunk - 1])
            if drafts:
                drafts[-1] = (drafts[-1] + 1) % vocab
            position = len(prompt) + len(tokens) - 1
            rows = self.runner.forward(
                [SequenceChunk([tokens[-1], *drafts], position, self.block_table, len(drafts) + 1)]
            )
            for index in range(len(drafts) + 1):
                tokens.append(int(rows[index].argmax()))
                if index == len(drafts) or drafts[index] != tokens[-1]:
                    break
        return tokens[: len(decoded)]

    def step_ms(self, prompt: list[int], steps: int) -> float:
        """Median milliseconds of ``steps`` single-token decode steps after ``prompt``."""
        from xpuspec.core.chunks import SequenceChunk

        self.runner.forward([SequenceChunk(prompt, 0, self.block_table, 1)])
        token, times = prompt[-1], []
        for index in range(steps):
            chunk = SequenceChunk([token], len(prompt) + index, self.block_table, 1)
            started = time.perf_counter()
            logits = self.runner.forward([chunk])
            times.append(time.perf_counter() - started)
            token = int(logits[0].argmax())
        return statistics.median(times) * 1000


class Trial:
    """The candidates compiled so far for one model, and how each agrees with the exact reference."""

    def __init__(
        self,
        make_runner: Callable[[dict[str, Any]], Any],
        role: str,
        context: int,
        prompts: Sequence[list[int]],
        max_tokens: int,
        verify_chunk: int,
        progress: Callable[[str], None],
    ) -> None:
        self.make_runner, self.role, self.context = make_runner, role, context
        self.prompts, self.max_tokens, self.progress = prompts, max_tokens, progress
        self.verify_chunk = verify_chunk
        self.subjects: dict[int, Subject] = {}
        self.expected: list[list[int]] = []  # the exact reference's greedy tokens for each prompt

    def compile(self, candidate: PropertyCandidate) -> None:
        """Compile ``candidate``'s runner, or record why the device refused it or it has too few blocks."""
        try:
            runner = self.make_runner(candidate.properties)
        except (RuntimeError, ValueError) as error:  # a combination the device refuses
            candidate.error = f"refused by the device: {essence(str(error))}"
            self.progress(f"  {self.role}: {candidate.label}: skipped, {candidate.error}")
            return
        blocks = -(-self.context // runner.block_size)
        if runner.num_blocks < blocks:
            candidate.error = f"needs {blocks} KV blocks, the runner has {runner.num_blocks}"
            return
        self.subjects[id(candidate)] = Subject(runner, list(range(blocks)))

    def agreement(self, candidate: PropertyCandidate) -> None:
        """Count the prompts on which ``candidate`` (where compiled) writes the reference's tokens, and
        those on which its verified tokens are its decoded ones."""
        subject = self.subjects.get(id(candidate))
        if subject is not None:
            got = [subject.greedy(p, self.max_tokens) for p in self.prompts]
            candidate.agreement = sum(g == e for g, e in zip(got, self.expected, strict=True))
            verified = [
                subject.verified(p, g, self.verify_chunk) for p, g in zip(self.prompts, got, strict=True)
            ]
            candidate.verified = sum(v == g for v, g in zip(verified, got, strict=True))

    def measured(self, candidates: list[PropertyCandidate]) -> list[PropertyCandidate]:
        return [c for c in candidates if id(c) in self.subjects]


def essence(message: str) -> str:
    """The telling line of an OpenVINO exception (its first lines are source locations)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    telling = [line for line in lines if not line.startswith(("Exception from ", "Check '"))]
    return (telling[-1] if telling else lines[0] if lines else "failed")[:200]
