"""The latency section's comparisons: greedy agreement with the exact reference and xpuspec over its peers."""

from __future__ import annotations

import statistics
from typing import Any

from xpuspec.bench.figures import OK, LatencyResult
from xpuspec.bench.latency_labels import (
    ADAPTIVE,
    BEST_PEERS_OF,
    GENAI,
    PEER_OF,
    TRANSFORMERS,
    TREE_AUTO,
    XPUSPEC,
    XPUSPEC_EXACT,
)
from xpuspec.planning.agreement import compare


def compare_tokens(results: list[LatencyResult], summaries: dict[str, dict[str, Any]]) -> None:
    """Greedy agreement with the exact reference: requests whose tokens equal those of xpuspec
    target-only in exact mode (falling back to xpuspec target-only when the reference did not run)."""
    reference = next((r for r in results if r.engine == XPUSPEC_EXACT and r.requests), None)
    reference = reference or next(
        (r for r in results if r.engine == XPUSPEC and r.draft_length is None), None
    )
    if reference is None or not reference.requests:
        return
    expected = [t.token_ids for t in reference.requests]
    for result in results:
        if result.requests:
            same = sum(t.token_ids == e for t, e in zip(result.requests, expected, strict=True))
            summaries[result.name]["same_tokens_as_exact"] = f"{same}/{len(expected)}"
            summaries[result.name]["same_tokens_reference"] = reference.name
    # Speculative against target-only under the same properties (the same engine's target-only row).
    target_only = {r.engine: r for r in results if r.draft_length is None and r.requests}
    for result in results:
        alone = target_only.get(result.engine)
        if result.draft_length is not None and result.requests and alone is not None:
            agreement = compare([t.token_ids for t in alone.requests], [t.token_ids for t in result.requests])
            summaries[result.name]["same_tokens_as_target_only"] = f"{agreement.same}/{agreement.total}"


def paired_ratios(ours: LatencyResult, peer: LatencyResult, prompts: list[int] | None = None) -> list[float]:
    """The peer's seconds over ours, run by run: one ratio per prompt per round (>1: xpuspec is faster).

    The two runs of a pair ran the same prompt in the same round, back to back where the rows are
    neighbours (see :func:`adjacent_peers`), so a slow spell of the machine falls on both; runs of
    different rounds or prompts are never divided. ``prompts``: only these prompt indices.
    """
    if len(ours.prompt_seconds) != len(peer.prompt_seconds):
        return []
    ratios = []
    for mine, theirs in zip(ours.prompt_seconds, peer.prompt_seconds, strict=True):
        if len(mine) != len(theirs):
            return []
        for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            if a > 0 and (prompts is None or index in prompts):
                ratios.append(b / a)
    return ratios


def peer_ratios(results: list[LatencyResult], summaries: dict[str, dict[str, Any]]) -> None:
    """xpuspec over each peer row at the same draft length (>1: xpuspec is faster).

    Same-properties rows compare with GenAI at the same properties, default rows with GenAI's default;
    the adaptive and tree rows, which GenAI lacks, compare with GenAI's best row, target-only included
    (a user of GenAI who finds drafting slower runs without it) and, for the same-properties rows, its
    prompt lookup (xpuspec's adaptive γ also looks up). The ratio is
    the median of the paired runs' ratios (:func:`paired_ratios`), which a run slowed by the machine
    moves little; the best rows' tokens/s ratio where the runs cannot be paired. Per-prompt bests
    summed, the rows' tokens/s, let one round in which the peer happened to run on a quiet machine
    decide the ratio: on the 110M target they gave a ratio below most of its rounds' own
    (docs/experiments/code-comment-figures.md).
    """
    rate = {(r.engine, r.draft_length): summaries[r.name].get("tokens_per_s") for r in results}
    rows = {(r.engine, r.draft_length): r for r in results if r.status == OK}
    for result in results:
        genai = PEER_OF.get(result.engine)
        if genai is None:
            continue
        ratios: dict[str, float | None] = {}
        ours = rate.get((result.engine, result.draft_length))
        if result.draft_length in (ADAPTIVE, TREE_AUTO):
            peers = BEST_PEERS_OF.get(result.engine, (genai,))
            fixed = [
                key
                for key, v in rate.items()
                if key[0] in peers and (key[1] is None or isinstance(key[1], int)) and v
            ]
            best = max(fixed, key=lambda key: rate[key] or 0.0, default=None)
        else:
            best = (genai, result.draft_length) if rate.get((genai, result.draft_length)) else None
        theirs = rate.get(best) if best is not None else None
        peer_row = rows.get(best) if best is not None else None
        paired = paired_ratios(result, peer_row) if ours and peer_row is not None else []
        if paired:
            ratios[GENAI] = statistics.median(paired)
            summaries[result.name]["paired_ratios_to_genai"] = paired
        else:
            ratios[GENAI] = ours / theirs if ours and theirs else None
        if ours and peer_row is not None and len(peer_row.round_seconds) == len(result.round_seconds):
            # The same ratio round by round (the rounds run the same tokens): its spread is the noise.
            summaries[result.name]["round_ratios_to_genai"] = [
                theirs_s / ours_s
                for ours_s, theirs_s in zip(result.round_seconds, peer_row.round_seconds, strict=True)
            ]
        if ours and peer_row is not None and len(peer_row.requests) == len(result.requests):
            # Time per token depends on the text (a lookup accepts more on repetitive text), and at
            # bf16 a run's text departs from another's where their chunk sizes or KV precisions differ
            # (GenAI's prompt lookup from xpuspec target-only on most demo prompts; the default rows,
            # u8 against bf16 KV, on some: docs/experiments/code-comment-figures.md). So the ratio
            # also over the prompts both wrote alike.
            equal = [
                index
                for index, (mine, peer) in enumerate(zip(result.requests, peer_row.requests, strict=True))
                if mine.token_ids == peer.token_ids
            ]
            summaries[result.name]["equal_outputs_with_genai"] = f"{len(equal)}/{len(result.requests)}"
            paired_equal = paired_ratios(result, peer_row, equal) if equal else []
            summaries[result.name]["ratio_to_genai_on_equal_outputs"] = (
                statistics.median(paired_equal) if paired_equal else None
            )
        if result.engine == XPUSPEC:
            hf = rate.get((TRANSFORMERS, result.draft_length))
            ratios[TRANSFORMERS] = ours / hf if ours and hf else None
        summaries[result.name]["ratio_to_peers"] = ratios
