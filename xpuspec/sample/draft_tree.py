"""The shape a request asks its speculation tree to take (``SamplingParams.draft_tree``), and its parsing.

What the trees are and how they are drafted and verified is :mod:`xpuspec.spec_decode.tree`; the
shape lives here, beside the sampling parameters that carry it, so that they need nothing above them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
        return value
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
