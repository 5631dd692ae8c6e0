"""What a request gets for the sampling parameters it leaves out: the one definition every entry point
uses (the CLI, the Python API, the OpenAI and Ollama routes, the chat page).

A model's own recommendation comes first: the Hugging Face ``generation_config.json`` its bundle keeps
(``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``, and ``do_sample: false``,
which means greedy), or for a GGUF the ``general.sampling.*`` keys ``prepare`` copies into that file.
Whatever the model does not say comes from llama.cpp's defaults (``common_params_sampling`` in
llama.cpp's ``common/common.h``). A request that names no length limit gets :data:`DEFAULT_MAX_TOKENS`
(or the server's ``--max-tokens``), so that no reply runs on to the end of the context.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from xpuspec.sample.dry import (
    DEFAULT_DRY_ALLOWED_LENGTH,
    DEFAULT_DRY_BASE,
    DEFAULT_DRY_MULTIPLIER,
    DEFAULT_DRY_PENALTY_LAST_N,
    DEFAULT_SEQUENCE_BREAKERS,
    MAX_DRY_BASE,
)

# The reply cap of requests that name no limit (max_tokens, num_predict, --max-tokens absent).
DEFAULT_MAX_TOKENS = 1024

# llama.cpp's own defaults (common/common.h, struct common_params_sampling).
LLAMA_CPP = "llama.cpp"
LLAMA_CPP_TEMPERATURE = 0.8
LLAMA_CPP_TOP_K = 40
LLAMA_CPP_TOP_P = 0.95
LLAMA_CPP_MIN_P = 0.05
LLAMA_CPP_REPEAT_PENALTY = 1.0
LLAMA_CPP_REPEAT_LAST_N = 64

# generation_config.json key -> SamplingDefaults field. ``repetition_penalty`` is Hugging Face's name
# for the same multiplicative penalty as llama.cpp's ``repeat_penalty``.
GENERATION_CONFIG_KEYS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",  # not a Hugging Face key: written by prepare from a GGUF
    # Nor these: llama.cpp's DRY, which a bundle's manifest may recommend.
    "dry_multiplier": "dry_multiplier",
    "dry_base": "dry_base",
    "dry_allowed_length": "dry_allowed_length",
    "dry_penalty_last_n": "dry_penalty_last_n",
}
# A bundle's manifest may also recommend this xpuspec switch (a bool: DRY without the prompt).
BOOLEAN_KEYS = {"dry_include_prompt": "dry_include_prompt"}
INTEGER_KEYS = ("top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n")
# A GGUF's recommended sampling (llama.cpp's general.sampling.* keys) -> generation_config.json key.
GGUF_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
    "general.sampling.penalty_last_n": "repeat_last_n",
}


@dataclass(frozen=True)
class SamplingDefaults:
    """The values a request's unset sampling fields take, and where each came from (``sources``:
    field -> "generation_config.json" or "llama.cpp"; the cap's source is "xpuspec" or "--max-tokens")."""

    temperature: float = LLAMA_CPP_TEMPERATURE
    top_k: int = LLAMA_CPP_TOP_K
    top_p: float = LLAMA_CPP_TOP_P
    min_p: float = LLAMA_CPP_MIN_P
    repeat_penalty: float = LLAMA_CPP_REPEAT_PENALTY
    repeat_last_n: int = LLAMA_CPP_REPEAT_LAST_N
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = DEFAULT_DRY_MULTIPLIER
    dry_base: float = DEFAULT_DRY_BASE
    dry_allowed_length: int = DEFAULT_DRY_ALLOWED_LENGTH
    dry_penalty_last_n: int = DEFAULT_DRY_PENALTY_LAST_N
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_SEQUENCE_BREAKERS
    dry_include_prompt: bool = True
    max_tokens: int = DEFAULT_MAX_TOKENS
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def source(self, name: str) -> str:
        return self.sources.get(name, "xpuspec" if name == "max_tokens" else LLAMA_CPP)

    def with_max_tokens(self, max_tokens: int | None, source: str) -> SamplingDefaults:
        """These defaults with another reply cap (None: unchanged)."""
        if max_tokens is None:
            return self
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"the default max_tokens must be an integer >= 1, got {max_tokens!r}")
        return dataclasses.replace(
            self, max_tokens=max_tokens, sources={**self.sources, "max_tokens": source}
        )

    def as_dict(self) -> dict[str, object]:
        """The values by field name (without the sources; the breakers as a list, as JSON has them)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sources"}
        return {**values, "dry_sequence_breakers": list(self.dry_sequence_breakers)}


def from_generation_config(
    config: Mapping[str, object] | None,
    recommended: Mapping[str, object] | None = None,
    recommended_by: str = "",
) -> SamplingDefaults:
    """The defaults a model's ``generation_config.json`` recommends, llama.cpp's for the rest.

    ``recommended`` (the same keys), where given, comes before the file, said to come from
    ``recommended_by``. ``do_sample: false`` (Hugging Face's greedy) sets temperature 0. Values of
    the wrong type or out of range are ignored (the file is the model author's, not the user's):
    the next source's value stands.
    """
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for layer, source in ((config or {}, "generation_config.json"), (recommended or {}, recommended_by)):
        for key, name in GENERATION_CONFIG_KEYS.items():
            value = layer.get(key)
            if _acceptable(name, value):
                number = float(value)  # type: ignore[arg-type]  # _acceptable: a finite int or float
                values[name] = int(number) if name in INTEGER_KEYS else number
                sources[name] = source
        for key, name in BOOLEAN_KEYS.items():
            if isinstance(layer.get(key), bool):
                values[name] = layer[key]
                sources[name] = source
        if layer.get("do_sample") is False:
            values["temperature"] = 0.0
            sources["temperature"] = f"{source} (do_sample: false)"
    return SamplingDefaults(**values, sources=sources)  # type: ignore[arg-type]


def _acceptable(name: str, value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    if name in INTEGER_KEYS:
        lowest = {"top_k": 0, "dry_allowed_length": 1}.get(name, -1)
        return float(value).is_integer() and value >= lowest
    if name == "temperature":
        return 0 <= value <= 100
    if name == "top_p":
        return 0 < value <= 1
    if name == "min_p":
        return 0 <= value <= 1
    if name == "dry_multiplier":
        return value >= 0
    if name == "dry_base":
        return 1 <= value <= MAX_DRY_BASE
    return value > 0  # repeat_penalty
