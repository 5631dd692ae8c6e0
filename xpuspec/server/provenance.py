"""Speculation provenance in streamed chunks: the opt-in ``xpuspec`` field of each chunk.

With ``stream_options: {"include_speculation": true}`` every text chunk carries
``"xpuspec": {"runs": [...]}``: the chunk's text cut into runs, each ``{"text", "tokens",
"accepted_draft"}``, whose texts concatenate to the chunk's text. ``accepted_draft`` true: the run's
tokens were drafts the target accepted; false: tokens the target chose itself. Text the detokenizer
or a stop string held back shows in the run of the token that released it, so ``tokens`` is exact
and the text boundary is as close as the text allows. A choice's finishing chunk adds
``"speculation"``: the engine's figures for that choice (:func:`summary`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xpuspec.api.engine_loop import ChoiceEvent
from xpuspec.core.request_stats import RequestStats
from xpuspec.sample.draft_tree import TreeShape
from xpuspec.sample.sampling_params import SamplingParams


@dataclass(frozen=True)
class Speculation:
    """How one request speculates, as the client is told: the drafter and the γ policy."""

    drafter: str
    gamma_policy: str


def speculation_of(params: SamplingParams, server_drafter: str) -> Speculation:
    """The drafter and γ policy a request with ``params`` runs under on a server with ``server_drafter``."""
    if params.num_draft_tokens == 0 or server_drafter == "none":
        return Speculation("none", "off")
    tree = params.draft_tree
    if isinstance(tree, TreeShape):
        policy = f"tree depth {tree.depth}, width {tree.width}, {tree.nodes} nodes"
    elif tree is not None:
        policy = f"tree {tree}"
    elif params.num_draft_tokens is not None:
        policy = f"fixed γ={params.num_draft_tokens}"
    else:
        policy = "adaptive γ"
    return Speculation(server_drafter, policy)


class Runs:
    """The provenance runs of one choice's text not yet sent, and its accepted drafts so far."""

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.accepted_tokens = 0

    def add(self, event: ChoiceEvent) -> None:
        drafts = event.num_accepted_drafts
        cut = event.draft_chars if drafts else 0
        self.accepted_tokens += drafts
        if drafts:
            self._append(event.text[:cut], drafts, True)
        if event.num_new_tokens > drafts or event.text[cut:]:
            self._append(event.text[cut:], event.num_new_tokens - drafts, False)

    def _append(self, text: str, tokens: int, accepted: bool) -> None:
        last = self.pending[-1] if self.pending else None
        if last is not None and last["accepted_draft"] == accepted:
            last["text"] += text
            last["tokens"] += tokens
        else:
            self.pending.append({"text": text, "tokens": tokens, "accepted_draft": accepted})

    def take(self) -> list[dict[str, Any]]:
        runs, self.pending = self.pending, []
        return runs


def summary(stats: RequestStats | None, speculation: Speculation, accepted_tokens: int) -> dict[str, Any]:
    """The ``speculation`` object of a choice's finishing chunk.

    ``drafted`` / ``accepted`` are the engine's verification counts (as in /metrics; a draft accepted
    beyond ``max_tokens`` or a stop string counts there); ``accepted_tokens`` counts the output tokens
    that were accepted drafts: the sum of the ``tokens`` of the ``accepted_draft`` runs."""
    out: dict[str, Any] = {
        "drafter": speculation.drafter,
        "gamma_policy": speculation.gamma_policy,
        "accepted_tokens": accepted_tokens,
    }
    if stats is None:
        return out
    passes = stats.target_passes
    return {
        **out,
        "output_tokens": stats.num_output_tokens,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "verification_steps": stats.verification_steps,
        "target_passes": passes,
        "tokens_per_target_pass": stats.num_output_tokens / passes if passes else None,
        # Steps by what the speculation policy chose, and why it drafted nothing where it did not.
        "drafting_decisions": dict(stats.drafting_decisions),
        "ttft_s": stats.ttft_s,
        "tokens_per_s": stats.tokens_per_s,
    }
