"""The drafter-independent part of EAGLE-2-style dynamic trees: node scores, frontier and final choice.

Both tree drafters (the draft model's :mod:`xpuspec.spec_decode.tree_proposer` and the EAGLE-3 head's
:mod:`xpuspec.spec_decode.eagle3.tree`) grow one :class:`TreeBuild` per sequence the same way; only how
a depth's frontier is run differs. The rules (see :mod:`xpuspec.spec_decode.tree_proposer` for why):

- children of a node come from its draft logits row: greedy requests take the ``width`` most probable
  tokens, sampled ones draw ``width`` tokens without replacement from q and record q per node;
- a node's score is the cumulative draft log-probability of its path;
- each depth expands the ``width`` best-scored nodes of the deepest level (within the node budget);
- the final tree is the ``nodes`` best-scored nodes (greedy) or every drawn node (sampled), in
  breadth-first order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from xpuspec.core.proposal import Proposal
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.sample.draft_tree import TreeShape
from xpuspec.sample.sampler import probabilities
from xpuspec.spec_decode.tree import DraftTree

logger = logging.getLogger(__name__)


@dataclass
class TreeNode:
    token: int  # a target id
    parent: int  # index into TreeBuild.nodes, -1 for the root's children
    depth: int
    score: float  # cumulative draft log-probability of the path root -> this node
    probs: np.ndarray | None  # [target vocab] q this node was drawn from (sampled requests)


@dataclass
class TreeBuild:
    """One sequence's tree while it is drafted."""

    chunk: ScheduledChunk
    shape: TreeShape
    budget: int  # nodes the scheduler granted
    rng: np.random.Generator | None
    nodes: list[TreeNode] = field(default_factory=list)
    expanded: list[int] = field(default_factory=list)  # node ids run in the draft, breadth-first
    error: str | None = None

    @property
    def request_id(self) -> str:
        return self.chunk.sequence.request_id

    def choose_frontier(self, depth: int) -> list[int]:
        """Mark the best nodes of ``depth`` as expanded; return them (ascending ids), [] when none can be."""
        if self.error is not None or depth >= min(self.shape.depth, self.budget):
            return []
        if self.rng is None:
            room = self.budget - len(self.expanded)  # a draft model's chunk must fit the granted KV slots
        else:
            # A sampled tree keeps every drawn child (see proposal): expand only what fits.
            room = (self.budget - len(self.nodes)) // self.shape.width
        level = [index for index, node in enumerate(self.nodes) if node.depth == depth]
        level.sort(key=lambda index: -self.nodes[index].score)
        frontier = sorted(level[: min(self.shape.width, room)])
        self.expanded.extend(frontier)
        return frontier

    def expand(
        self,
        parents: list[int],
        logits: np.ndarray,  # [len(parents), draft vocab]
        target_vocab_size: int,
        target_ids: np.ndarray | None = None,  # [draft vocab] target id of each draft id; None: identity
    ) -> None:
        """Add the children of each of ``parents`` (-1: the root) from their draft logits rows."""
        if self.error is not None:
            return
        if not np.all(np.isfinite(logits.max(axis=-1))):
            self.error = "drafting failed: the draft's logits hold NaN or infinity"
            return
        params = self.chunk.sequence.params
        width = self.shape.width
        for parent, row in zip(parents, logits, strict=True):
            base = 0.0 if parent < 0 else self.nodes[parent].score
            depth = 1 if parent < 0 else self.nodes[parent].depth + 1
            if params.greedy:
                log_probs = row.astype(np.float64) - row.max()  # [draft vocab]
                log_probs -= np.log(np.exp(log_probs).sum())
                top = np.argpartition(-log_probs, width - 1)[:width]
                top = top[np.argsort(-log_probs[top], kind="stable")]
                for draft_id in top:
                    token = int(draft_id) if target_ids is None else int(target_ids[draft_id])
                    self.nodes.append(TreeNode(token, parent, depth, base + float(log_probs[draft_id]), None))
                continue
            q_draft = probabilities(row[None, :], params)[0]  # [draft vocab]
            if target_ids is None:
                q = q_draft
                if q.shape[0] < target_vocab_size:
                    q = np.pad(q, (0, target_vocab_size - q.shape[0]))
            else:
                # Zero outside the draft vocabulary: verification recovers those ids from the residual.
                q = np.zeros(target_vocab_size, np.float64)  # [target vocab]
                q[target_ids] = q_draft
            count = min(width, self.budget - len(self.nodes))
            for token in draw_without_replacement(q, count, self.rng):
                self.nodes.append(TreeNode(int(token), parent, depth, base + float(np.log(q[token])), q))

    def proposal(self) -> Proposal:
        if self.error is not None:
            logger.warning("tree drafting failed for %s: %s", self.request_id, self.error)
            return Proposal([], None, error=self.error)
        if self.rng is None:
            # The best nodes by path score; on equal scores the shallower first, so parents precede.
            ranked = sorted(
                range(len(self.nodes)), key=lambda i: (-self.nodes[i].score, self.nodes[i].depth, i)
            )
            chosen = sorted(ranked[: self.budget], key=lambda i: (self.nodes[i].depth, i))
        else:
            # Sampled: every drawn child stays, in draw order. Keeping children by their own
            # probability would bias the candidates that verification assumes were drawn from q
            # without replacement (tree_acceptance); which nodes get children may depend on
            # tokens drawn before (the frontier choice), which verification allows.
            chosen = sorted(range(len(self.nodes)), key=lambda i: (self.nodes[i].depth, i))
        index_of = {node: index for index, node in enumerate(chosen)}
        parents = []
        for node in chosen:
            parent = self.nodes[node].parent
            if parent >= 0 and parent not in index_of:
                raise AssertionError("a chosen tree node lacks its parent")
            parents.append(index_of[parent] if parent >= 0 else -1)
        probs = None
        if not self.chunk.sequence.params.greedy:
            drawn = [row for node in chosen if (row := self.nodes[node].probs) is not None]
            if len(drawn) != len(chosen):
                raise AssertionError("a node of a sampled tree lacks the distribution it was drawn from")
            probs = np.stack(drawn)
        tree = DraftTree([self.nodes[node].token for node in chosen], parents, probs)
        return Proposal(tree.token_ids, tree.probs, tree_parents=tree.parents)


def draw_without_replacement(q: np.ndarray, count: int, rng: np.random.Generator | None) -> list[int]:
    """``count`` distinct tokens drawn one after another from q renormalised over the tokens left
    (sampling without replacement; fewer when q has fewer non-zero tokens)."""
    if rng is None:
        raise ValueError("a sampled tree needs the request's random stream")
    remaining = q.astype(np.float64).copy()
    drawn: list[int] = []
    for _ in range(count):
        total = remaining.sum()
        if not total > 0.0:
            break
        token = int(np.searchsorted(np.cumsum(remaining), rng.random() * total, side="right"))
        token = min(token, remaining.shape[0] - 1)
        while remaining[token] == 0.0:  # rounding at the top end of the cumulative sum
            token -= 1
        drawn.append(token)
        remaining[token] = 0.0
    return drawn
