"""Calibration: the target and the drafter timed on dummy steps, so the cost model starts from
measurements rather than priors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpuspec.core.chunks import SequenceChunk

if TYPE_CHECKING:
    from xpuspec.core.interfaces import Drafter
    from xpuspec.engine.view import EngineView

CALIBRATION_CONTEXT = 256  # tokens of context at which calibration times the target


def calibrate(engine: EngineView, repeats: int = 5) -> None:
    """Time the target and the drafter on dummy steps so the cost model starts from measurements.

    Runs before any request holds blocks: the dummy tokens are written into the first blocks
    and overwritten by the first real sequences.
    """
    if engine.num_requests:
        raise RuntimeError("calibrate() runs only while no request is in flight")
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
    chunks = {
        n: SequenceChunk(
            token_ids=[0] * n,
            past_length=past,
            block_table=[0] * engine.block_manager.blocks_needed(past + n),
            num_logits=n,
        )
        for n in sizes
    }
    engine.target.warm_up(config.max_model_len)
    if engine.proposer is not None:
        engine.proposer.warm_up(config.max_model_len)
    for chunk in chunks.values():
        engine.target.forward([chunk])  # the first inference of a shape compiles kernels: not timed
    if engine.proposer is not None:
        for tokens in (1, 2):
            engine.proposer.measure_step_seconds(past + 1, tokens=tokens)  # warm-up, not timed
    for _ in range(repeats):
        _time_each_size(engine, chunks, past)
    engine.step_shape.last = None
    engine.reset_prefix_cache()  # the dummy tokens overwrote blocks a cached prefix may name


def _time_each_size(engine: EngineView, chunks: dict[int, SequenceChunk], past: int) -> None:
    """One round over the sizes.

    Each size twice in a row: the first pass after another size pays the plugin's change of
    shapes (cost_model.shape_change), the second is the steady cost a fixed γ pays. As in a
    real step, a pass over 1 + γ tokens follows the drafting that proposed them (a model
    that just ran left the other's weights out of cache and its threads asleep).
    """
    cost_model, clock = engine.cost_model, engine.clock
    for n, chunk in chunks.items():
        started = clock()
        engine.target.forward([chunk])
        changed = clock() - started
        if n > 1:  # the drafting of γ = n - 1: a catch-up of 2 tokens, then one-token passes
            assert engine.proposer is not None  # sizes above 1 only with a drafter
            _time_drafting(engine, engine.proposer, n - 1, past)
        started = clock()
        engine.target.forward([chunk])
        steady = clock() - started
        cost_model.calibrate_target(1, n, steady)
        if len(chunks) > 1:
            cost_model.calibrate_shape_change(changed - steady)


def _time_drafting(engine: EngineView, proposer: Drafter, gamma: int, past: int) -> None:
    """Time a drafting phase of ``gamma`` drafts: a catch-up of 2 tokens, then one-token passes."""
    drafting = proposer.measure_step_seconds(past + 1, tokens=2)
    for _pass in range(gamma - 1):
        seconds = proposer.measure_step_seconds(past + 1)
        engine.cost_model.calibrate_draft(seconds)
        drafting += seconds
    engine.cost_model.calibrate_drafting(1, gamma, drafting)
