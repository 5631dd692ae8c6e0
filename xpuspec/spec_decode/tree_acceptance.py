"""Verification of a draft tree: which root-to-leaf path the target keeps, and one more token.

The target ran the root (the sequence's last token) and every node of the tree in one pass, so
row 0 of its output is its next-token distribution after the root and row ``1 + i`` the one after
node ``i``'s path (:mod:`xpuspec.spec_decode.tree`).

**Greedy.** From the root, move to the child whose token is the target's argmax at the current
node, while there is one; then emit the argmax at the last node reached. The emitted tokens are the
target's own argmax chain, so the output equals target-only greedy decoding token for token; a
chain is the special case of one child per node (``verify_greedy`` of the chain sampler).

**Sampled: recursive rejection sampling over siblings drawn without replacement** (Jeon et al.
2024, "Recursive Speculative Decoding", Algorithm 1; SpecInfer's multi-step speculative sampling,
Miao et al. 2024, is the with-replacement variant). At a node with target distribution ``p`` the
children ``c_1 .. c_k`` were drawn by the drafter one after another from the draft distribution
``q`` with the earlier ones removed: ``c_i ~ q_i = normalize(q · 1[not c_1..c_{i-1}])``. Let
``r_1 = p``. For ``i = 1..k``: accept ``c_i`` with probability ``min(1, r_i(c_i) / q_i(c_i))`` and
descend into it; otherwise ``r_{i+1} = normalize(max(0, r_i - q_i))`` and try the next sibling.
If every child is rejected (or the node has none), sample the emitted token from ``r_{k+1}``.

*Why the emitted token is distributed as p.* Claim: for any j, the procedure run from sibling j
on with residual ``r_j`` outputs a token distributed as ``r_j``, whatever ``q_j`` is (the drafts
are the drafter's, drawn independently of the verification's uniforms). For j = k+1 it samples
``r_{k+1}`` directly. For j <= k, given the history, ``c_j ~ q_j``; the output is ``c_j`` with
probability ``q_j(x) min(1, r_j(x)/q_j(x)) = min(q_j(x), r_j(x))`` at x, and otherwise (probability
``1 - Σ min(q_j, r_j) = Σ max(0, r_j - q_j)``) the procedure from j+1, which by induction outputs
``r_{j+1} = max(0, r_j - q_j) / Σ max(0, r_j - q_j)`` whatever ``c_j`` was. Sum:
``min(q_j, r_j)(x) + max(0, r_j - q_j)(x) = r_j(x)``. This is the speculative-sampling lemma
(Leviathan et al. 2023, Theorem 1) applied once per sibling with the residual as the new target;
drawing without replacement only changes the proposals ``q_j``, which the lemma allows to be any
distribution fixed before ``c_j`` is drawn. With j = 1, the emitted token at this position is
distributed as ``p``.

*Deeper positions.* Once ``c_j`` is accepted, the next position is verified at ``c_j`` with the
target's row there (its distribution given the accepted prefix) and the children of ``c_j``, which
the drafter drew from the draft's distribution at ``c_j`` independently of everything the
verification did. Whether ``c_j`` has children at all may depend on tokens drafted earlier (the
frontier choice of the drafter) but not on the children's own values: the drafter keeps every
child it draws (:mod:`xpuspec.spec_decode.tree_proposer`). Conditioned on the accepted prefix,
the procedure at the next position is again exact, so by induction on depth every emitted token
follows the target given the tokens before it: the output is distributed as target-only sampling.
(Pruning children by their own probability, as the greedy tree does, would break this: the kept
candidates would no longer be draws from ``q_j``.)

Seeded requests do not draft trees: their chain verification is coupled by position
(``RejectionSampler.verify_coupled``), which a tree's several candidates per position do not fit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from xpuspec.sample.sampler import finite_argmax, sample
from xpuspec.spec_decode.rejection_sampler import RejectionSampler
from xpuspec.spec_decode.tree import DraftTree

logger = logging.getLogger(__name__)


@dataclass
class TreeVerification:
    """What verifying one tree emits: the accepted path's tokens, then one more token."""

    token_ids: list[int]
    accepted_nodes: list[int]  # node indices of the accepted path, root's child first

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_nodes)

    def path_ranks(self, tree: DraftTree) -> tuple[list[int], list[int]]:
        """Along the path: how many children each level's node had, and the accepted child's rank
        among them (for the cost model's acceptance per depth and rank)."""
        counts, ranks = [], []
        node = -1
        for level in range(self.num_accepted + 1):
            children = tree.children(node)
            counts.append(len(children))
            if level < self.num_accepted:
                node = self.accepted_nodes[level]
                ranks.append(children.index(node))
        return counts, ranks


