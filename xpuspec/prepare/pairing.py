"""Can this draft speculate for this target? Same tokens for every draft id, same special tokens; where
they differ, the pair translates: the draft's drafts become target tokens through text."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from xpuspec.prepare.config import PrepareError

logger = logging.getLogger(__name__)

SPECIAL_TOKEN_ROLES = ("bos", "eos", "pad", "unk")


class PairingError(PrepareError):
    """The draft's tokenizer differs from the target's; speculation would propose wrong tokens."""


def check_vocabularies(target: Sequence[str], draft: Sequence[str], draft_name: str = "") -> None:
    """Every id the draft can emit must be the same token string for the target (which may have more)."""
    for token_id, draft_token in enumerate(draft):
        target_token = target[token_id] if token_id < len(target) else None
        if draft_token != target_token:
            target_text = repr(target_token) if target_token is not None else "(none: target vocabulary ends)"
            named = f"draft {draft_name} " if draft_name else "draft "
            raise PairingError(
                f"vocabularies differ at token id {token_id}: target {target_text}, {named}"
                f"{draft_token!r} (target vocabulary {len(target)}, draft {len(draft)}); a draft of the "
                "same model family drafts without translating, --force-pair pairs them by token id anyway"
            )


def check_pair(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Raise :class:`PairingError` naming the first difference.

    Every id the draft can emit must mean the same string to the target; the target's vocabulary
    may be larger (extra ids the draft never proposes).
    """
    target_size = len(target_tokenizer)
    check_vocabularies(
        [target_tokenizer.convert_ids_to_tokens(token_id) for token_id in range(target_size)],
        [draft_tokenizer.convert_ids_to_tokens(token_id) for token_id in range(len(draft_tokenizer))],
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


def translating_pair(error: PairingError) -> dict[str, Any]:
    """The manifest's "pairing" of a draft whose tokenizer differs from the target's: it drafts through
    text (:mod:`xpuspec.spec_decode.cross_tokenizer`), so every pair of tokenizers can speculate."""
    difference = str(error).split(";")[0]  # what differs, without the advice for pairing by id
    logger.info(
        "the tokenizers differ (%s): the draft's drafts will be translated into target tokens", difference
    )
    return {"checked": True, "forced": False, "mismatch": None, "translate": True, "difference": difference}
