"""Prefix caching changes no token: greedy output with it on equals output with it off, at f32.

Prompts share long prefixes (a system prompt, a conversation that grows), so requests hit the
cache: one at a time, 16 in flight, with the draft model and with n-grams, with a cache small enough
to evict and preempt, and with a prefix that hits in the target's cache but not in the draft's.
"""

from __future__ import annotations

import pytest

from tests.conftest import EXACT_PRESET
from xpuspec import Pipeline, SamplingParams

SYSTEM = (
    "You are a careful assistant for Python code. Answer briefly, show code, and explain each step.\n"
    "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n"
    "        self.x = x\n        self.y = y\n\nfor i in range(10):\n    print(add(i, i))\n"
)
QUESTIONS = [
    "def mul(a, b):",
    "class Line:",
    "import os",
    "print(Point(1, 2).x)",
    "The quick brown fox",
    "while True:",
    "x = [i * i for i in range(5)]",
    "return a - b",
]
# Turns of one conversation: each prompt extends the previous one.
CONVERSATION = [SYSTEM + "Q: " + " ".join(QUESTIONS[: turn + 1]) + "\nA:" for turn in range(4)]
PROMPTS = [SYSTEM + question for question in QUESTIONS] + CONVERSATION + [SYSTEM] * 2 + QUESTIONS[:2]
MAX_TOKENS = 24


def greedy(num_draft_tokens: int | None = 3) -> SamplingParams:
    return SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=num_draft_tokens
    )


@pytest.fixture(scope="module")
def uncached(pair_bundle) -> list[list[int]]:
    pipe = Pipeline(pair_bundle, drafter="none", properties=EXACT_PRESET, enable_prefix_caching=False)
    assert pipe.engine.block_manager.__class__.__name__ == "BlockManager"
    return [pipe.generate(prompt, greedy(None))[0].token_ids for prompt in PROMPTS]


def _mismatches(expected: list[list[int]], results) -> list[int]:
    return [i for i, (ids, r) in enumerate(zip(expected, results, strict=True)) if ids != r.token_ids]


@pytest.mark.parametrize("drafter", ["draft", "ngram", "none"])
def test_one_at_a_time_then_sixteen_in_flight(pair_bundle, uncached, drafter):
    pipe = Pipeline(pair_bundle, drafter=drafter, properties=EXACT_PRESET)
    assert pipe.engine.prefix_caching
    results = [pipe.generate(prompt, greedy())[0] for prompt in PROMPTS]
    assert _mismatches(uncached, results) == []
    cached = [r.stats["cached_tokens"] for r in results]
    assert cached[0] == 0 and all(c > 0 for c in cached[1 : len(QUESTIONS) + 6])
    # The repeated system prompt takes its first copy's partial tail too, not only full blocks.
    assert pipe.engine.block_manager.stats.num_tail_hit_tokens > 0
    if drafter == "draft":
        assert sum(r.stats["cached_draft_tokens"] for r in results) > 0
        assert sum(r.stats["drafted"] for r in results) > 0
    # All at once, over a warm cache: every request shares the system prompt's blocks.
    batch = pipe.generate(PROMPTS[:16], greedy())
    assert _mismatches(uncached[:16], batch) == []
    assert all(r.stats["cached_tokens"] > 0 for r in batch[: len(QUESTIONS)])
    assert pipe.engine.block_manager.num_used_blocks == 0
    pipe.engine.block_manager.check_invariants()


def test_a_small_cache_evicts_and_preempts_without_changing_output(pair_bundle, uncached):
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET, num_kv_blocks=14)
    manager = pipe.engine.block_manager
    results = pipe.generate(PROMPTS, greedy())
    again = pipe.generate(PROMPTS, greedy())
    assert _mismatches(uncached, results) == [] and _mismatches(uncached, again) == []
    assert sum(r.stats["num_preemptions"] for r in results + again) > 0
    assert manager.stats.num_evicted_blocks > 0 and manager.stats.num_hit_tokens > 0
    assert manager.num_used_blocks == 0
    manager.check_invariants()


def test_a_prefix_cached_for_the_target_but_not_the_draft(pair_bundle, uncached):
    pipe = Pipeline(pair_bundle, drafter="draft", properties=EXACT_PRESET)
    first = pipe.generate(PROMPTS[0], greedy(0))[0]  # γ = 0: the draft never runs
    assert first.token_ids == uncached[0] and first.stats["drafted"] == 0
    second = pipe.generate(PROMPTS[1], greedy(4))[0]
    assert second.token_ids == uncached[1]
    assert second.stats["cached_tokens"] > 0 and second.stats["cached_draft_tokens"] == 0
    assert second.stats["drafted"] > 0
    # The draft has now computed the system prompt: a third request hits in both caches.
    third = pipe.generate(PROMPTS[2], greedy(4))[0]
    assert third.token_ids == uncached[2]
    assert third.stats["cached_draft_tokens"] > 0


def _run_turns(pipe: Pipeline, num_draft_tokens: int | None) -> list[list[int]]:
    """A conversation on token ids: each turn's prompt is the previous prompt, its answer and a new
    question, so later turns reuse blocks holding generated tokens."""
    engine = pipe.engine
    prompt = pipe.tokenizer.encode(SYSTEM + QUESTIONS[0])
    answers = []
    for turn in range(4):
        engine.add_request(f"turn-{turn}", prompt, greedy(num_draft_tokens))
        answer: list[int] = []
        while engine.has_unfinished():
            for output in engine.step():
                answer.extend(output.new_token_ids)
        answers.append(answer)
        prompt = prompt + answer + pipe.tokenizer.encode(QUESTIONS[turn + 1], add_special_tokens=False)
    return answers


@pytest.mark.parametrize("drafter", ["draft", "ngram"])
def test_a_conversation_reuses_its_generated_tokens_exactly(pair_bundle, drafter):
    reference = Pipeline(pair_bundle, drafter="none", properties=EXACT_PRESET, enable_prefix_caching=False)
    pipe = Pipeline(pair_bundle, drafter=drafter, properties=EXACT_PRESET)
    assert _run_turns(pipe, 3) == _run_turns(reference, None)
    stats = pipe.engine.block_manager.stats
    # Every later turn found its whole previous prompt and answer, less the partial last block.
    assert stats.num_hit_tokens >= stats.num_queried_tokens // 2
