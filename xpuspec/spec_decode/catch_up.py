"""The draft model's catch-up pass: shared by its chain drafter and its tree drafter."""

from __future__ import annotations

from xpuspec.core.chunks import SequenceChunk
from xpuspec.core.sequence import Sequence


def catch_up_chunk(sequence: Sequence) -> SequenceChunk:
    """The draft's pass over the tokens it has not computed yet (the accepted ones, and the bonus
    token), with the logits of the last; marks them computed."""
    start, end = sequence.num_draft_computed_tokens, sequence.num_tokens
    sequence.num_draft_computed_tokens = end
    return SequenceChunk(
        token_ids=sequence.token_ids[start:end],
        past_length=start,
        block_table=sequence.block_table,
        num_logits=1,
        sequence_id=sequence.request_id,
    )
