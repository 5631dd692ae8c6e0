"""What `xpuspec bench --quick` runs: the rows of a quick look, and engines compiled a pair at a time.

A quick look answers three questions: how fast xpuspec is on this machine, whether drafting pays,
and how it compares with OpenVINO GenAI on the same model. So it keeps the same-properties group
(both engines compiled with the same properties, so ÷ GenAI compares the engines alone):

- xpuspec target-only, speculative at the quick draft lengths (one engine serves every fixed γ) and
  adaptive γ (what `xpuspec generate` and `serve` do by default);
- GenAI's target-only and speculative rows beside them;
- xpuspec exact target-only: the reference of the "= exact" column;
- transformers' rows when Hugging Face checkpoints are given.

The full bench adds the default-properties group, tree drafting, EAGLE-3 (xpuspec's and GenAI's),
GenAI's prompt lookup, the structured-output section and the rows that cannot run here.

Engines are compiled a pair at a time (each xpuspec engine with its GenAI peer, run interleaved prompt
by prompt so ÷ GenAI stays paired) and freed before the next pair: a round of the full bench holds
every engine at once, which on the default model took most of a small machine's memory.
"""

from __future__ import annotations

from xpuspec.bench.latency_labels import ADAPTIVE, GENAI, TRANSFORMERS, TREE_AUTO, XPUSPEC, XPUSPEC_EXACT
from xpuspec.bench.latency_rows import BenchEngine, Row, compile_order, peer_engine

QUICK_ENGINES = (XPUSPEC, GENAI, XPUSPEC_EXACT, TRANSFORMERS)  # the row groups a quick look keeps


def quick_rows(
    configs: list[Row], engines: dict[str, BenchEngine]
) -> tuple[list[Row], dict[str, BenchEngine]]:
    """The rows of a quick look (see the module's docstring) and the engines they run on."""
    kept = [
        row
        for row in configs
        if row.result.engine in QUICK_ENGINES
        and row.draft_length != TREE_AUTO
        # Rows a peer lacks (GenAI's adaptive γ) or that need what was not given (transformers
        # without checkpoints) say nothing in a quick look.
        and not (row.result.engine in (GENAI, TRANSFORMERS) and row.draft_length == ADAPTIVE)
        and not (row.result.engine == TRANSFORMERS and row.engine_key is None)
    ]
    keys = {row.engine_key for row in kept}
    return kept, {key: engine for key, engine in engines.items() if key in keys}


def engine_groups(engines: dict[str, BenchEngine], round_index: int) -> list[list[BenchEngine]]:
    """The round's engines in :func:`compile_order`, cut into groups compiled and freed together: each
    xpuspec engine with its GenAI peer, every other engine alone."""
    groups: list[list[BenchEngine]] = []
    for engine in compile_order(engines, round_index):
        if groups and len(groups[-1]) == 1 and _paired(groups[-1][0], engine):
            groups[-1].append(engine)
        else:
            groups.append([engine])
    return groups


def _paired(first: BenchEngine, second: BenchEngine) -> bool:
    return peer_engine(first.key) == second.key or peer_engine(second.key) == first.key
