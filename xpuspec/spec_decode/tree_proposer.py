"""Tree drafting with the draft model: EAGLE-2-style dynamic trees, one batched draft pass per depth.

For every sequence that drafts a tree this step:

1. **catch-up** (one pass for all of them): the draft computes the tokens it has not seen; the
   last row is the draft's distribution after the root (the sequence's last token);
2. the root's ``width`` most probable tokens become the depth-1 nodes, each scored by its
   cumulative draft log-probability (the log-probability of its whole path);
3. **per depth** (one pass for all sequences): the ``width`` best-scored nodes of the deepest
   level are expanded. The pass runs every expanded node so far as one tree chunk (the
   qq_bias mask makes each attend to the past and its ancestors only), because KV already in the
   cache is visible to every query: nodes of earlier passes cannot stay in the cache as "past".
   The tree is small (<= 16 nodes) and the draft memory-bound, so re-running it costs about as
   much as running one level. The expanded nodes' children (top ``width`` of each row) form the
   next level;
4. the final tree is the ``nodes`` best-scored nodes of all levels (a child never scores above
   its parent, so the best nodes form a tree), in breadth-first order.

Draft KV: the passes write the tree into the draft cache after ``num_tokens``; they do not count
as computed (``num_draft_computed_tokens`` stays at ``num_tokens``), so the next catch-up rewrites
those slots with the accepted tokens. This is the chain drafter's rollback, and it leaves the
draft cache without copies.

Greedy requests draft deterministically (top-``width`` by probability). Sampled requests draw the
children of a node without replacement from the draft distribution q, keep all of them (step 4
then keeps every node: the budget bounds the expansion instead) and record q for each node, as
the exact verification of :mod:`xpuspec.spec_decode.tree_acceptance` needs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from xpuspec.engine.model_runner import SequenceChunk
from xpuspec.engine.scheduler import ScheduledChunk
from xpuspec.sample.sampler import probabilities
from xpuspec.spec_decode.proposal import Proposal, catch_up_chunk
from xpuspec.spec_decode.tree import DraftTree, TreeShape

logger = logging.getLogger(__name__)


@dataclass
class _Node:
    token: int
    parent: int  # index into _Build.nodes, -1 for the root's children
    depth: int
    score: float  # cumulative draft log-probability of the path root -> this node
    probs: np.ndarray | None  # [target vocab] q this node was drawn from (sampled requests)


@dataclass
class _Build:
    """One sequence's tree while it is drafted."""

    chunk: ScheduledChunk
    shape: TreeShape
    budget: int  # nodes the scheduler granted
    rng: np.random.Generator | None
    nodes: list[_Node] = field(default_factory=list)
    expanded: list[int] = field(default_factory=list)  # node ids run in the draft, breadth-first
    error: str | None = None

    @property
    def request_id(self) -> str:
        return self.chunk.sequence.request_id


