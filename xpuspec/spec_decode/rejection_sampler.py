"""Verification of draft tokens by the target: the rule that makes speculative decoding exact.

A drafter proposes γ tokens ``d_0 .. d_{γ-1}``; one target pass over them yields γ+1
distributions ``p_0 .. p_γ`` (``p_i`` is the target's next-token distribution after ``d_0 .. d_{i-1}``).
Verification emits:

- **accepted** tokens: the longest prefix of the drafts that the target keeps;
- then exactly one more token, either
  - a **recovered** token, sampled in place of the first rejected draft ``d_i``, or
  - the **bonus** token, sampled from ``p_γ`` when every draft was accepted.

So each verification step emits between 1 and γ+1 tokens.

Greedy (temperature 0): ``d_i`` is accepted while it equals ``argmax p_i``; the recovered token is
``argmax p_i`` at the first mismatch and the bonus is ``argmax p_γ``.

Sampled: ``d_i`` (drawn from the draft distribution ``q_i``) is accepted with probability
``min(1, p_i(d_i) / q_i(d_i))``; on rejection the recovered token is drawn from
``normalize(max(0, p_i - q_i))``. Every emitted token is then distributed exactly as if sampled
from the target alone (Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via
Speculative Decoding", ICML, Theorem 1; Chen et al. 2023, "Accelerating Large Language Model
Decoding with Speculative Sampling", arXiv:2302.01318, Theorem 1). A deterministic drafter
(n-gram lookup) is the special case where ``q_i`` is one-hot at ``d_i``: accept with probability
``p_i(d_i)``, otherwise sample from ``p_i`` with ``d_i`` removed.

Seeded requests use **coupled** verification instead (``verify_coupled``): the token of
position t is the winner of an exponential race (Gumbel-max) ``argmax p_t / E_t`` with noise
``E_t`` drawn from a stream keyed by (seed, t) alone; the drafter raced ``q_t`` with the same
``E_t``; a draft is accepted iff it equals the target's winner. Every emitted token is then the
target's own race winner, an exact sample of ``p_t``, and the output is the seeded target-only
output whatever γ, batch or step grouping was: rejection sampling draws a varying count of
uniforms per step, so its output would depend on them. The price: the race coupling accepts
``P(argmax q/E = argmax p/E)``, somewhat less than the optimal ``1 - TV(p, q)`` of rejection
sampling, and a deterministic drafter is accepted with probability ``p_t(d)``, as before.

The loop mirrors gpt-fast's ``speculative_decode``; γ+1 is at most 17, so a plain Python loop over
positions costs microseconds next to the model passes. The acceptance test and the recovery
distribution are separate methods so that tests can substitute deliberately wrong rules and
check that the statistical tests catch them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from xpuspec.sample.sampler import finite_argmax, race, sample

logger = logging.getLogger(__name__)


@dataclass
class VerificationResult:
    """What one verification step emits for one sequence."""

    token_ids: list[int]  # the accepted draft tokens, then exactly one recovered or bonus token
    num_accepted: int  # how many draft tokens were accepted (0..γ)


class RejectionSampler:
    """Verifies one sequence's draft tokens against the target's outputs (greedy or sampled)."""

    def verify_greedy(
        self,
        draft_token_ids: Sequence[int],
        target_logits: np.ndarray,  # [γ+1, vocab]
    ) -> VerificationResult:
        """Accept the longest draft prefix equal to the target's argmax, then one target argmax token.

        Raises ``ValueError`` when a row's largest logit is NaN or infinite (no greedy token exists).
        """
        num_drafts = len(draft_token_ids)
        _check_rows("target_logits", target_logits, num_drafts + 1)
        target_tokens = finite_argmax(target_logits, "target's logits for this request")  # γ+1
        num_accepted = 0
        while num_accepted < num_drafts and int(draft_token_ids[num_accepted]) == target_tokens[num_accepted]:
            num_accepted += 1
        # At the first mismatch target_tokens[i] is the recovered token; after γ accepts, the bonus.
        return VerificationResult(token_ids=target_tokens[: num_accepted + 1], num_accepted=num_accepted)

    def verify_sampled(
        self,
        draft_token_ids: Sequence[int],
        draft_probs: np.ndarray | None,  # [γ, vocab], or None for a deterministic drafter
        target_probs: np.ndarray,  # [γ+1, vocab]
        rng: np.random.Generator,
    ) -> VerificationResult:
        """Speculative sampling: the emitted tokens follow the target distribution exactly.

        ``draft_probs`` and ``target_probs`` must come from the same logits transform
        (temperature, top-k, top-p; see :func:`xpuspec.sample.sampler.probabilities`).
        ``draft_probs=None`` means each ``q_i`` is one-hot at ``d_i`` (n-gram drafts).
        Consumes one uniform per examined draft plus one for the recovered or bonus token.
        """
        num_drafts = len(draft_token_ids)
        _check_rows("target_probs", target_probs, num_drafts + 1)
        if draft_probs is not None:
            _check_rows("draft_probs", draft_probs, num_drafts)
            if draft_probs.shape[1] != target_probs.shape[1]:
                raise ValueError(
                    f"draft_probs and target_probs need the same vocabulary size, got "
                    f"{draft_probs.shape[1]} and {target_probs.shape[1]}"
                )

        token_ids: list[int] = []
        for position, draft_token in enumerate(draft_token_ids):
            draft_token = int(draft_token)
            target_row = target_probs[position]  # [vocab]
            draft_row = None if draft_probs is None else draft_probs[position]  # [vocab]
            draft_prob = 1.0 if draft_row is None else float(draft_row[draft_token])
            if rng.random() < self.acceptance_probability(float(target_row[draft_token]), draft_prob):
                token_ids.append(draft_token)
                continue
            residual = self.recovery_distribution(target_row, draft_row, draft_token)  # [vocab]
            token_ids.append(sample(residual, rng))
            return VerificationResult(token_ids=token_ids, num_accepted=position)

        token_ids.append(sample(target_probs[num_drafts], rng))  # the bonus token
        return VerificationResult(token_ids=token_ids, num_accepted=num_drafts)

    def verify_coupled(
        self,
        draft_token_ids: Sequence[int],
        target_probs: np.ndarray,  # [γ+1, vocab]
        noise_at: Callable[[int], np.ndarray],
    ) -> VerificationResult:
        """Coupled verification of a seeded request: emit the target's race winners while the drafts match.

        ``noise_at(i)`` is the exponential noise ([vocab]) of row i's token position, the same the
        drafter raced its ``q_i`` with. Noise is drawn only up to the first mismatch.
        """
        num_drafts = len(draft_token_ids)
        _check_rows("target_probs", target_probs, num_drafts + 1)
        token_ids: list[int] = []
        for position in range(num_drafts + 1):
            target_token = race(target_probs[position], noise_at(position))
            if position < num_drafts:
                draft_token = int(draft_token_ids[position])
                if self.coupled_acceptance(draft_token, target_token):
                    token_ids.append(draft_token)
                    continue
            token_ids.append(target_token)  # the recovered token at a mismatch, or the bonus token
            return VerificationResult(token_ids=token_ids, num_accepted=position)
        raise AssertionError("unreachable: the last position always returns")

    @staticmethod
    def coupled_acceptance(draft_token: int, target_token: int) -> bool:
        """Coupled rule: a draft stands iff it is the token the target's own race picked."""
        return draft_token == target_token

    @staticmethod
    def acceptance_probability(target_prob: float, draft_prob: float) -> float:
        """``min(1, p(d) / q(d))`` for the draft token d.

        q(d) = 0 cannot happen for a token drawn from q; it is treated as "the target decides":
        accept if p(d) > 0, reject otherwise.
        """
        if draft_prob <= 0.0:
            return 1.0 if target_prob > 0.0 else 0.0
        return min(1.0, target_prob / draft_prob)

    @staticmethod
    def recovery_distribution(
        target_row: np.ndarray,  # [vocab]
        draft_row: np.ndarray | None,  # [vocab], or None: one-hot at draft_token
        draft_token: int,
    ) -> np.ndarray:
        """``max(0, p - q)`` (unnormalised; :func:`sample` normalises), the law of a recovered token.

        If it has no mass (p == q, so a rejection had probability 0 but rounding produced one)
        the target row itself is returned, which is then the correct law.
        """
        if draft_row is None:
            residual = target_row.copy()
            residual[draft_token] = 0.0  # p - one_hot(d) is negative only at d
        else:
            residual = np.maximum(target_row - draft_row, 0.0)
        if not residual.sum() > 0.0:
            logger.debug("empty residual distribution at a rejection; sampling from the target row")
            return target_row
        return residual


def _check_rows(name: str, array: np.ndarray, expected_rows: int) -> None:
    if array.ndim != 2 or array.shape[0] != expected_rows:
        raise ValueError(
            f"{name} must have shape [{expected_rows}, vocab] (one row per draft token"
            f"{' plus one' if name.startswith('target') else ''}), got {array.shape}"
        )
