"""One run of the quality measure: the text through the reference, the candidates and llama.cpp, then the
budget (docs/quality.md).

**The budget.** A way of running the weights is acceptable when it deviates from the exact reference no
more than llama.cpp does on the same weights: its mean KL divergence at most the budget's and its top-1
agreement at least the budget's. Where a ``llama-server`` and the bundle's GGUF are at hand, the budget
is llama.cpp measured (its KL on the top-n lumped support, so every row is held to the lumped figure).
Otherwise it is llama.cpp's arithmetic emulated in OpenVINO on the same weights
(:data:`~xpuspec.bench.quality.EMULATED_LLAMA_PROPERTIES`), held to the full KL. The report names which.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from xpuspec.bench.llama_cpp import BUILD_SCRIPT, bundle_gguf, find_llama_server
from xpuspec.bench.progress import Progress
from xpuspec.bench.quality import (
    EMULATED_LLAMA,
    EMULATED_LLAMA_PROPERTIES,
    LLAMA_ROW,
    Candidate,
    CompiledCandidate,
    Measured,
    QualityConfig,
    compare_chunk,
    compile_candidate,
    compiled_keys,
    heldout_text,
    measure_speed,
    paged_plugin,
    text_chunks,
    weights_of,
)
from xpuspec.executor.properties import EXACT_PROPERTIES
from xpuspec.models.bundle import ModelBundle

logger = logging.getLogger(__name__)

REFERENCE_ROW = "exact (reference)"
_TOLERANCE = 1e-9  # rounding of equal figures


@dataclass(frozen=True)
class Budget:
    """The deviation a candidate may have: one row's KL mean (the key says which KL) and top-1."""

    source: str  # "llama.cpp" (measured) or "emulated" (llama.cpp's arithmetic in OpenVINO)
    row: str
    kl_key: str  # "kl_top_n_mean" or "kl_mean"
    kl: float
    top1: float

    def within(self, figures: dict[str, float | None]) -> bool | None:
        kl, top1 = figures.get(self.kl_key), figures.get("top1")
        if kl is None or top1 is None:
            return None
        return kl <= self.kl + _TOLERANCE and top1 >= self.top1 - _TOLERANCE

    def describe(self) -> str:
        measure = "KL on the top-n lumped support" if self.kl_key == "kl_top_n_mean" else "KL"
        how = "measured through llama-server" if self.source == "llama.cpp" else "emulated in OpenVINO"
        return f"{self.row} ({how}): {measure} mean <= {self.kl:.5f}, top-1 >= {self.top1:.4f}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "row": self.row,
            "kl": self.kl_key,
            "kl_mean": self.kl,
            "top1": self.top1,
        }


@dataclass
class QualityReport:
    bundle: str
    text: dict[str, Any]
    rows: list[Measured]
    budget: Budget | None
    config: QualityConfig
    not_run: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LlamaChoice:
    """Whether and how to measure llama.cpp: ``binary`` (None: find one), threads, and ``off``."""

    binary: Path | None = None
    threads: int = 1
    off: bool = False


def run_quality(
    bundle: ModelBundle,
    candidates: Sequence[Candidate],
    config: QualityConfig,
    *,
    llama: LlamaChoice,
    logs: Path,
    core: Any = None,
) -> QualityReport:
    """The text set through the reference and ``candidates`` (and llama.cpp), compared; speed; budget."""
    import openvino as ov

    from xpuspec.text import Tokenizer

    core = core or ov.Core()
    passages = heldout_text()
    chunks = text_chunks(Tokenizer(bundle.target.path, core), passages, config.chunk_tokens)
    chunks = chunks[: config.max_chunks] if config.max_chunks else chunks
    if not chunks:
        raise ValueError("the quality text gave no chunk of two tokens or more")
    not_run: dict[str, str] = {}
    peers = _llama_peers(bundle, chunks, config, llama, logs, not_run)
    rows, compiled = _compile_all(bundle, candidates, config, chunks, core, not_run)
    if peers is not None:
        rows[LLAMA_ROW] = Measured(LLAMA_ROW, properties="llama.cpp defaults", weights="the GGUF's")
    progress = Progress("quality", len(chunks))
    for index, chunk in enumerate(chunks):
        compare_chunk(compiled[0], compiled[1:], rows, chunk, config.top_n, peers[index] if peers else None)
        progress.advance(f"{len(chunk)} tokens through {len(compiled)} candidates")
    if config.speed_rounds:
        prompt = [token for chunk in chunks for token in chunk][: config.speed_prompt_tokens]
        measure_speed(compiled, rows, prompt, config)
    text = {
        "passages": len(passages),
        "chunks": len(chunks),
        "positions": sum(len(chunk) - 1 for chunk in chunks),
        "chunk_tokens": config.chunk_tokens,
        "top_n": config.top_n,
    }
    ordered = [rows[label] for label in rows]
    return QualityReport(str(bundle.root), text, ordered, choose_budget(rows), config, not_run)


