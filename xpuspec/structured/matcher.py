"""Per-request grammar matchers: token masks for every verified and every drafted position.

The engine keeps one :class:`GuidedRequest` per constrained request. Its matcher has consumed
exactly the request's output tokens (the committed state). Speculation looks ahead of it and comes
back:

* **drafting**: the draft model's logits at draft step ``s`` are masked with the state after the
  ``s`` tokens drafted before it (:meth:`GuidedRequest.mask_draft_logits`), so the draft proposes
  from the masked, renormalised q; :meth:`GuidedRequest.end_drafting` rolls the lookahead back;
* **n-gram proposals** are cut at the first token the grammar forbids (:meth:`valid_prefix`);
* **verification**: masks of the ``1 + γ`` target rows (:meth:`verification_masks`) are the states
  after 0..γ drafts, computed ahead by consuming the drafts and rolled back; they can be prepared
  while the target runs (:meth:`prepare`), since the drafts are known before its inference starts;
* **acceptance**: the matcher consumes the tokens the step emitted (:meth:`advance`).

Both p and q are masked with the same mask before the same transform (temperature, top-k, top-p),
so the rejection rule reproduces the masked target distribution; greedy decoding takes the argmax
of the masked target row. A draft token the mask forbids has p = 0 and is always rejected.

The tokenizer is llguidance's, built from the bundle's ``tokenizer.json`` (the same vocabulary as
the OpenVINO tokenizer IRs); masks are as wide as the model's vocabulary: model ids beyond the
tokenizer's are never allowed.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
from llguidance import LLMatcher, LLTokenizer

from xpuspec.structured.constraint import Constraint

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"


class GrammarCompiler:
    """Engine-wide: the llguidance tokenizer of a model (loaded on first use) and grammar compilation."""

    def __init__(self, tokenizer_json: str | Path, vocab_size: int, eos_token_ids: list[int]):
        self.tokenizer_json = Path(tokenizer_json)
        if not self.tokenizer_json.is_file():
            raise ValueError(
                f"structured output needs the model's {TOKENIZER_FILE}, not found at {self.tokenizer_json}"
            )
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._tokenizer: LLTokenizer | None = None
        self._lock = threading.Lock()
        # Seconds spent computing masks and how many: the per-token mask cost `xpuspec bench` reports.
        self.mask_seconds = 0.0
        self.num_masks = 0

    @property
    def tokenizer(self) -> LLTokenizer:
        with self._lock:  # the server compiles on request threads
            if self._tokenizer is None:
                started = time.perf_counter()
                self._tokenizer = LLTokenizer(str(self.tokenizer_json), eos_token=self.eos_token_ids or None)
                logger.info(
                    "grammar tokenizer of %d tokens loaded in %.2f s",
                    self._tokenizer.vocab_size,
                    time.perf_counter() - started,
                )
            return self._tokenizer

    def compile(self, constraint: Constraint) -> GuidedRequest:
        """A fresh matcher for one request; ValueError with llguidance's message for a bad grammar."""
        try:
            grammar = constraint.grammar()
        except ValueError as error:
            raise ValueError(f"invalid {_describe(constraint)}: {error}") from error
        tokenizer = self.tokenizer
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if is_error:
            raise ValueError(f"invalid {_describe(constraint)}: {messages[0] if messages else 'rejected'}")
        matcher = LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid {_describe(constraint)}: {matcher.get_error()}")
        return GuidedRequest(matcher, self)


def _describe(constraint: Constraint) -> str:
    what = {"json_schema": "JSON schema", "regex": "regular expression", "lark": "Lark grammar"}
    name = f" {constraint.name!r}" if constraint.name else ""
    return f"{what.get(constraint.kind, constraint.kind)}{name}"


