"""EAGLE-3 drafting through the whole engine: exact greedy output, its drafts against the torch
reference head, accepted drafts, the sampled distribution, and heads that do not fit.

The target is the tiny 2-layer Llama of ``pair_bundle``; EAGLE-3's default taps need 6 layers, so the
random heads name boundaries (0, 1, 2) explicitly. Their draft vocabulary is 96 of the target's 384 ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from research.training.eagle3_torch import random_head, save_head  # noqa: E402
from tests.conftest import EXACT_PRESET, F32  # noqa: E402
from tests.engine.test_exactness import PROMPTS, _make_drafting_hopeless, _mismatches  # noqa: E402
from tests.support.engine_runs import draft_whenever_the_cost_model_says  # noqa: E402
from tests.support.statistics import goodness_of_fit, sampling_engine_config, target_joint  # noqa: E402
from xpuspec import Pipeline, SamplingParams  # noqa: E402
from xpuspec.core.chunks import SequenceChunk  # noqa: E402
from xpuspec.executor.eagle3_head import Eagle3Head  # noqa: E402
from xpuspec.executor.paged_runner import PagedModelRunner  # noqa: E402
from xpuspec.models.bundle import ModelBundle  # noqa: E402
from xpuspec.spec_decode.eagle3.head_state import HeadStates  # noqa: E402
from xpuspec.spec_decode.eagle3.proposer import Eagle3Proposer  # noqa: E402
from xpuspec.spec_decode.rejection_sampler import RejectionSampler  # noqa: E402

pytestmark = pytest.mark.slow

TAPS = (0, 1, 2)
DRAFT_VOCAB = 96
HEAD_SEED = 5
MAX_TOKENS = 32
NUM_PROMPTS = 12  # of test_exactness's 20: enough lengths and repeats, half the time


def greedy(num_draft_tokens: int | None, max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, num_draft_tokens=num_draft_tokens
    )


@pytest.fixture(scope="module")
def target_config(pair_bundle) -> dict:
    return json.loads((ModelBundle.open(pair_bundle).target.path / "config.json").read_text())


@pytest.fixture(scope="module")
def head(target_config, tmp_path_factory):
    """The random head (torch module, config) and its published-layout folder."""
    module, config = random_head(target_config, DRAFT_VOCAB, seed=HEAD_SEED, aux_layer_ids=TAPS)
    assert int(module.d2t.abs().sum()) > 0, "the test needs a draft vocabulary that is not a prefix"
    return module, config, save_head(module, config, tmp_path_factory.mktemp("eagle3") / "head")


@pytest.fixture(scope="module")
def target_only(pair_bundle) -> list[list[int]]:
    pipe = Pipeline(pair_bundle, drafter="none", properties=EXACT_PRESET)
    return [pipe.generate(prompt, greedy(None))[0].token_ids for prompt in PROMPTS[:NUM_PROMPTS]]


@pytest.fixture(scope="module")
def eagle3(pair_bundle, head) -> Pipeline:
    pipe = Pipeline(pair_bundle, drafter="eagle3", eagle3_head=head[2], properties=EXACT_PRESET)
    pipe.engine.proposer.head.compile_chains_inline = True  # one-call chains from the first round
    return pipe


def test_pipeline_taps_the_target_for_eagle3_only(eagle3, target_only, pair_bundle):
    assert isinstance(eagle3.engine.proposer, Eagle3Proposer)
    assert eagle3.target_runner.hidden_state_layers == TAPS
    # The head's fc is folded into the target: it returns fused rows, one hidden state per token.
    assert eagle3.target_runner.hidden_state_width == eagle3.engine.proposer.head.config.hidden_size
    assert not eagle3.engine.prefix_caching  # a cached prefix has no states for the head
    plain = Pipeline(pair_bundle, drafter="ngram", properties=EXACT_PRESET)
    assert plain.target_runner.hidden_state_layers is None


@pytest.mark.parametrize("num_draft_tokens", [None, 1, 3])
def test_one_request_at_a_time(eagle3, target_only, num_draft_tokens):
    results = [eagle3.generate(prompt, greedy(num_draft_tokens))[0] for prompt in PROMPTS[:NUM_PROMPTS]]
    assert _mismatches(target_only, results) == []
    if num_draft_tokens:
        assert sum(r.stats["drafted"] for r in results) > 0
    assert len(eagle3.engine.proposer.states) == 0  # every finished sequence released


def test_sixteen_in_flight(eagle3, target_only):
    prompts = PROMPTS[:NUM_PROMPTS] + PROMPTS[: 16 - NUM_PROMPTS]
    results = eagle3.generate(prompts, greedy(3))
    assert _mismatches(target_only + target_only[: 16 - NUM_PROMPTS], results) == []
    assert sum(r.stats["drafted"] for r in results) > 0


def test_preemption_keeps_output_exact(pair_bundle, head, target_only):
    pipe = Pipeline(
        pair_bundle, drafter="eagle3", eagle3_head=head[2], properties=EXACT_PRESET, num_kv_blocks=12
    )
    results = pipe.generate(PROMPTS[:NUM_PROMPTS], greedy(3))
    assert _mismatches(target_only, results) == []
    assert sum(r.stats["num_preemptions"] for r in results) > 0
    assert pipe.engine.block_manager.num_used_blocks == 0
    assert len(pipe.engine.proposer.states) == 0


def test_a_cached_prefix_restarts_the_head_after_it(eagle3, target_only, monkeypatch, caplog):
    """With prefix caching forced on, a second request's prefill starts past the cached blocks, where
    the head has no states: it restarts there (shorter context, same output)."""
    import logging

    # Prefix caching forced on: the head must still observe every state (its cap stays set).
    monkeypatch.setattr(type(eagle3.engine), "prefix_caching", property(lambda engine: True))
    eagle3.engine.build_scheduler()
    try:
        assert eagle3.engine.prefix_caching
        with caplog.at_level(logging.INFO, logger="xpuspec.spec_decode.eagle3"):
            results = [eagle3.generate(PROMPTS[4], greedy(3))[0] for _ in range(2)]
        assert [r.token_ids for r in results] == [target_only[4]] * 2
        assert results[1].stats["cached_tokens"] > 0
        assert "starts at position" in caplog.text
        assert "not drafting" not in caplog.text
    finally:
        monkeypatch.undo()
        eagle3.engine.build_scheduler()


def test_draft_tree_drafts_a_tree(eagle3, target_only):
    """A request asking for a tree drafts one with the head (tests/spec_decode/test_eagle3_tree.py)."""
    params = SamplingParams(
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        ignore_eos=True,
        num_draft_tokens=3,
        draft_tree={"depth": 3, "width": 2, "nodes": 6},
    )
    result = eagle3.generate(PROMPTS[1], params)[0]
    assert result.token_ids == target_only[1]
    assert result.stats["drafted"] > 0 and result.stats["tree_verifications"] > 0


# ----------------------------------------------------------------------- drafts against the reference


class _Recorder:
    """Wraps ``propose``: (tokens computed, drafted target ids) of every chain it drafted."""

    def __init__(self, proposer: Eagle3Proposer):
        self.proposer, self.calls = proposer, []
        self._propose = proposer.propose

    def __call__(self, chunks, draw):
        computed = {c.sequence.request_id: c.sequence.num_computed_tokens for c in chunks}
        proposals = self._propose(chunks, draw)
        for request_id, proposal in proposals.items():
            self.calls.append((computed[request_id], list(proposal.token_ids)))
        return proposals


def unfused_target_states(pair_bundle, tokens: list[int]) -> np.ndarray:
    """The target's raw taps ``[len(tokens), 3 * hidden]`` at f32, from a runner of its own without the
    head's fc (the engine's target folds it in): the reference fuses them with the torch module."""
    runner = PagedModelRunner(
        ModelBundle.open(pair_bundle).target.path, properties=F32, hidden_state_layers=TAPS
    )
    runner.forward([SequenceChunk(tokens, 0, list(range(runner.num_blocks)), num_logits=1)])
    return runner.hidden_states().copy()


def _reference_chain(
    module, ov_head: Eagle3Head, states: np.ndarray, tokens: list[int], computed: int, gamma: int
):
    """The torch head's greedy chain after ``computed`` tokens, from scratch: catch-up over slots
    0..computed-1 (target state j, token j + 1), then γ - 1 rollout steps. -> target ids [γ]."""
    target_ids = ov_head.target_ids
    with torch.no_grad():
        fused = module.fuse(torch.from_numpy(states[:computed]))[None]  # [1, computed, hidden]
        embeds = torch.from_numpy(ov_head.embed(tokens[1 : computed + 1]))[None]
        logits, hidden, cache = module(embeds, fused, torch.arange(computed)[None])
        chain = [int(target_ids[int(logits[0, -1].argmax())])]
        for step in range(1, gamma):
            embeds = torch.from_numpy(ov_head.embed(chain[-1:]))[None]
            position = torch.tensor([[computed - 1 + step]])
            logits, hidden, cache = module(embeds, hidden[:, -1:], position, cache)
            chain.append(int(target_ids[int(logits[0, -1].argmax())]))
    return chain


@pytest.mark.parametrize("drafting", ["one_call", "pass_by_pass"])
@pytest.mark.parametrize("schedule", ["fixed", "after_gamma_zero"])
def test_drafts_equal_the_torch_reference(pair_bundle, head, monkeypatch, caplog, schedule, drafting):
    """Every chain the proposer drafts (after prefill, rejections, and a long catch-up after γ = 0
    steps) equals the torch head's chain computed from scratch from the target's states: the lone
    greedy request's chain in one call, and the pass-by-pass loop that batches and sampling use."""
    module, _config, head_dir = head
    pipe = Pipeline(pair_bundle, drafter="eagle3", eagle3_head=head_dir, properties=EXACT_PRESET)
    proposer = pipe.engine.proposer
    proposer.head.compile_chains_inline = True
    one_call = proposer.head.draft_greedy_chain
    calls = []

    def counted(step, count):
        drafted = one_call(step, count)
        if drafted is not None:
            calls.append(count)
        return drafted

    monkeypatch.setattr(proposer.head, "draft_greedy_chain", counted)
    if drafting == "pass_by_pass":
        monkeypatch.setattr(proposer, "_drafts_greedy_chain", lambda drafting: False)
    recorder = _Recorder(proposer)
    monkeypatch.setattr(proposer, "propose", recorder)
    if schedule == "fixed":
        params = greedy(3, max_tokens=24)
    else:
        _make_drafting_hopeless(pipe.engine)  # γ = 0, but for a probe of γ = 1 after 64 steps ...
        draft_whenever_the_cost_model_says(pipe.engine)  # ... which whole steps' rates do not stop
        params = greedy(None, max_tokens=100)
    prompt = PROMPTS[3]
    result = pipe.generate(prompt, params)[0]
    tokens = pipe.encode(prompt) + result.token_ids
    assert recorder.calls, "nothing was drafted"
    assert "not drafting" not in caplog.text  # every step that asked for drafts found its states
    if schedule == "after_gamma_zero":
        assert max(computed for computed, _ in recorder.calls) > 64

    # One-call chains draft γ ≥ 2; adaptive γ's probes of γ = 1 go pass by pass.
    assert bool(calls) == (drafting == "one_call" and schedule == "fixed"), calls
    states = unfused_target_states(pair_bundle, tokens)  # [len(tokens), 3 * hidden]
    for computed, drafted in recorder.calls:
        expected = _reference_chain(module, proposer.head, states, tokens, computed, len(drafted))
        assert drafted == expected, f"after {computed} tokens"


