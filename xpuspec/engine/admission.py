"""The checks a request passes before any engine structure holds it (``LLMEngine.add_request``)."""

from __future__ import annotations

import logging

import numpy as np

from xpuspec.sample.dry import SequenceBreakers
from xpuspec.sample.sampling_params import SamplingParams
from xpuspec.structured.matcher import GrammarCompiler, GuidedRequest

logger = logging.getLogger(__name__)


def check_prompt(prompt_token_ids: list[int], vocab_size: int) -> None:
    """Raise ValueError unless the prompt is a non-empty flat list of ids in the vocabulary."""
    if not isinstance(prompt_token_ids, (list, tuple, np.ndarray)) or len(prompt_token_ids) == 0:
        raise ValueError("the prompt is empty: at least one token is needed")
    ids = np.asarray(prompt_token_ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError("prompt token ids must be a flat list of integers")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(
            f"prompt token ids must lie in [0, {vocab_size}), got ids from {ids.min()} to {ids.max()}"
        )


def compile_constraint(grammar: GrammarCompiler | None, params: SamplingParams) -> GuidedRequest | None:
    """The matcher of the request's output constraint (None without one), or ValueError: a grammar
    that cannot be compiled is the request's own mistake, refused at admission."""
    constraint = params.constraint()
    if constraint is None:
        return None
    if grammar is None:
        raise ValueError(
            "this engine has no grammar support (no tokenizer.json in the model folder), so it "
            "cannot constrain output; drop response_format / guided_regex / guided_grammar"
        )
    try:
        return grammar.compile(constraint)
    except ValueError:
        raise
    except Exception as error:  # the grammar engine failing on this request's grammar is still its own
        logger.warning("compiling an output constraint failed", exc_info=error)
        raise ValueError(f"the output constraint could not be compiled: {error}") from error


def breaker_token_ids(breakers: SequenceBreakers | None, params: SamplingParams) -> np.ndarray:
    """The token ids of the request's DRY sequence breakers (none where DRY is off), or ValueError
    where the engine has no token texts to find them in."""
    if not params.dry or not params.dry_sequence_breakers:
        return np.empty(0, dtype=np.int64)
    if breakers is None:
        raise ValueError(
            "this engine has no token texts, so it cannot find DRY's sequence breakers; send "
            "dry_sequence_breakers: [] or dry_multiplier: 0"
        )
    return breakers.token_ids(params.dry_sequence_breakers)
