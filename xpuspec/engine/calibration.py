"""Calibration: the target and the drafter timed on dummy steps, so the cost model starts from
measurements rather than priors."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from xpuspec.core.block_manager import BlockGeometry
from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.interfaces import Drafter, TargetExecutor
from xpuspec.engine.outputs import EngineConfig
from xpuspec.spec_decode.policy import CostModel

CALIBRATION_CONTEXT = 256  # tokens of context at which calibration times the target
# Tokens per sequence timed at the largest batch (and 1 + the largest γ): the cost between them is
# interpolated. One sequence's curve says little about a full batch's: on 2 cores a step of 16 sequences
# is compute-bound, each verified token costing about as much as a sequence's one token, where one
# sequence's extra tokens are nearly free; extrapolated from one sequence, a full batch's drafts looked
# far cheaper than they were until the batch had measured them (docs/benchmarks.md, "A full batch
# priced as it runs").
BATCH_CALIBRATION_SIZES = (1, 3)
# Stored timings are replayed only while the target's cost curve keeps their shape: its largest size's
# steady pass over a one-token pass, timed again at start, within this factor of the stored ratio. A
# calibration stored while another process had the cores can price the larger sizes far above their
# cost, and sizes the policy then never chooses are never measured again: lookups stopped at 4 tokens
# for good (docs/benchmarks.md, "A stored calibration that no longer holds"). Load that slows every
# size alike leaves the ratio alone, and the online scale absorbs it.
STORED_SHAPE_TOLERANCE = 1.25

logger = logging.getLogger(__name__)


@dataclass
class CalibrationTimings:
    """What a calibration measured, in the order it fed the cost model, so that a later start on
    the same models, properties and machine can feed the same figures without timing them again.

    ``target``: (sequences, tokens per sequence, seconds); ``shape_change``: seconds;
    ``draft``: seconds of a one-token drafting pass; ``drafting``: (sequences, γ, seconds)."""

    target: list[tuple[int, int, float]] = field(default_factory=list)
    shape_change: list[float] = field(default_factory=list)
    draft: list[float] = field(default_factory=list)
    drafting: list[tuple[int, int, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, list]:
        return {
            "target": self.target,
            "shape_change": self.shape_change,
            "draft": self.draft,
            "drafting": self.drafting,
        }

    @classmethod
    def from_json(cls, data: dict[str, list]) -> CalibrationTimings:
        return cls(
            target=[(int(s), int(n), float(t)) for s, n, t in data["target"]],
            shape_change=[float(t) for t in data["shape_change"]],
            draft=[float(t) for t in data["draft"]],
            drafting=[(int(s), int(g), float(t)) for s, g, t in data["drafting"]],
        )


def replay(cost_model: CostModel, timings: CalibrationTimings) -> None:
    """Feed a stored calibration's figures to the cost model, as :func:`calibrate` fed them."""
    for num_sequences, tokens, seconds in timings.target:
        cost_model.calibrate_target(num_sequences, tokens, seconds)
    for seconds in timings.shape_change:
        cost_model.calibrate_shape_change(seconds)
    for seconds in timings.draft:
        cost_model.calibrate_draft(seconds)
    for num_sequences, gamma, seconds in timings.drafting:
        cost_model.calibrate_drafting(num_sequences, gamma, seconds)


@dataclass
class CalibratedModels:
    """What a calibration times and what it feeds: the executors, the engine's limits and block
    size, its clock and its cost model."""

    target: TargetExecutor
    proposer: Drafter | None
    config: EngineConfig
    block_manager: BlockGeometry
    clock: Callable[[], float]
    cost_model: CostModel


def calibrate(
    engine: CalibratedModels, repeats: int = 5, stored: CalibrationTimings | None = None
) -> CalibrationTimings:
    """Time the target and the drafter on dummy steps so the cost model starts from measurements.

    Runs before any request holds blocks (the caller's to check): the dummy tokens are written into
    the first blocks and overwritten by the first real sequences, whose cached prefixes the caller
    then forgets. With ``stored`` timings (an earlier calibration of the same models on the same
    machine), the warm-up passes still run, since they are what compiles each shape's kernels and
    sizes the buffers, and a few passes check that the stored figures still have the shape of this
    machine's (:func:`stored_shape_holds`); the stored figures are then replayed, or timed afresh
    where they no longer hold. Returns the timings fed to the cost model (``stored`` itself when
    replayed).
    """
    config = engine.config
    # Verification by tokens per sequence, 1 .. 1 + γ_max: its cost is far from linear on
    # small models, and adaptive γ reads it per γ (spec_decode.verify_costs). Sizes are
    # interleaved, so a busy moment of the machine does not land on one size alone.
    sizes = range(1, 2 + config.max_draft_tokens if engine.proposer is not None else 2)
    # At a typical context: verifying several tokens runs the plugin's multi-query attention,
    # whose cost grows with the context (timed at an empty context, several tokens looked far
    # cheaper than they are; docs/experiments/code-comment-figures.md). Every position maps to block 0: the
    # timing needs no cache of that size, and block 0 is rewritten by the first request.
    past = max(0, min(CALIBRATION_CONTEXT, config.max_model_len) - len(sizes))
    chunks = {n: _dummy_chunk(engine, n, past) for n in sizes}
    batch = (
        {
            n: [_dummy_chunk(engine, n, past) for _ in range(config.max_num_seqs)]
            for n in batch_calibration_sizes(config, sizes[-1])
        }
        if engine.proposer is not None
        else {}
    )
    engine.target.warm_up(config.max_model_len)
    if engine.proposer is not None:
        engine.proposer.warm_up(config.max_model_len)
    for chunk in chunks.values():
        engine.target.forward([chunk])  # the first inference of a shape compiles kernels: not timed
    for batch_chunks in batch.values():
        engine.target.forward(batch_chunks)
    if engine.proposer is not None:
        for tokens in (1, 2):
            engine.proposer.measure_step_seconds(past + 1, tokens=tokens)  # warm-up, not timed
    timings = stored
    if timings is not None and not stored_shape_holds(engine, chunks, timings):
        logger.info("the stored calibration no longer fits this machine's timings: timing the models again")
        timings = None
    if timings is None:
        timings = CalibrationTimings()
        for _ in range(repeats):
            _time_each_size(engine, chunks, past, timings)
            _time_batch(engine, batch, timings)
    replay(engine.cost_model, timings)
    return timings


