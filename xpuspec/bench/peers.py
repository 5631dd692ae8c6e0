"""Peer engines on the same models and prompts: OpenVINO GenAI, Hugging Face transformers, llama.cpp.

Each peer is optional. ``*_unavailable()`` returns why a peer cannot run here (the report lists it
as "skipped: <reason>"), or None when it can. Every runner takes prompt token ids, so every engine
sees exactly the same tokens.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from xpuspec.api.errors import one_line, openvino_message
from xpuspec.bench.figures import RequestTiming

logger = logging.getLogger(__name__)


def why_failed(error: BaseException, limit: int = 300) -> str:
    """A peer's failure as one line for the report and the log: OpenVINO's C++ exceptions span lines
    of source locations ("Exception from src/...") around the message, which would break a table cell
    and bury the reason; the meaningful part, joined, and cut at ``limit`` characters."""
    text = openvino_message(error) or one_line(str(error) or type(error).__name__)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def genai_unavailable() -> str | None:
    if importlib.util.find_spec("openvino_genai") is None:
        return "openvino-genai is not installed (a dependency of xpuspec: pip install openvino-genai)"
    return None


def transformers_unavailable(target: Path | None, draft: Path | None) -> str | None:
    if target is None or draft is None:
        return "no Hugging Face checkpoints given (--hf-target DIR --hf-draft DIR)"
    for name in ("torch", "transformers"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed (pip install 'xpuspec[convert]')"
    return None


def llama_cpp_unavailable() -> str:
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed"
    # xpuspec bundles hold OpenVINO IR; llama.cpp needs GGUF files of the same pair.
    return "llama_cpp imports, but the bench has no GGUF models of this pair to give it"


# GenAI's prompt lookup: n-gram size and tokens per lookup where none is given (its sample's settings).
GENAI_LOOKUP_NGRAM = 3
GENAI_LOOKUP_TOKENS = 4


def _genai_config(max_tokens: int, num_assistant_tokens: int | None, prompt_lookup: bool = False) -> Any:
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = max_tokens
    config.min_new_tokens = max_tokens
    config.ignore_eos = True
    config.do_sample = False
    if prompt_lookup:  # GenAI's prompt lookup refuses to run without both set (e.g. a warm-up)
        config.num_assistant_tokens = num_assistant_tokens or GENAI_LOOKUP_TOKENS
        config.max_ngram_size = GENAI_LOOKUP_NGRAM
    elif num_assistant_tokens is not None:
        config.num_assistant_tokens = num_assistant_tokens
    return config


def _tensor(token_ids: list[int]) -> Any:
    import openvino as ov

    return ov.Tensor(np.array([token_ids], dtype=np.int64))  # [1, prompt_tokens]


def _scheduler_config(cache_gb: int = 1) -> Any:
    """GenAI's scheduler with prefix caching off (xpuspec has none: a benchmark that repeats prompts
    would otherwise time GenAI reusing the prompt's KV) and a bounded cache."""
    import openvino_genai

    scheduler = openvino_genai.SchedulerConfig()
    scheduler.cache_size = cache_gb  # bounded: the default grows with the machine's memory
    scheduler.enable_prefix_caching = False
    return scheduler


class GenaiLatencyRunner:
    """``openvino_genai.LLMPipeline``, target only, with the draft (its speculative decoding) or with
    ``prompt_lookup`` (its n-gram drafting), with prefix caching off."""

    def __init__(
        self,
        target_dir: Path,
        draft_dir: Path | None,
        properties: dict[str, Any],
        prompt_lookup: bool = False,
    ) -> None:
        import openvino_genai

        if prompt_lookup and draft_dir is not None:
            raise ValueError("GenAI drafts with a draft model or by prompt lookup, not both")
        self.genai = openvino_genai
        kwargs: dict[str, Any] = dict(properties)
        if draft_dir is not None:
            kwargs["draft_model"] = openvino_genai.draft_model(str(draft_dir), "CPU", **properties)
        if prompt_lookup:
            kwargs["prompt_lookup"] = True
        kwargs["scheduler_config"] = _scheduler_config()
        self.pipe = openvino_genai.LLMPipeline(str(target_dir), "CPU", **kwargs)
        self.speculative = draft_dir is not None or prompt_lookup
        self.prompt_lookup = prompt_lookup

    def generate(self, token_ids: list[int], max_tokens: int, draft_length: int | None) -> RequestTiming:
        import openvino as ov

        ids = np.array([token_ids], dtype=np.int64)  # [1, prompt_tokens]
        inputs = self.genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        config = _genai_config(max_tokens, draft_length if self.speculative else None, self.prompt_lookup)
        started = time.perf_counter()
        result = self.pipe.generate(inputs, config)
        seconds = time.perf_counter() - started
        metrics = result.perf_metrics
        timing = RequestTiming(
            prompt_tokens=len(token_ids),
            token_ids=list(result.tokens[0]),
            seconds=seconds,
            ttft_s=metrics.get_ttft().mean / 1000.0,
            tpot_s=metrics.get_tpot().mean / 1000.0,
        )
        extended = getattr(result, "extended_perf_metrics", None)
        if self.speculative and extended is not None and hasattr(extended, "get_num_accepted_tokens"):
            timing.accepted = int(extended.get_num_accepted_tokens())
            timing.drafted = int(extended.get_num_draft_tokens())
        return timing


class GenaiBatchRunner:
    """``openvino_genai.ContinuousBatchingPipeline``: a list of prompts generated together."""

    def __init__(
        self,
        target_dir: Path,
        draft_dir: Path | None,
        properties: dict[str, Any],
        max_num_seqs: int,
        cache_gb: int = 1,
    ) -> None:
        import openvino_genai

        scheduler = _scheduler_config(cache_gb)
        scheduler.max_num_seqs = max(scheduler.max_num_seqs, max_num_seqs)
        kwargs: dict[str, Any] = dict(properties)
        if draft_dir is not None:
            kwargs["draft_model"] = openvino_genai.draft_model(str(draft_dir), "CPU", **properties)
        self.pipe = openvino_genai.ContinuousBatchingPipeline(str(target_dir), scheduler, "CPU", kwargs)
        self.speculative = draft_dir is not None

    def generate(self, prompts: list[list[int]], max_tokens: int, draft_length: int | None) -> int:
        """Generate for all prompts at once; return the number of output tokens."""
        config = _genai_config(max_tokens, draft_length if self.speculative else None)
        results = self.pipe.generate([_tensor(p) for p in prompts], [config] * len(prompts))
        return sum(len(r.m_generation_ids[0]) for r in results)


class TransformersLatencyRunner:
    """Hugging Face assisted generation on PyTorch: ``model.generate(assistant_model=draft)``."""

    def __init__(self, target_dir: Path, draft_dir: Path) -> None:
        from xpuspec.prepare.hf_peer import TransformersAssistedGenerator  # torch: only when this peer runs

        self._generator = TransformersAssistedGenerator(target_dir, draft_dir)

    def generate(
        self, token_ids: list[int], max_tokens: int, draft_length: int | str | None
    ) -> RequestTiming:
        run = self._generator.generate(token_ids, max_tokens, draft_length)
        first, last, new_tokens = run.first_token_s, run.last_token_s, run.token_ids
        return RequestTiming(
            prompt_tokens=len(token_ids),
            token_ids=new_tokens,
            seconds=run.seconds,
            ttft_s=first,
            tpot_s=(last - first) / (len(new_tokens) - 1)
            if first is not None and last is not None and len(new_tokens) > 1
            else None,
        )
