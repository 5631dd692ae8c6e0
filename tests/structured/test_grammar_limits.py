"""Constraints refused when compiled (unsatisfiable, too large, too slow, refusals cached), messages that
hold none of the constraint's text, strict schemas' closed objects and bounded JSON whitespace; on the
demo bundle's vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from tests.server.conftest import wait_until
from xpuspec.models.bundle import ModelBundle
from xpuspec.models.demo import demo_bundle_path
from xpuspec.structured import constraint_of
from xpuspec.structured.constraint import close_objects, has_finite_value
from xpuspec.structured.matcher import GrammarCompiler, GrammarLimits, grammar_compiler
from xpuspec.text import Tokenizer

SECRET = "SECRET-CUSTOMER-12345"
RECURSIVE = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(ModelBundle.open(demo_bundle_path()).target.path)


def new_compiler(tokenizer: Tokenizer, limits: GrammarLimits | None = None) -> GrammarCompiler:
    bundle = ModelBundle.open(demo_bundle_path())
    compiler = grammar_compiler(
        tokenizer, [bundle.target.path], bundle.target.vocab_size, bundle.eos_token_ids, limits
    )
    assert compiler is not None
    return compiler


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer) -> GrammarCompiler:
    # A generous budget: a busy machine must not turn a refusal into "too slow" (tested on its own).
    return new_compiler(tokenizer, GrammarLimits(compile_seconds=60))


def refusal(compiler: GrammarCompiler, **constraint: object) -> str:
    with pytest.raises(ValueError) as refused:
        compiler.compile(constraint_of(**constraint))  # type: ignore[arg-type]
    return str(refused.value)


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        ({"guided_grammar": "start: a\na: a"}, "the Lark grammar allows no output"),
        ({"guided_regex": "[^\\x00-\\U0010FFFF]"}, "the regular expression allows no output"),
        ({"guided_regex": "a{99999999}"}, "the regular expression is too large"),
    ],
)
def test_unsatisfiable_and_huge_constraints_are_refused_at_compile(compiler, constraint, message) -> None:
    first = refusal(compiler, **constraint)
    assert first.startswith(message), first
    assert refusal(compiler, **constraint) == first  # the cached compilation carries its refusal


def test_a_required_recursive_ref_has_no_finite_value() -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "chain", "schema": RECURSIVE}}
    with pytest.raises(ValueError, match="the JSON schema 'chain' allows no finite value"):
        constraint_of(response_format=response_format)
    assert not has_finite_value({"type": "object", "properties": {"x": False}, "required": ["x"]})
    assert not has_finite_value(
        {
            "$defs": {"list": {"type": "array", "items": {"$ref": "#"}, "minItems": 1}},
            "type": "object",
            "properties": {"items": {"$ref": "#/$defs/list"}},
            "required": ["items"],
        }
    )
    # A way out (optional, an alternative, an empty array) is a finite value.
    assert has_finite_value({**RECURSIVE, "required": []})
    assert has_finite_value(
        {
            "type": "object",
            "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
            "required": ["next"],
        }
    )
    assert has_finite_value({"type": "array", "items": {"$ref": "#"}})


def test_refusals_hold_none_of_the_constraint(compiler) -> None:
    for constraint in (
        {"guided_grammar": f'start: a\na: a SECRET\nSECRET: "{SECRET}"'},
        {"guided_regex": f"{SECRET}{{99999999}}"},
    ):
        message = refusal(compiler, **constraint)
        assert "SECRET" not in message and "99999999" not in message and "\n" not in message, message


def test_a_run_time_failure_holds_none_of_the_constraint(compiler, tokenizer) -> None:
    """A grammar that dead-ends after its first tokens compiles; the mask where it fails says so
    without the grammar or the tokens so far."""
    guide = compiler.compile(constraint_of(guided_grammar=f'start: "{SECRET}" a\na: a'))
    guide.advance(tokenizer.encode(SECRET, add_special_tokens=False))
    with pytest.raises(ValueError) as failed:
        guide.allowed()
    assert "SECRET" not in str(failed.value) and "\n" not in str(failed.value), failed.value


def test_a_compilation_over_its_time_budget_is_refused_and_its_end_cached(tokenizer) -> None:
    compiler = new_compiler(tokenizer, GrammarLimits(compile_seconds=0.001))
    huge = {"guided_regex": "b{99999999}"}  # llguidance takes a good part of a second to give up
    assert refusal(compiler, **huge).startswith("the regular expression is too slow to compile")
    # The compilation went on: once it ends, its own refusal is what every use gets.
    assert wait_until(lambda: "too large" in refusal(compiler, **huge), timeout=60, interval=0.1)
    assert "too large" in refusal(compiler, **huge)


def test_limits_are_checked() -> None:
    for bad in ({"compile_seconds": 0}, {"max_lexer_states": 0}, {"max_grammar_size": True}):
        with pytest.raises(ValueError):
            GrammarLimits(**bad)  # type: ignore[arg-type]


def test_a_grammar_over_the_size_limit_is_refused(tokenizer) -> None:
    compiler = new_compiler(tokenizer, GrammarLimits(max_grammar_size=50))
    properties = {f"key{i}": {"type": "integer"} for i in range(40)}
    message = refusal(compiler, response_format={"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": properties, "required": list(properties)}}})  # fmt: skip
    assert message.startswith("the JSON schema is too large"), message


def _allows_after(
    compiler: GrammarCompiler, tokenizer: Tokenizer, strict: bool | None, text: str
) -> np.ndarray:
    spec = {"name": "city", "schema": CITY} | ({} if strict is None else {"strict": strict})
    guide = compiler.compile(constraint_of(response_format={"type": "json_schema", "json_schema": spec}))
    guide.advance(tokenizer.encode(text, add_special_tokens=False))
    return guide.allowed()


def test_strict_schemas_close_their_objects(compiler, tokenizer) -> None:
    (comma,) = tokenizer.encode(",", add_special_tokens=False)
    (close,) = tokenizer.encode("}", add_special_tokens=False)
    after_city = '{"city": "Oslo"'
    strict = _allows_after(compiler, tokenizer, True, after_city)
    assert strict[close] and not strict[comma]  # no key beyond the schema's
    for open_schema in (False, None):  # JSON Schema's meaning: objects are open
        allowed = _allows_after(compiler, tokenizer, open_schema, after_city)
        assert allowed[close] and allowed[comma]


def test_close_objects_reaches_every_object_and_keeps_what_a_schema_says() -> None:
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {}}}},
            "extra": {"type": "object", "additionalProperties": {"type": "integer"}},
            "either": {"anyOf": [{"properties": {"a": {}}}, {"type": "string"}]},
        },
        "$defs": {"node": {"type": ["object", "null"]}},
    }
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    assert closed["properties"]["extra"]["additionalProperties"] == {"type": "integer"}
    assert closed["properties"]["either"]["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["either"]["anyOf"][1]
    assert closed["$defs"]["node"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # a copy


@pytest.mark.parametrize(
    ("text", "allowed"),
    [
        ('{"a":1,"b":["x"]}', True),
        ('{"a": 1, "b": ["x"]}', True),
        ('{ "a" : 1 , "b" : [ "x" ] }', True),
        ('{"a":  1,"b":[]}', False),  # at most one space in a row
        ('{"a":1,\n"b":[]}', False),  # no newlines
        (' {"a":1,"b":[]}', False),  # nothing around the value
    ],
)
def test_json_whitespace_is_flexible_but_bounded(compiler, tokenizer, text, allowed) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}},
        "required": ["a", "b"],
    }
    guide = compiler.compile(
        constraint_of(response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    )
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    accepted = guide.valid_prefix(token_ids) == len(token_ids)
    if accepted:
        guide.advance(token_ids)
    assert (accepted and guide.is_accepting()) == allowed


def test_a_dead_end_on_one_alternative_is_not_refused(compiler, tokenizer) -> None:
    """Compiling refuses what no output can satisfy; a path that dead-ends beside one that does not is
    left to run time (the first allowed token, "a", leads into the dead end)."""
    guide = compiler.compile(constraint_of(guided_grammar='start: "a" b | "c"\nb: b'))
    guide.advance(tokenizer.encode("c", add_special_tokens=False))
    assert guide.is_accepting()
