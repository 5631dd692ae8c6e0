"""The "auto" tree shape: chosen per sequence and step from measured costs and measured acceptance.

What is measured:

- the target's step cost against the tokens in the step, and the draft's pass cost against the
  tokens in the pass (the engine's :class:`~xpuspec.spec_decode.policy.speculation_length.CostModel`);
- **acceptance per depth and rank** (:class:`RankAcceptance`): each verified tree says, at every
  depth its accepted path reached, whether the target's token was the draft's rank-r candidate
  there (rank 0 = the draft's first choice). For greedy requests that is exactly the event that
  the path goes on through the rank-r child.

The prediction for a shape of depth d and width w (w candidates at each of d levels along the
likely path, so about n = w·d nodes): the path goes past level j with probability
``A_j = Σ_{r<w} a(j, r)``, so it accepts ``E = Σ_{k=1..d} Π_{j<=k} A_j`` drafts on average and emits
``1 + E`` tokens per step. The step costs the target pass with ``n`` more tokens per sequence
than a plain decode, plus d draft passes (the catch-up, then passes over the growing tree). The
shape with the most predicted tokens per second wins; a width-1 winner means a chain (left to the
chain policy), and nothing that beats plain decoding by ``min_speedup`` means no drafting. Under
load the target's per-token cost grows with the batch, so the same formula shrinks trees to
chains and then to nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from xpuspec.sample.draft_tree import MAX_TREE_DEPTH, TreeShape
from xpuspec.spec_decode.policy.cost_model import CostModel

MAX_RANK = 4  # widths considered: 1 .. MAX_RANK
# Before measurements: the chance that the target's token is the draft's rank-r candidate, given
# the path got there (a draft about as good as a small same-family draft; rank 0 follows the
# chain policy's measured α instead, see RankAcceptance.rates).
PRIOR_RANK_ACCEPTANCE = (0.6, 0.12, 0.05, 0.03)
PRIOR_WEIGHT = 4.0
DECAY = 0.98
REFRESH_CALLS = 64
REFRESH_RECORDS = 8


@dataclass
class RankAcceptance:
    """Decayed counts of (depth, rank) events over all greedy tree verifications of the engine."""

    reached: np.ndarray = field(default_factory=lambda: np.zeros((MAX_TREE_DEPTH, MAX_RANK)))
    hits: np.ndarray = field(default_factory=lambda: np.zeros((MAX_TREE_DEPTH, MAX_RANK)))

    def record(self, num_children_on_path: list[int], accepted_ranks: list[int]) -> None:
        """One verification: at path level j the node had ``num_children_on_path[j]`` children and
        the accepted child had rank ``accepted_ranks[j]`` (the list ends at the first miss)."""
        self.reached *= DECAY
        self.hits *= DECAY
        for depth, children in enumerate(num_children_on_path[:MAX_TREE_DEPTH]):
            width = min(children, MAX_RANK)
            self.reached[depth, :width] += 1.0
            if depth < len(accepted_ranks) and accepted_ranks[depth] < MAX_RANK:
                self.hits[depth, accepted_ranks[depth]] += 1.0

    def rates(self, chain_alpha: float) -> np.ndarray:
        """``a(depth, rank)`` ``[MAX_TREE_DEPTH, MAX_RANK]``: each depth's counts shrunk towards
        the counts pooled over depths, themselves shrunk towards the prior (rank 0: ``chain_alpha``)."""
        prior = np.array(PRIOR_RANK_ACCEPTANCE[:MAX_RANK], dtype=np.float64)
        prior[0] = chain_alpha
        pooled = (self.hits.sum(axis=0) + prior * PRIOR_WEIGHT) / (self.reached.sum(axis=0) + PRIOR_WEIGHT)
        rates = (self.hits + pooled * PRIOR_WEIGHT) / (self.reached + PRIOR_WEIGHT)
        # Rank probabilities at one depth are of disjoint events: they sum to at most 1.
        totals = np.maximum(rates.sum(axis=1, keepdims=True), 1.0)
        return rates / totals


def expected_accepted(level_rates: np.ndarray) -> float:
    """``Σ_k Π_{j<=k} A_j`` for the per-level probabilities ``A_j`` of going on."""
    return float(np.cumprod(level_rates).sum())


class TreeShapePolicy:
    """Chooses the "auto" tree of a sequence (see the module docstring)."""

    def __init__(self, cost_model: CostModel, max_nodes: int, min_speedup: float = 1.05) -> None:
        self.cost_model = cost_model
        self.max_nodes = max_nodes
        self.min_speedup = min_speedup
        self.acceptance = RankAcceptance()
        # choose() evaluates dozens of shapes; a batch asks it once per sequence per step. Answers
        # are reused for the same (α to 2 digits, batch) until new acceptance counts arrive or
        # REFRESH_CALLS calls have passed (the measured costs move slowly).
        self._cache: dict[tuple[float, int, int], tuple[TreeShape | None, float]] = {}
        # Per (batch tokens, sequences): whether no tree could win even with every draft accepted.
        # Under load that holds for every α, and the per-α search above is skipped (its cost was a
        # visible part of a 16-sequence step on the default model).
        self._hopeless: dict[tuple[int, int], bool] = {}
        self._calls = 0
        self._recorded = 0

    def record(self, num_children_on_path: list[int], accepted_ranks: list[int]) -> None:
        """Count one greedy tree verification (see :meth:`RankAcceptance.record`)."""
        self.acceptance.record(num_children_on_path, accepted_ranks)
        self._recorded += 1
        if self._recorded % REFRESH_RECORDS == 0:
            self._cache.clear()

    def step_seconds(self, depth: int, width: int, batch_tokens: int, num_sequences: int) -> float:
        """Predicted seconds of a step drafting and verifying a depth x width tree per sequence."""
        nodes = depth * width
        seconds = self.cost_model.target_cost(batch_tokens + nodes * num_sequences)
        if depth:
            seconds += self.cost_model.draft_cost(num_sequences)  # the catch-up pass
            for level in range(1, depth):  # each later pass runs the tree expanded so far
                seconds += self.cost_model.draft_cost(num_sequences * width * level)
        return max(seconds, 1e-12)

    def tokens_per_second(
        self, rates: np.ndarray, depth: int, width: int, batch_tokens: int, num_sequences: int
    ) -> float:
        level_rates = rates[:depth, :width].sum(axis=1)
        seconds = self.step_seconds(depth, width, batch_tokens, num_sequences)
        return (1.0 + expected_accepted(level_rates)) / seconds

    def _no_tree_can_win(self, batch_tokens: int, num_sequences: int) -> bool:
        """True when no tree of width >= 2 beats plain decoding by ``min_speedup`` even if all its
        levels were accepted (1 + depth tokens per step): then :meth:`_choose` returns None for any α."""
        num_sequences = max(num_sequences, 1)
        threshold = self.min_speedup / self.step_seconds(0, 1, batch_tokens, num_sequences)
        return all(
            (1.0 + depth) / self.step_seconds(depth, width, batch_tokens, num_sequences) <= threshold
            for depth, width in self._shapes(min_width=2)
        )

    def _shapes(self, min_width: int = 1) -> Iterator[tuple[int, int]]:
        """(depth, width) of every shape within the node budget, widths from ``min_width`` up."""
        for width in range(min_width, MAX_RANK + 1):
            for depth in range(1, min(self.max_nodes // width, MAX_TREE_DEPTH) + 1):
                yield depth, width

    def choose(self, chain_alpha: float, batch_tokens: int, num_sequences: int) -> TreeShape | None:
        """The best tree of width >= 2, or None when a chain (or no drafting) predicts as well."""
        return self.choose_with_rate(chain_alpha, batch_tokens, num_sequences)[0]

    def choose_with_rate(
        self, chain_alpha: float, batch_tokens: int, num_sequences: int
    ) -> tuple[TreeShape | None, float]:
        """:meth:`choose`, and the tokens per second predicted for the tree (0.0 with no tree)."""
        self._calls += 1
        if self._calls % REFRESH_CALLS == 0:
            self._cache.clear()
            self._hopeless.clear()
        batch = (batch_tokens, num_sequences)
        if batch not in self._hopeless:
            self._hopeless[batch] = self._no_tree_can_win(batch_tokens, num_sequences)
        if self._hopeless[batch]:
            return None, 0.0
        key = (round(chain_alpha, 2), batch_tokens, num_sequences)
        if key not in self._cache:
            self._cache[key] = self._choose(round(chain_alpha, 2), batch_tokens, num_sequences)
        return self._cache[key]

    def _choose(
        self, chain_alpha: float, batch_tokens: int, num_sequences: int
    ) -> tuple[TreeShape | None, float]:
        num_sequences = max(num_sequences, 1)
        rates = self.acceptance.rates(chain_alpha)
        plain = self.tokens_per_second(rates, 0, 1, batch_tokens, num_sequences)
        best, best_rate = None, self.min_speedup * plain
        chain_rate = 0.0
        for depth, width in self._shapes():
            rate = self.tokens_per_second(rates, depth, width, batch_tokens, num_sequences)
            if width == 1:
                chain_rate = max(chain_rate, rate)
            elif rate > max(best_rate, chain_rate):
                best, best_rate = TreeShape(depth=depth, width=width, nodes=depth * width), rate
        return (best, best_rate) if best is not None and best_rate > chain_rate else (None, 0.0)
