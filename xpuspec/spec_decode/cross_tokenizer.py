"""A draft model with a tokenizer of its own, drafting for a target with another.

Per sequence the drafter keeps the draft's own tokens and KV cache (blocks of its own runner, not
the target's block tables: the two sequences have different lengths). Each drafting step:

1. **sync**: the target's tokens are decoded to text; the draft's tokens are kept up to a safe
   boundary inside the longest common prefix of the two texts and the rest of the text is encoded
   with the draft's tokenizer (:class:`xpuspec.spec_decode.text_bridge.DraftText`);
2. **catch-up and drafting**: the new draft tokens run in one pass, then the draft decodes greedily,
   one token per pass, as many draft tokens as the target's γ is likely to need (the ratio of the
   sequence's draft tokens to its target tokens, plus one for the last target token, which is
   dropped);
3. **translation**: the drafted text becomes target tokens
   (:func:`xpuspec.spec_decode.text_bridge.target_tokens_for`), at most γ of them.

The proposal is a chain of target tokens without a distribution: the engine verifies it with q
one-hot, as it does prompt lookups. Greedy output is the target's own; for sampled requests the
rejection rule with a one-hot q keeps the target's distribution exactly (docs/exactness.md). The
draft always drafts greedily: with a one-hot q a draft d is kept with probability p(d), which the
target's likeliest token maximises.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.interfaces import DrafterCaps, TargetExecutor
from xpuspec.core.proposal import Proposal, TokenDraw
from xpuspec.core.scheduler import ScheduledChunk
from xpuspec.sample.sampler import finite_argmax
from xpuspec.spec_decode.text_bridge import DraftText, TextCodec, drafted_text, target_tokens_for

logger = logging.getLogger(__name__)

__all__ = ["CrossTokenizerDrafter"]

# Text whose token counts under both tokenizers give the first estimate of draft tokens per target
# token (each sequence then uses its own ratio), and on which a translation is timed for calibration.
SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs back home.\n"
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n"
)

TRANSLATION_TIMINGS = 6  # timings of a translation at calibration, the first not counted


@dataclass
class _DraftSequence:
    """The draft's state for one target sequence: its tokens and text, and its cache blocks."""

    text: DraftText = field(default_factory=DraftText)
    blocks: list[int] = field(default_factory=list)


@dataclass
class _Drafting:
    """One sequence's drafting this step."""

    chunk: ScheduledChunk
    state: _DraftSequence
    start: int  # the first draft position the catch-up pass computes
    context: list[int]  # the draft's tokens before drafting (its cache holds them after the catch-up)
    passes: int  # draft tokens to draft
    drafted: list[int] = field(default_factory=list)
    stopped: bool = False  # the draft emitted its end-of-sequence token


