"""The engine's structured-output hooks around one speculative step.

Kept apart from the engine so its step reads the same with or without constraints:

* :func:`forced_proposals` before drafting: tokens the grammar alone decides (jump-forward);
* :func:`constrain_proposals` after drafting: cuts n-gram proposals at the first forbidden token;
* :func:`prepare_masks` while the target runs: the verification masks of each constrained chunk;
* :func:`mask_target_rows` before the rejection rule: forbidden tokens' logits to -inf.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from xpuspec.spec_decode.proposal import Proposal
from xpuspec.structured.matcher import GuidedRequest


def forced_proposals(
    guides: Mapping[str, GuidedRequest], num_draft_tokens: Mapping[str, int]
) -> dict[str, Proposal]:
    """Jump-forward: proposals of the tokens the grammar alone decides, for the requests that have any.

    Such a request needs no drafter this step. A masked target row with one allowed token is
    one-hot on it whatever the logits, so the forced tokens are accepted with certainty and the
    output is what the target produces through the mask. ``num_draft_tokens``: γ granted per request.
    """
    proposals = {}
    for request_id, guide in guides.items():
        granted = num_draft_tokens.get(request_id, 0)
        forced = guide.forced_tokens(granted) if granted else []
        if forced:
            proposals[request_id] = Proposal(forced, None)  # q one-hot, as for n-gram drafts
    return proposals


def constrain_proposals(proposals: dict[str, Proposal], guides: Mapping[str, GuidedRequest]) -> None:
    """After drafting (lookahead rolled back): cut proposals at the first token the grammar forbids."""
    for request_id, guide in guides.items():
        proposal = proposals.get(request_id)
        if proposal is None or proposal.error is not None or not proposal.token_ids:
            continue
        keep = guide.valid_prefix(proposal.token_ids)
        if keep < len(proposal.token_ids):
            probs = proposal.probs[:keep] if proposal.probs is not None else None
            proposals[request_id] = Proposal(proposal.token_ids[:keep], probs)


def prepare_masks(guides: Mapping[str, GuidedRequest], draft_ids: Mapping[str, list[int]]) -> None:
    """Compute the verification masks of every constrained chunk ahead of its acceptance."""
    for request_id, guide in guides.items():
        guide.prepare(draft_ids.get(request_id, []))


def mask_target_rows(rows: np.ndarray, guide: GuidedRequest, draft_ids: list[int]) -> np.ndarray:
    """``rows`` ([1 + γ, vocab] logits) with the tokens the grammar forbids at each row at -inf."""
    masks = guide.verification_masks(draft_ids)  # [1 + γ, vocab]
    width = min(masks.shape[1], rows.shape[1])
    masked = np.full(rows.shape, -np.inf, dtype=np.float32 if rows.dtype == np.float16 else rows.dtype)
    masked[:, :width] = np.where(masks[:, :width], rows[:, :width], -np.inf)
    return masked