class TreeAcceptance:
    """Greedy and sampled acceptance of a :class:`DraftTree` against the target's rows ``[1 + n, vocab]``.

    The per-sibling acceptance probability and residual are separate methods so that tests can
    substitute a deliberately wrong rule and check that the statistical test catches it.
    """

    def verify_greedy(self, tree: DraftTree, target_logits: np.ndarray) -> TreeVerification:
        _check_rows(tree, target_logits)
        target_tokens = finite_argmax(target_logits, "target's logits for this request")  # 1 + n
        child_of = {
            (parent, token): node
            for node, (parent, token) in enumerate(zip(tree.parents, tree.token_ids, strict=True))
        }
        node, tokens = -1, []
        accepted: list[int] = []
        while True:
            wanted = int(target_tokens[node + 1])
            child = child_of.get((node, wanted))
            tokens.append(wanted)
            if child is None:
                return TreeVerification(tokens, accepted)
            accepted.append(child)
            node = child

    def verify_sampled(
        self, tree: DraftTree, target_probs: np.ndarray, rng: np.random.Generator
    ) -> TreeVerification:
        """Recursive rejection sampling over each node's children (see the module docstring).

        ``tree.probs[i]`` is the draft distribution node i's siblings were drawn from (the same row
        for all children of a node), over the target's vocabulary.
        """
        _check_rows(tree, target_probs)
        if tree.probs is None or tree.probs.shape != (len(tree), target_probs.shape[1]):
            raise ValueError("sampled tree verification needs the draft distribution of every node")
        node, tokens = -1, []
        accepted: list[int] = []
        while True:
            residual = target_probs[node + 1].astype(np.float64)  # r_1 = p
            chosen = None
            children = tree.children(node)
            if children:
                q = tree.probs[children[0]].astype(np.float64)  # drawn from this, without replacement
                for child in children:
                    token = tree.token_ids[child]
                    total = q.sum()
                    q_i = q / total if total > 0.0 else q
                    if rng.random() < self.acceptance_probability(residual, q_i, token):
                        chosen = child
                        break
                    residual = self.residual(residual, q_i)
                    q[token] = 0.0  # the next sibling was drawn without this one
            if chosen is None:
                tokens.append(sample(residual, rng))
                return TreeVerification(tokens, accepted)
            tokens.append(tree.token_ids[chosen])
            accepted.append(chosen)
            node = chosen

    @staticmethod
    def acceptance_probability(residual: np.ndarray, q_i: np.ndarray, token: int) -> float:
        """``min(1, r_i(c) / q_i(c))``."""
        return RejectionSampler.acceptance_probability(float(residual[token]), float(q_i[token]))

    @staticmethod
    def residual(residual: np.ndarray, q_i: np.ndarray) -> np.ndarray:
        """``normalize(max(0, r_i - q_i))``; r_i itself if that has no mass (a rejection that had
        probability 0 but happened through rounding)."""
        left = np.maximum(residual - q_i, 0.0)
        total = left.sum()
        if not total > 0.0:
            logger.debug("empty residual at a tree rejection; keeping the previous residual")
            return residual
        return left / total


def _check_rows(tree: DraftTree, rows: np.ndarray) -> None:
    if rows.ndim != 2 or rows.shape[0] != len(tree) + 1:
        raise ValueError(
            f"a tree of {len(tree)} nodes needs {len(tree) + 1} target rows (root first), got {rows.shape}"
        )
