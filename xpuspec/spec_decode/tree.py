"""Speculation trees: the drafted tree of one sequence, and how it is laid out in a step (the shape a
request asks for is :mod:`xpuspec.sample.draft_tree`).

A tree hangs off the sequence's last token (the **root**, already known, not yet in the target's
KV). Its ``n`` draft nodes are kept in breadth-first order (every parent before its children, all
nodes of depth k before those of depth k+1), so any prefix of the nodes is itself a tree: cutting
the node budget keeps a valid tree, and the frontier of the deepest level is the trailing nodes.

In the target's verification chunk the root comes first, then the nodes: chunk index ``1 + i`` for
node ``i``, KV slot ``root_position + 1 + i``, position id ``root_position + depth`` (see
:class:`xpuspec.executor.paged_runner.SequenceChunk` ``tree_parents``; the qq_bias mask lets each
node attend to the past and its own ancestors only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DraftTree:
    """The drafted tree of one sequence: node tokens and parents in breadth-first order.

    ``parents[i]`` is the index of node i's parent, or -1 when its parent is the root.
    ``probs`` holds, per node, the draft distribution it was chosen from (sampled requests only).
    """

    token_ids: list[int]  # [n]
    parents: list[int]  # [n]
    probs: np.ndarray | None = None  # [n, vocab]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.parents):
            raise ValueError(f"{len(self.token_ids)} tree tokens but {len(self.parents)} parents")
        for index, parent in enumerate(self.parents):
            if not -1 <= parent < index:
                raise ValueError(f"parents[{index}] = {parent}: a parent is -1 or an earlier node")
        depths = self.depths()
        for index in range(1, len(depths)):
            if depths[index] < depths[index - 1]:
                raise ValueError("tree nodes must be in breadth-first order (depths non-decreasing)")

    def __len__(self) -> int:
        return len(self.token_ids)

    def depths(self) -> list[int]:
        """Depth of each node: 1 for children of the root."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return depths

    @property
    def depth(self) -> int:
        return max(self.depths(), default=0)

    def children(self, node: int) -> list[int]:
        """Nodes whose parent is ``node`` (-1: the root's children), in order."""
        return [index for index, parent in enumerate(self.parents) if parent == node]

    def chunk_parents(self) -> list[int]:
        """``tree_parents`` of the verification chunk ``[root] + nodes`` (the root attaches to the past)."""
        return [-1] + [parent + 1 for parent in self.parents]

    def prefix(self, count: int) -> DraftTree:
        """The first ``count`` nodes: a tree too (breadth-first order)."""
        probs = None if self.probs is None else self.probs[:count]
        return DraftTree(self.token_ids[:count], self.parents[:count], probs)