# ----------------------------------------------------------------------------- accepted drafts


def test_right_drafts_are_accepted_and_output_stays_exact(
    pair_bundle, target_config, target_only, tmp_path, monkeypatch
):
    """A head whose logits are set to the target's next token (wrong at every fifth position) is
    accepted, rejected now and then, and the output is still the target's."""
    prompt_index = 4
    pipe_plain = Pipeline(pair_bundle, drafter="none", properties=EXACT_PRESET)
    tokens = pipe_plain.encode(PROMPTS[prompt_index]) + target_only[prompt_index]
    # A draft vocabulary holding every token of the continuation, padded with other ids: d2t not identity.
    wanted = sorted(set(tokens))
    others = [t for t in range(target_config["vocab_size"]) if t not in set(wanted)][::3]
    draft_ids = np.array(sorted(wanted + others[: max(0, DRAFT_VOCAB - len(wanted))]))
    module, config = random_head(target_config, len(draft_ids), seed=HEAD_SEED, aux_layer_ids=TAPS)
    module.set_draft_vocabulary(draft_ids)
    head_dir = save_head(module, config, tmp_path / "oracle")

    pipe = Pipeline(pair_bundle, drafter="eagle3", eagle3_head=head_dir, properties=EXACT_PRESET)
    ov_head = pipe.engine.proposer.head
    draft_of = {int(t): d for d, t in enumerate(ov_head.target_ids)}
    run = ov_head.run

    def oracle_run(steps):
        results = run(steps)
        for step, result in zip(steps, results, strict=True):
            predicted = int(step.positions[-1]) + 2  # slot j predicts the token at j + 2
            if predicted < len(tokens) and predicted % 5:
                result.logits[-1] = 0.0
                result.logits[-1, draft_of[tokens[predicted]]] = 1.0
        return results

    monkeypatch.setattr(ov_head, "run", oracle_run)
    # The oracle edits each pass's logits, so the chain is drafted pass by pass, not in one call.
    monkeypatch.setattr(pipe.engine.proposer, "_drafts_greedy_chain", lambda drafting: False)
    result = pipe.generate(PROMPTS[prompt_index], greedy(3))[0]
    assert result.token_ids == target_only[prompt_index]
    assert 0 < result.stats["accepted"] < result.stats["drafted"]


