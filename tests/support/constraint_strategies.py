"""Hypothesis strategies of output constraints for the constraint fuzz test: JSON Schemas, regular
expressions and Lark grammars, valid and hostile (unsatisfiable, non-terminating, huge, malformed).

Every constraint carries a marker, ``SECRET-`` and eight hex digits, inside its own source (a literal,
a property name, a schema's name), so a test can check that no byte of it reaches another request.
Where the language is known, a constraint also carries an oracle for a finished output: a Python
regex it must fully match, or a JSON Schema it must validate against. Regexes and Lark grammars are
built from the subset of syntax that llguidance and Python's ``re`` read alike, so the Python regex
of a grammar is the grammar's language.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from hypothesis import strategies as st

MARKER_PREFIX = "SECRET-"
JSON_SCHEMA_VALIDATOR = jsonschema.Draft202012Validator

# Literal characters and the only ones ever escaped: no quotes, slashes or backslashes, so a literal
# reads the same in a regex, a Lark string and a Lark /regex/.
_LITERAL_ALPHABET = "abcxyz019 ,:._-"
_REGEX_META = set(".^$*+?()[]{}|")
_CLASSES = ("[a-z]", "[0-9]", "[A-Fa-f0-9]", "[xyz]", "[^a-z]", ".")
_EMPTY_CLASS = r"[^\x00-\U0010FFFF]"  # matches no character at all
HUGE_REGEXES = (r"a{99999999}", r"(?:[a-z]{1000}){1000}", r"[0-9]{65536}", r"(?:(?:x{100}){100}){100}")
INVALID_REGEXES = ("(", ")", "[", "*a", "a{3,1}", r"\q", "[z-a]", "(?P<", "a{,5}", "x++?(", "\\")


@dataclass(frozen=True)
class FuzzConstraint:
    """One fuzzed constraint: the request fields that carry it and what its output must satisfy."""

    family: str  # e.g. "regex", "regex-huge", "lark-nonterminating", "schema-contradiction"
    fields: dict[str, Any]  # response_format, guided_regex or guided_grammar
    marker: str
    well_formed: bool  # small, valid and satisfiable by construction: the engine must serve it
    output_regex: str | None = None  # a finished output fully matches it
    output_schema: dict[str, Any] | None = field(default=None, repr=False)  # a finished output validates

    def check_output(self, text: str) -> None:
        """AssertionError when ``text``, a finished ("stop") output, breaks the constraint."""
        if self.output_regex is not None:
            assert re.fullmatch(self.output_regex, text) is not None, (
                f"{text!r} does not match {self.output_regex!r}"
            )
        if "response_format" in self.fields:
            value = json.loads(text)  # any JSON constraint promises JSON
            if self.output_schema is not None:
                JSON_SCHEMA_VALIDATOR(self.output_schema).validate(value)


def markers() -> st.SearchStrategy[str]:
    return st.integers(0, 16**8 - 1).map(lambda number: f"{MARKER_PREFIX}{number:08x}")


def constraints() -> st.SearchStrategy[FuzzConstraint]:
    """Any fuzzed constraint: regexes, Lark grammars and JSON Schemas, valid and hostile mixed."""
    return st.one_of(regex_constraints(), lark_constraints(), schema_constraints())


def escape(text: str) -> str:
    return "".join("\\" + char if char in _REGEX_META else char for char in text)


def python_regex(pattern: str) -> str | None:
    """``pattern`` when Python's ``re`` reads it (an oracle), else None."""
    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError):
        return None
    return pattern


# Regular expressions ---------------------------------------------------------------------------

_literals = st.text(alphabet=_LITERAL_ALPHABET, min_size=1, max_size=4)
_quantifiers = st.one_of(
    st.sampled_from(["?", "*", "+"]),
    st.integers(0, 4).map(lambda m: f"{{{m}}}"),
    st.tuples(st.integers(0, 3), st.integers(0, 3)).map(lambda p: f"{{{min(p)},{max(p)}}}"),
)


def _regex_extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    parts = st.lists(inner, min_size=2, max_size=3)
    return st.one_of(
        st.tuples(inner, _quantifiers).map(lambda p: f"(?:{p[0]}){p[1]}"),
        parts.map("".join),
        parts.map(lambda alternatives: "(?:" + "|".join(alternatives) + ")"),
        inner.map(lambda body: f"({body})"),
    )


def valid_regexes() -> st.SearchStrategy[str]:
    """Small regexes in the syntax llguidance and ``re`` share; every one matches something."""
    atoms = st.one_of(_literals.map(escape), st.sampled_from(_CLASSES))
    return st.recursive(atoms, _regex_extend, max_leaves=8)


