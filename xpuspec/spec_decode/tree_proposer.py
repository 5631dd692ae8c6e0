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

The node rules (scores, frontier, final choice, draws) live in :mod:`xpuspec.spec_decode.tree_build`,
shared with the EAGLE-3 head's trees (:mod:`xpuspec.spec_decode.eagle3.tree`).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.interfaces import TargetExecutor
from xpuspec.core.proposal import Proposal
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.sample.draft_tree import TreeShape
from xpuspec.spec_decode.catch_up import catch_up_chunk
from xpuspec.spec_decode.tree_build import TreeBuild

logger = logging.getLogger(__name__)


class TreeDrafter:
    """Drafts trees with a draft model's paged runner (which must support tree chunks); a
    :class:`xpuspec.core.interfaces.TreeDrafting`, built by ``DraftModelProposer.tree_drafter``."""

    def __init__(self, runner: TargetExecutor, target_vocab_size: int) -> None:
        if not runner.caps.trees:
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
            TreeBuild(chunk, shape, chunk.num_draft_tokens, (rngs or {}).get(chunk.sequence.request_id))
            for chunk, shape in requests
            if chunk.num_draft_tokens > 0
        ]
        if not builds:
            return {}
        catch_up = [catch_up_chunk(build.chunk.sequence) for build in builds]
        logits = self._forward(catch_up)  # [len(builds), draft vocab]
        for row, build in enumerate(builds):
            build.expand([-1], logits[row : row + 1], self.target_vocab_size)

        for depth in range(1, max(build.shape.depth for build in builds)):
            active = [build for build in builds if build.choose_frontier(depth)]
            if not active:
                break
            chunks = [self._tree_chunk(build) for build in active]
            logits = self._forward(chunks)  # [sum frontier sizes, draft vocab]
            row = 0
            for build, chunk in zip(active, chunks, strict=True):
                frontier = build.expanded[-chunk.num_logits :]
                build.expand(frontier, logits[row : row + chunk.num_logits], self.target_vocab_size)
                row += chunk.num_logits
        return {build.request_id: build.proposal() for build in builds}

    @staticmethod
    def _tree_chunk(build: TreeBuild) -> SequenceChunk:
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