def test_chains_compiled_in_the_background_take_over_once_ready(pair_bundle, head, target_only):
    """By default a chain's graph compiles in the background: the first request drafts pass by pass,
    a later one in one call, and both write the target's text."""
    pipe = Pipeline(pair_bundle, drafter="eagle3", eagle3_head=head[2], properties=EXACT_PRESET)
    ov_head = pipe.engine.proposer.head
    assert not ov_head.compile_chains_inline
    one_call = ov_head.draft_greedy_chain
    chains = []

    def counted(step, count):
        drafted = one_call(step, count)
        chains.append(drafted is not None)
        return drafted

    ov_head.draft_greedy_chain = counted
    assert pipe.generate(PROMPTS[1], greedy(3))[0].token_ids == target_only[1]
    assert chains and not chains[0]  # the first call found nothing compiled
    ov_head.chains.wait(timeout=120)
    chains.clear()
    result = pipe.generate(PROMPTS[1], greedy(3))[0]
    assert result.token_ids == target_only[1] and result.stats["drafted"] > 0
    assert any(chains)


def test_a_chain_with_nan_logits_fails_its_request_alone(eagle3, target_only, monkeypatch):
    """A one-call chain whose logits held NaN ends its request with the error, as a pass-by-pass draft's
    NaN does; the next request drafts and stays exact."""
    head = eagle3.engine.proposer.head
    one_call = head.draft_greedy_chain

    def poisoned(step, count):
        drafted = one_call(step, count)
        return drafted and (drafted[0], np.full_like(drafted[1], np.nan))

    monkeypatch.setattr(head, "draft_greedy_chain", poisoned)
    failed = eagle3.generate(PROMPTS[2], greedy(3))[0]
    assert failed.finish_reason == "error" and "NaN or infinity" in failed.error
    monkeypatch.setattr(head, "draft_greedy_chain", one_call)
    result = eagle3.generate(PROMPTS[2], greedy(3))[0]
    assert result.token_ids == target_only[2] and result.stats["drafted"] > 0


