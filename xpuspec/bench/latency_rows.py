"""The latency section's rows and the engines they run on, and the order a round compiles and runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xpuspec.bench.config import BenchConfig
from xpuspec.bench.figures import SKIPPED, LatencyResult
from xpuspec.bench.genai_eagle3 import convert_head, genai_eagle3_unavailable
from xpuspec.bench.latency_labels import (
    ADAPTIVE,
    BEST_PEERS_OF,
    EAGLE3_KEY,
    GENAI,
    GENAI_DEFAULT,
    GENAI_EAGLE3,
    GENAI_EAGLE3_KEY,
    GENAI_LOOKUP,
    GENAI_LOOKUP_KEY,
    LLAMA_CPP,
    PEER_OF,
    TRANSFORMERS,
    TREE_AUTO,
    XPUSPEC,
    XPUSPEC_DEFAULT,
    XPUSPEC_EAGLE3,
    XPUSPEC_EXACT,
    row_label,
)
from xpuspec.bench.latency_runner import XpuspecLatencyRunner
from xpuspec.bench.peers import (
    GenaiLatencyRunner,
    TransformersLatencyRunner,
    genai_unavailable,
    llama_cpp_unavailable,
    transformers_unavailable,
)
from xpuspec.models.bundle import ModelBundle


@dataclass
class Row:
    result: LatencyResult
    engine_key: str | None  # the BenchEngine that runs it; None when skipped
    draft_length: int | str | None
    reference_only: bool = False  # measured in the first round only (the exact reference)


@dataclass
class BenchEngine:
    """One engine configuration, compiled afresh every round by ``build``."""

    key: str
    family: str  # XPUSPEC, GENAI or TRANSFORMERS (see compile_order)
    build: Callable[[], Any]  # -> an object with generate(token_ids, max_tokens, draft_length)
    fresh_per_round: bool = True


@dataclass
class _Rows:
    """The rows being listed and the engines they run on, keyed as ``Row.engine_key`` names them."""

    configs: list[Row] = field(default_factory=list)
    engines: dict[str, BenchEngine] = field(default_factory=dict)

    def add(
        self, label: str, draft_length: int | str | None, key: str | None, reason: str | None, **kw: Any
    ) -> None:
        result = LatencyResult(row_label(label, draft_length), label, draft_length)
        if key is None:
            result.status, result.reason = SKIPPED, reason
        self.configs.append(Row(result, key, draft_length, **kw))


def configurations(
    config: BenchConfig,
    bundle: ModelBundle,
    build_pipeline: Callable[[str, Any, Any], Any],
    same_properties: dict[str, Any],
    default_properties: tuple[dict[str, Any] | None, dict[str, Any] | None],
) -> tuple[list[Row], dict[str, BenchEngine]]:
    """The rows and the engines they run on. ``build_pipeline(drafter, properties, draft_properties)``
    loads an xpuspec Pipeline."""
    rows = _Rows()
    _xpuspec_rows(rows, config, bundle, build_pipeline, same_properties, default_properties)
    _genai_rows(rows, config, bundle, same_properties)
    _transformers_rows(rows, config)
    rows.add(LLAMA_CPP, None, None, llama_cpp_unavailable())
    return rows.configs, rows.engines


def _xpuspec_rows(
    rows: _Rows,
    config: BenchConfig,
    bundle: ModelBundle,
    build_pipeline: Callable[[str, Any, Any], Any],
    same_properties: dict[str, Any],
    default_properties: tuple[dict[str, Any] | None, dict[str, Any] | None],
) -> None:
    """xpuspec's rows: same properties, default, EAGLE-3 (with a head in the bundle) and exact."""
    lengths: list[int | str] = [*config.draft_lengths, ADAPTIVE]
    has_draft = bundle.draft is not None

    def xpuspec_engine(key: str, drafter: str, properties: Any, draft_properties: Any) -> str:
        rows.engines[key] = BenchEngine(
            key, XPUSPEC, lambda: XpuspecLatencyRunner(build_pipeline(drafter, properties, draft_properties))
        )
        return key

    # xpuspec, same properties as GenAI; then as it comes (plan-recorded or plugin properties).
    for label, properties, draft_properties in (
        (XPUSPEC, same_properties, same_properties),
        (XPUSPEC_DEFAULT, *default_properties),
    ):
        rows.add(label, None, xpuspec_engine(f"{label}/none", "none", properties, None), None)
        spec = xpuspec_engine(f"{label}/draft", "draft", properties, draft_properties) if has_draft else None
        # Adaptive γ and automatic trees learn costs and acceptance (of the draft and of prompt
        # lookups) from their own steps: each on an engine of its own, as a user runs it, not one
        # whose other rows fed it their steps.
        own: dict[int | str, str | None] = {
            length: xpuspec_engine(f"{label}/{length}", "draft", properties, draft_properties)
            if has_draft
            else None
            for length in (ADAPTIVE, TREE_AUTO)
        }
        for length in [*lengths, TREE_AUTO]:
            rows.add(label, length, own.get(length, spec), "the bundle has no draft model")
    if bundle.eagle3 is not None:  # the head's rows, same properties; speed-ups over xpuspec target-only
        eagle3 = xpuspec_engine(EAGLE3_KEY, "eagle3", same_properties, same_properties)
        for length in lengths:
            rows.add(XPUSPEC_EAGLE3, length, eagle3, None)
    rows.add(
        XPUSPEC_EXACT, None, xpuspec_engine("exact/none", "none", "exact", None), None, reference_only=True
    )


