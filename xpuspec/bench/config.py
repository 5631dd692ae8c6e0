"""Settings of one `xpuspec bench` run, with the sizes of the ``--quick`` run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuspec.engine.engine import EngineConfig
from xpuspec.executor.properties import EXACT_PROPERTIES

MODES = ("latency", "load", "all")
F32_PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
MIN_ROUNDS = 3  # the methodology's minimum for figures to compare engines by (--quick runs fewer)


@dataclass
class BenchConfig:
    """What to run and how much of it. ``quick``: a quick look (:data:`QUICK` sizes with it): only the rows
    of :mod:`xpuspec.bench.quick`, engines compiled a pair at a time and freed between pairs."""

    out: Path
    bundle: Path | None = None  # None: the default model (SmolLM2 + draft); "demo": the demo pair
    workload: str = "code"
    mode: str = "all"
    draft_lengths: tuple[int, ...] = (1, 2, 4, 6)
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    num_prompts: int = 8
    prompt_chars: int = 600
    max_tokens: int = 64
    rounds: int = MIN_ROUNDS  # batch-1 rounds, interleaved, engines compiled afresh; each keeps its best
    requests_per_client: int = 2  # load mode: each client sends this many requests in turn
    hf_target: Path | None = None
    hf_draft: Path | None = None
    f32: bool = False
    exact: bool = False  # the same-properties rows (and the load mode) run in exact mode
    server_timeout_s: float = 300.0
    properties: dict[str, Any] = field(default_factory=dict)
    quick: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        max_draft = EngineConfig().max_draft_tokens
        if not self.draft_lengths or any(not 1 <= g <= max_draft for g in self.draft_lengths):
            raise ValueError(f"draft lengths must be in [1, {max_draft}], got {list(self.draft_lengths)}")
        if not self.concurrency or any(n < 1 for n in self.concurrency):
            raise ValueError(f"concurrency levels must be >= 1, got {list(self.concurrency)}")
        for name in ("num_prompts", "prompt_chars", "max_tokens", "rounds", "requests_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if (self.hf_target is None) != (self.hf_draft is None):
            raise ValueError("give both --hf-target and --hf-draft, or neither")
        if self.f32:
            self.properties = {**F32_PROPERTIES, **self.properties}
        if self.exact:
            self.properties = {**EXACT_PROPERTIES, **self.properties}

    @property
    def runs_latency(self) -> bool:
        return self.mode in ("latency", "all")

    @property
    def runs_load(self) -> bool:
        return self.mode in ("load", "all")

    def settings(self) -> dict[str, Any]:
        """The settings as the report records them."""
        return {
            "bundle": str(self.bundle) if self.bundle else "default model (SmolLM2-135M-Instruct + draft)",
            "quick": self.quick,
            "workload": self.workload,
            "mode": self.mode,
            "draft_lengths": list(self.draft_lengths),
            "concurrency": list(self.concurrency),
            "prompts": self.num_prompts,
            "prompt_chars": self.prompt_chars,
            "max_tokens": self.max_tokens,
            "rounds": self.rounds,
            "requests_per_client": self.requests_per_client,
            "greedy": True,
            "ignore_eos": True,
            "properties": self.properties or "GenAI's CPU defaults, made explicit, for both engines",
        }


QUICK = {
    "draft_lengths": (2, 4),
    "concurrency": (1, 4),
    "num_prompts": 3,
    "prompt_chars": 200,
    "max_tokens": 16,
    "rounds": 1,
    "requests_per_client": 1,
}
