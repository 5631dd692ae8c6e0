"""The demo bundle's tokenizer and grammar compiler, for tests of masks without an engine."""

from __future__ import annotations

from xpuspec.models.bundle import ModelBundle
from xpuspec.models.demo import demo_bundle_path
from xpuspec.structured.matcher import GrammarCompiler, grammar_compiler
from xpuspec.text import Tokenizer


def demo_grammar_compiler() -> tuple[Tokenizer, GrammarCompiler]:
    bundle = ModelBundle.open(demo_bundle_path())
    tokenizer = Tokenizer(bundle.target.path)
    compiler = grammar_compiler(
        tokenizer, [bundle.target.path], bundle.target.vocab_size, bundle.eos_token_ids
    )
    assert compiler is not None
    return tokenizer, compiler