# ----------------------------------------------------------------------------- sampled requests

SAMPLED = dict(
    max_tokens=4, temperature=1.5, top_k=3, top_p=1.0, min_p=0.0, ignore_eos=True, num_draft_tokens=2
)
NUM_SAMPLES = 3000
SIGNIFICANCE = 1e-3
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def exact_joint(pair_bundle) -> dict[tuple[int, int, int], float]:
    """p(t1, t2, t3) of the target under the same top-k/temperature transform."""
    return target_joint(pair_bundle, PROMPT, SAMPLED)


def _sample_triples(pair_bundle, head_dir: Path, seeded: bool) -> list[tuple[int, ...]]:
    pipe = Pipeline(
        pair_bundle,
        drafter="eagle3",
        eagle3_head=head_dir,
        properties=F32,
        engine_config=sampling_engine_config(pair_bundle),
    )
    params = [SamplingParams(seed=seed if seeded else None, **SAMPLED) for seed in range(NUM_SAMPLES)]
    results = pipe.generate([PROMPT] * NUM_SAMPLES, params)
    assert all(r.stats["per_position_acceptance"][1] is not None for r in results)
    return [tuple(r.token_ids[:3]) for r in results]


@pytest.mark.parametrize("seeded", [False, True], ids=["rejection", "coupled"])
def test_sampled_output_follows_the_target(pair_bundle, head, exact_joint, seeded):
    p_value = goodness_of_fit(_sample_triples(pair_bundle, head[2], seeded), exact_joint)
    assert p_value > SIGNIFICANCE, f"chi-square p = {p_value:.2e}"


