"""The drafter of a Pipeline whose draft has a tokenizer of its own (``bundle.translates_tokens``): the
draft model on its own KV cache, translating through text (:mod:`xpuspec.spec_decode.cross_tokenizer`)."""

from __future__ import annotations

import logging
from typing import Any

from xpuspec.models.bundle import ModelBundle
from xpuspec.spec_decode.cross_tokenizer import CrossTokenizerDrafter
from xpuspec.text import Tokenizer

logger = logging.getLogger(__name__)


def draft_options(bundle: ModelBundle, options: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The draft runner's ``options``, and whether the draft translates (``bundle.translates_tokens``):
    then its sequences hold at most its own context."""
    if bundle.draft is None or not bundle.translates_tokens:
        return options, False
    own = int(bundle.draft.facts.get("max_position_embeddings", options["max_context"]))
    return {**options, "max_context": min(options["max_context"], own)}, True


def draft_blocks(translates: bool, target_runner: Any) -> dict[str, Any]:
    """The draft runner's KV blocks: the target's count and size, where it shares the target's block
    tables; its own (the runner's budget) where it translates."""
    if translates:
        return {"num_blocks": None, "block_size": None}
    return {"num_blocks": target_runner.num_blocks, "block_size": target_runner.block_size}


def cross_tokenizer_proposer(
    bundle: ModelBundle, draft_runner: Any, max_context: int
) -> CrossTokenizerDrafter:
    """The draft model ``draft_runner`` (its own blocks, sequences of at most ``max_context`` positions)
    drafting for the target through both tokenizers."""
    draft = bundle.draft
    assert draft is not None  # translates_tokens says there is one
    draft_tokenizer = Tokenizer(draft.path)
    eos_ids = {token for token in (draft_tokenizer.eos_token_id,) if token is not None}
    logger.debug("the draft has a tokenizer of its own: its drafts are translated into the target's tokens")
    return CrossTokenizerDrafter(
        draft_runner,
        Tokenizer(bundle.target.path),
        draft_tokenizer,
        eos_ids,
        max_draft_context=max_context,
    )
