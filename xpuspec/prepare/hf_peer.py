"""Hugging Face assisted generation on PyTorch, the bench's transformers peer (torch and transformers).

It lives in ``xpuspec.prepare`` because only ``prepare`` loads the conversion stack; the bench
(:class:`xpuspec.bench.peers.TransformersLatencyRunner`) turns its results into its own rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class AssistedGeneration:
    """One request's new tokens, its wall time, and when its first and last tokens arrived (seconds
    since the request started; None when no token arrived)."""

    token_ids: list[int]
    seconds: float
    first_token_s: float | None
    last_token_s: float | None


class _TokenTimes:
    """A transformers streamer that notes when tokens arrive (the first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.times: list[tuple[float, int]] = []  # (time, tokens in this put)
        self._seen_prompt = False

    def put(self, value: Any) -> None:
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        self.times.append((time.perf_counter(), int(value.numel())))

    def end(self) -> None:
        pass


class TransformersAssistedGenerator:
    """``model.generate(assistant_model=draft)`` on the target and draft checkpoints, greedy, f32."""

    def __init__(self, target_dir: Path, draft_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
        self.draft = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).eval()

    def generate(
        self, token_ids: list[int], max_tokens: int, draft_length: int | str | None
    ) -> AssistedGeneration:
        """Exactly ``max_tokens`` new tokens; ``draft_length`` None runs the target alone, "adaptive"
        uses transformers' own heuristic schedule, an int drafts that many tokens per step."""
        kwargs: dict[str, Any] = {}
        if draft_length is not None:
            config = self.draft.generation_config
            if draft_length == "adaptive":  # transformers' own heuristic schedule
                config.num_assistant_tokens, config.num_assistant_tokens_schedule = 20, "heuristic"
            else:
                config.num_assistant_tokens, config.num_assistant_tokens_schedule = draft_length, "constant"
            config.assistant_confidence_threshold = 0.0  # draft exactly γ tokens per step
            kwargs["assistant_model"] = self.draft
        streamer = _TokenTimes()
        inputs = self.torch.tensor([token_ids], dtype=self.torch.long)  # [1, prompt_tokens]
        started = time.perf_counter()
        with self.torch.inference_mode():
            output = self.target.generate(
                inputs,
                attention_mask=self.torch.ones_like(inputs),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                streamer=streamer,
                **kwargs,
            )
        seconds = time.perf_counter() - started
        return AssistedGeneration(
            token_ids=output[0, len(token_ids) :].tolist(),
            seconds=seconds,
            first_token_s=streamer.times[0][0] - started if streamer.times else None,
            last_token_s=streamer.times[-1][0] - started if streamer.times else None,
        )
