"""The target's executor for a pipeline: its compile properties for the drafter it serves, and the
EAGLE-3 head's taps where that is the drafter."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpuspec.devices.executors import create_runner
from xpuspec.devices.placement import TREE_DRAFTERS
from xpuspec.models.bundle import ModelBundle

if TYPE_CHECKING:
    from xpuspec.executor.eagle3_head import HeadFolder


def target_properties(properties: dict[str, Any] | None, drafter: str, device: str) -> dict[str, Any] | None:
    """``properties`` with what the drafter needs of the target's cache on ``device``."""
    if drafter in TREE_DRAFTERS and device == "CPU" and "KEY_CACHE_QUANT_MODE" not in (properties or {}):
        # Tree acceptance moves single tokens' KV; the CPU's u8 key cache is quantised per
        # channel over a block unless keys carry per-token scales (xpuspec.executor.paged_runner).
        # Set whenever trees can be drafted, not only for a default tree: any request (e.g. the
        # server's draft_tree field) may ask for one. Per-token scales cost no time beyond the
        # noise of interleaved rounds (docs/experiments/code-comment-figures.md).
        return {**(properties or {}), "KEY_CACHE_QUANT_MODE": "BY_TOKEN"}
    return properties


def target_decode_lane(drafter: str, device: str) -> bool:
    """Whether the target gets a second compiled copy for its steps of one token per sequence
    (``ExecutorCaps.decode_lane``): where a drafter makes its steps alternate between verifications
    and single tokens, on the CPU, whose plugin re-prepares the graph at every change of a step's
    token count (what that costs, and what the copy gains and takes: docs/benchmarks.md, "A second
    compiled copy of the target"). Target-only steps keep one count; other devices are not measured."""
    return drafter != "none" and device == "CPU"


def build_target(
    bundle: ModelBundle,
    placed: Any,
    properties: dict[str, Any] | None,
    eagle3_head: str | Path | None,
    runner_options: dict[str, Any],
) -> tuple[Any, HeadFolder | None]:
    """The target's executor on the ``placed`` device, and the EAGLE-3 head read for its taps (None
    without one). ``runner_options``: the rest of ``create_runner``'s keywords (limits, blocks)."""
    # An EAGLE-3 target taps the residual stream at the head's layers (checked against the target
    # first); other drafters keep the plain target graph.
    tap_layers = tap_projection = head = None
    if eagle3_head is not None:
        from xpuspec.executor import eagle3_graph
        from xpuspec.executor.eagle3_head import HEAD_WEIGHT_TYPE, read_head

        head = read_head(eagle3_head, bundle.target.path)
        tap_layers = head.tap_layers
        # The head's fc runs inside the target's pass, as in GenAI: a call of its own after every
        # step cost a noticeable part of a round (docs/experiments/code-comment-figures.md).
        tap_projection = eagle3_graph.fusion(head.weights, HEAD_WEIGHT_TYPE)
    runner = create_runner(
        placed,
        bundle.target,
        "target",
        properties,
        hidden_state_layers=tap_layers,
        hidden_state_projection=tap_projection,
        **runner_options,
    )
    return runner, head
