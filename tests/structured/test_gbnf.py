"""llama.cpp's GBNF: parsed, translated into Lark and compiled by llguidance on the demo bundle's
vocabulary; each grammar checked on texts it must take and texts it must refuse."""

from __future__ import annotations

import pytest

from tests.structured.test_grammar_limits import new_compiler
from xpuspec.models.bundle import ModelBundle
from xpuspec.models.demo import demo_bundle_path
from xpuspec.structured import constraint_of
from xpuspec.structured.gbnf import GbnfError, gbnf_to_lark, is_gbnf, parse_gbnf
from xpuspec.structured.matcher import GrammarCompiler, GrammarLimits
from xpuspec.text import Tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(ModelBundle.open(demo_bundle_path()).target.path)


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer) -> GrammarCompiler:
    return new_compiler(tokenizer, GrammarLimits(compile_seconds=60))


def accepts(compiler: GrammarCompiler, tokenizer: Tokenizer, grammar: str, text: str) -> bool:
    """Whether the GBNF grammar generates exactly ``text`` (its tokens all allowed, then the end)."""
    guided = compiler.compile(constraint_of(guided_grammar=grammar))
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    if guided.valid_prefix(token_ids) < len(token_ids):
        return False
    guided.advance(token_ids)
    return guided.is_accepting()


YES_NO = 'root ::= "yes" | "no"'
# Character classes (ranges, negation, escapes), repetition of every kind, grouping, comments,
# rules with dashes and capitals, and alternatives over several lines.
RECORD = r"""
# a record: a name, an age and an optional note
root      ::= Name-field ", " age ( ", " note )?   # the note is optional
Name-field ::= [A-Z] [a-z]{1,7}
age       ::= [1-9] [0-9]? | "0"
note      ::= "\"" [^"\n]* "\"" |
              "tags:" ( " " tag )+
tag       ::= [a-z-]+ "\x21"?
"""
CASES = [
    (YES_NO, ["yes", "no"], ["", "y", "yes ", "No", "yesno"]),
    (
        RECORD,
        ["Ada, 36", "Bo, 0", 'Cy, 7, "hi there"', 'Di, 99, ""', "Ed, 5, tags: a-b c!", "Flora, 12, tags: x"],
        ["ada, 36", "A, 3", "Ann, 012", "Ann, 100", 'Ann, 3, "a\nb"', "Ann, 3, tags:", "Abcdefghi, 1"],
    ),
    ('root ::= "a" . "c"', ["abc", "a\nc", "a€c"], ["ac", "abbc"]),
    ('root ::= ("ab"){2} "x"{0,1} [^a-c]{2,}', ["ababdd", "ababx\t\t"], ["abd", "ababa", "abababdd"]),
    ('root ::= "caf\\u00e9 \\U0001F600"', ["café 😀"], ["cafe 😀"]),
    # Left recursion and a class ending in '-'.
    ("root ::= expr\nexpr ::= expr [+-] num | num\nnum ::= [0-9]+", ["1+2-30", "7"], ["1+", "+1", "1*2"]),
]


@pytest.mark.parametrize(("grammar", "good", "bad"), CASES)
def test_gbnf_generates_what_llama_cpp_would(compiler, tokenizer, grammar, good, bad) -> None:
    assert is_gbnf(grammar)
    for text in good:
        assert accepts(compiler, tokenizer, grammar, text), text
    for text in bad:
        assert not accepts(compiler, tokenizer, grammar, text), text


def test_a_greedy_class_leaves_the_rest_its_characters(compiler, tokenizer) -> None:
    # One regex lexeme for [a-z]+ would swallow the final "z" under a greedy lexer.
    assert accepts(compiler, tokenizer, 'root ::= [a-z]+ "z"', "abz")


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        ('root ::= "yes" | maybe', "line 1, column 18: rule 'maybe' is used but never defined"),
        ('answer ::= "yes"', "has no 'root' rule"),
        ('root ::= "yes', "unclosed string literal"),
        ("root ::= [a-z", "unclosed character class"),
        ('root ::= ("a" | "b"', "unclosed '('"),
        ('root ::= * "a"', "'*' repeats nothing"),
        ('root ::= "a"{3,1}', "maximum below its minimum"),
        ('root ::= "a"{2', "expecting '}'"),
        ('root ::= "\\q"', "unknown escape '\\q'"),
        ('root ::= "\\x4"', "\\x needs 2 hex digits"),
        ("root ::= [z-a]", "runs backwards"),
        ('root ::= "a"\nroot ::= "b"', "line 2, column 1: rule 'root' is defined twice"),
        ('root ::= "a" ) "b"', "unexpected ')'"),
        ("root ::= <think>", "token references"),
        ("root ::= " + "(" * 100 + '"a"' + ")" * 100, "nested more than 64 deep"),
    ],
)
def test_bad_gbnf_is_one_line_naming_the_fault(grammar: str, message: str) -> None:
    with pytest.raises(GbnfError) as refused:
        constraint_of(guided_grammar=grammar)
    assert message in str(refused.value) and "\n" not in str(refused.value), refused.value


def test_lark_is_still_lark() -> None:
    lark = 'start: "yes" | "no"'
    assert not is_gbnf(lark)
    assert constraint_of(guided_grammar=lark).kind == "lark"
    assert constraint_of(guided_grammar=YES_NO).kind == "gbnf"


def test_the_translation_names_rules_apart() -> None:
    # 'a-b' and 'a_b' and 'A_b' are three GBNF rules; Lark names are lower case without dashes.
    grammar = 'root ::= a-b a_b A_b\na-b ::= "1"\na_b ::= "2"\nA_b ::= "3"'
    assert set(parse_gbnf(grammar)) == {"root", "a-b", "a_b", "A_b"}
    lark = gbnf_to_lark(grammar)
    assert (
        lark.splitlines()[0] == "start: gbnf_0"
        and len({line.split(":")[0] for line in lark.splitlines()}) == 5
    )


# What llama.cpp's json_schema_to_grammar.py writes for a {name, age}[] schema with 10-100 items
# (llama.cpp's grammars/README.md): escapes and ranges in classes, {m}, {m,n}, an empty alternative.
NAME_AGE = r"""
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
item ::= "{" space item-name-kv "," space item-age-kv "}" space
item-age ::= ([0-9] | ([1-8] [0-9] | [9] [0-9]) | "1" ([0-4] [0-9] | [5] "0")) space
item-age-kv ::= "\"age\"" space ":" space item-age
item-name ::= "\"" char{1,100} "\"" space
item-name-kv ::= "\"name\"" space ":" space item-name
root ::= "[" space item ("," space item){9,99} "]" space
space ::= | " " | "\n" [ \t]{0,20}
"""


def test_a_grammar_llama_cpp_generates_works(compiler, tokenizer) -> None:
    item = '{"name": "Ann \\u00e9\\"x", "age": 150}'
    assert accepts(compiler, tokenizer, NAME_AGE, "[" + ",\n  ".join([item] * 10) + "]")
    assert not accepts(compiler, tokenizer, NAME_AGE, "[" + ",".join([item] * 9) + "]")  # too few
    assert not accepts(compiler, tokenizer, NAME_AGE, "[" + ",".join([item.replace("150", "151")] * 10) + "]")
