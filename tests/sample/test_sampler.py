"""Logits → probabilities transform and token sampling."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from xpuspec.sample.sampler import argmax, finite_argmax, make_generator, probabilities, sample
from xpuspec.sample.sampling_params import SamplingParams


def _reference_probabilities(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Straightforward full-sort implementation of temperature → top-k → top-p, one row at a time."""
    out = np.zeros(logits.shape, dtype=np.float64)
    for row_index, row in enumerate(logits.astype(np.float64) / temperature):
        if 0 < top_k < row.shape[0]:
            row = np.where(row < np.sort(row)[-top_k], -np.inf, row)
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")
        mass_before = np.cumsum(probs[order]) - probs[order]
        keep = (
            order[mass_before < top_p] if top_p < 1.0 else order
        )  # kept iff the strictly more likely tokens hold < top_p
        keep = keep if keep.size else order[:1]
        out[row_index, keep] = probs[keep] / probs[keep].sum()
    return out


def _random_logits(seed: int, num_rows: int = 5, vocab: int = 1000, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((num_rows, vocab)) * scale).astype(np.float32)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [
        (1.0, 0, 1.0),
        (0.5, 0, 1.0),
        (1.7, 0, 1.0),
        (1.0, 20, 1.0),
        (0.8, 0, 0.9),
        (1.0, 0, 0.3),
        (0.7, 50, 0.8),
    ],
)
@pytest.mark.parametrize("scale", [0.3, 3.0, 12.0], ids=["flat", "normal", "peaked"])
def test_matches_full_sort_reference(temperature: float, top_k: int, top_p: float, scale: float) -> None:
    logits = _random_logits(seed=int(scale * 10), scale=scale)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    expected = _reference_probabilities(logits, temperature, top_k, top_p)
    actual = probabilities(logits, params)
    assert actual.shape == logits.shape and actual.dtype == np.float64
    np.testing.assert_array_equal(actual > 0, expected > 0)
    np.testing.assert_allclose(actual, expected, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(actual.sum(axis=-1), 1.0, rtol=1e-12)


def test_matches_hugging_face_warpers() -> None:
    torch = pytest.importorskip("torch")
    generation = pytest.importorskip("transformers.generation.logits_process")
    logits = _random_logits(seed=3, num_rows=4, vocab=500)
    temperature, top_k, top_p = 0.7, 40, 0.85
    scores = torch.from_numpy(logits.copy())
    for warper in (
        generation.TemperatureLogitsWarper(temperature),
        generation.TopKLogitsWarper(top_k),
        generation.TopPLogitsWarper(top_p),
    ):
        scores = warper(None, scores)
    expected = torch.softmax(scores.double(), dim=-1).numpy()
    actual = probabilities(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    np.testing.assert_array_equal(actual > 0, expected > 0)
    np.testing.assert_allclose(actual, expected, rtol=1e-5)


def test_greedy_is_one_hot_at_argmax() -> None:
    logits = _random_logits(seed=1)
    probs = probabilities(logits, SamplingParams(temperature=0.0))
    np.testing.assert_array_equal(probs.argmax(axis=-1), logits.argmax(axis=-1))
    np.testing.assert_array_equal(probs.sum(axis=-1), 1.0)
    assert np.count_nonzero(probs) == logits.shape[0]
    np.testing.assert_array_equal(argmax(logits), logits.argmax(axis=-1))
    assert argmax(logits[0]).shape == (1,)


def test_tiny_top_p_keeps_the_most_likely_token() -> None:
    logits = _random_logits(seed=2)
    probs = probabilities(logits, SamplingParams(top_p=1e-9))
    np.testing.assert_array_equal(probs.argmax(axis=-1), logits.argmax(axis=-1))
    assert np.count_nonzero(probs) == logits.shape[0]


def test_top_k_keeps_ties_with_the_kth_largest() -> None:
    logits = np.array([[5.0, 3.0, 3.0, 3.0, 1.0]], dtype=np.float32)
    probs = probabilities(logits, SamplingParams(top_k=2))
    np.testing.assert_array_equal(probs[0] > 0, [True, True, True, True, False])


def test_top_k_larger_than_vocab_keeps_everything() -> None:
    logits = _random_logits(seed=4, vocab=30)
    np.testing.assert_allclose(
        probabilities(logits, SamplingParams(top_k=100)), probabilities(logits, SamplingParams())
    )


def test_masked_logits_get_zero_probability() -> None:
    logits = _random_logits(seed=5, num_rows=2, vocab=40)
    logits[:, 10:] = -np.inf
    for params in (SamplingParams(), SamplingParams(top_k=20), SamplingParams(top_p=0.99)):
        probs = probabilities(logits, params)
        assert not probs[:, 10:].any()
        np.testing.assert_allclose(probs.sum(axis=-1), 1.0)


@pytest.mark.parametrize("bad_value", [np.nan, np.inf])
def test_non_finite_rows_raise(bad_value: float) -> None:
    logits = _random_logits(seed=6)
    logits[2, 7] = bad_value
    with pytest.raises(ValueError, match="finite"):
        probabilities(logits, SamplingParams())


def test_sample_follows_the_distribution_and_skips_zeros() -> None:
    probs_row = np.array([0.1, 0.0, 0.4, 0.2, 0.0, 0.3])
    rng = make_generator(11)
    draws = np.array([sample(probs_row, rng) for _ in range(20_000)])
    counts = np.bincount(draws, minlength=probs_row.shape[0])
    assert counts[1] == 0 and counts[4] == 0
    nonzero = probs_row > 0
    assert chisquare(counts[nonzero], probs_row[nonzero] * draws.shape[0]).pvalue > 1e-3


def test_sample_normalises_and_handles_trailing_zeros() -> None:
    rng = make_generator(0)
    assert {sample(np.array([0.0, 3.0, 0.0, 0.0]), rng) for _ in range(50)} == {1}
    with pytest.raises(ValueError, match="mass"):
        sample(np.zeros(4), rng)


def test_sample_uses_exactly_one_uniform() -> None:
    rng, twin = make_generator(9), make_generator(9)
    sample(np.full(10, 0.1), rng)
    twin.random()
    assert rng.random() == twin.random()


def test_seeded_generators_are_reproducible() -> None:
    probs_row = np.full(50, 1 / 50)
    first = [sample(probs_row, make_generator(42)) for _ in range(3)]
    rng_a, rng_b = make_generator(42), make_generator(42)
    assert [sample(probs_row, rng_a) for _ in range(20)] == [sample(probs_row, rng_b) for _ in range(20)]
    assert len(set(first)) == 1


def test_top_p_finds_a_nucleus_far_below_the_first_threshold() -> None:
    # One dominant token (p ≈ 0.9) and a long tail each ~1e-4 of it: the nucleus for top_p=0.95
    # needs tail tokens, which the first candidate threshold (1e-3 of the max) leaves out.
    logits = np.concatenate([[0.0], -9.0 - 1e-3 * np.arange(999)])[None].astype(np.float32)
    probs = probabilities(logits, SamplingParams(top_p=0.95))
    expected = _reference_probabilities(logits, 1.0, 0, 0.95)
    assert 1 < np.count_nonzero(probs) < logits.shape[1]
    np.testing.assert_allclose(probs, expected, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize(
    "bad_row",
    [[0.0, np.nan, 1.0], [np.nan, 5.0, 1.0], [0.0, np.inf, 1.0], [-np.inf, -np.inf, -np.inf]],
)
def test_finite_argmax_refuses_a_row_whose_max_is_not_finite(bad_row):
    logits = np.array([[0.0, 2.0, 1.0], bad_row], dtype=np.float32)
    assert not np.isfinite(logits.max(axis=-1)).all()  # the check it replaces refuses it too
    with pytest.raises(ValueError, match="the target's logits hold NaN or infinity"):
        finite_argmax(logits, "target's logits")


def test_finite_argmax_takes_rows_with_some_minus_infinity():
    logits = np.array([[-np.inf, 2.0, 3.0], [1.0, -np.inf, 0.5]], dtype=np.float32)
    assert finite_argmax(logits) == [2, 0]


@pytest.mark.parametrize("top_k", [0, 3])
def test_min_p_keeps_tokens_at_least_that_fraction_of_the_most_likely(top_k):
    logits = np.log(np.array([[0.5, 0.3, 0.12, 0.08]]))
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_k=top_k, min_p=0.2))[0]
    # 0.2 * 0.5 = 0.1: the 0.08 token goes, the rest are renormalised.
    np.testing.assert_allclose(probs, [0.5 / 0.92, 0.3 / 0.92, 0.12 / 0.92, 0.0])