class TreeDrafter:
    """Drafts trees with a draft model's paged runner (which must support tree chunks)."""

    def __init__(self, runner, target_vocab_size: int) -> None:
        if not getattr(runner, "supports_tree_masks", False):
            raise ValueError("the draft runner cannot run tree chunks (no qq_bias inputs)")
        self.runner = runner
        self.target_vocab_size = target_vocab_size
        self.step_timings: list[tuple[int, float]] = []

    def _forward(self, chunks: list[SequenceChunk]) -> np.ndarray:
        started = time.perf_counter()
        logits = self.runner.forward(chunks)
        self.step_timings.append((sum(len(c.token_ids) for c in chunks), time.perf_counter() - started))
        return logits

    def propose(
        self,
        requests: list[tuple[ScheduledChunk, TreeShape]],
        rngs: dict[str, np.random.Generator] | None = None,
    ) -> dict[str, Proposal]:
        """Draft one tree per (chunk, shape); ``chunk.num_draft_tokens`` is the node budget.

        ``rngs`` holds the random stream of each sampled request (greedy ones draft top-k).
        """
        self.step_timings = []
        builds = [
            _Build(chunk, shape, chunk.num_draft_tokens, (rngs or {}).get(chunk.sequence.request_id))
            for chunk, shape in requests
            if chunk.num_draft_tokens > 0
        ]
        if not builds:
            return {}
        catch_up = [catch_up_chunk(build.chunk.sequence) for build in builds]
        logits = self._forward(catch_up)  # [len(builds), draft vocab]
        for row, build in enumerate(builds):
            self._expand(build, [-1], logits[row : row + 1])

        for depth in range(1, max(build.shape.depth for build in builds)):
            active = [
                build for build in builds if build.error is None and self._choose_frontier(build, depth)
            ]
            if not active:
                break
            chunks = [self._tree_chunk(build) for build in active]
            logits = self._forward(chunks)  # [sum frontier sizes, draft vocab]
            row = 0
            for build, chunk in zip(active, chunks, strict=True):
                frontier = build.expanded[-chunk.num_logits :]
                self._expand(build, frontier, logits[row : row + chunk.num_logits])
                row += chunk.num_logits
        return {build.request_id: self._proposal(build) for build in builds}

    # ------------------------------------------------------------------ internals
    def _choose_frontier(self, build: _Build, depth: int) -> bool:
        """Mark the best nodes of ``depth`` as expanded; False when none can be."""
        if depth >= min(build.shape.depth, build.budget):
            return False
        if build.rng is None:
            room = build.budget - len(build.expanded)  # the draft chunk must fit the granted KV slots
        else:
            # A sampled tree keeps every drawn child (see _proposal): expand only what fits.
            room = (build.budget - len(build.nodes)) // build.shape.width
        level = [index for index, node in enumerate(build.nodes) if node.depth == depth]
        level.sort(key=lambda index: -build.nodes[index].score)
        frontier = level[: min(build.shape.width, room)]
        if not frontier:
            return False
        build.expanded.extend(sorted(frontier))
        return True

    @staticmethod
    def _tree_chunk(build: _Build) -> SequenceChunk:
        """The expanded nodes as one tree chunk after the sequence's tokens; logits for the deepest."""
        sequence = build.chunk.sequence
        position = {node: index for index, node in enumerate(build.expanded)}
        parents = [
            position[build.nodes[node].parent] if build.nodes[node].parent >= 0 else -1
            for node in build.expanded
        ]
        deepest = build.nodes[build.expanded[-1]].depth
        num_logits = sum(1 for node in build.expanded if build.nodes[node].depth == deepest)
        return SequenceChunk(
            token_ids=[build.nodes[node].token for node in build.expanded],
            past_length=sequence.num_tokens,
            block_table=sequence.block_table,
            num_logits=num_logits,
            sequence_id=sequence.request_id,
            tree_parents=parents,
        )

    def _expand(self, build: _Build, parents: list[int], logits: np.ndarray) -> None:
        """Add the children of each of ``parents`` (-1: the root) from their draft logits rows."""
        if build.error is not None:
            return
        if not np.all(np.isfinite(logits.max(axis=-1))):
            build.error = "drafting failed: the draft's logits hold NaN or infinity"
            return
        params = build.chunk.sequence.params
        width = build.shape.width
        for parent, row in zip(parents, logits, strict=True):
            base = 0.0 if parent < 0 else build.nodes[parent].score
            depth = 1 if parent < 0 else build.nodes[parent].depth + 1
            if params.greedy:
                log_probs = row.astype(np.float64) - row.max()
                log_probs -= np.log(np.exp(log_probs).sum())
                top = np.argpartition(-log_probs, width - 1)[:width]
                top = top[np.argsort(-log_probs[top], kind="stable")]
                for token in top:
                    build.nodes.append(_Node(int(token), parent, depth, base + float(log_probs[token]), None))
                continue
            q = probabilities(row[None, :], params)[0]  # [draft vocab]
            if q.shape[0] < self.target_vocab_size:
                q = np.pad(q, (0, self.target_vocab_size - q.shape[0]))
            count = min(width, build.budget - len(build.nodes))
            for token in _draw_without_replacement(q, count, build.rng):
                build.nodes.append(_Node(int(token), parent, depth, base + float(np.log(q[token])), q))

    @staticmethod
    def _proposal(build: _Build) -> Proposal:
        if build.error is not None:
            logger.warning("tree drafting failed for %s: %s", build.request_id, build.error)
            return Proposal([], None, error=build.error)
        if build.rng is None:
            # The best nodes by path score; on equal scores the shallower first, so parents precede.
            ranked = sorted(
                range(len(build.nodes)), key=lambda i: (-build.nodes[i].score, build.nodes[i].depth, i)
            )
            chosen = sorted(ranked[: build.budget], key=lambda i: (build.nodes[i].depth, i))
        else:
            # Sampled: every drawn child stays, in draw order. Keeping children by their own
            # probability would bias the candidates that verification assumes were drawn from q
            # without replacement (tree_acceptance); which nodes get children may depend on
            # tokens drawn before (the frontier choice), which verification allows.
            chosen = sorted(range(len(build.nodes)), key=lambda i: (build.nodes[i].depth, i))
        index_of = {node: index for index, node in enumerate(chosen)}
        parents = []
        for node in chosen:
            parent = build.nodes[node].parent
            if parent >= 0 and parent not in index_of:
                raise AssertionError("a chosen tree node lacks its parent")
            parents.append(index_of[parent] if parent >= 0 else -1)
        probs = None
        if not build.chunk.sequence.params.greedy:
            probs = np.stack([build.nodes[node].probs for node in chosen])
        tree = DraftTree([build.nodes[node].token for node in chosen], parents, probs)
        return Proposal(tree.token_ids, tree.probs, tree_parents=tree.parents)


def _draw_without_replacement(q: np.ndarray, count: int, rng: np.random.Generator | None) -> list[int]:
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
