"""Request preparation without a model: the tokenizer, the chat template, the limits a request is
checked against and the grammar compiler of a bundle, none of which needs the model's weights.

``Pipeline`` builds one over its loaded engine (``pipeline.requests``, with the engine's limits);
the Ray ingress builds one from the bundle alone (:meth:`RequestPreparer.load`), so it prepares
requests for the engine replicas without a copy of the weights. The server's routes read only this.

from xpuspec.api.requests import RequestLimits, RequestPreparer
requests = RequestPreparer.load(bundle, RequestLimits(max_model_len=2048, vocab_size=49152), drafter="draft")
requests.encode([{"role": "user", "content": "Hi"}]), requests.compile_constraint(constraint)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpuspec.structured.matcher import GrammarCompiler, GrammarLimits, grammar_compiler
from xpuspec.text import ChatTemplate, Tokenizer

if TYPE_CHECKING:
    from xpuspec.models.bundle import ModelBundle
    from xpuspec.sample.defaults import SamplingDefaults
    from xpuspec.sample.draft_tree import TreeShape
    from xpuspec.structured.constraint import Constraint

logger = logging.getLogger(__name__)

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class RequestLimits:
    """What a request is checked against before it reaches an engine.

    ``max_model_len``: tokens one sequence may hold, prompt plus output. ``vocab_size``: the target's
    vocabulary (a prompt's token ids stay below it; grammar masks are this wide).
    ``num_token_slots``: positions the engine's whole KV cache holds, the longest prompt that can ever
    be scheduled; None where no engine runs in this process (the engine that gets the request refuses
    a prompt too long for its cache).
    """

    max_model_len: int
    vocab_size: int
    num_token_slots: int | None = None

    def fits_cache(self, num_prompt_tokens: int) -> bool:
        """Whether a prompt this long can ever be scheduled (True while the cache is unknown)."""
        return self.num_token_slots is None or num_prompt_tokens < self.num_token_slots


def chat_template_of(bundle: ModelBundle) -> ChatTemplate | None:
    """The bundle's chat template with its special tokens, or None if it has none."""
    template = bundle.chat_template
    if not template:
        return None
    facts = bundle.tokenizer_facts
    return ChatTemplate(template, facts.get("bos_token"), facts.get("eos_token"))


def load_grammar(
    bundle: ModelBundle, tokenizer: Tokenizer, vocab_size: int, limits: GrammarLimits | None = None
) -> GrammarCompiler | None:
    """The grammar compiler of the bundle (its target's ``tokenizer.json``, else its draft's where the
    draft shares the target's tokenizer), within ``limits`` (default: :class:`GrammarLimits`'s); None
    when neither has one."""
    draft = None if bundle.translates_tokens else bundle.draft
    model_dirs = [model.path for model in (bundle.target, draft) if model is not None]
    return grammar_compiler(tokenizer, model_dirs, vocab_size, bundle.eos_token_ids, limits)


def auto_drafter(bundle: ModelBundle) -> str:
    """What ``drafter="auto"`` drafts with on this bundle: its draft model if it can draft for the
    target (its vocabulary no larger than the target's), else n-grams."""
    draft = bundle.draft
    if draft is None:
        return "ngram"
    if draft.vocab_size > bundle.target.vocab_size and not bundle.translates_tokens:
        logger.warning(
            "the draft's vocabulary (%d) is larger than the target's (%d), so it cannot draft; "
            "drafting with n-grams instead",
            draft.vocab_size,
            bundle.target.vocab_size,
        )
        return "ngram"
    return "draft"


class RequestPreparer:
    """Text to token ids, chat messages through the template, limits and constraint compilation, for
    the engine that serves ``bundle`` with ``drafter``. Thread-safe: the server's request threads
    share one."""

    def __init__(
        self,
        bundle: ModelBundle,
        tokenizer: Tokenizer,
        grammar: GrammarCompiler | None,
        limits: RequestLimits,
        *,
        drafter: str,
        default_draft_tree: TreeShape | str | None = None,
        sampling_defaults: SamplingDefaults | None = None,
    ) -> None:
        """``drafter``: what the engine drafts with (a request may name it, "auto" or "none").
        ``default_draft_tree``: the tree shape of requests that leave theirs unset (None: chains).
        ``sampling_defaults``: what the engine gives unset sampling fields (default: the bundle's)."""
        self.bundle = bundle
        self.tokenizer = tokenizer
        self.chat_template = chat_template_of(bundle)
        self.grammar = grammar
        self.limits = limits
        self.drafter = drafter
        self.default_draft_tree = default_draft_tree
        self.sampling_defaults = (
            sampling_defaults if sampling_defaults is not None else bundle.sampling_defaults
        )

    @classmethod
    def load(
        cls,
        bundle: ModelBundle,
        limits: RequestLimits,
        *,
        drafter: str,
        grammar_limits: GrammarLimits | None = None,
        default_draft_tree: TreeShape | str | None = None,
        sampling_defaults: SamplingDefaults | None = None,
    ) -> RequestPreparer:
        """From the bundle's text files alone: its OpenVINO tokenizer models and ``tokenizer.json``,
        never its models' weights."""
        tokenizer = Tokenizer(bundle.target.path)
        grammar = load_grammar(bundle, tokenizer, limits.vocab_size, grammar_limits)
        return cls(
            bundle,
            tokenizer,
            grammar,
            limits,
            drafter=drafter,
            default_draft_tree=default_draft_tree,
            sampling_defaults=sampling_defaults,
        )

    @property
    def max_model_len(self) -> int:
        return self.limits.max_model_len

    def apply_chat_template(self, messages: Messages) -> str:
        if self.chat_template is None:
            raise ValueError(f"{self.bundle.root} has no chat template; pass plain text prompts")
        return self.chat_template.render(messages, add_generation_prompt=True)

    def encode(self, prompt: str | Messages) -> list[int]:
        """Token ids of a text prompt, or of chat messages rendered with the chat template."""
        if isinstance(prompt, list):
            # A rendered chat template carries its own special tokens.
            return self.tokenizer.encode(self.apply_chat_template(prompt), add_special_tokens=False)
        if not isinstance(prompt, str):
            raise ValueError(f"a prompt is a string or a list of chat messages, got {type(prompt).__name__}")
        return self.tokenizer.encode(prompt)

    def compile_constraint(self, constraint: Constraint) -> None:
        """Compile a request's output constraint now (cached for the engine), or raise ValueError with
        the grammar engine's reason: a bad grammar is refused before any model work."""
        if self.grammar is None:
            raise ValueError("this model has no tokenizer.json, so its output cannot be constrained")
        self.grammar.compile(constraint)