class GuidedRequest:
    """One request's matcher and the masks of the positions a step samples."""

    def __init__(self, matcher: LLMatcher, compiler: GrammarCompiler):
        self.matcher = matcher
        self.compiler = compiler
        self.vocab_size = compiler.vocab_size
        num_words = (max(compiler.tokenizer.vocab_size, compiler.vocab_size) + 31) // 32
        self._bitmask = np.zeros(num_words, dtype=np.int32)
        self._lookahead = 0  # tokens consumed ahead of the committed state while drafting
        self._drafted = 0  # draft tokens seen while drafting (an end-of-sequence one is not consumed)
        self._prepared: tuple[tuple[int, ...], np.ndarray] | None = None

    # ------------------------------------------------------------------ masks
    def allowed(self) -> np.ndarray:
        """The tokens allowed at the matcher's current state: [vocab] bool."""
        started = time.perf_counter()
        self.matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[: self.vocab_size]
        self.compiler.mask_seconds += time.perf_counter() - started
        self.compiler.num_masks += 1
        if self.matcher.is_error():
            raise ValueError(f"the grammar matcher failed: {self.matcher.get_error()}")
        return bits.astype(bool)

    def verification_masks(self, draft_ids: list[int]) -> np.ndarray:
        """Masks of the 1 + γ target rows: [1 + γ, vocab] bool (prepared ones are reused).

        Row i is the state after drafts 0..i-1. After a forbidden draft the later rows are never
        read (that draft is rejected), so they are left all-allowed.
        """
        if self._prepared is not None and self._prepared[0] == tuple(draft_ids):
            masks = self._prepared[1]
            self._prepared = None
            return masks
        self._prepared = None
        masks = np.ones((1 + len(draft_ids), self.vocab_size), dtype=bool)
        consumed = 0
        try:
            for row in range(1 + len(draft_ids)):
                masks[row] = self.allowed()
                if row == len(draft_ids) or not masks[row][draft_ids[row]]:
                    break
                consumed += self._consume(draft_ids[row])
        finally:
            self._rollback(consumed)
        return masks

    def prepare(self, draft_ids: list[int]) -> None:
        """Compute the verification masks ahead (while the target runs)."""
        self._prepared = (tuple(draft_ids), self.verification_masks(draft_ids))

    # ---------------------------------------------------------------- drafting
    def mask_draft_logits(self, drafted: list[int], logits: np.ndarray) -> np.ndarray:
        """The draft's logits at the step after ``drafted`` with forbidden tokens at -inf.

        ``logits``: [1, draft vocab] (the draft's vocabulary may be smaller than the target's).
        """
        for token in drafted[self._drafted :]:
            self._lookahead += self._consume(token)
            self._drafted += 1
        mask = self.allowed()[: logits.shape[-1]]
        return np.where(mask, logits, -np.inf).astype(logits.dtype, copy=False)

    def end_drafting(self) -> None:
        """Roll the lookahead of :meth:`mask_draft_logits` back to the committed state."""
        self._rollback(self._lookahead)
        self._lookahead = self._drafted = 0

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many of ``token_ids`` the grammar allows in a row from the committed state."""
        return self.matcher.validate_tokens(list(token_ids)) if token_ids else 0

    def forced_tokens(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens in a row that are each the only one the grammar allows.

        A masked target row with one allowed token is one-hot on it whatever the logits, so these
        tokens are what the target produces through the mask: proposing them is exact and they
        are accepted with certainty (jump-forward without a drafter's pass).
        """
        forced: list[int] = []
        consumed = 0
        try:
            while len(forced) < limit and not self.matcher.is_stopped():
                allowed = np.flatnonzero(self.allowed())
                if len(allowed) != 1 or int(allowed[0]) in self.compiler.eos_token_ids:
                    break
                consumed += self._consume(int(allowed[0]))
                forced.append(int(allowed[0]))
        finally:
            self._rollback(consumed)
        return forced

    # --------------------------------------------------------------- committing
    def advance(self, token_ids: list[int]) -> None:
        """Consume the tokens a step emitted; ValueError if the grammar forbids one (a bug)."""
        self._prepared = None
        for token in token_ids:
            self._consume(token)

    def is_accepting(self) -> bool:
        return self.matcher.is_accepting()

    def _consume(self, token: int) -> int:
        """Consume one token; return how many entered the matcher's history (rollback counts them).

        A stopped matcher (grammar complete) takes end-of-sequence without recording it.
        """
        stopped = self.matcher.is_stopped()
        if not self.matcher.consume_token(token):
            raise ValueError(f"token {token} breaks the output constraint: {self.matcher.get_error()}")
        return 0 if stopped else 1

    def _rollback(self, num_tokens: int) -> None:
        if num_tokens and not self.matcher.rollback(num_tokens):
            raise ValueError(f"the grammar matcher could not roll back: {self.matcher.get_error()}")


def grammar_compiler(
    model_dir: str | Path, vocab_size: int, eos_token_ids: list[int]
) -> GrammarCompiler | None:
    """The grammar compiler of a model folder, or None (logged) if it has no ``tokenizer.json``."""
    path = Path(model_dir) / TOKENIZER_FILE
    if not path.is_file():
        logger.info("%s has no %s: structured output is off", model_dir, TOKENIZER_FILE)
        return None
    return GrammarCompiler(path, vocab_size, eos_token_ids)
