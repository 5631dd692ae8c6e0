"""What the step's phases use of the engine: :class:`EngineView`, a Protocol ``LLMEngine`` satisfies.

``xpuspec.engine.engine`` composes the phases (drafting, verification, bursts and the step
strategies) and hands each what it uses. Most of it comes as arguments; what changes under the
phases (the scheduler and its block manager are rebuilt after a failed step) or ends a request
(which every structure of the engine must forget) they reach through this view, by its name and not
by ``LLMEngine``'s: a phase importing the module that imports it would close a cycle of imports, a
type-only one included (tests/test_architecture.py). The view declares exactly what the phases use;
tests/engine/test_engine_view.py checks that, and that the engine has it. Recovery and calibration
take their arguments only.

A phase returns what it produced (proposals, a :class:`~xpuspec.engine.outputs.StepOutput` per
request, the accepted tree paths); a request that fails comes back as an output with finish_reason
"error" from :meth:`EngineView.fail`. Nothing here holds the step's outputs: the step does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from xpuspec.core.block_manager import BlockManager
from xpuspec.core.interfaces import Drafter, TargetExecutor
from xpuspec.core.prefix_cache import PrefixCachingBlockManager
from xpuspec.core.scheduler import Scheduler
from xpuspec.core.sequence import Sequence, SequenceStatus
from xpuspec.engine.outputs import EngineConfig, RequestState, StepOutput
from xpuspec.spec_decode.policy import SpeculationPolicy

__all__ = ["EngineView"]


class EngineView(Protocol):
    """The engine as its phases see it (``xpuspec.engine.engine.LLMEngine``)."""

    # The executors, the configuration, the clock and the speculation policy.
    target: TargetExecutor
    proposer: Drafter | None
    config: EngineConfig
    clock: Callable[[], float]
    policy: SpeculationPolicy

    # The requests in flight, and the scheduler and KV blocks (rebuilt after a failed step).
    states: dict[str, RequestState]
    scheduler: Scheduler
    block_manager: BlockManager | PrefixCachingBlockManager

    # Timing the phases (``xpuspec.engine.strategy.PhaseHooks``).
    def phase_started(self) -> float: ...

    def phase_ended(self, name: str, started: float) -> None: ...

    # Ending requests: every structure of the engine forgets them.
    def finish(self, sequence: Sequence, status: SequenceStatus) -> None: ...

    def fail(self, sequence: Sequence, message: str, failed_constraint: bool = False) -> StepOutput: ...