def _compile_all(
    bundle: ModelBundle,
    candidates: Sequence[Candidate],
    config: QualityConfig,
    chunks: Sequence[Sequence[int]],
    core: Any,
    not_run: dict[str, str],
) -> tuple[dict[str, Measured], list[CompiledCandidate]]:
    """The reference first, then each candidate and the emulated llama.cpp row; a candidate the device
    refuses is one line in ``not_run``."""
    plugin = paged_plugin(config.device, core)
    context = max(max(len(chunk) for chunk in chunks), config.speed_prompt_tokens + config.speed_tokens) + 1
    everyone = [
        Candidate(REFERENCE_ROW, bundle.target, dict(EXACT_PROPERTIES)),
        *candidates,
        Candidate(EMULATED_LLAMA, bundle.target, dict(EMULATED_LLAMA_PROPERTIES)),
    ]
    rows: dict[str, Measured] = {}
    compiled: list[CompiledCandidate] = []
    progress = Progress("compile", len(everyone))
    for candidate in everyone:
        try:
            item = compile_candidate(candidate, core, plugin, config.device, context)
        except (RuntimeError, ValueError) as error:
            if candidate.label == REFERENCE_ROW:
                raise
            not_run[candidate.label] = str(error).strip().splitlines()[-1][:200]
            progress.advance(f"{candidate.label}: refused ({not_run[candidate.label]})")
            continue
        compiled.append(item)
        rows[candidate.label] = Measured(
            candidate.label, properties=compiled_keys(item), weights=weights_of(candidate.model)
        )
        progress.advance(f"{candidate.label}: {rows[candidate.label].properties}")
    return rows, compiled


def _llama_peers(
    bundle: ModelBundle,
    chunks: Sequence[Sequence[int]],
    config: QualityConfig,
    llama: LlamaChoice,
    logs: Path,
    not_run: dict[str, str],
) -> list[Any] | None:
    """llama.cpp's distributions on every chunk, or None with one line in ``not_run`` saying why not."""
    from xpuspec.bench.quality_llama import llama_distributions

    if llama.off:
        not_run[LLAMA_ROW] = "not asked for (--no-llama-cpp)"
        return None
    binary, gguf = find_llama_server(llama.binary), bundle_gguf(bundle)
    if binary is None:
        not_run[LLAMA_ROW] = f"no llama-server: build one with {BUILD_SCRIPT}, or pass --llama-server PATH"
        return None
    if gguf is None:
        not_run[LLAMA_ROW] = "the bundle was not prepared from a GGUF file llama.cpp can read"
        return None
    progress = Progress("llama.cpp", len(chunks))
    try:
        return llama_distributions(
            binary,
            gguf,
            chunks,
            config.top_n,
            llama.threads,
            logs / "llama-server.log",
            progress.advance,
            vocab=bundle.target.vocab_size,
        )
    except (httpx.HTTPError, RuntimeError, TimeoutError, ValueError) as error:
        not_run[LLAMA_ROW] = (
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__} (log: {logs})"
        )
        logger.warning("llama.cpp: not run: %s", not_run[LLAMA_ROW])
        return None


def choose_budget(rows: dict[str, Measured]) -> Budget | None:
    """llama.cpp measured where it ran, else the emulated llama.cpp row (see the module doc)."""
    llama = rows.get(LLAMA_ROW)
    if llama is not None and llama.deviation.positions:
        figures = llama.deviation.figures()
        return Budget(
            "llama.cpp",
            LLAMA_ROW,
            "kl_top_n_mean",
            _number(figures["kl_top_n_mean"]),
            _number(figures["top1"]),
        )
    emulated = rows.get(EMULATED_LLAMA)
    if emulated is not None and emulated.deviation.positions:
        figures = emulated.deviation.figures()
        return Budget(
            "emulated", EMULATED_LLAMA, "kl_mean", _number(figures["kl_mean"]), _number(figures["top1"])
        )
    return None


def _number(value: float | None) -> float:
    assert value is not None, "a row with positions has every figure"
    return value
