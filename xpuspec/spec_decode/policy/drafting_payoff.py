"""Whether adaptive drafting really pays: the tokens per second of whole steps with it allowed,
against steps with it not, per batch shape and kind of work, batch 1 included.

Adaptive γ chooses per sequence and step from a cost model of one step (``CostModel``). Some costs
fall outside any one step's model, and they can outweigh the gain:
- a change of the target's shape (~a whole step on the CPU plugin), which one sequence's lookup
  causes for the whole batch, and at batch 1 every switch between one token and several;
- padding that holds the shape at the largest recent step;
- the draft model's catch-up over tokens accepted from lookups;
- the end of decode bursts, which only steps without drafts run;
- a verification that costs more than its calibration said (a busy machine, a long context).

On the default model at one request, the cost model alone predicted gains the steps did not get
(issue 53). So every batch shape is measured, and apart for three kinds of work (:class:`WorkKind`):
steps where a prompt lookup finds a long match (for a good share of a batch's sequences), text being
copied (summaries, retrieval answers, code edits, quoted turns, a small model's loops); steps where it
finds only short ones; and steps where it finds none, which only the draft model can draft. Drafting
often pays on the first kind and loses on the others; measured together, one would hide the other,
and a stretch of weak matches early in a reply would keep drafting off through the copying after it.

:class:`DraftingPayoff` compares, per (batch bucket, kind), two ways of running: adaptive drafting
allowed ("on"), and not ("off"). For each it keeps the tokens and wall seconds of whole engine steps
(drafting, verification, bursts and the engine's Python) as decayed sums. Steps with drafting on
that happened to draft nothing count as "on": the padding and shape changes drafting leaves behind
fall on them. Comparing steps that drafted with those that did not would miss that: on SmolLM2 both
kinds of step were slower than target-only decoding (docs/experiments/code-comment-figures.md).

Each bucket runs in cycles:
- most of a cycle runs in the way chosen, and its last steps in the other way
  (:data:`PROBE_OFF_STEPS` or :data:`PROBE_ON_STEPS`), so both rates stay current;
- at its end, once both ways are measured, drafting stays on unless its rate is below the "off"
  rate by more than :data:`MARGIN`;
- a bucket's first cycle is :data:`FIRST_CYCLE_STEPS` long, a cycle after a change of way
  :data:`CYCLE_STEPS`; each doubles (up to :data:`MAX_CYCLE_STEPS`) when its end confirms the way.

A new bucket starts with drafting on, so until its first "off" steps the cost model alone decides.
The first step after a switch pays the change of shapes either way and is left out of both rates.
Requests with a fixed γ or tree, and seeded ones, are not affected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from xpuspec.spec_decode.policy.verify_costs import batch_bucket

# Per recorded step of the same way. A step without drafts emits one token a sequence, so the "off" rate
# varies with timing alone and a memory of ~10 steps holds it; the tokens of a step with drafts vary
# with acceptance as well (at one sequence and γ = 1, one token or two), so "on" keeps ~50 steps: with
# ~10, chance stretches of rejections turned drafting that paid off for a whole cycle.
OFF_DECAY = 0.9
ON_DECAY = 0.98
# A new bucket decides after a short first cycle: a server's batch sizes come and go, and a whole
# burst of requests can end inside a long one, all of it drafting on the cost model's word alone.
FIRST_CYCLE_STEPS = 24
CYCLE_STEPS = 96  # a cycle after a change of way; each that confirms the last decision doubles it ...
MAX_CYCLE_STEPS = 768  # ... up to this
PROBE_OFF_STEPS = 8  # while drafting is on, the last steps of each cycle run without it ...
PROBE_ON_STEPS = 12  # ... and while it is off, with it
MIN_STEPS = 6  # recorded steps of each way before a bucket decides
MARGIN = 0.05  # drafting must lose by more than this share before it is turned off
# Drafting whose steps already give this many times the tokens per second the cost model predicts for
# plain steps skips the cycle's steps without drafts: they would cost far more than they could teach
# (a perfect draft's probe steps each give up γ tokens), and the model's plain step, measured on every
# target-only pass, is the part of it least often wrong.
CLEAR_WIN = 2.0


class WorkKind(Enum):
    """What a step's adaptive sequences can draft from: text being copied (a prompt lookup found a
    long match for a good share of them: ``draft_choice.COPY_SHARE``), a short match, or only the
    draft model."""

    COPY = "copy"
    SHORT_MATCH = "short match"
    FREE = "free"


@dataclass
class _Rate:
    """Decayed tokens and seconds of one way of running at one bucket."""

    decay: float
    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0

    def record(self, tokens: int, seconds: float) -> None:
        self.tokens = self.decay * self.tokens + tokens
        self.seconds = self.decay * self.seconds + seconds
        self.steps += 1

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Bucket:
    on: _Rate = field(default_factory=lambda: _Rate(ON_DECAY))
    off: _Rate = field(default_factory=lambda: _Rate(OFF_DECAY))
    drafting: bool = True  # the way chosen, outside the probe steps
    step: int = 0  # steps into the cycle
    cycle: int = FIRST_CYCLE_STEPS
    last_way: bool | None = None  # the way of the last recorded step

    def drafts_now(self) -> bool:
        probe = PROBE_OFF_STEPS if self.drafting else PROBE_ON_STEPS
        return self.drafting != (self.step >= self.cycle - probe)

    def confirm_clear_win(self, plain_rate: float) -> None:
        """At the start of a drafting cycle's probe steps: end the cycle, drafting, where its steps
        clearly win over the rate predicted for plain steps (:data:`CLEAR_WIN`)."""
        if (
            self.drafting
            and self.step == self.cycle - PROBE_OFF_STEPS
            and self.on.steps >= MIN_STEPS
            and plain_rate > 0.0
            and self.on.rate >= CLEAR_WIN * plain_rate
        ):
            self.step = 0
            self.cycle = max(min(2 * self.cycle, MAX_CYCLE_STEPS), CYCLE_STEPS)

    def end_cycle(self) -> None:
        """Decide the way of the next cycle, once both are measured; a decision confirmed lengthens
        the cycles, so the probes of a settled bucket cost less and less."""
        self.step = 0
        if self.on.steps < MIN_STEPS or self.off.steps < MIN_STEPS:
            return
        drafting = self.on.rate >= (1.0 - MARGIN) * self.off.rate
        self.cycle = (
            max(min(2 * self.cycle, MAX_CYCLE_STEPS), CYCLE_STEPS)
            if drafting == self.drafting
            else CYCLE_STEPS
        )
        self.drafting = drafting


class DraftingPayoff:
    """Per batch bucket and kind of work, whether adaptive requests draft this step."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[int, WorkKind], _Bucket] = {}

    def pays(self, num_sequences: int, kind: WorkKind) -> bool:
        """Whether adaptive requests at this batch and kind of work draft this step (the probes
        included)."""
        key = (batch_bucket(max(num_sequences, 1)), kind)
        return self._buckets.setdefault(key, _Bucket()).drafts_now()

    def record(
        self,
        num_sequences: int,
        kind: WorkKind,
        drafting_on: bool,
        tokens: int,
        seconds: float,
        plain_rate: float = 0.0,
    ) -> None:
        """A whole decode step of ``num_sequences`` sequences and ``kind`` that emitted ``tokens``
        tokens in ``seconds``; ``drafting_on``: its adaptive requests were allowed to draft.
        ``plain_rate``: the tokens per second the cost model predicts for a step without drafts at this
        batch (0: unknown), against which a clear win skips the probes (:data:`CLEAR_WIN`)."""
        bucket = self._buckets.get((batch_bucket(max(num_sequences, 1)), kind))
        if bucket is None or seconds <= 0.0:
            return
        if drafting_on == bucket.last_way:
            (bucket.on if drafting_on else bucket.off).record(tokens, seconds)
        bucket.last_way = drafting_on
        bucket.step += 1
        if bucket.step >= bucket.cycle:
            bucket.end_cycle()
        bucket.confirm_clear_win(plain_rate)

    def rates(self, num_sequences: int, kind: WorkKind) -> tuple[float, float]:
        """(on, off) tokens per second at this bucket, 0 where unmeasured: for reports."""
        bucket = self._buckets.get((batch_bucket(max(num_sequences, 1)), kind))
        return (bucket.on.rate, bucket.off.rate) if bucket is not None else (0.0, 0.0)
