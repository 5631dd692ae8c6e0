"""`xpuspec quality`: how far a bundle's target, as it runs, is from the same weights in exact mode.

The text: ``heldout_text.jsonl`` beside this module, passages written for this measure (prose, code,
dialogue, numbers, structured data, mathematics, verse, five European languages and non-Latin scripts;
docs/quality.md), none of them a bench prompt. Each passage is one sequence, cut into chunks of at most
``chunk_tokens``; every chunk is one prefill whose logits give the next-token distribution at each of
its positions (teacher forcing).

The reference: the bundle's target in exact mode (the ``exact`` preset: f32 compute, f32 KV cache, no
dynamic quantisation). Each candidate (the target at its default properties, other property sets, other
bundles' targets: other weight formats of the same weights) is compared with it position by position
(:mod:`xpuspec.bench.quality_math`), and so is llama.cpp on the bundle's GGUF where a ``llama-server`` is
at hand (:mod:`xpuspec.bench.quality_llama`). Each candidate's single-stream decode speed is measured in
interleaved rounds. The budget and the report are :mod:`xpuspec.bench.quality_report`'s.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from xpuspec.bench.progress import Progress
from xpuspec.bench.quality_math import Deviation, compare_rows, log_softmax
from xpuspec.executor.properties import KEY_QUANT_MODE, STABLE_PROPERTIES, TUNED_KEYS, readable
from xpuspec.models.bundle import ModelBundle, ModelInfo

logger = logging.getLogger(__name__)

TEXT_FILE = "heldout_text.jsonl"
ROWS_PER_SLICE = 128  # positions compared at once: bounds the temporaries of vocabulary-wide rows

# Compile-property sets `--properties` compares with the plugin's defaults (label -> properties).
PROPERTY_SETS: dict[str, dict[str, Any]] = {
    "bf16, bf16 KV": {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "bf16"},
    "f32, u8 KV, dq 32": {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "u8",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32,
        KEY_QUANT_MODE: "BY_TOKEN",
    },
    "f32, f32 KV, dq 32": {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "f32",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32,
    },
    "stable": dict(STABLE_PROPERTIES),
}
# llama.cpp's arithmetic on the same weights, as OpenVINO can approximate it: f32 accumulation of
# activations quantised to 8 bits in blocks of 32 (ggml's Q8_0 / Q8_1 dot products) and an f16 KV cache
# (llama.cpp's default cache type). The budget where no llama-server measures llama.cpp itself.
EMULATED_LLAMA = "llama.cpp arithmetic, emulated"
EMULATED_LLAMA_PROPERTIES: dict[str, Any] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f16",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32,
}


@dataclass(frozen=True)
class Passage:
    kind: str
    text: str


def heldout_text() -> list[Passage]:
    """The measure's text set, shipped with the package."""
    lines = resources.files("xpuspec.bench").joinpath(TEXT_FILE).read_text(encoding="utf-8").splitlines()
    return [Passage(**json.loads(line)) for line in lines if line.strip()]


def text_chunks(tokenizer: Any, passages: Sequence[Passage], chunk_tokens: int) -> list[list[int]]:
    """Each passage's tokens (no special tokens added), cut into chunks of at most ``chunk_tokens``;
    chunks of fewer than two tokens (no next token to predict) are dropped."""
    chunks = []
    for passage in passages:
        tokens = tokenizer.encode(passage.text, add_special_tokens=False)
        for start in range(0, len(tokens), chunk_tokens):
            piece = tokens[start : start + chunk_tokens]
            if len(piece) >= 2:
                chunks.append(piece)
    return chunks


@dataclass(frozen=True)
class Candidate:
    """A way to run the weights: a target model and compile properties over the plugin's defaults."""

    label: str
    model: ModelInfo
    properties: dict[str, Any] | None = None  # None: the plugin's defaults


@dataclass
class Measured:
    """One row of the report: a candidate's (or llama.cpp's) deviation, properties and decode speed."""

    label: str
    deviation: Deviation = field(default_factory=Deviation)
    properties: str = ""  # the tuned keys as compiled, readable
    weights: str = ""
    decode_rounds: list[float] = field(default_factory=list)  # tokens/s, one per round
    error: str | None = None

    @property
    def decode_tokens_per_s(self) -> float | None:
        return statistics.median(self.decode_rounds) if self.decode_rounds else None


@dataclass(frozen=True)
class QualityConfig:
    chunk_tokens: int = 512
    top_n: int = 20  # llama-server's n_probs; every row's lumped KL uses the same support size
    max_chunks: int | None = None  # None: the whole text set
    speed_rounds: int = 3  # interleaved decode-speed rounds; 0 skips the speed measurement
    speed_prompt_tokens: int = 64
    speed_tokens: int = 32
    device: str = "CPU"

    def __post_init__(self) -> None:
        if self.chunk_tokens < 2:
            raise ValueError(f"chunk_tokens must be >= 2, got {self.chunk_tokens}")
        if self.top_n < 1:
            raise ValueError(f"top_n must be >= 1, got {self.top_n}")
        if self.speed_rounds < 0:
            raise ValueError(f"speed_rounds must be >= 0, got {self.speed_rounds}")


