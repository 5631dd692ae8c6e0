"""Rejection sampler: greedy verification, and statistical proof that sampled output follows the target.

The statistical tests run a tiny "language": a first-order Markov chain over a small vocabulary
for the target (P) and a markedly different one for the drafter (Q). Speculative decoding is run
many times from the start state and the first emitted token, and the first two emitted tokens,
are compared with the exact target probabilities by a chi-square goodness-of-fit test. The same
test is run with deliberately wrong rules to show it has the power to catch them.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest, chisquare

from xpuspec.sample.sampler import make_generator, position_exponentials, race, sample
from xpuspec.spec_decode.rejection_sampler import RejectionSampler, VerificationResult

VOCAB = 8
START = VOCAB  # the extra row of the transition matrices: the distribution of the first token
NUM_RUNS = 20_000
# Correct rules must pass with p > FIT_THRESHOLD; broken rules must fail with p < FIT_THRESHOLD.
FIT_THRESHOLD = 1e-3
MIN_EXPECTED_COUNT = 5.0  # chi-square cells with fewer expected counts are pooled into one


def _transitions(seed: int, concentration: float) -> np.ndarray:
    """A random Markov chain: row s is the next-token distribution after token s ([VOCAB+1, VOCAB])."""
    return np.random.default_rng(seed).dirichlet(np.full(VOCAB, concentration), size=VOCAB + 1)


TARGET = _transitions(seed=1, concentration=0.7)  # [VOCAB+1, VOCAB]
DRAFT = _transitions(seed=2, concentration=0.7)  # [VOCAB+1, VOCAB]


# Deliberately wrong rules. (A "p/q without the min" rule is not among them: compared with a
# uniform in [0, 1), p/q and min(1, p/q) accept in exactly the same cases.)
class AlwaysAccept(RejectionSampler):
    @staticmethod
    def acceptance_probability(target_prob: float, draft_prob: float) -> float:
        return 1.0


class AcceptWithTargetProbability(RejectionSampler):
    @staticmethod
    def acceptance_probability(target_prob: float, draft_prob: float) -> float:
        return target_prob


class InvertedRatio(RejectionSampler):
    @staticmethod
    def acceptance_probability(target_prob: float, draft_prob: float) -> float:
        return min(1.0, draft_prob / target_prob) if target_prob > 0 else 1.0


class RecoverFromTarget(RejectionSampler):
    @staticmethod
    def recovery_distribution(
        target_row: np.ndarray, draft_row: np.ndarray | None, draft_token: int
    ) -> np.ndarray:
        return target_row


class RecoverFromAbsoluteDifference(RejectionSampler):
    @staticmethod
    def recovery_distribution(
        target_row: np.ndarray, draft_row: np.ndarray | None, draft_token: int
    ) -> np.ndarray:
        draft = np.eye(target_row.shape[0])[draft_token] if draft_row is None else draft_row
        return np.abs(target_row - draft)


def _generate_two_tokens(
    sampler: RejectionSampler, num_drafts: int, deterministic_drafter: bool, rng: np.random.Generator
) -> tuple[int, int]:
    """Speculatively decode until two tokens are emitted; returns the first two."""
    emitted: list[int] = []
    while len(emitted) < 2:
        last_token = emitted[-1] if emitted else START
        draft_tokens: list[int] = []
        previous = last_token
        for _ in range(num_drafts):
            if deterministic_drafter:
                # A lookup drafter: a fixed guess per context, i.e. one-hot q.
                token = int(np.argmax(DRAFT[previous]))
            else:
                token = sample(DRAFT[previous], rng)
            draft_tokens.append(token)
            previous = token
        contexts = [last_token, *draft_tokens]  # the target row i conditions on contexts[i]
        draft_probs = None if deterministic_drafter else DRAFT[contexts[:-1]]  # [γ, VOCAB]
        result = sampler.verify_sampled(draft_tokens, draft_probs, TARGET[contexts], rng)
        emitted.extend(result.token_ids)
    return emitted[0], emitted[1]


def _fit_p_values(
    sampler: RejectionSampler, num_drafts: int, deterministic_drafter: bool
) -> tuple[float, float]:
    """Chi-square p-values of the first token and of the first pair against the exact target law."""
    rng = make_generator(1234)
    pairs = np.array(
        [_generate_two_tokens(sampler, num_drafts, deterministic_drafter, rng) for _ in range(NUM_RUNS)]
    )  # [NUM_RUNS, 2]
    first_counts = np.bincount(pairs[:, 0], minlength=VOCAB)
    pair_counts = np.bincount(pairs[:, 0] * VOCAB + pairs[:, 1], minlength=VOCAB * VOCAB)
    first_law = TARGET[START]  # [VOCAB]
    pair_law = (first_law[:, None] * TARGET[:VOCAB]).reshape(-1)  # [VOCAB*VOCAB]: P(a) P(b | a)
    return _chisquare_p(first_counts, first_law), _chisquare_p(pair_counts, pair_law)


def _chisquare_p(counts: np.ndarray, law: np.ndarray) -> float:
    expected = law * counts.sum()
    small = expected < MIN_EXPECTED_COUNT
    observed_cells, expected_cells = counts[~small], expected[~small]
    if small.any():
        observed_cells = np.append(observed_cells, counts[small].sum())
        expected_cells = np.append(expected_cells, expected[small].sum())
    return float(chisquare(observed_cells, expected_cells).pvalue)


@pytest.mark.parametrize("num_drafts", [1, 3])
@pytest.mark.parametrize("deterministic_drafter", [False, True], ids=["draft-model", "one-hot-q"])
def test_sampled_output_follows_target_distribution(num_drafts: int, deterministic_drafter: bool) -> None:
    first_p, pair_p = _fit_p_values(RejectionSampler(), num_drafts, deterministic_drafter)
    assert first_p > FIT_THRESHOLD, f"first token deviates from the target law (p={first_p:.2e})"
    assert pair_p > FIT_THRESHOLD, f"first two tokens deviate from the target law (p={pair_p:.2e})"


@pytest.mark.parametrize(
    "broken_sampler",
    [
        AlwaysAccept,
        AcceptWithTargetProbability,
        InvertedRatio,
        RecoverFromTarget,
        RecoverFromAbsoluteDifference,
    ],
)
def test_broken_rules_fail_the_same_test(broken_sampler: type[RejectionSampler]) -> None:
    first_p, pair_p = _fit_p_values(broken_sampler(), num_drafts=3, deterministic_drafter=False)
    assert min(first_p, pair_p) < FIT_THRESHOLD, (first_p, pair_p)


@pytest.mark.parametrize("broken_sampler", [AlwaysAccept, RecoverFromTarget])
def test_broken_rules_fail_with_one_hot_drafts(broken_sampler: type[RejectionSampler]) -> None:
    first_p, pair_p = _fit_p_values(broken_sampler(), num_drafts=3, deterministic_drafter=True)
    assert min(first_p, pair_p) < FIT_THRESHOLD, (first_p, pair_p)


def test_acceptance_rate_is_one_minus_total_variation() -> None:
    """P(accept d_0) = Σ_x min(p(x), q(x)) (Leviathan et al., Corollary 3.6)."""
    rng = make_generator(7)
    target, draft = TARGET[START], DRAFT[START]
    num_trials = 5000
    accepted = 0
    for _ in range(num_trials):
        draft_token = sample(draft, rng)
        result = RejectionSampler().verify_sampled(
            [draft_token], draft[None], np.stack([target, target]), rng
        )
        accepted += result.num_accepted
    expected_rate = float(np.minimum(target, draft).sum())
    assert binomtest(accepted, num_trials, expected_rate).pvalue > FIT_THRESHOLD


def test_identical_draft_and_target_accept_everything() -> None:
    rng = make_generator(0)
    probs = TARGET[:4]  # [4, VOCAB]
    for _ in range(200):
        drafts = [sample(row, rng) for row in probs[:3]]
        result = RejectionSampler().verify_sampled(drafts, probs[:3], probs, rng)
        assert result.num_accepted == 3
        assert result.token_ids[:3] == drafts and len(result.token_ids) == 4


def test_sampled_without_drafts_samples_one_token_from_the_target() -> None:
    rng = make_generator(3)
    counts = np.zeros(VOCAB, dtype=np.int64)
    for _ in range(4000):
        result = RejectionSampler().verify_sampled([], None, TARGET[START][None], rng)
        assert result.num_accepted == 0 and len(result.token_ids) == 1
        counts[result.token_ids[0]] += 1
    assert _chisquare_p(counts, TARGET[START]) > FIT_THRESHOLD


def test_sampled_is_reproducible_with_a_seed() -> None:
    def run(seed: int) -> list[VerificationResult]:
        rng = make_generator(seed)
        drafts = [1, 2, 3]
        return [RejectionSampler().verify_sampled(drafts, DRAFT[:3], TARGET[:4], rng) for _ in range(50)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_rejected_one_hot_draft_is_never_recovered() -> None:
    rng = make_generator(4)
    target = np.array([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    for _ in range(300):
        result = RejectionSampler().verify_sampled([0], None, target, rng)
        if result.num_accepted == 0:
            assert result.token_ids == [1]  # p - one_hot(0) leaves only token 1


def _logits_with_argmax(argmaxes: list[int], vocab: int = 10) -> np.ndarray:
    logits = np.random.default_rng(0).standard_normal((len(argmaxes), vocab)).astype(np.float32)
    logits[np.arange(len(argmaxes)), argmaxes] = 10.0
    return logits  # [len(argmaxes), vocab]


@pytest.mark.parametrize(
    ("drafts", "target_argmax", "expected_tokens", "expected_accepted"),
    [
        ([], [4], [4], 0),  # no drafts: one target token
        ([1, 2, 3], [1, 2, 3, 9], [1, 2, 3, 9], 3),  # all accepted + bonus
        ([1, 2, 3], [1, 5, 3, 9], [1, 5], 1),  # mismatch at 1: recovered target token
        ([7, 2, 3], [1, 2, 3, 9], [1], 0),  # first draft wrong
        ([1, 2, 3], [1, 2, 0, 9], [1, 2, 0], 2),
    ],
)
def test_verify_greedy(
    drafts: list[int], target_argmax: list[int], expected_tokens: list[int], expected_accepted: int
) -> None:
    result = RejectionSampler().verify_greedy(drafts, _logits_with_argmax(target_argmax))
    assert result == VerificationResult(token_ids=expected_tokens, num_accepted=expected_accepted)


def test_greedy_accepts_numpy_draft_ids_and_returns_python_ints() -> None:
    result = RejectionSampler().verify_greedy(np.array([1, 2]), _logits_with_argmax([1, 2, 6]))
    assert result.token_ids == [1, 2, 6]
    assert all(type(token) is int for token in result.token_ids)


def test_shape_mismatches_raise() -> None:
    sampler = RejectionSampler()
    with pytest.raises(ValueError, match="target_logits"):
        sampler.verify_greedy([1, 2], _logits_with_argmax([1, 2]))
    with pytest.raises(ValueError, match="draft_probs"):
        sampler.verify_sampled([1, 2], DRAFT[:1], TARGET[:3], make_generator(0))
    with pytest.raises(ValueError, match="vocabulary"):
        sampler.verify_sampled([1], DRAFT[:1, :4], TARGET[:2], make_generator(0))


# --- coupled verification (seeded requests) ----------------------------------------------------
def _race_tokens(probs: np.ndarray, seed: int, first_position: int) -> list[int]:
    """The target-only tokens of rows ``probs`` ([n, vocab]) at consecutive positions."""
    vocab = probs.shape[1]
    return [race(row, position_exponentials(seed, first_position + i, vocab)) for i, row in enumerate(probs)]


def test_the_race_samples_its_distribution() -> None:
    probs = np.array([0.05, 0.0, 0.3, 0.15, 0.0, 0.5])
    tokens = [race(probs, position_exponentials(11, position, 6)) for position in range(NUM_RUNS)]
    counts = np.bincount(tokens, minlength=6)
    assert counts[1] == counts[4] == 0
    kept = probs > 0
    assert chisquare(counts[kept], probs[kept] * NUM_RUNS).pvalue > FIT_THRESHOLD


def test_the_race_noise_is_keyed_by_seed_and_position_only() -> None:
    first = position_exponentials(2**64 - 1, 5, 16)
    assert np.array_equal(first, position_exponentials(2**64 - 1, 5, 16))
    assert not np.array_equal(first, position_exponentials(2**64 - 1, 6, 16))
    assert not np.array_equal(first, position_exponentials(2**64 - 2, 5, 16))


@pytest.mark.parametrize("case", ["right", "first_wrong", "last_wrong", "random"])
def test_coupled_verification_emits_the_target_only_tokens(case: str) -> None:
    """Whatever the drafts, the emitted tokens are a prefix of the target-only race tokens, one
    longer than the accepted drafts."""
    rng = np.random.default_rng(5)
    probs = rng.dirichlet(np.full(VOCAB, 0.7), size=5)  # [γ+1 = 5, vocab]
    expected = _race_tokens(probs, seed=3, first_position=40)
    drafts = {
        "right": expected[:4],
        "first_wrong": [(expected[0] + 1) % VOCAB] + expected[1:4],
        "last_wrong": expected[:3] + [(expected[3] + 1) % VOCAB],
        "random": rng.integers(0, VOCAB, size=4).tolist(),
    }[case]
    result = RejectionSampler().verify_coupled(
        drafts, probs, lambda row: position_exponentials(3, 40 + row, VOCAB)
    )
    num_matching = next((i for i, (d, t) in enumerate(zip(drafts, expected[:4], strict=True)) if d != t), 4)
    assert result.num_accepted == num_matching
    assert result.token_ids == expected[: num_matching + 1]