class CrossTokenizerDrafter:
    """Drafts target tokens with a draft model whose tokenizer differs from the target's."""

    # A draft model: prompt lookup may draft beside it. No shared block tables (the draft's sequence
    # has other positions), no trees, no constraint masks (the engine cuts its drafts at the first
    # token the grammar forbids), no overlap.
    caps = DrafterCaps(is_draft_model=True)

    def __init__(
        self,
        runner: TargetExecutor,
        target_codec: TextCodec,
        draft_codec: TextCodec,
        draft_eos_ids: Collection[int],
        max_draft_context: int,
    ) -> None:
        self.runner = runner
        self.target_codec = target_codec
        self.draft_codec = draft_codec
        self.draft_eos_ids = frozenset(draft_eos_ids)
        self.max_draft_context = max_draft_context
        self.step_timings: list[tuple[int, float]] = []
        self._free_blocks = list(range(runner.num_blocks))
        self._sequences: dict[str, _DraftSequence] = {}
        # Draft tokens per target token on text of both kinds, until a sequence has its own ratio.
        self.tokens_per_target_token = 1.0
        self._translation_seconds: float | None = None

    # ------------------------------------------------------------ the Drafter protocol
    def warm_up(self, max_model_len: int) -> None:
        self.runner.warm_up(min(max_model_len, self.max_draft_context))
        target = len(self.target_codec.encode(SAMPLE_TEXT, add_special_tokens=False))
        draft = len(self.draft_codec.encode(SAMPLE_TEXT, add_special_tokens=False))
        self.tokens_per_target_token = max(draft / max(target, 1), 0.1)

    def release(self, sequence_id: str) -> None:
        state = self._sequences.pop(sequence_id, None)
        if state is not None:
            self._free_blocks += state.blocks

    def recover(self) -> None:
        try:
            self.runner.wait()
        except Exception:
            logger.debug("no draft inference was pending", exc_info=True)
        for sequence_id in list(self._sequences):  # synced again from the target's text
            self.release(sequence_id)

    def measure_step_seconds(self, context: int = 1, tokens: int = 1) -> float:
        """One drafting pass per target token drafted: ``tokens_per_target_token`` draft passes; a
        catch-up (``tokens`` > 1) also pays the step's translations, timed on a sample."""
        context = min(max(context, tokens), self.max_draft_context)
        blocks = -(-context // self.runner.block_size)
        chunk = SequenceChunk([0] * tokens, context - tokens, [0] * blocks, num_logits=1)
        started = time.perf_counter()
        self.runner.forward([chunk])
        seconds = time.perf_counter() - started
        if tokens == 1:
            return seconds * self.tokens_per_target_token
        return seconds + self.translation_seconds()

    def translation_seconds(self) -> float:
        """The seconds of one step's translations (sync, drafted text, target tokens), the median of a
        few timings on :data:`SAMPLE_TEXT` (taken once)."""
        if self._translation_seconds is None:
            target_ids = self.target_codec.encode(SAMPLE_TEXT * 4, add_special_tokens=False)
            timings = [self._time_translation(target_ids) for _ in range(TRANSLATION_TIMINGS)]
            self._translation_seconds = statistics.median(timings[1:])  # the first warms the tokenizers
        return self._translation_seconds

    def _time_translation(self, target_ids: list[int]) -> float:
        text = DraftText()
        text.sync(self.draft_codec, self.target_codec.decode(target_ids[:-8], skip_special_tokens=False))
        started = time.perf_counter()
        text.sync(self.draft_codec, self.target_codec.decode(target_ids, skip_special_tokens=False))
        drafted = text.ids[-6:]
        text.extend(self.draft_codec, drafted[:-1])
        new_text = drafted_text(self.draft_codec, text.ids, drafted)
        target_tokens_for(self.target_codec, target_ids, new_text, 4)
        return time.perf_counter() - started

    def propose(self, chunks: list[ScheduledChunk], draw: TokenDraw) -> dict[str, Proposal]:
        """Greedy drafts in target tokens; ``draw`` is not used (the draft never samples)."""
        self.step_timings = []
        proposals: dict[str, Proposal] = {}
        work: list[_Drafting] = []
        for chunk in chunks:
            if chunk.num_draft_tokens == 0:
                continue
            request_id = chunk.sequence.request_id
            try:
                drafting = self._prepare(chunk)
            except Exception as error:  # this sequence's translation alone
                logger.exception("cross-tokenizer drafting failed for %s", request_id)
                proposals[request_id] = Proposal([], None, error=f"drafting failed: {error}")
                continue
            if drafting is not None:
                work.append(drafting)
        if work:
            self._draft(work)
        for drafting in work:
            request_id = drafting.chunk.sequence.request_id
            try:
                token_ids = self._translate(drafting)
            except Exception as error:
                logger.exception("translating drafts failed for %s", request_id)
                proposals[request_id] = Proposal([], None, error=f"drafting failed: {error}")
                continue
            if token_ids:
                proposals[request_id] = Proposal(token_ids, None)
        return proposals

    # ------------------------------------------------------------ one step
    def _prepare(self, chunk: ScheduledChunk) -> _Drafting | None:
        """Sync the sequence's draft tokens with the target's text and reserve cache blocks; None
        when the draft cannot draft for it (context beyond the draft's, no blocks left)."""
        sequence = chunk.sequence
        state = self._sequences.setdefault(sequence.request_id, _DraftSequence())
        target_text = self.target_codec.decode(sequence.token_ids, skip_special_tokens=False)
        start = state.text.sync(self.draft_codec, target_text)
        context = list(state.text.ids)
        if not context:
            return None
        start = min(start, len(context) - 1)  # the last token runs again: its logits draft the next
        ratio = len(context) / max(len(sequence.token_ids), 1)
        passes = math.ceil((chunk.num_draft_tokens + 1) * ratio)
        passes = min(passes, self.max_draft_context - len(context))
        if passes < 1 or not self._reserve(state, len(context) + passes - 1):
            return None
        return _Drafting(chunk, state, start, context, passes)

    def _reserve(self, state: _DraftSequence, num_positions: int) -> bool:
        """Blocks for ``num_positions`` draft positions; False (and the sequence's blocks given back)
        when the draft's cache has too few free."""
        needed = -(-num_positions // self.runner.block_size) - len(state.blocks)
        if needed <= 0:
            return True
        if needed > len(self._free_blocks):
            self._free_blocks += state.blocks
            state.blocks = []
            state.text = DraftText()
            return False
        state.blocks += [self._free_blocks.pop() for _ in range(needed)]
        return True

    def _draft(self, work: list[_Drafting]) -> None:
        """The catch-up pass over every sequence's new draft tokens, then one-token greedy passes."""
        logits = self._timed_forward(
            [
                SequenceChunk(
                    token_ids=d.context[d.start :],
                    past_length=d.start,
                    block_table=d.state.blocks,
                    num_logits=1,
                    sequence_id=d.chunk.sequence.request_id,
                )
                for d in work
            ]
        )
        active = work
        for step in range(max(d.passes for d in work)):
            if step > 0:
                active = [d for d in active if not d.stopped and len(d.drafted) < d.passes]
                if not active:
                    break
                logits = self._timed_forward(
                    [
                        SequenceChunk(
                            token_ids=[d.drafted[-1]],
                            past_length=len(d.context) + step - 1,
                            block_table=d.state.blocks,
                            num_logits=1,
                            sequence_id=d.chunk.sequence.request_id,
                        )
                        for d in active
                    ]
                )
            for row, drafting in enumerate(active):
                token = finite_argmax(logits[row : row + 1], "draft's logits")[0]
                if token in self.draft_eos_ids:
                    drafting.stopped = True
                else:
                    drafting.drafted.append(token)

    def _translate(self, drafting: _Drafting) -> list[int]:
        """The drafted tokens as target tokens; the draft's tokens now in its cache join its text."""
        drafted = drafting.drafted
        # Every drafted token but the last ran through the cache (the last too when the draft stopped).
        in_cache = drafted if drafting.stopped else drafted[:-1]
        drafting.state.text.extend(self.draft_codec, in_cache)
        text = drafted_text(self.draft_codec, drafting.context, drafted)
        sequence = drafting.chunk.sequence
        proposal = target_tokens_for(
            self.target_codec, sequence.token_ids, text, drafting.chunk.num_draft_tokens
        )
        logger.debug("%s: drafted %r, proposing %d target tokens", sequence.request_id, text, len(proposal))
        return proposal

    def _timed_forward(self, chunks: list[SequenceChunk]) -> np.ndarray:
        started = time.perf_counter()
        logits = self.runner.forward(chunks)
        self.step_timings.append((sum(len(c.token_ids) for c in chunks), time.perf_counter() - started))
        return logits
