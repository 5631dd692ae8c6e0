"""Greedy agreement: is a configuration's text the same as a reference's, prompt by prompt?

Two questions use it, and they are different ones:

- **speculative vs target-only**, under the same compile properties: does drafting change the answer?
  At properties whose KV cache is written the same way whatever the chunk shape, it should not
  (docs/exactness.md);
- **vs exact mode**: how far a lower-precision configuration's answers are from the target's own f32
  answers (expected to differ now and then: lower precision flips near-ties).

Both count the prompts whose greedy token ids are identical, and where they differ, the position of the
first differing token (a late first difference is a near-tie flipped deep in a long answer; an early
one is a different answer).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from xpuspec.sample.sampling_params import SamplingParams


class Generates(Protocol):
    """What agreement needs of a pipeline: :meth:`xpuspec.api.pipeline.Pipeline.generate`."""

    def generate(self, prompts: Any, params: Any = None) -> list[Any]: ...


@dataclass(frozen=True)
class Agreement:
    """How many of ``total`` greedy outputs were identical to the reference's."""

    same: int
    total: int
    first_differences: tuple[int, ...] = ()  # per differing prompt: the index of its first differing token

    @property
    def median_first_difference(self) -> float | None:
        return statistics.median(self.first_differences) if self.first_differences else None

    @property
    def all_same(self) -> bool:
        return self.same == self.total

    def describe(self) -> str:
        """``"12/12 identical"``, or ``"10/12 identical (first difference at token 37, median)"``."""
        text = f"{self.same}/{self.total} identical"
        median = self.median_first_difference
        if median is not None:
            text += f" (first difference at token {median:g}, median)"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "same": self.same,
            "total": self.total,
            "median_first_difference": self.median_first_difference,
        }


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The index of the first token where ``a`` and ``b`` differ (a length difference counts); ``None``
    when they are identical."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]]) -> Agreement:
    """Prompt-by-prompt agreement of ``candidate``'s token ids with ``reference``'s."""
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference outputs but {len(candidate)} candidate outputs")
    differences = [first_difference(r, c) for r, c in zip(reference, candidate, strict=True)]
    found = tuple(d for d in differences if d is not None)
    return Agreement(len(reference) - len(found), len(reference), found)


def greedy_token_ids(
    pipe: Generates,
    prompts: Sequence[Any],
    max_tokens: int,
    *,
    in_flight: int = 1,
    ignore_eos: bool = False,
    num_draft_tokens: int | None = None,
    draft_tree: Any = None,
) -> list[list[int]]:
    """Each prompt's greedy token ids, ``in_flight`` requests at a time (1: one after the other)."""
    if in_flight < 1:
        raise ValueError(f"in_flight must be >= 1, got {in_flight}")
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        ignore_eos=ignore_eos,
        num_draft_tokens=num_draft_tokens,
        draft_tree=draft_tree,
    )
    outputs: list[list[int]] = []
    for start in range(0, len(prompts), in_flight):
        results = pipe.generate(list(prompts[start : start + in_flight]), params)
        outputs += [list(result.token_ids) for result in results]
    return outputs


def speculative_agreement(
    speculative: Generates,
    target_only: Generates,
    prompts: Sequence[Any],
    max_tokens: int,
    *,
    in_flight: int = 1,
) -> Agreement:
    """Greedy text of ``speculative`` (a pipeline with a drafter) against ``target_only`` (the same
    target and compile properties, ``drafter="none"``), on the same prompts, EOS honoured."""
    reference = greedy_token_ids(target_only, prompts, max_tokens)
    return compare(reference, greedy_token_ids(speculative, prompts, max_tokens, in_flight=in_flight))
