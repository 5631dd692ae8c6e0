"""A seeded sampled request gives the same tokens whatever else runs beside it (issue 10).

Its random numbers are keyed by token position (coupled verification, see
xpuspec.spec_decode.rejection_sampler), so neither γ (cut by the token budget when 15 other
requests share the step) nor the overlapped engine's grouping changes its output, which is then
the seeded target-only output itself.
"""

from __future__ import annotations

import pytest

from tests.support.faults import EXACT
from xpuspec import Pipeline, SamplingParams
from xpuspec.engine.engine import EngineConfig

SEEDED = SamplingParams(max_tokens=80, temperature=0.9, top_p=0.95, seed=2**63 + 5, ignore_eos=True)
# A small step budget: beside older decodes the request's γ is cut below the 8 it gets alone.
CONFIG = EngineConfig(max_model_len=512, max_num_batched_tokens=20, max_num_seqs=16, max_draft_tokens=8)


# Short prompts: all 15 neighbours are admitted within a few steps and decode beside the request.
NEIGHBOUR_PROMPTS = [
    "def",
    "The",
    "class",
    "return a + b",
    "fox jumps",
    "import os",
    "self.y = y",
    "yield i",
    "lazy dog",
    "x = 1",
    "continue",
    "print(x)",
    "if x:",
    "a + b",
    "for i in",
]


def neighbours() -> list[SamplingParams]:
    """15 other requests: greedy, unseeded and seeded sampling, fixed and adaptive γ."""
    params = []
    for index in range(15):
        kind = index % 3
        params.append(
            SamplingParams(
                max_tokens=60 + index,
                temperature=0.0 if kind == 0 else 1.0,
                seed=index if kind == 2 else None,
                ignore_eos=True,
                num_draft_tokens=(None, 2, 8)[index % 3],
            )
        )
    return params


@pytest.fixture(scope="module")
def target_only_tokens() -> list[int]:
    pipe = Pipeline("demo", drafter="none", properties=EXACT, engine_config=CONFIG)
    return pipe.generate("def add(a, b):", SEEDED)[0].token_ids


@pytest.mark.parametrize("drafter, overlap", [("draft", False), ("ngram", False), ("draft", True)])
@pytest.mark.parametrize("num_draft_tokens", [8, None])
def test_seeded_request_alone_and_among_fifteen_others(
    target_only_tokens, drafter, overlap, num_draft_tokens
):
    pipe = Pipeline("demo", drafter=drafter, properties=EXACT, engine_config=CONFIG, overlap=overlap)
    seeded = SamplingParams(**{**vars(SEEDED), "num_draft_tokens": num_draft_tokens})
    alone = pipe.generate("def add(a, b):", seeded)[0]
    # Fourth in line: admitted at once, behind three older decodes that take the budget first.
    prompts = NEIGHBOUR_PROMPTS[:3] + ["def add(a, b):"] + NEIGHBOUR_PROMPTS[3:]
    crowd = pipe.generate(prompts, neighbours()[:3] + [seeded] + neighbours()[3:])
    among = crowd[3]
    assert alone.token_ids == among.token_ids == target_only_tokens
    if num_draft_tokens:
        assert alone.stats["drafted"] > 0 and among.stats["drafted"] > 0
        # The crowd did cut γ: the same request verified its drafts in a different rhythm.
        rhythms = [(r.stats["verification_steps"], r.stats["drafted"]) for r in (alone, among)]
        assert rhythms[0] != rhythms[1], rhythms
    assert pipe.engine.block_manager.num_used_blocks == 0