def _genai_rows(
    rows: _Rows, config: BenchConfig, bundle: ModelBundle, same_properties: dict[str, Any]
) -> None:
    """OpenVINO GenAI's rows: same properties and default, its prompt lookup and its EAGLE-3."""
    has_draft = bundle.draft is not None
    reason = genai_unavailable()
    for label, properties in ((GENAI, same_properties), (GENAI_DEFAULT, {})):
        keys: dict[bool, str] = {}
        if reason is None:
            for speculative in (False, True) if has_draft else (False,):
                key = f"{label}/{'draft' if speculative else 'none'}"
                draft_dir = bundle.draft.path if speculative and bundle.draft is not None else None

                def build(draft_dir: Any = draft_dir, properties: dict[str, Any] = properties) -> Any:
                    return GenaiLatencyRunner(bundle.target.path, draft_dir, properties)

                rows.engines[key] = BenchEngine(key, GENAI, build)
                keys[speculative] = key
        for length in [None, *config.draft_lengths]:
            engine_key = keys.get(length is not None)
            why = reason or ("the bundle has no draft model" if engine_key is None else None)
            rows.add(label, length, engine_key if not why else None, why)
        # GenAI's LLMPipeline has no adaptive draft length; say so rather than leave the row out.
        rows.add(
            label, ADAPTIVE, None, "LLMPipeline has no adaptive draft length (num_assistant_tokens is fixed)"
        )
    lookup_key = None
    if reason is None:
        lookup_key = GENAI_LOOKUP_KEY
        rows.engines[lookup_key] = BenchEngine(
            lookup_key,
            GENAI,
            lambda: GenaiLatencyRunner(bundle.target.path, None, same_properties, prompt_lookup=True),
        )
    for length in config.draft_lengths:
        rows.add(GENAI_LOOKUP, length, lookup_key, reason)
    if bundle.eagle3 is not None:
        _genai_eagle3_rows(config, bundle, same_properties, rows.configs, rows.engines)


def _transformers_rows(rows: _Rows, config: BenchConfig) -> None:
    """transformers' rows (PyTorch), where the bench was given Hugging Face models."""
    target, draft = config.hf_target, config.hf_draft
    reason = transformers_unavailable(target, draft)
    hf_key = None
    if reason is None and target is not None and draft is not None:  # no reason: both are given
        hf_key = "transformers"
        rows.engines[hf_key] = BenchEngine(
            hf_key,
            TRANSFORMERS,
            lambda: TransformersLatencyRunner(target, draft),
            fresh_per_round=False,  # PyTorch compiles nothing: one load serves every round
        )
    for length in [None, *config.draft_lengths, ADAPTIVE]:
        rows.add(TRANSFORMERS, length, hf_key, reason)


