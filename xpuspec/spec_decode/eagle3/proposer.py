"""EAGLE-3 drafting for the engine: a chain of γ tokens per sequence from the target's own hidden states.

The target's states of every computed token reach the head through :meth:`Eagle3Proposer.observe_target`
and wait in the sequences' shared state (:mod:`xpuspec.spec_decode.eagle3.head_state`, which says what
is kept and at which positions). Drafting a chain: one catch-up pass over a sequence's pending slots
(:meth:`HeadStates.catch_up_step`) yields the first draft from its last row; each further draft is one
rollout pass at the next slot, feeding the head's previous ``hidden_out`` and the token just drafted.
Rollout slots hold the head's own states, so the head's KV is cut back to the target-backed slots at the
end of every ``propose``. A lone greedy, unconstrained sequence (the latency case) gets the catch-up and
the rollout in one call instead (:meth:`HeadExecutor.draft_greedy_chain`: the same drafts, without a
call and a loop iteration per token) once the executor can run that chain in one call.

The head's executor is passed in (:class:`~xpuspec.spec_decode.eagle3.head.HeadExecutor`; the OpenVINO
one is :class:`xpuspec.executor.eagle3_head.Eagle3Head`). Trees: :meth:`Eagle3Proposer.tree_drafter`
(:mod:`xpuspec.spec_decode.eagle3.tree`), on the same per-sequence states.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import numpy as np

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.interfaces import DrafterCaps
from xpuspec.core.proposal import Proposal, TokenDraw
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.sample.sampler import probabilities
from xpuspec.spec_decode.eagle3.head import HeadExecutor, HeadStep, HeadStepResult
from xpuspec.spec_decode.eagle3.head_state import HeadStates
from xpuspec.spec_decode.eagle3.tree import Eagle3TreeDrafter

logger = logging.getLogger(__name__)

# The head's KV of the calibration passes (measure_step_seconds); no request id starts with NUL.
_MEASURE_ID = "\x00eagle3-measure"

# (request_id, tokens drafted so far this step, logits [1, vocab]) -> logits with the tokens the
# request's output constraint forbids at -inf (the engine's; it may raise).
DraftMask = Callable[[str, list[int], np.ndarray], np.ndarray]


class Eagle3Proposer:
    """A :class:`xpuspec.core.interfaces.Drafter` drafting chains with an EAGLE-3 head (trees:
    :meth:`tree_drafter`).

    ``target_states`` returns the last target step's tapped states ``[num_tokens, 3 * hidden]``, or
    ``[num_tokens, hidden]`` already fused when the target's taps carry the head's ``fc``
    (``PagedModelRunner.hidden_states``); ``target_vocab_size`` is the width of the target's logits.
    """

    # Reads the target's state of every token in order: the engine pads no step, caches no prefix,
    # runs no target-only burst and drafts no prompt lookup beside it. The drafts come from the
    # step the target verifies, so drafting cannot overlap it.
    caps = DrafterCaps(
        needs_every_target_state=True,
        drafts_trees=True,
        constraint_aware=True,
        overlappable=False,
        is_draft_model=False,
        shares_block_tables=False,
    )

    def __init__(
        self, head: HeadExecutor, target_states: Callable[[], np.ndarray], target_vocab_size: int
    ) -> None:
        if head.config.vocab_size != target_vocab_size:
            raise ValueError(
                f"the EAGLE-3 head maps into a vocabulary of {head.config.vocab_size}, the target's logits "
                f"have {target_vocab_size}: it is not this target's head"
            )
        self.head = head
        self.target_states = target_states
        self.target_vocab_size = target_vocab_size
        self.step_timings: list[tuple[int, float]] = []
        self.states = HeadStates(head)
        self._draft_mask: DraftMask | None = None

    # --- the engine's hand-off -------------------------------------------------------------------

    def observe_target(
        self,
        chunks: list[ScheduledChunk],
        runner_chunks: list[SequenceChunk],
        tree_paths: Mapping[str, list[int]] | None = None,
    ) -> None:
        """Keep the target states of the step's tokens that are computed after acceptance
        (:meth:`HeadStates.observe`)."""
        self.states.observe(self.target_states(), chunks, runner_chunks, tree_paths)

    def set_draft_mask(self, mask: DraftMask | None) -> None:
        """Mask each constrained request's draft rows by its output constraint (the engine's)."""
        self._draft_mask = mask

    # --- Drafter ---------------------------------------------------------------------------------

    def tree_drafter(self) -> Eagle3TreeDrafter:
        """The drafter of trees with this head (the engine's ``draft_tree`` requests)."""
        return Eagle3TreeDrafter(self.states, self.target_vocab_size)

    def warm_up(self, max_model_len: int) -> None:
        """Nothing to warm: the head's pass graph is compiled when it is built, and a greedy chain's
        graph compiles in the background at its first use (drafted pass by pass meanwhile)."""

    def release(self, sequence_id: str) -> None:
        self.states.release(sequence_id)

    def recover(self) -> None:
        # A failed step ends every request in flight; the head's passes are synchronous, so only the
        # per-sequence state (perhaps half-updated by the failed pass) needs dropping.
        self.states.release_all()

    def measure_step_seconds(self, context: int = 1, tokens: int = 1) -> float:
        hidden = self.head.config.hidden_size
        past = max(context - tokens, 0)
        if self.head.kv_length(_MEASURE_ID) < past:  # a cache of `past` slots, built once, untimed
            self.head.release(_MEASURE_ID)
            self.head.run([HeadStep(_MEASURE_ID, [0] * past, np.zeros((past, hidden), np.float32))])
        self.head.truncate(_MEASURE_ID, past)
        step = HeadStep(_MEASURE_ID, [0] * tokens, np.zeros((tokens, hidden), np.float32))
        started = time.perf_counter()
        self.head.run([step])
        seconds = time.perf_counter() - started
        self.head.truncate(_MEASURE_ID, past)
        return seconds

    def propose(self, chunks: list[ScheduledChunk], draw: TokenDraw) -> dict[str, Proposal]:
        self.step_timings = []
        drafting: list[ScheduledChunk] = []
        steps: list[HeadStep] = []
        for chunk in chunks:
            if chunk.num_draft_tokens == 0:
                continue
            step = self.states.catch_up_step(chunk.sequence)
            if step is not None:
                drafting.append(chunk)
                steps.append(step)
        if not steps:
            return {}
        try:
            if self._drafts_greedy_chain(drafting):
                proposals = self._draft_greedy_chain(drafting[0], steps[0])
                if proposals is not None:  # None: that chain's graph is not compiled yet
                    return proposals
            return self._draft(drafting, self._timed_run(steps), draw)
        finally:
            # Rollout slots hold the head's own states: cut back to the target-backed ones.
            self.states.cut_back(chunk.sequence for chunk in drafting)

    def _drafts_greedy_chain(self, drafting: list[ScheduledChunk]) -> bool:
        """A lone greedy, unconstrained sequence drafting two or more tokens: the latency case, drafted in
        one call (:meth:`HeadExecutor.draft_greedy_chain`) instead of a call and a Python loop a token."""
        if len(drafting) != 1 or drafting[0].num_draft_tokens < 2:
            return False
        params = drafting[0].sequence.params
        return params.greedy and not params.constrained

    def _draft_greedy_chain(self, chunk: ScheduledChunk, step: HeadStep) -> dict[str, Proposal] | None:
        request_id, count = chunk.sequence.request_id, chunk.num_draft_tokens
        started = time.perf_counter()
        drafted = self.head.draft_greedy_chain(step, count)
        if drafted is None:
            return None
        token_ids, logit_sums = drafted
        share = (time.perf_counter() - started) / count
        # The cost model times passes: the call's time shared among them (the first one catches up).
        self.step_timings += [(len(step.token_ids), share)] + [(1, share)] * (count - 1)
        if not np.isfinite(logit_sums).all():
            error = "drafting failed: the EAGLE-3 head's logits hold NaN or infinity"
            logger.warning("EAGLE-3 %s for %s", error, request_id)
            return {request_id: Proposal([], None, error=error)}
        return {request_id: Proposal(token_ids.tolist(), None)}

    def _timed_run(self, steps: list[HeadStep]) -> list[HeadStepResult]:
        started = time.perf_counter()
        results = self.head.run(steps)
        self.step_timings.append((sum(len(step.token_ids) for step in steps), time.perf_counter() - started))
        return results

    def _draft(
        self, drafting: list[ScheduledChunk], results: list[HeadStepResult], draw: TokenDraw
    ) -> dict[str, Proposal]:
        """γ tokens per sequence: the catch-up's ``results`` give the first, rollout passes the rest."""
        token_ids: dict[str, list[int]] = {c.sequence.request_id: [] for c in drafting}
        probs: dict[str, list[np.ndarray]] = {c.sequence.request_id: [] for c in drafting}
        errors: dict[str, str] = {}
        stopped: set[str] = set()  # the output constraint left nothing the head can draft
        active = drafting
        for step in range(max(c.num_draft_tokens for c in drafting)):
            if step > 0:
                carried = {id(c): r.hidden[-1:] for c, r in zip(active, results, strict=True)}
                active = [
                    c
                    for c in active
                    if c.num_draft_tokens > step
                    and c.sequence.request_id not in errors
                    and c.sequence.request_id not in stopped
                ]
                if not active:
                    break
                results = self._timed_run(
                    [
                        HeadStep(
                            c.sequence.request_id,
                            token_ids[c.sequence.request_id][-1:],
                            carried[id(c)],  # [1, hidden]: the previous pass's state, before the norm
                            # The catch-up's last slot was num_computed_tokens - 1.
                            positions=[c.sequence.num_computed_tokens - 1 + step],
                        )
                        for c in active
                    ]
                )
            for chunk, result in zip(active, results, strict=True):
                request_id = chunk.sequence.request_id
                try:
                    drafted = self._draft_token(chunk, step, result.logits, token_ids[request_id], draw)
                except Exception as error:  # this sequence's row alone (e.g. NaN in its logits)
                    logger.warning("EAGLE-3 drafting failed for %s: %s", request_id, error)
                    errors[request_id] = f"drafting failed: {error}"
                    continue
                if drafted is None:
                    stopped.add(request_id)
                    continue
                token, row_probs = drafted
                token_ids[request_id].append(token)
                if row_probs is not None:
                    probs[request_id].append(row_probs)
        proposals = {}
        for request_id, ids in token_ids.items():
            if request_id in errors:
                proposals[request_id] = Proposal([], None, error=errors[request_id])
            elif ids:
                proposals[request_id] = Proposal(
                    ids, np.stack(probs[request_id]) if probs[request_id] else None
                )
        return proposals

    def _draft_token(
        self, chunk: ScheduledChunk, step: int, logits: np.ndarray, drafted: list[int], draw: TokenDraw
    ) -> tuple[int, np.ndarray | None] | None:
        """The target id drafted at ``step`` from the head's logits ``[1, draft vocab]``, with its q row
        over the target vocabulary when sampled; None when the output constraint allows no draft id."""
        params = chunk.sequence.params
        if not np.isfinite(logits.max()):
            raise ValueError("the EAGLE-3 head's logits hold NaN or infinity")
        if self._draft_mask is not None and params.constrained:
            # The grammar masks target ids: scatter, mask, and read the draft columns back (only for
            # constrained requests: the scatter costs time at large vocabularies).
            masked = self._draft_mask(chunk.sequence.request_id, drafted, self.head.target_logits(logits))
            logits = masked[:, self.head.target_ids]  # [1, draft vocab]
            if not np.isfinite(logits.max()):
                return None
        if params.greedy:
            return int(self.head.target_ids[int(np.argmax(logits[0]))]), None
        # Zero probability outside the draft vocabulary: the rejection sampler then recovers those
        # ids from the target's residual, which keeps the output the target's distribution.
        row_probs = np.zeros(self.target_vocab_size, np.float64)  # [vocab]
        row_probs[self.head.target_ids] = probabilities(logits, params)[0]
        position = chunk.sequence.num_tokens + step
        return draw(chunk.sequence.request_id, position, row_probs), row_probs