@st.composite
def regex_constraints(draw: st.DrawFn) -> FuzzConstraint:
    marker = draw(markers())
    kind = draw(st.sampled_from(["regex", "regex-unsatisfiable", "regex-huge", "regex-invalid"]))
    body = draw(valid_regexes())
    if kind != "regex":
        hostile = {
            "regex-unsatisfiable": st.just(_EMPTY_CLASS),
            "regex-huge": st.sampled_from(HUGE_REGEXES),
            "regex-invalid": st.sampled_from(INVALID_REGEXES),
        }[kind]
        piece = draw(hostile)
        body = draw(
            st.sampled_from([piece + body, body + piece, f"(?:{body}|{piece})", f"(?:{piece})+{body}"])
        )
    pattern = f"(?:{marker})?{body}"  # the marker is a literal of the constraint's own language
    return FuzzConstraint(kind, {"guided_regex": pattern}, marker, kind == "regex", python_regex(pattern))


# Lark grammars ---------------------------------------------------------------------------------
# A grammar is built as a tree whose leaves are literals and /regex/ terminals; rendering gives the
# Lark source and, beside it, a Python regex of the same language (recursive lists included: a
# left- or right-recursive list of items is a regular language).


@dataclass
class _LarkRules:
    rules: list[str] = field(default_factory=list)

    def add(self, body: str) -> str:
        name = f"r{len(self.rules)}"
        self.rules.append(f"{name}: {body}")
        return name


def _lark_extend(inner: st.SearchStrategy[tuple]) -> st.SearchStrategy[tuple]:
    parts = st.lists(inner, min_size=2, max_size=3)
    return st.one_of(
        parts.map(lambda items: ("seq", items)),
        parts.map(lambda items: ("alt", items)),
        st.tuples(inner, st.sampled_from(["?", "*", "+"])).map(lambda p: ("rep", *p)),
        inner.map(lambda item: ("rule", item)),
        st.tuples(inner, _literals, st.booleans()).map(lambda p: ("list", *p)),
    )


def lark_trees() -> st.SearchStrategy[tuple]:
    leaves = st.one_of(
        _literals.map(lambda text: ("lit", text)), st.sampled_from(_CLASSES[:4]).map(lambda c: ("re", c))
    )
    return st.recursive(leaves, _lark_extend, max_leaves=8)


def render_lark(tree: tuple, rules: _LarkRules) -> tuple[str, str]:
    """(Lark expression, Python regex) of ``tree``; named rules it needs are added to ``rules``."""
    kind = tree[0]
    if kind == "lit":
        return json.dumps(tree[1]), escape(tree[1])
    if kind == "re":
        return f"/{tree[1]}/", tree[1]
    if kind in ("seq", "alt"):
        rendered = [render_lark(item, rules) for item in tree[1]]
        joiner = " " if kind == "seq" else " | "
        regex_joiner = "" if kind == "seq" else "|"
        lark = joiner.join(part for part, _ in rendered)
        return f"({lark})", "(?:" + regex_joiner.join(f"(?:{regex})" for _, regex in rendered) + ")"
    if kind == "rep":
        lark, regex = render_lark(tree[1], rules)
        return f"({lark}){tree[2]}", f"(?:{regex}){tree[2]}"
    if kind == "rule":
        lark, regex = render_lark(tree[1], rules)
        return rules.add(lark), f"(?:{regex})"
    item, regex = render_lark(tree[1], rules)
    separator = json.dumps(tree[2])
    name = f"r{len(rules.rules)}"
    recursion = f"{name} {separator} {item}" if tree[3] else f"{item} {separator} {name}"
    rules.add(f"{recursion} | {item}")
    return name, f"(?:{regex})(?:{escape(tree[2])}(?:{regex}))*"


def _nonterminating(marker: str, size: int) -> list[str]:
    """Rules loop0..loop(size-1) that only ever refer to each other: none derives a finite string."""
    rules = [f'loop0: loop{1 % size} "{marker}"']
    rules += [f"loop{i}: loop{(i + 1) % size} | loop{i} loop0" for i in range(1, size)]
    return rules


LARK_HOSTILE_KINDS = (
    "lark-nonterminating", "lark-unproductive-branch", "lark-undefined", "lark-syntax", "lark-huge",
    "lark-unsatisfiable",
)  # fmt: skip


