"""After a failure of the step as a whole: every request in flight ends with "error", the engine
goes on (the failure-containment rule of ``xpuspec.engine.engine``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from xpuspec.core.request_stats import RequestStats
from xpuspec.core.sequence import SequenceStatus
from xpuspec.engine.outputs import StepOutput

if TYPE_CHECKING:
    from xpuspec.engine.view import EngineView

logger = logging.getLogger("xpuspec.engine.engine")  # the engine's failures are logged as the engine's


def recover(engine: EngineView, error: BaseException) -> list[StepOutput]:
    """End every request in flight with "error".

    Frees every KV block by rebuilding the scheduler and its block manager (their state may be
    half-updated), releases executor state, and leaves the engine ready for new requests. The cost
    model keeps its measurements: they come from steps that completed. Returns the outputs of the
    step so far plus one "error" output per request that was in flight.
    """
    # The detail goes to the log only: it may quote any request's data (a grammar, its text).
    logger.error(
        "engine step failed; ending the %d requests in flight %s",
        len(engine.sequences),
        sorted(engine.sequences),
        exc_info=error,
    )
    engine.num_engine_failures += 1
    settle_executors(engine)
    sequences = list(engine.sequences.values())
    engine.build_scheduler()
    if engine.draft_choice is not None:
        engine.draft_choice.steps_without_drafting = 0
    for sequence in sequences:
        sequence.status = SequenceStatus.FINISHED_ERROR
        sequence.block_table.clear()
        state = engine.states.get(sequence.request_id)
        stats = (
            state.stats if state is not None else RequestStats(engine.clock(), engine.config.max_draft_tokens)
        )
        message = f"engine failure, request id {sequence.request_id}: the step serving it failed"
        engine.step_outputs.append(StepOutput(sequence.request_id, [], True, "error", stats, error=message))
        engine.num_requests_failed += 1
        try:
            engine.retire(sequence)
        except Exception:
            logger.exception("releasing %s after the failure failed", sequence.request_id)
    return engine.step_outputs


def settle_executors(engine: EngineView) -> None:
    """Leave no inference pending in the target or the drafter after a failed step."""
    try:
        engine.target.wait()
    except Exception:
        logger.debug("no target inference was pending", exc_info=True)
    if engine.proposer is not None:
        try:
            engine.proposer.recover()
        except Exception:
            logger.exception("the drafter did not recover")