class CompiledCandidate:
    """A candidate's paged runner and the KV blocks its one sequence at a time uses."""

    def __init__(self, candidate: Candidate, runner: Any, blocks: int, properties: dict[str, Any]) -> None:
        self.candidate, self.runner = candidate, runner
        self.block_table = list(range(blocks))
        self.properties = properties

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """The prefill's logits at every position of ``tokens`` (a copy: the runner reuses its buffer)."""
        from xpuspec.core.chunks import SequenceChunk

        chunk = SequenceChunk(list(tokens), 0, self.block_table, len(tokens))
        return np.array(self.runner.forward([chunk]), dtype=np.float32)

    def decode_tokens_per_s(self, prompt: Sequence[int], steps: int) -> float:
        """Tokens/s of ``steps`` greedy single-token decode steps after ``prompt`` (its prefill untimed)."""
        from xpuspec.core.chunks import SequenceChunk

        logits = self.runner.forward([SequenceChunk(list(prompt), 0, self.block_table, 1)])
        token = int(logits[0].argmax())
        started = time.perf_counter()
        for index in range(steps):
            chunk = SequenceChunk([token], len(prompt) + index, self.block_table, 1)
            token = int(self.runner.forward([chunk])[0].argmax())
        return steps / (time.perf_counter() - started)


def compile_candidate(
    candidate: Candidate, core: Any, plugin: Any, device: str, context: int
) -> CompiledCandidate:
    """The candidate's paged runner with room for one sequence of ``context`` tokens."""
    from xpuspec.devices.executors import model_weights
    from xpuspec.executor.paged_runner import PagedModelRunner

    properties = plugin.compile_properties(
        "target", candidate.properties, weights=model_weights(candidate.model)
    )
    blocks = -(-context // 16) + 1  # the CPU's blocks hold 32 tokens; 16 leaves room for any plugin's
    runner = PagedModelRunner(
        candidate.model.path, device=device, properties=properties, num_blocks=blocks, core=core
    )
    needed = -(-context // runner.block_size)
    if runner.num_blocks < needed:
        raise ValueError(f"{candidate.label}: needs {needed} KV blocks, the runner has {runner.num_blocks}")
    return CompiledCandidate(candidate, runner, needed, properties)


def paged_plugin(device: str, core: Any) -> Any:
    """The device's OpenVINO plugin; ``ValueError`` where it has no paged executor (the measure's)."""
    from xpuspec.devices.placement import resolve_device
    from xpuspec.devices.plugin import OpenVINODevicePlugin
    from xpuspec.devices.registry import default_registry

    plugin = resolve_device(device, core, default_registry()).plugin
    if not isinstance(plugin, OpenVINODevicePlugin) or plugin.executor_kind != "paged":
        raise ValueError(
            f"the quality measure runs paged executors; {device} runs the {plugin.executor_kind} one"
        )
    return plugin


def compare_chunk(
    reference: CompiledCandidate,
    others: Sequence[CompiledCandidate],
    rows: dict[str, Measured],
    chunk: Sequence[int],
    top_n: int,
    peer: Any = None,
) -> None:
    """One chunk through the reference and every candidate in turn (the reference's log-probabilities and
    one candidate's logits held at a time), compared slice by slice of positions."""
    from xpuspec.bench.quality_llama import compare_peer

    actual = np.asarray(chunk[1:], dtype=np.int64)
    exact = reference.logits(chunk)[:-1]
    parts = [slice(start, start + ROWS_PER_SLICE) for start in range(0, len(actual), ROWS_PER_SLICE)]
    reference_parts = [log_softmax(exact[part]) for part in parts]
    own = rows[reference.candidate.label].deviation
    for part, reference_rows in zip(parts, reference_parts, strict=True):
        compare_rows(reference_rows, reference_rows, actual[part], top_n, own)
        if peer is not None:
            compare_peer(reference_rows, peer.rows(part), rows[LLAMA_ROW].deviation)
    for compiled in others:
        logits = compiled.logits(chunk)[:-1]
        deviation = rows[compiled.candidate.label].deviation
        for part, reference_rows in zip(parts, reference_parts, strict=True):
            compare_rows(reference_rows, log_softmax(logits[part]), actual[part], top_n, deviation)


LLAMA_ROW = "llama.cpp (llama-server)"


def measure_speed(
    compiled: Sequence[CompiledCandidate], rows: dict[str, Measured], prompt: list[int], config: QualityConfig
) -> None:
    """Each candidate's decode tokens/s, one run per round, in an order rotating with the rounds."""
    progress = Progress("decode speed", config.speed_rounds * len(compiled))
    for round_index in range(config.speed_rounds):
        shift = round_index % len(compiled)
        for item in [*compiled[shift:], *compiled[:shift]]:
            rate = item.decode_tokens_per_s(prompt, config.speed_tokens)
            rows[item.candidate.label].decode_rounds.append(rate)
            progress.advance(f"{item.candidate.label}: {rate:.1f} tokens/s")


def compiled_keys(compiled: CompiledCandidate) -> str:
    """The tuned keys as the device compiled them (so a default the plugin left to the device shows)."""
    import openvino as ov

    values: dict[str, Any] = {}
    for key in TUNED_KEYS:
        try:
            value = compiled.runner.compiled_model.get_property(key)
        except RuntimeError:  # a key this device does not report: as asked, if asked
            value = compiled.properties.get(key)
        if value is not None:
            values[key] = value.to_string() if isinstance(value, ov.Type) else value
    return readable(values)


def weights_of(model: ModelInfo) -> str:
    compression = model.facts.get("compression")
    return str(compression.get("weights", "")) if isinstance(compression, dict) else ""


def bundle_candidates(
    bundle: ModelBundle, others: Sequence[tuple[str, ModelBundle]], property_sets: bool
) -> list[Candidate]:
    """The bundle's target at its defaults, then (``property_sets``) at each of :data:`PROPERTY_SETS`,
    then each other bundle's target at its defaults (other formats of the same weights)."""
    candidates = [Candidate("default", bundle.target)]
    if property_sets:
        candidates += [Candidate(label, bundle.target, dict(props)) for label, props in PROPERTY_SETS.items()]
    candidates += [Candidate(label, other.target) for label, other in others]
    return candidates
