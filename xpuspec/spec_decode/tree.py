"""Speculation trees: their shape, the drafted tree of one sequence, and how it is laid out in a step.

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

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

AUTO = "auto"
MAX_TREE_DEPTH = 16
MAX_TREE_WIDTH = 8
MAX_TREE_NODES = 16  # the engine's max_draft_tokens bound: a tree is verified in one chunk


@dataclass(frozen=True)
class TreeShape:
    """A fixed tree shape: at most ``depth`` levels, ``width`` children per expanded node and
    ``width`` expanded nodes per level, and ``nodes`` draft nodes in all (the best by cumulative
    draft probability, EAGLE-2 style)."""

    depth: int
    width: int
    nodes: int

    def __post_init__(self) -> None:
        for name, limit in (("depth", MAX_TREE_DEPTH), ("width", MAX_TREE_WIDTH), ("nodes", MAX_TREE_NODES)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
                raise ValueError(f"draft_tree {name} must be an integer in [1, {limit}], got {value!r}")
        if self.nodes < self.depth:
            raise ValueError(
                f"draft_tree nodes ({self.nodes}) must be >= depth ({self.depth}): a tree of depth d has "
                "at least d nodes"
            )

    @property
    def is_chain(self) -> bool:
        return self.width == 1


def parse_draft_tree(value: object) -> TreeShape | str | None:
    """``SamplingParams.draft_tree``: None (a chain), "auto", or a mapping {"depth", "width", "nodes"}."""
    if value is None or value == AUTO:
        return value  # type: ignore[return-value]
    if isinstance(value, TreeShape):
        return value
    if isinstance(value, Mapping):
        keys = set(value)
        if keys != {"depth", "width", "nodes"}:
            raise ValueError(
                f"draft_tree needs exactly the keys depth, width and nodes, got {sorted(map(str, keys))}"
            )
        return TreeShape(depth=value["depth"], width=value["width"], nodes=value["nodes"])
    raise ValueError(
        f'draft_tree must be None (a chain), "auto" or {{"depth": d, "width": w, "nodes": n}}, got {value!r}'
    )


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


def parse_draft_tree_text(text: str) -> TreeShape | str | None:
    """The command line's ``--draft-tree``: "auto", "none", or "DEPTH,WIDTH,NODES" (e.g. "4,2,8")."""
    value = text.strip().lower()
    if value in ("", "none", "chain"):
        return None
    if value == AUTO:
        return AUTO
    parts = value.split(",")
    if len(parts) != 3 or not all(part.strip().isdigit() for part in parts):
        raise ValueError(
            f'--draft-tree takes "auto", "none" or DEPTH,WIDTH,NODES such as 4,2,8; got {text!r}'
        )
    depth, width, nodes = (int(part) for part in parts)
    return TreeShape(depth=depth, width=width, nodes=nodes)
