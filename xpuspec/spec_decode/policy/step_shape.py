"""The shape of the target's steps: how many tokens a step runs, and padding that keeps it unchanged.

The CPU plugin re-prepares every node when a step's token count changes (see ``PagedModelRunner``),
which costs more than a few tokens' compute: on the 2-layer demo target, more than a whole 5-token
step (measured: docs/experiments/code-comment-figures.md). So fixed-γ steps are padded up to 1 + γ
tokens when their drafter proposed fewer, and adaptive steps are padded up to the last step's count
until shrinking pays (``CostModel.shrink_pays``). OpenVINO GenAI's prompt lookup pads its candidates
for the same reason.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.sample.draft_tree import TreeShape

Shape = tuple[int, "int | None"]  # (tokens, decoding sequences or None)


class ShapeCosts(Protocol):
    """What the step shape asks of the engine's cost model
    (:class:`xpuspec.spec_decode.policy.cost_model.CostModel`, a layer above)."""

    def shrink_pays(self, padded_tokens: int, needed_tokens: int, num_sequences: int, steps: int) -> bool: ...


def step_tokens(chunks: list[SequenceChunk]) -> int:
    """The tokens a target step runs, padding included: what its cost and its shape depend on."""
    return sum(len(chunk.token_ids) + chunk.padding for chunk in chunks)


def decode_sequences(chunks: list[SequenceChunk]) -> int | None:
    """The number of sequences when every chunk is a decode verifying all its tokens (a step the
    verification cost curve describes), else None (a prefill is in the step)."""
    for chunk in chunks:
        if chunk.num_logits != len(chunk.token_ids):
            return None
    return len(chunks) or None


class StepShape:
    """The last target step's shape, and the padding of the next steps. ``can_pad``: the target
    runs padding tokens (``SequenceChunk.padding``) and no drafter reads the target's states of
    every token (EAGLE-3 would get the padding's too)."""

    def __init__(self, can_pad: bool, max_model_len: int) -> None:
        self.can_pad = can_pad
        self.max_model_len = max_model_len
        # (tokens, decoding sequences or None) of the last target step: the shape of the next
        # step decides whether the plugin pays a change of shapes (CostModel.shape_change).
        self.last: Shape | None = None
        # Consecutive decode steps padded up to the last shape, and the most tokens they needed.
        self._padded_steps = self._padded_need = 0

    def record(self, chunks: list[SequenceChunk]) -> tuple[Shape, bool]:
        """A target step ran ``chunks``: its shape, and whether that changed from the last step's."""
        shape = (step_tokens(chunks), decode_sequences(chunks))
        changed = self.last is not None and shape != self.last
        self.last = shape
        return shape, changed

    def fixed_padding(self, chunk: ScheduledChunk, num_tokens: int) -> int:
        """Padding tokens that keep a fixed-γ decode step at 1 + γ tokens, and a fixed tree's at
        1 + its nodes, when the drafter proposed fewer (an n-gram match that is short or missing, a
        γ or a tree cut near ``max_tokens``). Adaptive γ and automatic trees price the change in
        the cost model instead, and pad through :meth:`keep`."""
        params = chunk.sequence.params
        tree = params.draft_tree
        gamma = tree.nodes if isinstance(tree, TreeShape) else params.num_draft_tokens
        if not gamma or not chunk.samples or chunk.num_tokens != 1 or not self.can_pad:
            return 0
        padding = 1 + gamma - num_tokens
        end = chunk.sequence.num_computed_tokens + num_tokens + padding
        return padding if padding > 0 and end <= self.max_model_len else 0

    def keep(self, chunks: list[SequenceChunk], cost_model: ShapeCosts, hold: bool = True) -> None:
        """Pad a decode step that needs fewer tokens than the last target step up to that step's
        count, until the stretch of smaller steps has lasted long enough that shrinking pays
        (``CostModel.shrink_pays``); then shrink to the most any step of the stretch needed.

        Adaptive γ, automatic trees and prompt lookup otherwise change the count from step to step.
        Fixed shapes are padded already (:meth:`fixed_padding`); padding goes on the last decode
        chunk with room for it. Replaces that chunk in ``chunks``. ``hold=False`` shrinks at once."""
        last = self.last
        num_sequences = decode_sequences(chunks)
        num_tokens = step_tokens(chunks)
        if (
            not self.can_pad
            or not hold
            or last is None
            or num_sequences is None
            or last[1] != num_sequences
            or num_tokens >= last[0]
        ):
            self._padded_steps = self._padded_need = 0
            return
        steps, need = self._padded_steps + 1, max(self._padded_need, num_tokens)
        if cost_model.shrink_pays(last[0], need, num_sequences, steps):
            self._padded_steps = self._padded_need = 0
            target = need
        else:
            self._padded_steps, self._padded_need = steps, need
            target = last[0]
        padding = target - num_tokens
        if padding <= 0:
            return
        for index in reversed(range(len(chunks))):
            chunk = chunks[index]
            end = chunk.past_length + len(chunk.token_ids) + chunk.padding + padding
            if end <= self.max_model_len:
                chunks[index] = replace(chunk, padding=chunk.padding + padding)
                return