def test_broken_rejection_is_caught_at_this_sample_size(pair_bundle, head, exact_joint, monkeypatch):
    monkeypatch.setattr(RejectionSampler, "acceptance_probability", staticmethod(lambda p, q: 1.0))
    p_value = goodness_of_fit(_sample_triples(pair_bundle, head[2], seeded=False), exact_joint)
    assert p_value < SIGNIFICANCE, f"a broken rule passed: chi-square p = {p_value:.2e}"


# ----------------------------------------------------------------------------- heads that do not fit


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 32, "intermediate_size": 64}, "does not fit the target"),
        ({"vocab_size": 512}, "does not fit the target"),
        ({"aux_layer_ids": (0, 1, 7)}, "past the target's 2"),
        ({"aux_layer_ids": None}, "at least 6 layers"),
    ],
    ids=["hidden", "vocab", "layers", "default_layers"],
)
def test_a_head_that_does_not_fit_raises(pair_bundle, target_config, tmp_path, change, message):
    layers = change.get("aux_layer_ids", TAPS)
    config = {**target_config, **{k: v for k, v in change.items() if k != "aux_layer_ids"}}
    module, head_config = random_head(config, 64, seed=1, aux_layer_ids=layers)
    head_dir = save_head(module, head_config, tmp_path / "head")
    with pytest.raises(ValueError, match=message):
        Pipeline(pair_bundle, drafter="eagle3", eagle3_head=head_dir, properties=EXACT_PRESET)


def test_eagle3_needs_a_head(pair_bundle):
    with pytest.raises(ValueError, match="has no EAGLE-3 head; add one with `xpuspec prepare"):
        Pipeline(pair_bundle, drafter="eagle3", properties=EXACT_PRESET)


# ----------------------------------------------------------------------------- state bookkeeping


class _StubHead:
    """What the per-sequence bookkeeping asks of the head: per-sequence KV lengths."""

    class config:  # noqa: N801
        vocab_size = 384

    def __init__(self):
        self.lengths: dict[str, int] = {}

    def kv_length(self, sequence_id: str) -> int:
        return self.lengths.get(sequence_id, 0)

    def truncate(self, sequence_id: str, length: int) -> None:
        self.lengths[sequence_id] = min(self.kv_length(sequence_id), length)

    def release(self, sequence_id: str) -> None:
        self.lengths.pop(sequence_id, None)


def test_states_recomputed_or_missing_rewind_or_restart_the_head():
    head = _StubHead()
    states = HeadStates(head)  # type: ignore[arg-type]
    rows = lambda count: np.ones((count, 4), np.float32)  # noqa: E731

    states.sequence_at("a", 0).add(rows(6))  # positions 0..5 pending
    head.lengths["a"] = 4  # a catch-up consumed 0..3 ...
    state = states.get("a")
    assert state is not None
    state.keep(0)
    state.add(rows(2))  # ... and 4, 5 are pending again
    assert states.sequence_at("a", 6) is state and state.num_pending == 2  # the next position

    states.sequence_at("a", 5)  # recomputed from 5: pending keeps 4 only
    assert (head.kv_length("a"), state.num_pending) == (4, 1)
    states.sequence_at("a", 2)  # recomputed from 2: the head's KV too
    assert (head.kv_length("a"), state.num_pending) == (2, 0)

    restarted = states.sequence_at("a", 9)  # a gap: 2..8 will never come
    assert restarted is not state and restarted.start == 9 and head.kv_length("a") == 0