@st.composite
def lark_constraints(draw: st.DrawFn) -> FuzzConstraint:
    marker = draw(markers())
    kind = draw(st.sampled_from(("lark", *LARK_HOSTILE_KINDS)))
    rules = _LarkRules()
    body, regex = render_lark(draw(lark_trees()), rules)
    extra: list[str] = []
    oracle: str | None = None
    if kind == "lark":
        start, oracle = f'{body} | "{marker}"', f"(?:{regex}|{escape(marker)})"
    elif kind == "lark-nonterminating":
        extra = _nonterminating(marker, draw(st.integers(1, 3)))
        start = draw(st.sampled_from(["loop0", f"{body} loop0", f"loop0 {body}"]))
    elif kind == "lark-unproductive-branch":  # the language is body's: the branch derives nothing
        extra = _nonterminating(marker, draw(st.integers(1, 2)))
        start, oracle = f"{body} | loop0", regex
    elif kind == "lark-undefined":
        start = f'{body} "{marker}" undefined_rule'
    elif kind == "lark-syntax":
        start = draw(
            st.sampled_from(
                [f'({body} "{marker}"', f'{body} "{marker}" )', f'{body} | "{marker}" /[/', f'"{marker}" ::']
            )
        )
    elif kind == "lark-huge":
        huge = draw(st.sampled_from(['"a"{99999999}', "/a{99999999}/", "/(?:[a-z]{1000}){1000}/"]))
        start = f'"{marker}"? {huge} {body}'
    else:
        start = draw(st.sampled_from([f"/{_EMPTY_CLASS}/", f"({body} /{_EMPTY_CLASS}/)+"])) + f' "{marker}"'
    lines = [f"// {marker}", f"start: {start}", *rules.rules, *extra]
    grammar = "\n".join(lines) + "\n"
    return FuzzConstraint(kind, {"guided_grammar": grammar}, marker, kind == "lark", oracle)


# JSON Schemas ----------------------------------------------------------------------------------
# Strategies of (schema, ok) pairs: ok when the schema is valid, satisfiable and small throughout.

_PROPERTY_NAMES = ("a", "b", "id", "name", "value", "items")
_scalars = st.one_of(st.integers(-20, 20), _literals, st.booleans(), st.none(), st.sampled_from([0.5, -1.25]))


def _bounds(low: int, high: int) -> st.SearchStrategy[tuple[int, int]]:
    return st.tuples(st.integers(low, high), st.integers(low, high)).map(lambda p: (min(p), max(p)))


def _optional_keys(schema: dict[str, Any], keys: dict[str, Any], chosen: list[bool]) -> dict[str, Any]:
    kept = {key: value for (key, value), keep in zip(keys.items(), chosen, strict=True) if keep}
    return {**schema, **kept}


@st.composite
def _valid_leaves(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["string", "pattern", "integer", "number", "boolean", "null", "enum",
                                 "const", "any"]))  # fmt: skip
    if kind == "string":  # bounded mostly: a small model's strings otherwise run to max_tokens
        low, high = draw(_bounds(0, 8))
        keep = [draw(st.booleans()), draw(st.sampled_from([True, True, True, False]))]
        return _optional_keys({"type": "string"}, {"minLength": low, "maxLength": high}, keep)
    if kind == "pattern":
        return {"type": "string", "pattern": draw(valid_regexes())}
    if kind in ("integer", "number"):
        low, high = draw(_bounds(-50, 50))
        scale = 1 if kind == "integer" else 0.5
        keep = draw(st.lists(st.booleans(), min_size=2, max_size=2))
        return _optional_keys({"type": kind}, {"minimum": low * scale, "maximum": high * scale}, keep)
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return {"enum": draw(st.lists(_scalars, min_size=1, max_size=4, unique_by=json.dumps))}
    if kind == "const":
        return {"const": draw(_scalars)}
    return {}


CONTRADICTIONS = (
    {"type": "string", "minLength": 5, "maxLength": 2},
    {"type": "integer", "minimum": 10, "maximum": 3},
    {"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1},
    {"allOf": [{"type": "string"}, {"type": "integer"}]},
    {"enum": []},
    {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1},
    {"type": "object", "required": ["missing"], "additionalProperties": False},
    {"type": "string", "pattern": _EMPTY_CLASS},
    {"type": "string", "minLength": 99999999},
    {"type": "array", "minItems": 99999999},
)
MALFORMED = (
    {"type": "strnig"},
    {"type": "string", "minLength": -1},
    {"$ref": "#/$defs/missing"},
    {"type": "object", "properties": []},
    {"type": 5},
    {"type": "object", "required": "id"},
    {"type": "string", "pattern": "("},
    {"type": "integer", "multipleOf": 0},
)


def _schema_extend(inner: st.SearchStrategy[tuple[dict, bool]]) -> st.SearchStrategy[tuple[dict, bool]]:
    return st.one_of(_arrays(inner), _objects(inner), _any_ofs(inner))


@st.composite
def _arrays(draw: st.DrawFn, inner: st.SearchStrategy[tuple[dict, bool]]) -> tuple[dict, bool]:
    items, ok = draw(inner)
    low, high = draw(_bounds(0, 3))
    return {"type": "array", "items": items, "minItems": low, "maxItems": high}, ok


@st.composite
def _objects(draw: st.DrawFn, inner: st.SearchStrategy[tuple[dict, bool]]) -> tuple[dict, bool]:
    names = draw(st.lists(st.sampled_from(_PROPERTY_NAMES), min_size=1, max_size=3, unique=True))
    properties = {name: draw(inner) for name in names}
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {name: sub for name, (sub, _) in properties.items()},
        "required": [name for name in names if draw(st.booleans())],
    }
    # Mostly closed: a small model adds keys to an open object until max_tokens.
    additional = draw(st.sampled_from(["absent", "true", "false", "false", "false", "schema"]))
    if additional != "absent":
        schema["additionalProperties"] = {"true": True, "false": False, "schema": {"type": "integer"}}[
            additional
        ]
    return schema, all(ok for _, ok in properties.values())


