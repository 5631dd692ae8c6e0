"""What the step's phases use of the engine: :class:`EngineView`, a Protocol ``LLMEngine`` satisfies.

``xpuspec.engine.engine`` composes the phases (drafting, verification, bursts, recovery, calibration,
and the step strategies) and hands each the engine itself. The phases name it by this view, not by
``LLMEngine``: a phase importing the module that imports it would close a cycle of imports, a
type-only one included (tests/test_architecture.py). The view declares exactly what the phases read
and call; a phase that needs more of the engine declares it here, and tests/engine/test_engine_view.py
checks that the engine has it.

Two of the engine's members are phases themselves, whose classes live in modules that import this
one; they appear here as Protocols of what the other phases ask of them (:class:`DraftingPhase`,
:class:`VerificationPhase`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from xpuspec.core.block_manager import BlockManager
from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.interfaces import Drafter, DrafterCaps, TargetExecutor, TreeDrafting
from xpuspec.core.prefix_cache import PrefixCachingBlockManager
from xpuspec.core.proposal import Proposal
from xpuspec.core.scheduler import ScheduledChunk, Scheduler
from xpuspec.core.sequence import Sequence
from xpuspec.engine.outputs import EngineConfig, RequestState, StepOutput
from xpuspec.spec_decode.policy.acceptance import AcceptanceRates
from xpuspec.spec_decode.policy.cost_model import CostModel
from xpuspec.spec_decode.policy.draft_choice import DraftChoice
from xpuspec.spec_decode.policy.step_shape import StepShape
from xpuspec.spec_decode.policy.tree_policy import TreeShapePolicy
from xpuspec.spec_decode.prompt_lookup import PromptLookup
from xpuspec.spec_decode.rejection_sampler import RejectionSampler
from xpuspec.spec_decode.tree_acceptance import TreeAcceptance
from xpuspec.structured.matcher import GuidedRequest

__all__ = ["DraftingPhase", "EngineView", "VerificationPhase"]


class DraftingPhase(Protocol):
    """The propose phase (``xpuspec.engine.drafting.Drafting``), as the step strategies run it."""

    seconds: float  # wall time of the last drafting phase

    def propose(self, chunks: list[ScheduledChunk]) -> dict[str, Proposal]: ...

    def drop_failed(
        self, chunks: list[ScheduledChunk], proposals: dict[str, Proposal]
    ) -> list[ScheduledChunk]: ...


class VerificationPhase(Protocol):
    """The verify and accept phases (``xpuspec.engine.verification.Verifier``), as the step strategies
    and decode bursts run them."""

    tree_paths: dict[str, list[int]]  # the accepted path of each tree verified this step

    def target_chunk(self, chunk: ScheduledChunk, proposal: Proposal | None) -> SequenceChunk: ...

    def forward(
        self, chunks: list[ScheduledChunk], runner_chunks: list[SequenceChunk], proposals: dict[str, Proposal]
    ) -> np.ndarray: ...

    def prepare_masks(self, guides: dict[str, GuidedRequest], proposals: dict[str, Proposal]) -> None: ...

    def accept_all(
        self,
        chunks: list[ScheduledChunk],
        runner_chunks: list[SequenceChunk],
        logits: np.ndarray,
        proposals: dict[str, Proposal],
    ) -> None: ...

    def accept(self, sequence: Sequence, rows: np.ndarray, proposal: Proposal | None) -> StepOutput: ...


class EngineView(Protocol):
    """The engine as its phases see it (``xpuspec.engine.engine.LLMEngine``)."""

    # The executors, the configuration and the clock.
    target: TargetExecutor
    proposer: Drafter | None
    config: EngineConfig
    clock: Callable[[], float]
    burst_interrupt: Callable[[], bool] | None

    # Scheduling and the KV blocks.
    scheduler: Scheduler
    block_manager: BlockManager | PrefixCachingBlockManager

    # Speculation: verification rules, costs, acceptance rates, the step's shape, the drafters' choice.
    rejection_sampler: RejectionSampler
    cost_model: CostModel
    acceptance: AcceptanceRates
    step_shape: StepShape
    tree_drafter: TreeDrafting | None
    tree_acceptance: TreeAcceptance
    tree_policy: TreeShapePolicy
    draft_choice: DraftChoice | None

    # The requests in flight, the outputs of the step in progress, and the failure counts.
    sequences: dict[str, Sequence]
    states: dict[str, RequestState]
    step_outputs: list[StepOutput]
    num_engine_failures: int
    num_requests_failed: int

    # Read-only here: the phases read them and never rebind them.
    @property
    def drafter_caps(self) -> DrafterCaps: ...

    @property
    def prompt_lookup(self) -> PromptLookup | None: ...

    @property
    def num_requests(self) -> int: ...

    @property
    def drafting(self) -> DraftingPhase: ...

    @property
    def verifier(self) -> VerificationPhase: ...

    # The phases' shared bookkeeping.
    def build_scheduler(self) -> None: ...

    def holds_shape(self) -> bool: ...

    def reset_prefix_cache(self) -> int: ...

    def schedule(self) -> list[ScheduledChunk]: ...

    def phase_started(self) -> float: ...

    def phase_ended(self, name: str, started: float) -> None: ...

    def guides(self, chunks: list[ScheduledChunk]) -> dict[str, GuidedRequest]: ...

    def fail_request(self, sequence: Sequence, message: str, failed_constraint: bool = False) -> None: ...

    def retire(self, sequence: Sequence) -> None: ...
