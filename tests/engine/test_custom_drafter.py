"""A drafter written outside the package runs through the real engine, unchanged.

The drafter below implements ``xpuspec.core.interfaces.Drafter`` and declares ``DrafterCaps()``
(nothing asked of the engine, nothing offered beyond chains): the engine drives it from its caps
alone, and greedy output stays the target's, whether its drafts are all right (an oracle of the
target's own output) or mostly wrong (the last token repeated).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import F32
from tests.support.engine_runs import run_engine
from xpuspec import SamplingParams
from xpuspec.core.interfaces import Drafter, DrafterCaps
from xpuspec.core.proposal import Proposal, TokenDraw
from xpuspec.core.request_stats import RequestStats
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.engine.engine import EngineConfig, LLMEngine
from xpuspec.executor.paged_runner import PagedModelRunner
from xpuspec.models.bundle import ModelBundle

PROMPTS = [[5, 6, 7], [11, 12, 13, 14, 15, 16], [20] * 9, [3]]
MAX_TOKENS = 20
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, num_draft_tokens=4)


class ScriptedDrafter:
    """Proposes the next γ tokens of a fixed continuation per prompt (None: repeats the last token)."""

    caps = DrafterCaps()

    def __init__(self, continuations: dict[tuple[int, ...], list[int]] | None = None) -> None:
        self.continuations = continuations
        self.step_timings: list[tuple[int, float]] = []
        self.released: set[str] = set()

    def propose(self, chunks: list[ScheduledChunk], draw: TokenDraw) -> dict[str, Proposal]:
        proposals = {}
        for chunk in chunks:
            sequence, gamma = chunk.sequence, chunk.num_draft_tokens
            if gamma == 0:
                continue
            if self.continuations is None:
                token_ids = [sequence.last_token_id] * gamma
            else:
                done = len(sequence.output_token_ids)
                continuation = self.continuations[tuple(sequence.prompt_token_ids)]
                token_ids = continuation[done : done + gamma]
            proposals[sequence.request_id] = Proposal(token_ids, None)
        self.step_timings = [(len(chunks), 1e-5)]
        return proposals

    def measure_step_seconds(self, context: int = 1, tokens: int = 1) -> float:
        return 1e-5

    def warm_up(self, max_model_len: int) -> None:
        pass

    def release(self, sequence_id: str) -> None:
        self.released.add(sequence_id)

    def recover(self) -> None:
        pass


def run(engine: LLMEngine) -> tuple[list[list[int]], list[RequestStats]]:
    """Every prompt at once, stepped until all finish; tokens and stats in prompt order."""
    return run_engine(engine, PROMPTS, GREEDY)


def make_engine(pair_bundle: Path, drafter: Drafter | None) -> LLMEngine:
    target = PagedModelRunner(ModelBundle.open(pair_bundle).target.path, properties=F32, num_blocks=64)
    return LLMEngine(target, drafter, EngineConfig(max_num_seqs=4, max_model_len=128), [])


@pytest.fixture(scope="module")
def target_only(pair_bundle) -> list[list[int]]:
    return run(make_engine(pair_bundle, None))[0]


def test_an_oracle_drafter_is_exact_and_accepted(pair_bundle, target_only):
    drafter = ScriptedDrafter({tuple(p): out for p, out in zip(PROMPTS, target_only, strict=True)})
    engine = make_engine(pair_bundle, drafter)
    tokens, stats = run(engine)
    assert tokens == target_only
    assert sum(s.drafted for s in stats) > 0
    assert sum(s.accepted for s in stats) == sum(s.drafted for s in stats)  # every draft was right
    assert drafter.released == {f"r{index}" for index in range(len(PROMPTS))}
    assert engine.tree_drafter is None and engine.prompt_lookup is None


def test_a_mostly_wrong_drafter_is_exact(pair_bundle, target_only):
    tokens, stats = run(make_engine(pair_bundle, ScriptedDrafter()))
    assert tokens == target_only
    assert sum(s.accepted for s in stats) < sum(s.drafted for s in stats)


def test_the_drafter_is_known_to_no_module_of_core_or_engine():
    """Adding it edited nothing in xpuspec/core or xpuspec/engine: neither names it."""
    package = Path(__file__).resolve().parents[2] / "xpuspec"
    for folder in ("core", "engine"):
        for path in (package / folder).glob("*.py"):
            assert "ScriptedDrafter" not in path.read_text(), path


class PhaseRecorder:
    """Phase hooks that keep every (phase, seconds) the engine reports."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, float]] = []

    def on_phase(self, name: str, seconds: float) -> None:
        self.phases.append((name, seconds))


def test_phase_hooks_hear_each_phase_of_each_step(pair_bundle, target_only):
    engine = make_engine(pair_bundle, ScriptedDrafter())
    recorder = PhaseRecorder()
    engine.phase_hooks = recorder
    tokens, _ = run(engine)
    assert tokens == target_only  # timing changes nothing
    names = [name for name, _ in recorder.phases]
    assert {"schedule", "propose", "verify", "accept", "step"} <= set(names)
    assert all(seconds >= 0.0 for _, seconds in recorder.phases)
    steps = sum(seconds for name, seconds in recorder.phases if name == "step")
    # The phases lie within their steps (a burst's passes report "accept" inside "burst").
    assert sum(seconds for name, seconds in recorder.phases if name not in ("step", "burst")) <= steps
