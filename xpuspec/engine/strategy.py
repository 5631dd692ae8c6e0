"""The order of a step's phases after scheduling: a :class:`StepStrategy`, chosen when the engine is
built.

:class:`SequentialSteps` runs propose → verify → update for every scheduled sequence in turn;
``xpuspec.engine.overlap.OverlappedSteps`` drafts for one group of sequences while the target
verifies another. Both compose the values the phases return: the proposals
(``xpuspec.engine.drafting``), the target's logits and the :class:`~xpuspec.engine.verification.Verification`
(``xpuspec.engine.verification``), and a list of ``StepOutput``. They add the outputs to the step's
list as each phase returns them, so that a step failing midway still reports what it produced.

The engine tells its :class:`PhaseHooks`, when set, the seconds of each phase: "schedule",
"propose", "verify" (the target's pass, with the masks computed meanwhile), "accept", "burst" (a
target-only decode burst, whose passes report "accept" too) and "step" (the whole ``step()``).
Without hooks a phase costs one attribute test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.interfaces import TargetObserver
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.engine import bursts
from xpuspec.engine.bursts import Interrupt
from xpuspec.engine.drafting import Drafting
from xpuspec.engine.outputs import StepOutput
from xpuspec.engine.verification import Verifier

if TYPE_CHECKING:
    from xpuspec.engine.view import EngineView


class PhaseHooks(Protocol):
    """Told the wall time of each phase of a step (profiling, e.g. ``research.bench.profile``)."""

    def on_phase(self, name: str, seconds: float) -> None: ...


class StepStrategy(Protocol):
    """How one engine orders the phases of its steps after scheduling."""

    def run(
        self,
        chunks: list[ScheduledChunk],
        outputs: list[StepOutput],
        started: float,
        interrupt: Interrupt | None,
    ) -> None:
        """Propose, verify and update the scheduled ``chunks`` of a step that began at ``started``;
        each phase's outputs join ``outputs``, the step's list. Raises only for a failure of the
        step. ``interrupt``: asked between the passes of a decode burst."""
        ...

    def pending_draft_lengths(self) -> dict[str, int]:
        """The drafts already proposed and not yet verified, by request id (their draft lengths)."""
        ...

    def forget(self, request_id: str) -> None:
        """The request finished or was preempted: drop what the strategy keeps for it."""
        ...


class SequentialSteps:
    """Propose, verify and accept every sequence of the step, in that order."""

    allows_trees = True  # drafts are verified in the step that drafts them

    def __init__(self, engine: EngineView, drafting: Drafting, verifier: Verifier) -> None:
        self.engine = engine
        self.drafting = drafting
        self.verifier = verifier

    def pending_draft_lengths(self) -> dict[str, int]:
        return {}

    def forget(self, request_id: str) -> None:
        pass

    def run(
        self,
        chunks: list[ScheduledChunk],
        outputs: list[StepOutput],
        started: float,
        interrupt: Interrupt | None,
    ) -> None:
        engine, drafting, verifier = self.engine, self.drafting, self.verifier
        phase = engine.phase_started()
        proposals = drafting.propose(chunks)
        engine.phase_ended("propose", phase)
        drafting_seconds = drafting.seconds if proposals else 0.0
        chunks, failed = drafting.drop_failed(chunks, proposals)
        outputs += failed
        if not chunks:
            return
        runner_chunks = [
            verifier.target_chunk(chunk, proposals.get(chunk.sequence.request_id)) for chunk in chunks
        ]
        engine.policy.keep_shape(runner_chunks)
        phase = engine.phase_started()
        logits, mask_failures = verifier.forward(chunks, runner_chunks, proposals)  # [sum num_logits, vocab]
        engine.phase_ended("verify", phase)
        phase = engine.phase_started()
        verification = verifier.accept_all(chunks, runner_chunks, logits, proposals, mask_failures)
        outputs += verification.outputs
        engine.phase_ended("accept", phase)
        self._after_verification(chunks, runner_chunks, verification.tree_paths, started, drafting_seconds)
        if not proposals:
            phase = engine.phase_started()
            bursts.burst(engine, verifier, chunks, engine.clock() - started, outputs, interrupt)
            engine.phase_ended("burst", phase)
        emitted = sum(len(output.new_token_ids) for output in outputs)
        engine.policy.record_payoff(len(chunks), runner_chunks, emitted, engine.clock() - started)

    def _after_verification(
        self,
        chunks: list[ScheduledChunk],
        runner_chunks: list[SequenceChunk],
        tree_paths: dict[str, list[int]],
        started: float,
        drafting_seconds: float,
    ) -> None:
        """Hand the target's states to a drafter that reads them; time the step for the cost model."""
        engine = self.engine
        proposer = engine.proposer
        if proposer is not None and proposer.caps.needs_every_target_state:  # EAGLE-3 reads them
            cast(TargetObserver, proposer).observe_target(chunks, runner_chunks, tree_paths)
        # The whole step but the drafting (SpeculationPolicy.record_target_pass).
        engine.policy.record_target_pass(runner_chunks, engine.clock() - started - drafting_seconds)