@st.composite
def _any_ofs(draw: st.DrawFn, inner: st.SearchStrategy[tuple[dict, bool]]) -> tuple[dict, bool]:
    branches = draw(st.lists(inner, min_size=1, max_size=3))
    return {"anyOf": [sub for sub, _ in branches]}, all(ok for _, ok in branches)


def schema_parts(hostile: tuple[dict, ...] = ()) -> st.SearchStrategy[tuple[dict, bool]]:
    """Nested (schema, ok) pairs; with ``hostile`` leaves, some of them are those (ok False)."""
    leaves = _valid_leaves().map(lambda schema: (schema, True))
    if hostile:
        leaves = st.one_of(leaves, st.sampled_from(hostile).map(lambda schema: (schema, False)))
    return st.recursive(leaves, _schema_extend, max_leaves=6)


def _recursive_schema(marker: str, required_next: bool, next_first: bool, self_reference: bool) -> dict:
    """A linked list by $ref. A required "next" has no finite instance; written first, it also forces
    an endless run of tokens ahead of the model's."""
    link = {"$ref": "#" if self_reference else "#/$defs/node"}
    value = {"type": "integer", "minimum": 0, "maximum": 9}
    properties = {"next": link, "value": value} if next_first else {"value": value, "next": link}
    node = {
        "type": "object",
        "properties": {**properties, marker: {"const": marker}},
        "required": ["next", "value"] if required_next else ["value"],
        "additionalProperties": False,
    }
    if self_reference:
        return node
    return {"$defs": {"node": node}, "type": "object", "properties": {"head": {"$ref": "#/$defs/node"}},
            "required": ["head"]}  # fmt: skip


SCHEMA_KINDS = ("schema", "schema-contradiction", "schema-malformed", "schema-recursive", "json_object")


@st.composite
def schema_constraints(draw: st.DrawFn) -> FuzzConstraint:
    marker = draw(markers())
    kind = draw(st.sampled_from(SCHEMA_KINDS))
    if kind == "json_object":  # nothing to carry a marker: a valid constraint beside the others
        fields = {"response_format": {"type": "json_object"}}
        return FuzzConstraint(kind, fields, marker, True, None, {"type": "object"})
    if kind == "schema-recursive":
        required_next = draw(st.booleans())
        schema = _recursive_schema(marker, required_next, draw(st.booleans()), draw(st.booleans()))
        ok = not required_next
    else:
        hostile = {"schema": (), "schema-contradiction": CONTRADICTIONS, "schema-malformed": MALFORMED}[kind]
        inner, ok = draw(schema_parts(hostile))
        if hostile and ok:  # at least one hostile part, beside the valid ones
            inner = {"type": "object", "properties": {"x": inner, "y": draw(st.sampled_from(hostile))},
                     "required": draw(st.sampled_from([["y"], ["x", "y"], []]))}  # fmt: skip
            ok = False
        # The marker is an optional property of the top-level object, last: it changes nothing else.
        schema = {
            "type": "object",
            "properties": {"data": inner, marker: {"const": marker}},
            "required": ["data"],
            "additionalProperties": draw(st.sampled_from([False, False, True])),
        }
    strict = draw(st.sampled_from([None, True, False]))
    spec: dict[str, Any] = {"name": marker, "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    response_format = {"type": "json_schema", "json_schema": spec}
    # Strict mode may narrow or refuse open objects (OpenAI's strict schemas are closed): only a
    # non-strict schema is one the engine must serve.
    well_formed = ok and strict is not True
    fields = {"response_format": response_format}
    return FuzzConstraint(kind, fields, marker, well_formed, None, _oracle_schema(schema))


def _oracle_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """``schema`` when jsonschema reads it as a valid schema (an oracle), else None."""
    try:
        JSON_SCHEMA_VALIDATOR.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return schema
