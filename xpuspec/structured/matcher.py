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

**Compilation** (:meth:`GrammarCompiler.compile`) runs before a request is admitted (the server
compiles on the request's thread, the engine again in ``add_request``, from the cache), within the
budgets of :class:`GrammarLimits`. A constraint is refused with a ValueError (the server's 400) when it is
invalid, when no token can start it, when its first token already breaks a limit, or when compiling it
takes longer than the budget; the message names the request's own constraint kind and holds neither
its text nor llguidance's parser state. A grammar that dead-ends later (after a literal prefix, say)
compiles, and fails at run time where its mask is computed. Refusals are cached like compiled grammars.

The grammar engine's tokenizer (:mod:`xpuspec.structured.grammar_tokenizer`) comes from the bundle's
``tokenizer.json``. A byte-level BPE vocabulary
(GPT-2, Llama 3, Qwen, SmolLM2) is read entry by entry, each token's bytes from the byte-level
alphabet, with the model's OpenVINO tokenizer for encoding: a converted file's decoder section may
be wrong (the default draft's describes SmolLM2's vocabulary as SentencePiece pieces, which would
make ``Ċ`` a letter instead of a newline), the vocabulary itself is what the model saw. Masks are
as wide as the model's vocabulary: model ids beyond the tokenizer's are never allowed.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from llguidance import LLMatcher, LLParserLimits, LLTokenizer

from xpuspec.structured.constraint import Constraint
from xpuspec.structured.grammar_tokenizer import load_tokenizer

if TYPE_CHECKING:
    from xpuspec.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
COMPILED_CACHE_SIZE = 64  # compiled grammars kept per engine (refusals included)
MAX_DETAIL_CHARS = 200  # of llguidance's message in a refusal
# llguidance's words for a limit of LLParserLimits (or one of its own) reached.
_OVER_LIMIT = re.compile(r"too (big|large|many)", re.IGNORECASE)


@dataclass(frozen=True)
class GrammarLimits:
    """What compiling one request's constraint may cost; a constraint beyond it is refused (a 400).

    ``compile_seconds`` bounds the wall time of a new grammar's compilation (checking it, building its
    matcher, its first mask and one step past it). Each new grammar compiles on a thread of its own and
    the request waits at most this long: a compilation still running then is refused as too slow, and
    whatever it ends with (a matcher or a refusal) is cached for the next use. llguidance releases the
    GIL while it builds a matcher, so the waiting thread hears back in time.
    ``max_lexer_states`` caps the lexer states one grammar may build (about 1-2 kB each, built lazily
    as masks are computed, and shared by the requests using the same grammar): beyond it the compilation
    is refused, or a running request's mask fails. ``max_grammar_size`` caps the symbols of the grammar's
    productions and ``lexer_fuel`` the work of building its regular expressions; the llguidance limits
    also bound every later mask, so no constraint holds a core for long.
    The three caps default to llguidance's own; the budget is generous for any schema a client means.
    """

    compile_seconds: float = 2.0
    max_lexer_states: int = 250_000
    max_grammar_size: int = 500_000
    lexer_fuel: int = 1_000_000

    def __post_init__(self) -> None:
        if isinstance(self.compile_seconds, bool) or not self.compile_seconds > 0:
            raise ValueError(f"compile_seconds must be a positive number, got {self.compile_seconds!r}")
        for name in ("max_lexer_states", "max_grammar_size", "lexer_fuel"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    def parser_limits(self) -> LLParserLimits:
        # Terse errors: a verbose one holds the grammar and the parser state, which are request data.
        return LLParserLimits(
            initial_lexer_fuel=self.lexer_fuel,
            max_lexer_states=self.max_lexer_states,
            max_grammar_size=self.max_grammar_size,
            verbose_errors=False,
        )


class GrammarCompiler:
    """Engine-wide: the llguidance tokenizer of a model (loaded on first use) and grammar compilation.

    Compiled grammars are cached by their llguidance grammar text, refusals included: a constraint
    refused once is refused the same way (and at once) while it stays in the cache.
    """

    def __init__(
        self,
        load_tokenizer: Callable[[], LLTokenizer],
        vocab_size: int,
        eos_token_ids: list[int],
        limits: GrammarLimits | None = None,
    ):
        self._load_tokenizer = load_tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.limits = limits or GrammarLimits()
        self._tokenizer: LLTokenizer | None = None
        self._compiled: dict[str, _Compilation] = {}  # grammar -> its compilation, least recently used first
        self._lock = threading.Lock()
        # Seconds spent computing masks and how many: the per-token mask cost `xpuspec bench` reports.
        self.mask_seconds = 0.0
        self.num_masks = 0

    @property
    def tokenizer(self) -> LLTokenizer:
        with self._lock:  # the server compiles on request threads
            if self._tokenizer is None:
                started = time.perf_counter()
                self._tokenizer = self._load_tokenizer()
                logger.info(
                    "grammar tokenizer of %d tokens loaded in %.2f s",
                    self._tokenizer.vocab_size,
                    time.perf_counter() - started,
                )
            return self._tokenizer

    def compile(self, constraint: Constraint) -> GuidedRequest:
        """A fresh matcher for one request, its first mask checked.

        ValueError, with a message about this request's constraint only, for a constraint that is
        invalid, allows no output, breaks a limit of :class:`GrammarLimits` or fails its first step.
        """
        what = _describe(constraint)
        try:
            grammar = constraint.grammar()
        except ValueError as error:
            raise ValueError(f"invalid {what}: {_terse(str(error))}") from None
        tokenizer = self.tokenizer  # loaded outside the budget: a model's one-time cost
        budget = self.limits.compile_seconds
        compilation = self._compilation(grammar, tokenizer)
        if not compilation.done.wait(budget):
            raise ValueError(f"the {what} is too slow to compile (over {budget:g} s): simplify it")
        if compilation.refusal is not None:
            raise ValueError(compilation.refusal(what))
        assert compilation.template is not None
        guide = GuidedRequest(compilation.template.deep_copy(), self)
        # The copy shares the template's lexer: a limit another request's matcher reached at run time
        # shows here, and from then on the grammar is refused like any other failed compilation.
        words = self._bitmask_words(tokenizer)
        refusal = _check_start(guide.matcher, _allowed_ids(guide.matcher, words))
        if refusal is not None:
            compilation.refusal = refusal
            raise ValueError(refusal(what))
        return guide

    def _compilation(self, grammar: str, tokenizer: LLTokenizer) -> _Compilation:
        """The cached compilation of ``grammar``, or a new one started on a worker thread."""
        with self._lock:
            compilation = self._compiled.pop(grammar, None)
            if compilation is None:
                compilation = _Compilation()
                words = self._bitmask_words(tokenizer)
                threading.Thread(
                    target=compilation.run,
                    args=(grammar, tokenizer, self.limits, words, self.eos_token_ids),
                    name="xpuspec-grammar-compile",
                    daemon=True,
                ).start()
            # Most recently used last; the oldest goes beyond the cache's size (a running compilation
            # evicted so finishes for its waiting requests only).
            self._compiled[grammar] = compilation
            while len(self._compiled) > COMPILED_CACHE_SIZE:
                self._compiled.pop(next(iter(self._compiled)))
        return compilation

    def _bitmask_words(self, tokenizer: LLTokenizer) -> int:
        return (max(tokenizer.vocab_size, self.vocab_size) + 31) // 32


# A refusal's message, given the request's own description of its constraint ("JSON schema 'x'"):
# one grammar may be named differently by the requests that share its compilation.
Refusal = Callable[[str], str]


class _Compilation:
    """One grammar's compilation, run once: a template matcher (copied per request) or a refusal."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.template: LLMatcher | None = None
        self.refusal: Refusal | None = None

    def run(
        self, grammar: str, tokenizer: LLTokenizer, limits: GrammarLimits, words: int, eos: list[int]
    ) -> None:
        started = time.perf_counter()
        try:
            self.template, self.refusal = _build(grammar, tokenizer, limits, words, eos)
        except Exception as error:  # noqa: BLE001 - whatever llguidance raises is this grammar's refusal
            logger.warning("compiling a constraint failed: %s", type(error).__name__, exc_info=True)
            self.refusal = lambda what: f"the {what} could not be compiled"
        finally:
            self.done.set()
        logger.debug("constraint compiled in %.3f s", time.perf_counter() - started)


def _build(
    grammar: str, tokenizer: LLTokenizer, limits: GrammarLimits, words: int, eos: list[int]
) -> tuple[LLMatcher | None, Refusal | None]:
    """The template matcher of ``grammar``, checked at its start and one token past it, or a refusal."""
    parser_limits = limits.parser_limits()
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer, limits=parser_limits)
    if is_error:
        return None, _refusal_of(messages[0] if messages else "rejected", invalid=True)
    template = LLMatcher(tokenizer, grammar, log_level=0, limits=parser_limits)
    if template.is_error():
        return None, _refusal_of(template.get_error(), invalid=True)
    allowed = _allowed_ids(template, words)
    refusal = _check_start(template, allowed)
    if refusal is None and allowed is not None:
        refusal = _check_first_step(template, allowed, words, eos)
    return (None, refusal) if refusal is not None else (template, None)


def _allowed_ids(matcher: LLMatcher, words: int) -> np.ndarray | None:
    """The ids ``matcher`` allows now, or None if computing them put it in error."""
    bitmask = np.zeros(words, dtype=np.int32)
    matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)
    if matcher.is_error():
        return None
    return np.flatnonzero(np.unpackbits(bitmask.view(np.uint8), bitorder="little"))


def _check_start(matcher: LLMatcher, allowed: np.ndarray | None) -> Refusal | None:
    """A refusal if no output can start: no token allowed (and not complete), or the matcher failed."""
    if allowed is None:
        return _refusal_of(matcher.get_error())
    if len(allowed) == 0 and not (matcher.is_accepting() or matcher.is_stopped()):
        return lambda what: f"the {what} allows no output: no token can start it"
    return None


def _check_first_step(template: LLMatcher, allowed: np.ndarray, words: int, eos: list[int]) -> Refusal | None:
    """A refusal if the first allowed token (not end-of-sequence) runs into a limit of llguidance's.

    Limits a grammar reaches only once output begins (a huge repetition count, a rule that forces
    itself forever) show on the first token: the request is refused now instead of failing as it runs.
    Any other failure there is left to run time: that path may be one alternative among others.
    """
    first = next((int(token) for token in allowed if int(token) not in eos), None)
    if first is None or template.is_stopped():
        return None
    probe = template.deep_copy()  # a matcher in error stays in error: the template is kept clean
    if probe.consume_token(first) and _allowed_ids(probe, words) is not None:
        return None
    error = probe.get_error()
    return _refusal_of(error) if _OVER_LIMIT.search(_terse(error)) else None


def _refusal_of(error: str, invalid: bool = False) -> Refusal:
    """The refusal for llguidance's ``error``; ``invalid``: it came from checking the grammar."""
    detail = _terse(error)
    if "NoExtensionBias" in error:  # llguidance: the grammar's first step allows no token
        return lambda what: f"the {what} allows no output: no token can start it"
    if _OVER_LIMIT.search(detail):
        return lambda what: f"the {what} is too large: {detail}"
    if invalid:
        return lambda what: f"invalid {what}: {detail}"
    return lambda what: f"the {what} cannot be matched: {detail}"


def _terse(message: str) -> str:
    """One bounded line of an llguidance message: its first line and its ``error:`` line (the other
    lines draw the grammar around the error)."""
    lines = [line.strip() for line in message.replace("<non-verbose/>", "").splitlines() if line.strip()]
    kept = lines[:1] + [line for line in lines[1:] if line.startswith("error:")][:1]
    line = " ".join(kept) or "rejected"
    return line if len(line) <= MAX_DETAIL_CHARS else line[: MAX_DETAIL_CHARS - 3] + "..."


def _describe(constraint: Constraint) -> str:
    what = {
        "json_schema": "JSON schema",
        "regex": "regular expression",
        "lark": "Lark grammar",
        "gbnf": "GBNF grammar",
    }
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
        # Masks of states past the committed one, keyed by the tokens after it (cleared on advance).
        self._masks: dict[tuple[int, ...], np.ndarray] = {}

    # ------------------------------------------------------------------ masks
    def _mask_at(self, prefix: tuple[int, ...]) -> np.ndarray:
        """``allowed()`` at the state ``prefix`` past the committed one (where the matcher is now).

        A step asks for the same states up to three times (forced-token check, the draft's
        steps, the verified rows): each is computed once per committed state.
        """
        mask = self._masks.get(prefix)
        if mask is None:
            mask = self._masks[prefix] = self.allowed()
        return mask

    def allowed(self) -> np.ndarray:
        """The tokens allowed at the matcher's current state: [vocab] bool."""
        started = time.perf_counter()
        self.matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[: self.vocab_size].view(bool)
        self.compiler.mask_seconds += time.perf_counter() - started
        self.compiler.num_masks += 1
        if self.matcher.is_error():
            error = self.matcher.get_error()
            # NoExtensionBias: llguidance's word for a state no token can leave.
            raise ValueError(
                "no token can continue the output here" if "NoExtensionBias" in error else _terse(error)
            )
        return bits

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
                masks[row] = self._mask_at(tuple(draft_ids[:row]))
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
        mask = self._mask_at(tuple(drafted))[: logits.shape[-1]]
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
                allowed = np.flatnonzero(self._mask_at(tuple(forced)))
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
        self._masks.clear()
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
    tokenizer: Tokenizer,
    model_dirs: list[Path],
    vocab_size: int,
    eos_token_ids: list[int],
    limits: GrammarLimits | None = None,
) -> GrammarCompiler | None:
    """The grammar compiler of a model, from the first ``tokenizer.json`` in ``model_dirs`` (the
    target's, then the draft's: a pair shares its vocabulary), within ``limits`` (default:
    :class:`GrammarLimits`'s); None (logged) when there is none.

    A byte-level BPE vocabulary is read token by token (with the model's OpenVINO tokenizer for
    encoding); any other is left to llguidance's own reading of the file.
    """
    for model_dir in model_dirs:
        path = Path(model_dir) / TOKENIZER_FILE
        if path.is_file():
            return GrammarCompiler(
                functools.partial(load_tokenizer, path, tokenizer, eos_token_ids),
                vocab_size,
                eos_token_ids,
                limits,
            )
    logger.info("no %s in %s: structured output is off", TOKENIZER_FILE, [str(d) for d in model_dirs])
    return None
