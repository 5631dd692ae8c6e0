"""How far one model's next-token distributions are from a reference's, position by position.

The field's measure of a quantised model (``llama-perplexity --kl-divergence``): for every position of a
text, the KL divergence KL(reference || candidate) of the two next-token distributions, whether the two
agree on the most likely token (top-1), and each side's perplexity on the text's actual next tokens.

A peer that gives only its top-n probabilities (``llama-server``'s ``n_probs``) cannot give the full
KL divergence. For it, and for every row beside it so that the rows compare, the divergence is also
computed on a lumped support: the candidate's top-n tokens and the actual next token, each a category of
its own, and all other tokens one category. Lumping categories never increases a KL divergence (the
data-processing inequality), so the lumped figure is a lower bound of the full one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# A lumped remainder can round to zero or below; its probability is floored here before the logarithm.
_FLOOR = 1e-12


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Rows of log-probabilities (float64, so that a divergence of identical rows is exactly 0)."""
    rows = logits.astype(np.float64)
    rows -= rows.max(axis=-1, keepdims=True)
    rows -= np.log(np.exp(rows).sum(axis=-1, keepdims=True))
    return rows


def kl_divergence(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """KL(reference || candidate) per row of log-probabilities."""
    return np.sum(np.exp(reference) * (reference - candidate), axis=-1)


def lumped_kl(reference: np.ndarray, support: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """KL(reference || candidate) per row on a lumped support. ``reference``: full rows of
    log-probabilities; ``support``: each row's token ids, one category each (-1: an unused column, no id
    twice in a row); ``candidate``: the candidate's log-probabilities of those ids (-inf where unused).
    Every token outside a row's support is one more category."""
    ids = np.where(support < 0, 0, support)
    inside = np.where(support < 0, -np.inf, np.take_along_axis(reference, ids, axis=-1))
    p, q = np.exp(inside), np.exp(candidate)
    p_rest = np.maximum(1.0 - p.sum(axis=-1), _FLOOR)
    q_rest = np.maximum(1.0 - q.sum(axis=-1), _FLOOR)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (inside - candidate), 0.0)
    return terms.sum(axis=-1) + p_rest * (np.log(p_rest) - np.log(q_rest))


def top_support(candidate: np.ndarray, actual: np.ndarray, top_n: int) -> np.ndarray:
    """Each row's ``top_n`` most likely ids under ``candidate``, then the actual next token where it is
    not among them (else -1: an unused column)."""
    top = np.argpartition(-candidate, top_n - 1, axis=-1)[:, :top_n]
    known = np.any(top == actual[:, None], axis=-1)
    return np.concatenate([top, np.where(known, -1, actual)[:, None]], axis=-1)


@dataclass
class Deviation:
    """One candidate's deviation from the reference, gathered chunk by chunk."""

    kl: list[np.ndarray] = field(default_factory=list)  # per position
    kl_top_n: list[np.ndarray] = field(default_factory=list)  # per position, lumped on the top-n support
    top1_same: int = 0
    positions: int = 0
    nll: float = 0.0  # summed negative log-likelihood of the actual next tokens

    def add(
        self,
        kl: np.ndarray | None,
        kl_top_n: np.ndarray,
        top1_same: int,
        nll: float,
    ) -> None:
        if kl is not None:
            self.kl.append(kl)
        self.kl_top_n.append(kl_top_n)
        self.top1_same += top1_same
        self.positions += len(kl_top_n)
        self.nll += nll

    def figures(self) -> dict[str, float | None]:
        """KL mean and 99th percentile (full and top-n lumped), top-1 agreement and perplexity."""
        full = np.concatenate(self.kl) if self.kl else None
        lumped = np.concatenate(self.kl_top_n) if self.kl_top_n else np.zeros(0)
        return {
            "kl_mean": None if full is None else float(full.mean()),
            "kl_p99": None if full is None else float(np.percentile(full, 99)),
            "kl_top_n_mean": float(lumped.mean()) if lumped.size else None,
            "kl_top_n_p99": float(np.percentile(lumped, 99)) if lumped.size else None,
            "top1": self.top1_same / self.positions if self.positions else None,
            "perplexity": math.exp(self.nll / self.positions) if self.positions else None,
        }


def compare_rows(
    reference: np.ndarray, candidate: np.ndarray, actual: np.ndarray, top_n: int, deviation: Deviation
) -> None:
    """Add one chunk's positions to ``deviation``: rows of log-probabilities of both sides, and the
    actual next token of each row."""
    support = top_support(candidate, actual, top_n)
    ids = np.where(support < 0, 0, support)
    on_support = np.where(support < 0, -np.inf, np.take_along_axis(candidate, ids, axis=-1))
    same = int(np.sum(reference.argmax(axis=-1) == candidate.argmax(axis=-1)))
    nll = float(-np.take_along_axis(candidate, actual[:, None], axis=-1).sum())
    deviation.add(kl_divergence(reference, candidate), lumped_kl(reference, support, on_support), same, nll)
