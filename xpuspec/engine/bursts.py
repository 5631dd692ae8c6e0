"""Target-only decode bursts: more decode passes within one step, without scheduling between them.

On a small model a pass takes well under a millisecond and the step around it (scheduling, building
chunks, verification, outputs, the caller's text) adds a good share to it; a burst pays that once for
several tokens, as vLLM's multi-step scheduling does. Tokens are those of single steps: the same
one-token decode inputs, accepted by the verifier. A burst runs only while no step would draft (no
drafter; γ fixed at 0; adaptive γ or an automatic tree whose policy says 0 and no probe is due) and
the scheduler would plan the same batch: every running sequence decodes, none waits, no output
constraint, none gets its first token. It ends when a sequence finishes or fails, a block cannot be
had without preempting, a request waits, the step's ``interrupt`` says so, a step would draft, or the
next pass would end past ``decode_burst_seconds`` (so streaming stays smooth and new requests wait
little).

A burst continues the step's outputs: its tokens join the output each sequence already has in the
step (``outputs``, the step's own list, which a burst that fails midway leaves holding the passes
done).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.core.sequence import Sequence
from xpuspec.engine.outputs import StepOutput
from xpuspec.spec_decode.policy import step_tokens

if TYPE_CHECKING:
    from xpuspec.engine.verification import Verifier
    from xpuspec.engine.view import EngineView

# Asked between the passes of a burst: True ends it (work waits outside the engine).
Interrupt = Callable[[], bool]


def burst(
    engine: EngineView,
    verifier: Verifier,
    chunks: list[ScheduledChunk],
    pass_seconds: float,
    outputs: list[StepOutput],
    interrupt: Interrupt | None,
) -> None:
    """After a step without drafts: more target-only decode passes of its sequences, while they pay.
    Their tokens join ``outputs``, the step's outputs so far."""
    config = engine.config
    sequences = [chunk.sequence for chunk in chunks]
    if engine.proposer is not None and engine.proposer.caps.needs_every_target_state:
        return  # a drafter that reads every target state (EAGLE-3) observes every pass
    if (
        config.decode_burst_steps < 2
        or engine.scheduler.num_waiting
        or len(sequences) != engine.scheduler.num_running
        or any(not (chunk.num_tokens == 1 and chunk.samples) for chunk in chunks)
        # A first token goes out at once (a one-token prompt's prefill looks like a decode).
        or any(sequence.num_output_tokens < 2 for sequence in sequences)
        or any(engine.states[sequence.request_id].guide is not None for sequence in sequences)
    ):
        return
    passes: list[tuple[int, float]] = []  # (tokens run, seconds) of each pass
    try:
        _burst_passes(engine, verifier, sequences, pass_seconds, outputs, passes, interrupt)
    finally:
        if engine.proposer is not None:
            # Target-only tokens now cost a pass, not a step: the choice of γ weighs drafting
            # against that (recorded after the burst, so no pass recomputes the policy's costs).
            for num_tokens, seconds in passes:
                engine.policy.record_target_step(num_tokens, seconds, num_sequences=len(sequences))


def _may_continue(
    engine: EngineView,
    sequences: list[Sequence],
    elapsed: float,
    pass_seconds: float,
    interrupt: Interrupt | None,
) -> bool:
    """Whether the burst runs one more pass (and, if so, each sequence has a slot for its token)."""
    config = engine.config
    if elapsed + pass_seconds > config.decode_burst_seconds:
        return False
    if interrupt is not None and interrupt():
        return False
    if any(sequence.is_finished for sequence in sequences):
        return False  # a finished sequence is retired: nothing below may look it up
    if not engine.policy.burst_may_continue(sequences):
        return False  # the next step drafts (or probes): a step of its own
    for sequence in sequences:
        if sequence.num_tokens >= config.max_model_len or not engine.block_manager.ensure_capacity(
            sequence, sequence.num_tokens
        ):
            return False
    return True


def _burst_passes(
    engine: EngineView,
    verifier: Verifier,
    sequences: list[Sequence],
    pass_seconds: float,
    outputs: list[StepOutput],
    passes: list[tuple[int, float]],
    interrupt: Interrupt | None,
) -> None:
    """The passes of :func:`burst`; each pass's tokens join ``outputs``, its tokens and seconds
    go to ``passes``."""
    by_request = {output.request_id: output for output in outputs}
    elapsed = pass_seconds
    for _ in range(engine.config.decode_burst_steps - 1):
        if not _may_continue(engine, sequences, elapsed, pass_seconds, interrupt):
            return
        started = engine.clock()
        runner_chunks = [
            SequenceChunk(
                token_ids=[sequence.last_token_id],
                past_length=sequence.num_computed_tokens,
                block_table=sequence.block_table,
                num_logits=1,
                sequence_id=sequence.request_id,
            )
            for sequence in sequences
        ]
        engine.policy.keep_shape(runner_chunks)
        engine.policy.record_shape(runner_chunks)
        logits = engine.target.forward(runner_chunks)  # [num sequences, vocab]
        phase = engine.phase_started()
        for row, sequence in enumerate(sequences):
            sequence.num_computed_tokens += 1
            try:
                output, _ = verifier.accept(sequence, logits[row : row + 1], None)
            except Exception as error:
                outputs.append(engine.fail(sequence, f"sampling failed: {error}"))
                continue
            earlier = by_request.get(sequence.request_id)
            if earlier is None:
                by_request[sequence.request_id] = output
                outputs.append(output)
            else:
                earlier.new_token_ids.extend(output.new_token_ids)
                earlier.finished, earlier.finish_reason = output.finished, output.finish_reason
        for sequence in sequences:
            if not sequence.is_finished:
                engine.block_manager.commit(sequence)
        engine.phase_ended("accept", phase)
        pass_seconds = engine.clock() - started
        elapsed += pass_seconds
        passes.append((step_tokens(runner_chunks), pass_seconds))
