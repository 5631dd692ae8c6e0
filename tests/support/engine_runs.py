"""Driving a real engine to the end of a batch, as the tests of several layers do."""

from __future__ import annotations

from xpuspec.core.request_stats import RequestStats
from xpuspec.engine.engine import LLMEngine
from xpuspec.sample.sampling_params import SamplingParams


def run_engine(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[list[int]], list[RequestStats]]:
    """Submit every prompt at once and step until all finish; tokens and stats in prompt order."""
    tokens: dict[str, list[int]] = {f"r{index}": [] for index in range(len(prompts))}
    stats: dict[str, RequestStats] = {}
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, params)
    while engine.has_unfinished():
        for output in engine.step():
            tokens[output.request_id].extend(output.new_token_ids)
            stats[output.request_id] = output.stats
    return list(tokens.values()), [stats[request_id] for request_id in tokens]


def draft_whenever_the_cost_model_says(engine: LLMEngine) -> None:
    """Adaptive drafting allowed at every step, whatever whole steps measured
    (``xpuspec.spec_decode.policy.drafting_payoff``): for tests of what drafting does, not of whether
    it pays on this machine, which would otherwise decide by timings whether they draft at all. A
    batched step's drafts are not priced as a whole either (``xpuspec.spec_decode.policy.batch_step``)."""
    choice = engine.policy.draft_choice
    assert choice is not None, "the engine has no drafter"
    choice.payoff.pays = lambda num_sequences, kind: True
    engine.policy.prices_batched_steps = False
