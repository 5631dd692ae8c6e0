"""The engine's structured-output hooks around one speculative step.

Kept apart from the engine so its step reads the same with or without constraints:

* :func:`guides_of`: the matchers of a step's constrained requests;
* :func:`forced_proposals` before drafting: tokens the grammar alone decides (jump-forward);
* :func:`end_drafting` after drafting: each matcher back at its committed state;
* :func:`constrain_proposals` after drafting: cuts n-gram proposals at the first forbidden token;
* :func:`prepare_masks` while the target runs: the verification masks of each constrained chunk;
* :func:`mask_target_rows` before the rejection rule: forbidden tokens' logits to -inf.

Every hook computes on one request's own grammar, so whatever it raises belongs to that request:
a hook never lets an exception out. A failed request comes back as a :class:`Proposal` with
``error`` set (or, for :func:`prepare_masks`, in the returned failures), and the engine ends that
request alone. :func:`mask_target_rows` is called inside the engine's per-request verification and
and :func:`advance` are called inside the engine's per-request verification and raise
:class:`ConstraintFailure`; the engine ends that request alone too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from xpuspec.core.proposal import Proposal
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.engine.outputs import RequestState
from xpuspec.structured.matcher import GuidedRequest


class ConstraintFailure(ValueError):
    """A request's own output constraint failed while its step was verified; the message says so."""


def guides_of(chunks: list[ScheduledChunk], states: Mapping[str, RequestState]) -> dict[str, GuidedRequest]:
    """The matchers of the constrained requests among ``chunks``, by request id."""
    guides = {}
    for chunk in chunks:
        state = states.get(chunk.sequence.request_id)
        if state is not None and state.guide is not None:
            guides[chunk.sequence.request_id] = state.guide
    return guides


def constraint_failure(error: Exception) -> str:
    """The message that ends a request whose own output constraint failed (the engine logs it)."""
    return f"the output constraint failed: {error}"


def failed_proposal(error: Exception) -> Proposal:
    """The proposal that ends a request whose own output constraint failed."""
    return Proposal([], None, error=constraint_failure(error), failed_constraint=True)


def forced_proposals(
    guides: Mapping[str, GuidedRequest], num_draft_tokens: Mapping[str, int]
) -> dict[str, Proposal]:
    """Jump-forward: proposals of the tokens the grammar alone decides, for the requests that have any.

    Such a request needs no drafter this step. A masked target row with one allowed token is
    one-hot on it whatever the logits, so the forced tokens are accepted with certainty and the
    output is what the target produces through the mask. ``num_draft_tokens``: γ granted per request.
    A request whose grammar fails gets a proposal with ``error``.
    """
    proposals = {}
    for request_id, guide in guides.items():
        granted = num_draft_tokens.get(request_id, 0)
        try:
            forced = guide.forced_tokens(granted) if granted else []
        except Exception as error:
            proposals[request_id] = failed_proposal(error)
            continue
        if forced:
            proposals[request_id] = Proposal(forced, None)  # q one-hot, as for n-gram drafts
    return proposals


def end_drafting(guides: Mapping[str, GuidedRequest], proposals: dict[str, Proposal]) -> None:
    """Roll every matcher's drafting lookahead back; a failed rollback fails that request's proposal."""
    for request_id, guide in guides.items():
        try:
            guide.end_drafting()
        except Exception as error:
            proposals[request_id] = failed_proposal(error)


def constrain_proposals(proposals: dict[str, Proposal], guides: Mapping[str, GuidedRequest]) -> None:
    """After drafting (lookahead rolled back): cut proposals at the first token the grammar forbids."""
    for request_id, guide in guides.items():
        proposal = proposals.get(request_id)
        if proposal is None or proposal.error is not None or not proposal.token_ids:
            continue
        try:
            keep = guide.valid_prefix(proposal.token_ids)
        except Exception as error:
            proposals[request_id] = failed_proposal(error)
            continue
        if keep < len(proposal.token_ids):
            probs = proposal.probs[:keep] if proposal.probs is not None else None
            proposals[request_id] = dataclasses.replace(
                proposal, token_ids=proposal.token_ids[:keep], probs=probs
            )


def prepare_masks(guides: Mapping[str, GuidedRequest], draft_ids: Mapping[str, list[int]]) -> dict[str, str]:
    """Compute the verification masks of every constrained chunk ahead of its acceptance.

    Returns the messages of the requests whose grammar failed (they must not be verified).
    """
    failures = {}
    for request_id, guide in guides.items():
        try:
            guide.prepare(draft_ids.get(request_id, []))
        except Exception as error:
            failures[request_id] = constraint_failure(error)
    return failures


def mask_target_rows(rows: np.ndarray, guide: GuidedRequest, draft_ids: list[int]) -> np.ndarray:
    """``rows`` ([1 + γ, vocab] logits) with the tokens the grammar forbids at each row at -inf.

    Raises :class:`ConstraintFailure` when the grammar fails, or allows no token at a row the step
    may sample (its first row, or a row every draft before it is allowed into): the constraint can
    never be completed.
    """
    try:
        masks = guide.verification_masks(draft_ids)  # [1 + γ, vocab]
    except Exception as error:
        raise ConstraintFailure(constraint_failure(error)) from error
    width = min(masks.shape[1], rows.shape[1])
    allowed_rows = np.asarray(masks[:, :width].any(axis=1))
    for row in range(masks.shape[0]):
        if not allowed_rows[row]:
            raise ConstraintFailure(
                "the output constraint allows no token at this point: the output cannot complete it"
            )
        if row == len(draft_ids) or not masks[row, draft_ids[row]]:
            break  # later rows are read only past an allowed draft
    masked = np.full(rows.shape, -np.inf, dtype=np.float32 if rows.dtype == np.float16 else rows.dtype)
    masked[:, :width] = np.where(masks[:, :width], rows[:, :width], -np.inf)
    return masked


def advance(guide: GuidedRequest, token_ids: list[int]) -> int | None:
    """The matcher consumes the tokens a step emitted; :class:`ConstraintFailure` if it fails.

    Returns how many of them make the output whole when one of them completed the constraint and
    it allows nothing more (only end-of-sequence may follow), else None.
    """
    try:
        for index, token in enumerate(token_ids):
            guide.advance([token])
            if guide.matcher.is_stopped():
                guide.advance(token_ids[index + 1 :])  # end-of-sequence tokens, taken without a trace
                return index + 1
    except Exception as error:
        raise ConstraintFailure(constraint_failure(error)) from error
    return None