def stored_shape_holds(
    engine: CalibratedModels, chunks: dict[int, SequenceChunk], stored: CalibrationTimings
) -> bool:
    """Whether ``stored`` timings still have the shape the target's passes have now: the steady pass of
    the largest size over a one-token pass, timed again, within :data:`STORED_SHAPE_TOLERANCE` of the
    stored ratio (each size's fastest stored pass, as the cost model keeps it)."""
    small, large = min(chunks), max(chunks)
    then = {
        n: [seconds for seqs, size, seconds in stored.target if seqs == 1 and size == n]
        for n in (small, large)
    }
    if small == large or not then[small] or not then[large] or min(then[small]) <= 0:
        return True
    now = {n: _steady_seconds(engine, chunks[n]) for n in (small, large)}
    if now[small] <= 0:
        return True
    ratio = (now[large] / now[small]) / (min(then[large]) / min(then[small]))
    return 1 / STORED_SHAPE_TOLERANCE <= ratio <= STORED_SHAPE_TOLERANCE


def _steady_seconds(engine: CalibratedModels, chunk: SequenceChunk, passes: int = 3) -> float:
    """The fastest of ``passes`` timed passes over ``chunk``, after one untimed pass of its shape."""
    engine.target.forward([chunk])
    fastest = float("inf")
    for _pass in range(passes):
        started = engine.clock()
        engine.target.forward([chunk])
        fastest = min(fastest, engine.clock() - started)
    return fastest


def _time_each_size(
    engine: CalibratedModels, chunks: dict[int, SequenceChunk], past: int, timings: CalibrationTimings
) -> None:
    """One round over the sizes.

    Each size twice in a row: the first pass after another size pays the plugin's change of
    shapes (cost_model.shape_change; not a one-token pass on a decode lane), the second is the
    steady cost a fixed γ pays. As in a real step, a pass over 1 + γ tokens follows the drafting
    that proposed them (a model that just ran left the other's weights out of cache and its threads
    asleep).
    """
    clock = engine.clock
    for n, chunk in chunks.items():
        started = clock()
        engine.target.forward([chunk])
        changed = clock() - started
        if n > 1:  # the drafting of γ = n - 1: a catch-up of 2 tokens, then one-token passes
            assert engine.proposer is not None  # sizes above 1 only with a drafter
            _time_drafting(engine.proposer, n - 1, past, timings)
        started = clock()
        engine.target.forward([chunk])
        steady = clock() - started
        timings.target.append((1, n, steady))
        # A one-token pass on a decode lane follows the main copy's passes without a change.
        if len(chunks) > 1 and not (n == 1 and engine.target.caps.decode_lane):
            timings.shape_change.append(changed - steady)


def batch_calibration_sizes(config: EngineConfig, largest: int) -> list[int]:
    """Tokens per sequence timed at the largest batch (``config.max_num_seqs``, none at a batch of
    one): :data:`BATCH_CALIBRATION_SIZES` and ``largest``, within the step's token budget."""
    if config.max_num_seqs < 2:
        return []
    wanted = {*BATCH_CALIBRATION_SIZES, largest}
    return sorted(n for n in wanted if n * config.max_num_seqs <= config.max_num_batched_tokens)


def _dummy_chunk(engine: CalibratedModels, num_tokens: int, past: int) -> SequenceChunk:
    """A decode chunk of ``num_tokens`` after ``past`` tokens, every position in block 0 (the timing
    needs no cache of that size, and block 0 is rewritten by the first request)."""
    return SequenceChunk(
        token_ids=[0] * num_tokens,
        past_length=past,
        block_table=[0] * engine.block_manager.blocks_needed(past + num_tokens),
        num_logits=num_tokens,
    )


def _time_batch(
    engine: CalibratedModels, batch: dict[int, list[SequenceChunk]], timings: CalibrationTimings
) -> None:
    """One round over the batch sizes, each twice in a row and the second timed (the steady cost)."""
    clock = engine.clock
    for n, chunks in batch.items():
        engine.target.forward(chunks)
        started = clock()
        engine.target.forward(chunks)
        timings.target.append((len(chunks), n, clock() - started))


def _time_drafting(proposer: Drafter, gamma: int, past: int, timings: CalibrationTimings) -> None:
    """Time a drafting phase of ``gamma`` drafts: a catch-up of 2 tokens, then one-token passes."""
    drafting = proposer.measure_step_seconds(past + 1, tokens=2)
    for _pass in range(gamma - 1):
        seconds = proposer.measure_step_seconds(past + 1)
        timings.draft.append(seconds)
        drafting += seconds
    timings.drafting.append((1, gamma, drafting))
