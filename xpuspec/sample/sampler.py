"""Logits → probabilities (temperature, top-k, top-p) and token sampling, in numpy.

Speculative decoding is exact only if the draft and the target are compared under the SAME
transform: the engine calls :func:`probabilities` with the request's :class:`SamplingParams` on
both the draft logits and the target logits, and the rejection sampler then reproduces the
target's transformed distribution exactly.

The transform, in this order (the order Hugging Face's logits warpers use):

1. temperature: ``logits / temperature``; ``temperature == 0`` is greedy and gives a one-hot
   row at the argmax (so sampled verification degenerates to greedy verification);
2. top-k: keep the ``top_k`` largest logits; ties with the k-th largest are all kept, so the
   result does not depend on the order in which equal logits happen to be stored;
3. top-p (nucleus): keep the smallest set of most likely tokens whose mass reaches ``top_p``
   (at least the most likely token; ties with the last kept token are kept too), then renormalise;
4. min-p: keep the tokens whose probability is at least ``min_p`` times the most likely one's, then
   renormalise.

Repetition penalties come before all of this, on the logits (:mod:`xpuspec.sample.penalties`).

Speed: vocabularies reach ~150k and a verification step has up to 17 rows. Top-k uses
``np.partition`` (linear time) and computes the softmax of the kept tokens only. Top-p sorts only
a candidate set {p >= threshold} that already holds ``top_p`` of the mass, so no full-vocabulary
sort happens unless the distribution is nearly flat.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from xpuspec.sample.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Nucleus search: candidates are the tokens with p >= t; t starts at max_p * 1e-3 and drops
# by 1e-3 per round until the candidates hold top_p of the mass (below 1e-30 it drops to 0).
_NUCLEUS_FIRST_THRESHOLD = 1e-3
_NUCLEUS_THRESHOLD_STEP = 1e-3
_NUCLEUS_SMALLEST_THRESHOLD = 1e-30


def make_generator(seed: int | None) -> np.random.Generator:
    """A per-request random generator: reproducible with a seed, fresh OS entropy without one."""
    return np.random.default_rng(seed)


def position_exponentials(seed: int, position: int, vocab: int) -> np.ndarray:
    """The noise of one token position of a seeded request: ``vocab`` i.i.d. Exp(1) numbers.

    Drawn from a stream keyed by ``(seed, position)`` alone, so the noise of a position does not
    depend on how many numbers earlier steps drew (γ, batch, overlap grouping). -> [vocab] float64.
    """
    return np.random.default_rng([seed, position]).standard_exponential(vocab)


def race(probs_row: np.ndarray, exponentials: np.ndarray) -> int:
    """The token of an exponential race: ``argmax p_i / E_i`` with ``E_i`` i.i.d. Exp(1).

    ``E_i / p_i`` is Exp(p_i), and the smallest of independent exponentials is the one of rate
    ``p_i`` with probability ``p_i / sum(p)``: the winner is an exact sample of ``probs_row``
    (the Gumbel-max trick, with ``-log E_i`` the Gumbel noise). Two distributions raced with the
    same ``E`` pick the same token as often as their shapes allow, which is what the coupled
    verification of seeded requests relies on. ``probs_row``: [vocab], ``exponentials``: [>= vocab].
    Tokens with probability 0 never win.
    """
    scores = probs_row / exponentials[: probs_row.shape[0]]  # [vocab]
    token = int(np.argmax(scores))
    if not scores[token] > 0.0:
        raise ValueError("cannot sample from a row without positive mass")
    return token


def finite_argmax(logits: np.ndarray, what: str = "logits") -> list[int]:
    """Greedy tokens of each row, refusing a row whose largest logit is NaN or infinite.

    ``logits``: [num_rows, vocab] → num_rows ints. One pass over each row: ``np.argmax`` returns the
    first NaN of a row that holds one, so the logit it picks is finite exactly when the row's max is
    (the check :func:`probabilities` makes), and greedy decoding pays for one reduction, not three.
    """
    # Method calls and .item(), not np.argmax and a fancy index: right after an inference the
    # interpreter's and numpy's code is cold in the caches, and each numpy call then costs more than
    # the work it does on a few rows (figure: docs/experiments/code-comment-figures.md).
    tokens = logits.argmax(axis=-1).tolist()  # num_rows
    for row, token in enumerate(tokens):
        if not math.isfinite(logits.item(row, token)):
            raise ValueError(f"the {what} hold NaN or infinity")
    return tokens


def argmax(logits: np.ndarray) -> np.ndarray:
    """Greedy tokens: the index of the largest logit of each row (the first one on ties).

    ``logits``: [num_rows, vocab] → [num_rows] int64.
    """
    return np.argmax(np.atleast_2d(logits), axis=-1).astype(np.int64)


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Apply temperature, top-k, top-p and min-p to each row and return normalised probabilities.

    ``logits``: [num_rows, vocab] (or [vocab]) float → [num_rows, vocab] float64, each row
    summing to 1, with exact zeros outside the kept set. A field left unset (None) applies no
    transform here: the engine gives a request's params the model's defaults before it samples.
    """
    temperature = 1.0 if params.temperature is None else params.temperature
    top_k, top_p, min_p = params.top_k or 0, params.top_p or 1.0, params.min_p or 0.0
    logits = np.atleast_2d(np.asarray(logits))  # [num_rows, vocab]
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape [num_rows, vocab], got {logits.shape}")
    num_rows, vocab = logits.shape
    row_max = logits.max(axis=-1)  # [num_rows]
    if not np.all(np.isfinite(row_max)):
        raise ValueError("every row of logits needs a finite maximum (got a NaN, +inf or all -inf row)")
    if temperature == 0.0:
        one_hot = np.zeros((num_rows, vocab), dtype=np.float64)
        one_hot[np.arange(num_rows), argmax(logits)] = 1.0
        return one_hot

    inverse_temperature = 1.0 / float(temperature)
    if 0 < top_k < vocab:
        # Temperature is monotone, so the top-k set is found on the raw logits. Only the kept
        # tokens get a softmax: the rest of the row stays an exact zero.
        kth_largest = np.partition(logits, vocab - top_k, axis=-1)[:, vocab - top_k]
        probs = np.zeros((num_rows, vocab), dtype=np.float64)  # [num_rows, vocab]
        for row_index in range(num_rows):
            # Everything at least as large as the k-th largest: ties are kept, as in HF.
            kept = np.flatnonzero(logits[row_index] >= kth_largest[row_index])
            kept_probs = _softmax(logits[row_index, kept], row_max[row_index], inverse_temperature)
            if top_p < 1.0:
                kept, kept_probs = _nucleus(kept, kept_probs, top_p)
            if min_p:
                kept, kept_probs = _min_p(kept, kept_probs, min_p)
            probs[row_index, kept] = kept_probs
        return probs

    # float64 keeps tiny probabilities meaningful: the rejection sampler divides by them.
    probs = np.subtract(logits, row_max[:, None], dtype=np.float64)  # [num_rows, vocab]
    probs *= inverse_temperature
    np.exp(probs, out=probs)
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        for row in probs:
            candidates = _nucleus_candidates(row, top_p)
            kept, kept_probs = _nucleus(candidates, row[candidates], top_p)
            row[:] = 0.0
            row[kept] = kept_probs
    if min_p:
        for row in probs:
            kept = np.flatnonzero(row >= min_p * row.max())
            kept, kept_probs = _min_p(kept, row[kept], min_p)
            row[:] = 0.0
            row[kept] = kept_probs
    return probs


