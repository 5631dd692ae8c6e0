"""After a failure of the step as a whole: every request in flight ends with "error", the engine
goes on (the failure-containment rule of ``xpuspec.engine.engine``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from xpuspec.core.interfaces import Drafter, TargetExecutor
from xpuspec.core.request_stats import RequestStats
from xpuspec.core.sequence import Sequence, SequenceStatus
from xpuspec.engine.outputs import RequestState, StepOutput

logger = logging.getLogger("xpuspec.engine.engine")  # the engine's failures are logged as the engine's


def log_failure(request_ids: list[str], error: BaseException) -> None:
    """The detail goes to the log only: it may quote any request's data (a grammar, its text)."""
    logger.error(
        "engine step failed; ending the %d requests in flight %s",
        len(request_ids),
        sorted(request_ids),
        exc_info=error,
    )


def end_requests(
    sequences: list[Sequence],
    states: dict[str, RequestState],
    retire: Callable[[Sequence], None],
    new_stats: Callable[[], RequestStats],
) -> list[StepOutput]:
    """End each of ``sequences`` (in flight when the step failed) with "error": its KV blocks are
    the old block manager's, dropped with it; ``retire`` forgets it everywhere else. Returns one
    "error" output per request, whose message names that request alone. ``new_stats``: the stats
    of a request whose state is gone."""
    outputs = []
    for sequence in sequences:
        sequence.status = SequenceStatus.FINISHED_ERROR
        sequence.block_table.clear()
        state = states.get(sequence.request_id)
        stats = state.stats if state is not None else new_stats()
        message = f"engine failure, request id {sequence.request_id}: the step serving it failed"
        outputs.append(StepOutput(sequence.request_id, [], True, "error", stats, error=message))
        try:
            retire(sequence)
        except Exception:
            logger.exception("releasing %s after the failure failed", sequence.request_id)
    return outputs


def settle_executors(target: TargetExecutor, proposer: Drafter | None) -> None:
    """Leave no inference pending in the target or the drafter after a failed step."""
    try:
        target.wait()
    except Exception:
        logger.debug("no target inference was pending", exc_info=True)
    if proposer is not None:
        try:
            proposer.recover()
        except Exception:
            logger.exception("the drafter did not recover")
