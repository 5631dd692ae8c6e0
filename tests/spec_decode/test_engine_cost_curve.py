"""The engine feeds its cost curve: calibrated at load for 1 .. 1 + γ_max tokens, refreshed by real steps."""

from __future__ import annotations

from xpuspec.api.pipeline import Pipeline
from xpuspec.engine.calibration import batch_calibration_sizes
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.spec_decode.policy.cost_model import MAX_TOKENS_PER_SEQUENCE

EXACT = "exact"


def test_the_engine_calibrates_and_refreshes_the_verification_curve_by_tokens_per_sequence():
    pipe = Pipeline("demo", drafter="draft", properties=EXACT, draft_properties=EXACT)
    engine = pipe.engine
    max_gamma = engine.config.max_draft_tokens
    assert max_gamma + 1 <= MAX_TOKENS_PER_SEQUENCE
    table = engine.cost_model.verify.table(1)
    assert all(table[n]["calibrated"] > 0 for n in range(1, max_gamma + 2))
    assert all(table[n]["steps"] == 0 for n in table)
    assert engine.cost_model.draft_passes.table(1)[1]["calibrated"] > 0
    # The largest batch is timed at a few sizes of its own: one sequence's curve does not say what a
    # full batch's extra tokens cost.
    batch = engine.cost_model.verify.table(engine.config.max_num_seqs)
    sizes = batch_calibration_sizes(engine.config, max_gamma + 1)
    assert sizes and sizes[0] == 1
    assert all((batch[n]["calibrated"] is not None) == (n in sizes) for n in batch)

    result = pipe.generate("def main(", SamplingParams(max_tokens=40, temperature=0.0, num_draft_tokens=3))[0]
    table = engine.cost_model.verify.table(1)
    steps = result.stats["verification_steps"]
    # Every decode step verified 1 + 3 tokens. The first changed the step's shape (from the prompt's
    # tokens to 4) and measures the change instead. Near max_tokens the scheduler shortens γ (fewer
    # tokens left): fixed γ pads those steps back to 4 tokens, so the others are steady 4-token steps.
    assert table[4]["steps"] == steps - 1 and table[4]["mean"] > 0
    assert all(cell["steps"] == 0 for n, cell in table.items() if n != 4)
    drafts = engine.cost_model.draft_passes.table(1)[1]
    assert drafts["steps"] >= 2 * steps  # passes 2 and 3 of every step are plain single-token passes
    assert engine.cost_model.draft_python > 0


def test_a_target_only_engine_calibrates_single_token_steps_only():
    pipe = Pipeline("demo", drafter="none", properties=EXACT)
    table = pipe.engine.cost_model.verify.table(1)
    assert table[1]["calibrated"] > 0 and all(table[n]["calibrated"] is None for n in range(2, 10))
    batch = pipe.engine.cost_model.verify.table(pipe.engine.config.max_num_seqs)
    assert all(cell["calibrated"] is None for cell in batch.values())
