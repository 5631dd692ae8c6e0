"""What a drafter hands the engine: the draft tokens of one sequence, and how they were drawn."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# draw(request_id, position, probs_row [vocab]) -> token: the engine's sampling of one draft token
# at a sequence position (the request's random stream, or its position's noise when seeded).
TokenDraw = Callable[[str, int, np.ndarray], int]


@dataclass
class Proposal:
    """γ draft tokens for one sequence, and the draft distribution each was drawn from.

    ``error`` says that drafting failed for this sequence alone (e.g. NaN in its draft logits):
    the engine ends that request with finish_reason "error" and the batch goes on.
    """

    token_ids: list[int]  # [γ]
    probs: np.ndarray | None  # [γ, vocab]; None for a deterministic drafter (q is one-hot)
    error: str | None = None
    # The error is the request's own output constraint's (a client's mistake), not the drafter's.
    failed_constraint: bool = False
    # A tree instead of a chain (xpuspec.spec_decode.tree.DraftTree): the parent of each draft
    # token, -1 for the root's children; None for a chain.
    tree_parents: list[int] | None = None
    # Drafted by the engine's prompt lookup beside the drafter (LLMEngine.prompt_lookup): the length
    # of the n-gram that matched (0: the drafter's). Its acceptance is tracked apart.
    lookup_ngram: int = 0
    # The lookup's match came from other requests' tokens (xpuspec.spec_decode.suffix_index).
    lookup_shared: bool = False
