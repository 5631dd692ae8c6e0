"""The unit of work an executor runs: the tokens of one sequence in one step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class SequenceChunk:
    """The tokens of one sequence to run in this step."""

    token_ids: Sequence[int]  # [n] new tokens of this sequence to run now
    past_length: int  # tokens of this sequence already in the KV cache (positions start here)
    block_table: Sequence[int]  # physical KV blocks covering positions [0, past_length + n)
    num_logits: int  # how many trailing rows (of the n) need logits, 0..n
    # Which sequence the tokens belong to. The paged runner ignores it (the block table says where
    # the KV lives); a stateful runner keeps each sequence's KV in its own infer request.
    sequence_id: str | None = None
    # Tree tokens (speculation trees): for each of the n tokens, the index within token_ids of its
    # parent, or -1 for a token whose parent is the last token already in the cache. Parents come
    # before children. A token attends to the past and to its ancestors alone, and its position is
    # past_length + its depth (0 for a token without parent). None: an ordinary causal chunk.
    tree_parents: Sequence[int] | None = None
    # Dummy tokens run after token_ids so that the step keeps the token count of an earlier one:
    # the CPU plugin re-prepares every node of the graph when the count changes, which costs more
    # than a few tokens' compute (see PagedModelRunner). They repeat the last token at the next
    # positions, give no logits, and write their keys and values only past the sequence's length:
    # into its last block, whose later slots the sequence's next tokens overwrite before reading,
    # and beyond it into a scratch block that no sequence owns. In a tree chunk they are extra roots
    # (parent -1) that no node attends to.
    padding: int = 0


def one_token_each(chunks: Sequence[SequenceChunk]) -> bool:
    """Whether a step runs one token of each of its sequences, unpadded and without trees: the steps
    an executor's decode lane runs (``ExecutorCaps.decode_lane``), which change no other step's shape."""
    return bool(chunks) and all(
        len(chunk.token_ids) == 1 and not chunk.padding and chunk.tree_parents is None for chunk in chunks
    )