def _min_p(indices: np.ndarray, token_probs: np.ndarray, min_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The tokens ``indices`` whose probability (``token_probs``) is at least ``min_p`` times the
    largest, renormalised (the most likely token always stays)."""
    is_kept = token_probs >= min_p * token_probs.max()
    kept_probs = token_probs[is_kept]
    return indices[is_kept], kept_probs / kept_probs.sum()


def _softmax(values: np.ndarray, max_value: float, inverse_temperature: float) -> np.ndarray:
    """Softmax of ``values`` ([num_values]) at the given temperature, in float64."""
    weights = np.exp((values.astype(np.float64) - max_value) * inverse_temperature)
    return weights / weights.sum()


def _nucleus_candidates(row: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of a set of most likely tokens of ``row`` ([vocab], sums to 1) that holds the nucleus.

    A threshold set {p >= t} is a top set, so once its mass reaches ``top_p`` it contains the
    nucleus. Lowering t geometrically finds a small set in a few linear passes, with no sort.
    """
    threshold = row.max() * _NUCLEUS_FIRST_THRESHOLD
    while True:
        candidates = np.flatnonzero(row >= threshold)
        if row[candidates].sum() >= top_p or threshold == 0.0:
            return candidates
        threshold = threshold * _NUCLEUS_THRESHOLD_STEP if threshold > _NUCLEUS_SMALLEST_THRESHOLD else 0.0


def _nucleus(indices: np.ndarray, token_probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The nucleus of the tokens ``indices`` with probabilities ``token_probs`` (both [num_candidates]).

    Keeps the most likely tokens up to and including the first at which the cumulative mass
    reaches ``top_p`` (at least one token; HF's rule) plus any token tied with that last one,
    and renormalises them. ``token_probs`` are
    probabilities of the whole (top-k cut) row, so the candidates' own total may be below 1.
    """
    descending = np.sort(token_probs)[::-1]  # values only: much faster than an argsort
    cumulative = np.cumsum(descending)
    num_kept = min(int(np.searchsorted(cumulative, top_p, side="left")) + 1, descending.shape[0])
    # Tokens tied with the last kept one are all kept, so the set does not depend on storage order.
    is_kept = token_probs >= descending[num_kept - 1]
    kept_probs = token_probs[is_kept]
    return indices[is_kept], kept_probs / kept_probs.sum()


def sample(probs_row: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token from ``probs_row`` ([vocab], non-negative, need not sum to 1).

    Inverse CDF with a single uniform draw, so one call consumes exactly one number from ``rng``.
    Tokens with probability 0 are never returned.
    """
    cumulative = np.cumsum(probs_row, dtype=np.float64)  # [vocab]
    total = cumulative[-1]
    if not total > 0.0 or not np.isfinite(total):
        raise ValueError(f"cannot sample from a row with total mass {total}")
    token = int(np.searchsorted(cumulative, rng.random() * total, side="right"))
    if token >= probs_row.shape[0]:
        # u * total rounded up to total: fall back to the last token that has mass.
        token = int(np.flatnonzero(probs_row)[-1])
    return token
