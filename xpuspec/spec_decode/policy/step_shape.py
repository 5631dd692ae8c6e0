"""The shape of the target's steps: how many tokens a step runs, and padding that keeps it unchanged.

The CPU plugin re-prepares every node when a step's token count changes (see ``PagedModelRunner``),
which costs more than a few tokens' compute: on the 2-layer demo target, more than a whole 5-token
step (measured: docs/experiments/code-comment-figures.md). So fixed-γ steps are padded up to 1 + γ
tokens when their drafter proposed fewer, and adaptive steps are padded up to the last step's count
until shrinking pays (``CostModel.shrink_pays``). OpenVINO GenAI's prompt lookup pads its candidates
for the same reason.

A target with a decode lane (``ExecutorCaps.decode_lane``) runs steps of one token per sequence on a
second compiled copy: those change no shape of the other steps, and are never padded. The shape the
next verification is compared with is then the last step that ran on the main copy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from xpuspec.core.chunks import SequenceChunk, one_token_each
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
    every token (EAGLE-3 would get the padding's too). ``decode_lane``: the target runs steps of one
    token per sequence on a compiled copy of their own."""

    def __init__(self, can_pad: bool, max_model_len: int, decode_lane: bool = False) -> None:
        self.can_pad = can_pad
        self.max_model_len = max_model_len
        self.decode_lane = decode_lane
        # (tokens, decoding sequences or None) of the last target step (with a decode lane: the last
        # on the main copy): the shape of the next step decides whether the plugin pays a change of
        # shapes (CostModel.shape_change).
        self.last: Shape | None = None
        self.last_one_token: Shape | None = None  # the decode lane's last step
        # Consecutive decode steps padded up to the last shape, and the most tokens they needed.
        self._padded_steps = self._padded_need = 0

    def on_decode_lane(self, chunks: list[SequenceChunk]) -> bool:
        """Whether the target runs ``chunks`` on its decode lane."""
        return self.decode_lane and one_token_each(chunks)

    def record(self, chunks: list[SequenceChunk]) -> tuple[Shape, bool]:
        """A target step ran ``chunks``: its shape, and whether that changed from the last step's on
        the same compiled copy."""
        shape = (step_tokens(chunks), decode_sequences(chunks))
        if self.on_decode_lane(chunks):
            changed = self.last_one_token is not None and shape != self.last_one_token
            self.last_one_token = shape
            return shape, changed
        changed = self.last is not None and shape != self.last
        self.last = shape
        return shape, changed

    def forget(self) -> None:
        """The target ran passes outside the steps (calibration): no last shape to keep."""
        self.last = self.last_one_token = None

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
        chunk with room for it. Replaces that chunk in ``chunks``. ``hold=False`` shrinks at once.
        A step of one token per sequence with a decode lane is not padded: it changes no shape."""
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
            or self.on_decode_lane(chunks)
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