def _genai_eagle3_rows(
    config: BenchConfig,
    bundle: ModelBundle,
    same_properties: dict[str, Any],
    configs: list[Row],
    engines: dict[str, BenchEngine],
) -> None:
    """GenAI's EAGLE-3 with the bundle's head, a chain of each draft length, same properties; or one row
    saying why it does not run ("not run: <reason>")."""

    def add(name: str, draft_length: int | str | None, key: str | None, reason: str | None) -> None:
        result = LatencyResult(name, GENAI_EAGLE3, draft_length)
        if key is None:
            result.status, result.reason = SKIPPED, reason
        configs.append(Row(result, key, draft_length))

    reason = genai_eagle3_unavailable(bundle)
    if reason is not None:
        add(GENAI_EAGLE3, None, None, f"not run: {reason}")
        return

    def build() -> Any:
        # Converted once into the cache (torch tracing, seconds); later rounds only compile it afresh.
        return GenaiLatencyRunner(bundle.target.path, convert_head(bundle), same_properties)

    engines[GENAI_EAGLE3_KEY] = BenchEngine(GENAI_EAGLE3_KEY, GENAI, build)
    for length in config.draft_lengths:
        add(row_label(GENAI_EAGLE3, length), length, GENAI_EAGLE3_KEY, None)
    add(
        row_label(GENAI_EAGLE3, ADAPTIVE),
        ADAPTIVE,
        None,
        "GenAI's EAGLE-3 has no adaptive draft length (num_assistant_tokens is fixed)",
    )


def peer_engine(key: str) -> str | None:
    """The GenAI engine whose rows the rows of xpuspec engine ``key`` are compared with, if any."""
    if key == EAGLE3_KEY:
        return GENAI_EAGLE3_KEY
    if key == f"{XPUSPEC}/{ADAPTIVE}":
        return GENAI_LOOKUP_KEY  # GenAI's usual best row beside adaptive γ
    label, _, suffix = key.rpartition("/")
    peer = PEER_OF.get(label)
    return f"{peer}/{suffix}" if peer is not None and suffix in ("none", "draft") else None


def compile_order(engines: dict[str, BenchEngine], round_index: int) -> list[BenchEngine]:
    """The order in which a round compiles its engines: each xpuspec engine right beside its GenAI
    peer (:func:`peer_engine`), which of the two goes first alternating from round to round; the
    engines without a peer after them.

    In one process an engine compiled earlier in a round runs slower than one compiled later. When the
    bench compiled all of one family's engines before the other's, a row's ratio to its GenAI peer
    flipped with the order from round to round (measured on the 110M random target:
    docs/experiments/benchmark-history.md), and with an odd number of rounds that bias went to one
    family; beside each other a pair differs by a place.
    """
    order: list[BenchEngine] = []
    placed: set[str] = set()
    for key, engine in engines.items():
        if key in placed or engine.family != XPUSPEC:
            continue
        pair = [engine]
        peer = engines.get(peer_engine(key) or "")
        if peer is not None and peer.key not in placed:
            pair.append(peer)
        if round_index % 2:
            pair.reverse()
        order += pair
        placed.update(e.key for e in pair)
    return order + [e for e in engines.values() if e.key not in placed]


def adjacent_peers(entries: list[Row]) -> list[Row]:
    """``entries`` reordered so each row's peer (the row its ÷ GenAI divides by) runs right after it.

    A round runs every row on a prompt before the next prompt, so a row and its peer in the table's
    order ran many rows (seconds to tens of seconds) apart, and a slow spell of the machine fell
    on one of them; neighbours run within a request of each other. The adaptive and tree rows, whose
    peer is the best of the peer's rows (known only after the rounds), are followed by the peer rows
    not yet placed (GenAI's prompt lookup). Order within each group is kept.
    """
    ordered: list[Row] = []
    placed: set[int] = set()

    def place(entry: Row) -> None:
        ordered.append(entry)
        placed.add(id(entry))

    for entry in entries:
        if id(entry) in placed:
            continue
        place(entry)
        engine, length = entry.result.engine, entry.result.draft_length
        peer = PEER_OF.get(engine)
        if peer is None:
            continue
        if length in (ADAPTIVE, TREE_AUTO):
            peers = BEST_PEERS_OF.get(engine, (peer,))
            for other in entries:
                if id(other) not in placed and other.result.engine in peers:
                    place(other)
            continue
        for other in entries:
            if id(other) not in placed and (other.result.engine, other.result.draft_length) == (peer, length):
                place(other)
                break
    return ordered
