"""EAGLE-3 tree drafting: EAGLE-2-style dynamic trees grown with the head, one head pass per depth.

For every sequence that drafts a tree this step:

1. **catch-up** (one pass for all of them, the chain path's: :meth:`HeadStates.catch_up_step`):
   the head runs the sequence's pending target states; its last row gives the root's children;
2. **per depth** (one pass for all sequences): the frontier (the ``width`` best-scored nodes of the
   deepest level, :meth:`xpuspec.spec_decode.tree_build.TreeBuild.choose_frontier`) runs as new head
   slots, node ``v`` of depth ``k`` with

   - ``hidden_in``: the ``hidden_out`` of its parent's slot (the catch-up's last row for depth 1),
     as the chain's rollout feeds the previous pass's state;
   - the embedding of its own token, and position ``num_computed_tokens - 1 + k`` (the chain's
     rollout position at step ``k``);
   - an attention mask over the cache that lets it see the target-backed slots, the slots of its
     ancestors (run by earlier passes, still in the cache) and itself, never its siblings or other
     branches. Each node therefore computes exactly what the chain through its path would.

   Unlike the draft model's tree passes (:mod:`xpuspec.spec_decode.tree_proposer`), earlier tree
   slots can stay in the head's cache as past: the head takes an explicit mask over the past, so a
   pass runs only the frontier;
3. the final tree: the shared rules of :class:`~xpuspec.spec_decode.tree_build.TreeBuild`.

After the passes the head's KV is cut back to the target-backed slots (as the chain path does); the
engine hands over the target's states of the accepted path at the next ``observe_target``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from xpuspec.core.proposal import Proposal
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.sample.draft_tree import TreeShape
from xpuspec.spec_decode.eagle3.head import HeadStep, HeadStepResult
from xpuspec.spec_decode.eagle3.head_state import HeadStates
from xpuspec.spec_decode.tree_build import TreeBuild

logger = logging.getLogger(__name__)


@dataclass
class _HeadTree:
    """One sequence's tree and where its nodes live in the head's cache."""

    build: TreeBuild
    target_slots: int  # cached slots backed by the target's states (all of the past after the catch-up)
    root_hidden: np.ndarray  # [hidden]: the catch-up's last hidden_out, the depth-1 nodes' hidden_in
    slots: dict[int, int] = field(default_factory=dict)  # node id -> head cache slot
    hidden: dict[int, np.ndarray] = field(default_factory=dict)  # node id -> its slot's hidden_out [hidden]

    def parent_hidden(self, node: int) -> np.ndarray:
        parent = self.build.nodes[node].parent
        return self.root_hidden if parent < 0 else self.hidden[parent]

    def ancestors(self, node: int) -> list[int]:
        found = []
        parent = self.build.nodes[node].parent
        while parent >= 0:
            found.append(parent)
            parent = self.build.nodes[parent].parent
        return found


class Eagle3TreeDrafter:
    """Drafts trees with the head of ``states`` and its per-sequence target states (those the chain
    proposer, :class:`~xpuspec.spec_decode.eagle3.proposer.Eagle3Proposer`, keeps)."""

    def __init__(self, states: HeadStates, target_vocab_size: int) -> None:
        self.states = states
        self.head = states.head
        self.target_vocab_size = target_vocab_size
        self.step_timings: list[tuple[int, float]] = []

    def propose(
        self,
        requests: list[tuple[ScheduledChunk, TreeShape]],
        rngs: dict[str, np.random.Generator] | None = None,
    ) -> dict[str, Proposal]:
        """Draft one tree per (chunk, shape); ``chunk.num_draft_tokens`` is the node budget.

        ``rngs`` holds the random stream of each sampled request (greedy ones draft top-k).
        """
        self.step_timings = []
        builds: list[TreeBuild] = []
        steps: list[HeadStep] = []
        for chunk, shape in requests:
            if chunk.num_draft_tokens == 0:
                continue
            step = self.states.catch_up_step(chunk.sequence)
            if step is not None:
                rng = (rngs or {}).get(chunk.sequence.request_id)
                builds.append(TreeBuild(chunk, shape, chunk.num_draft_tokens, rng))
                steps.append(step)
        if not steps:
            return {}
        try:
            return self._draft(builds, self._run(steps))
        finally:
            # Tree slots hold the head's own states: cut back to the target-backed ones.
            self.states.cut_back(build.chunk.sequence for build in builds)

    def _run(self, steps: list[HeadStep]) -> list[HeadStepResult]:
        started = time.perf_counter()
        results = self.head.run(steps)
        self.step_timings.append((sum(len(step.token_ids) for step in steps), time.perf_counter() - started))
        return results

    def _draft(self, builds: list[TreeBuild], catch_up: list[HeadStepResult]) -> dict[str, Proposal]:
        head = self.head
        vocab = self.target_vocab_size
        trees = []
        for build, result in zip(builds, catch_up, strict=True):
            build.expand([-1], result.logits, vocab, head.target_ids)  # logits [1, draft vocab]
            trees.append(_HeadTree(build, head.kv_length(build.request_id), result.hidden[-1]))

        for depth in range(1, max(build.shape.depth for build in builds)):
            active = [(tree, frontier) for tree in trees if (frontier := tree.build.choose_frontier(depth))]
            if not active:
                break
            steps = [self._frontier_step(tree, frontier, depth) for tree, frontier in active]
            results = self._run(steps)
            for (tree, frontier), result in zip(active, results, strict=True):
                first = head.kv_length(tree.build.request_id) - len(frontier)  # the slots just appended
                for index, node in enumerate(frontier):
                    tree.slots[node] = first + index
                    tree.hidden[node] = result.hidden[index]
                tree.build.expand(frontier, result.logits, vocab, head.target_ids)  # [len(frontier), dv]
        return {tree.build.request_id: tree.build.proposal() for tree in trees}

    def _frontier_step(self, tree: _HeadTree, frontier: list[int], depth: int) -> HeadStep:
        """The head pass over ``frontier`` (nodes of ``depth``), each masked to the target-backed
        slots, its ancestors' slots and itself."""
        build = tree.build
        past = self.head.kv_length(build.request_id)
        count = len(frontier)
        mask = np.zeros((count, past + count), np.bool_)  # [frontier, past + frontier]
        mask[:, : tree.target_slots] = True
        for index, node in enumerate(frontier):
            ancestors = np.array([tree.slots[ancestor] for ancestor in tree.ancestors(node)], np.int64)
            mask[index, ancestors] = True
            mask[index, past + index] = True
        root_slot = build.chunk.sequence.num_computed_tokens - 1  # the catch-up's last slot's position
        return HeadStep(
            build.request_id,
            [build.nodes[node].token for node in frontier],
            np.stack([tree.parent_hidden(node) for node in frontier]),  # [frontier, hidden]
            positions=[root_slot + depth] * count,
            attention_mask=mask,
            logits_rows=list(range(count)),
        )
