"""The order of a step's phases: a :class:`StepStrategy`, chosen when the engine is built.

:class:`SequentialSteps` runs schedule → propose → verify → accept for every sequence in turn;
``xpuspec.engine.overlap.OverlappedSteps`` drafts for one group of sequences while the target
verifies another. Both run the same phases, which the engine offers to the package: ``schedule``,
``drafting.propose``, ``verifier`` (chunks, the target's pass, acceptance) and the bookkeeping of
failed requests.

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
from xpuspec.core.sequence import Sequence
from xpuspec.engine import bursts
from xpuspec.spec_decode.policy.step_shape import decode_sequences

if TYPE_CHECKING:
    from xpuspec.engine.view import EngineView


class PhaseHooks(Protocol):
    """Told the wall time of each phase of a step (profiling, e.g. ``research.bench.profile``)."""

    def on_phase(self, name: str, seconds: float) -> None: ...


class StepStrategy(Protocol):
    """How one engine orders the phases of its steps."""

    # Whether drafts may be trees: a tree is verified in the step that drafts it.
    allows_trees: bool

    def run(self) -> None:
        """One step; its outputs go to ``engine.step_outputs``. Raises only for a failure of the step."""
        ...

    def pending_draft_tokens(self, sequence: Sequence) -> int | None:
        """The drafts already proposed for ``sequence`` and not yet verified (None: none)."""
        ...

    def forget(self, request_id: str) -> None:
        """The request finished or was preempted: drop what the strategy keeps for it."""
        ...


class SequentialSteps:
    """Schedule, propose, verify and accept every sequence of the step, in that order."""

    allows_trees = True

    def __init__(self, engine: EngineView) -> None:
        self.engine = engine

    def pending_draft_tokens(self, sequence: Sequence) -> int | None:
        return None

    def forget(self, request_id: str) -> None:
        pass

    def run(self) -> None:
        engine = self.engine
        started = engine.clock()
        phase = engine.phase_started()
        chunks = engine.schedule()
        engine.phase_ended("schedule", phase)
        if not chunks:
            return
        phase = engine.phase_started()
        proposals = engine.drafting.propose(chunks)
        engine.phase_ended("propose", phase)
        drafting_seconds = engine.drafting.seconds if proposals else 0.0
        chunks = engine.drafting.drop_failed(chunks, proposals)
        if not chunks:
            return
        verifier = engine.verifier
        runner_chunks = [
            verifier.target_chunk(chunk, proposals.get(chunk.sequence.request_id)) for chunk in chunks
        ]
        if engine.proposer is not None:  # without a drafter every decode step has the same shape
            engine.step_shape.keep(runner_chunks, engine.cost_model, engine.holds_shape())
        phase = engine.phase_started()
        logits = verifier.forward(chunks, runner_chunks, proposals)  # [sum num_logits, vocab]
        engine.phase_ended("verify", phase)
        phase = engine.phase_started()
        verifier.accept_all(chunks, runner_chunks, logits, proposals)
        engine.phase_ended("accept", phase)
        self._after_verification(chunks, runner_chunks, started, drafting_seconds)
        if not proposals:
            phase = engine.phase_started()
            bursts.burst(engine, chunks, engine.clock() - started)
            engine.phase_ended("burst", phase)
        choice = engine.draft_choice
        if choice is not None and choice.step_drafting_on is not None and decode_sequences(runner_chunks):
            emitted = sum(len(output.new_token_ids) for output in engine.step_outputs)
            choice.payoff.record(len(chunks), choice.step_drafting_on, emitted, engine.clock() - started)

    def _after_verification(
        self,
        chunks: list[ScheduledChunk],
        runner_chunks: list[SequenceChunk],
        started: float,
        drafting_seconds: float,
    ) -> None:
        """Hand the target's states to a drafter that reads them; time the step for the cost model."""
        engine = self.engine
        if engine.drafter_caps.needs_every_target_state:  # drafts from the target's hidden states (EAGLE-3)
            observer = cast(TargetObserver, engine.proposer)
            observer.observe_target(chunks, runner_chunks, engine.verifier.tree_paths)
        if engine.proposer is not None:  # only the choice of γ reads the cost model
            # The whole step but the drafting: the engine's own work per step is paid once however
            # many tokens the step emits, and speculation amortises it as it does the target's pass.
            shape, changed = engine.step_shape.record(runner_chunks)
            engine.cost_model.record_target_step(
                shape[0],
                engine.clock() - started - drafting_seconds,
                num_sequences=shape[1],
                shape_changed=changed,
            )
