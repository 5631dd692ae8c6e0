"""Can this draft speculate for this target? Same tokens for every draft id, same special tokens."""

from __future__ import annotations

import logging
from typing import Any

from xpuspec.prepare.config import PrepareError

logger = logging.getLogger(__name__)

SPECIAL_TOKEN_ROLES = ("bos", "eos", "pad", "unk")


class PairingError(PrepareError):
    """The draft's tokenizer differs from the target's; speculation would propose wrong tokens."""


def check_pair(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Raise :class:`PairingError` naming the first difference.

    Every id the draft can emit must mean the same string to the target; the target's vocabulary
    may be larger (extra ids the draft never proposes).
    """
    draft_size = len(draft_tokenizer)
    target_size = len(target_tokenizer)
    for token_id in range(draft_size):
        draft_token = draft_tokenizer.convert_ids_to_tokens(token_id)
        target_token = target_tokenizer.convert_ids_to_tokens(token_id) if token_id < target_size else None
        if draft_token != target_token:
            target_text = repr(target_token) if target_token is not None else "(none: target vocabulary ends)"
            raise PairingError(
                f"vocabularies differ at token id {token_id}: target {target_text}, draft {draft_token!r} "
                f"(target vocabulary {target_size}, draft {draft_size}); use a draft of the same model "
                "family, or --force-pair to pair them anyway"
            )
    for role in SPECIAL_TOKEN_ROLES:
        target_special = _special_token(target_tokenizer, role)
        draft_special = _special_token(draft_tokenizer, role)
        if target_special != draft_special:
            raise PairingError(
                f"special token {role} differs: target {_describe(target_special)}, draft "
                f"{_describe(draft_special)}; use --force-pair to pair them anyway"
            )


def _special_token(tokenizer: Any, role: str) -> tuple[str | None, int | None]:
    return getattr(tokenizer, f"{role}_token", None), getattr(tokenizer, f"{role}_token_id", None)


def _describe(special: tuple[str | None, int | None]) -> str:
    token, token_id = special
    return "none" if token is None else f"{token!r} (id {token_id})"
