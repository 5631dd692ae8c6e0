"""What a request constrains its output to, and its compilation into an llguidance grammar.

A request names at most one constraint: an OpenAI ``response_format`` (``text``, ``json_object``,
``json_schema``), a regular expression or a Lark grammar. The shapes are checked here, when the
``SamplingParams`` are built; the grammar itself is compiled and checked against the tokenizer when
the engine admits the request (:class:`xpuspec.structured.matcher.GrammarCompiler`), and its error
message is the engine's (llguidance's) own.

JSON output is compact-but-spaced (``", "`` and ``": "`` separators, no free whitespace): a model
cannot wander into unbounded whitespace, and a schema may still say otherwise with its own
``x-guidance`` options.

JSON numbers are finite too (:func:`finite_numbers`): a schema's numbers without bounds get the
I-JSON range (RFC 7493: integers within ±(2^53 - 1), what a double holds exactly), and numbers without
``multipleOf`` at most :data:`MAX_FRACTION_DIGITS` fraction digits. A JSON Schema number is otherwise a
grammar loop: a small model sampling digits (``12.0767132112...``) never leaves it and writes until
``max_tokens``, an unparseable reply (seen in 3 of 640 sampled SmolLM2 replies before this bound).
Every reply still validates against the schema as given: the bound only narrows what is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
# The JSON compiler's options unless the schema's "x-guidance" says otherwise.
JSON_DEFAULTS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# llguidance reads multipleOf as a double and takes at most 10 fraction digits of it.
MAX_FRACTION_DIGITS = 10
I_JSON_LIMIT = 2**53 - 1
# Keywords whose subschemas describe values the grammar writes. "not", "if" and "contains" are left
# alone: narrowing a subschema there would widen or change what the whole schema allows.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "unevaluatedProperties", "then", "else")


@dataclass(frozen=True)
class Constraint:
    """One request's output constraint: ``kind`` is "json_schema", "regex" or "lark"."""

    kind: str
    source: str  # the schema as JSON text, the regex or the Lark grammar
    name: str = ""  # the json_schema's name, for messages

    def grammar(self) -> str:
        """The llguidance grammar (unchecked: :meth:`GrammarCompiler.compile` checks it)."""
        if self.kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_DEFAULTS)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.source)
        if self.kind == "lark":
            return LLMatcher.grammar_from_lark(self.source)
        raise ValueError(f"unknown constraint kind {self.kind!r}")


def finite_numbers(schema: Any) -> Any:
    """``schema`` (a copy) with every number it writes bounded: see the module docstring."""
    if not isinstance(schema, dict):
        return schema
    bounded = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            bounded[key] = {name: finite_numbers(sub) for name, sub in schema[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            bounded[key] = [finite_numbers(sub) for sub in schema[key]]
    for key in _SCHEMA_VALUES:
        if key in schema:
            value = schema[key]
            bounded[key] = (
                [finite_numbers(s) for s in value] if isinstance(value, list) else finite_numbers(value)
            )
    types = schema.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if not types & {"number", "integer"} or "enum" in schema or "const" in schema:
        return bounded
    low = _bound(schema, "minimum", "exclusiveMinimum", max)
    high = _bound(schema, "maximum", "exclusiveMaximum", min)
    if low is None and (high is None or high >= -I_JSON_LIMIT):
        bounded["minimum"] = -I_JSON_LIMIT
    if high is None and (low is None or low <= I_JSON_LIMIT):
        bounded["maximum"] = I_JSON_LIMIT
    if "number" in types and "multipleOf" not in schema:
        bounded["multipleOf"] = 10.0**-MAX_FRACTION_DIGITS
    return bounded


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str, tighter: Any) -> float | None:
    values = [schema[key] for key in (inclusive, exclusive) if isinstance(schema.get(key), (int, float))]
    return tighter(values) if values else None


def json_schema_constraint(schema: dict[str, Any] | bool, name: str = "") -> Constraint:
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"a JSON schema is an object (or a boolean), got {type(schema).__name__}")
    return Constraint("json_schema", json.dumps(finite_numbers(schema)), name)


def constraint_from_response_format(response_format: Any) -> Constraint | None:
    """The constraint of an OpenAI ``response_format`` (None for ``text``); ValueError on a bad shape."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ValueError(
            f"response_format is an object with a 'type' of {RESPONSE_FORMAT_TYPES}, got {response_format!r}"
        )
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_schema_constraint({"type": "object"})
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise ValueError("response_format json_schema needs a 'json_schema' object with a 'schema'")
        name = spec.get("name", "")
        if not isinstance(name, str):
            raise ValueError("response_format json_schema.name must be a string")
        schema = spec.get("schema", {})
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ValueError("response_format json_schema.strict must be a boolean")
        # strict or not, the output is constrained to the schema: both promise output that
        # validates, and constraining is how this engine keeps the promise.
        return json_schema_constraint(schema, name)
    raise ValueError(f"response_format type must be one of {RESPONSE_FORMAT_TYPES}, got {kind!r}")


def constraint_of(
    response_format: Any = None, guided_regex: str | None = None, guided_grammar: str | None = None
) -> Constraint | None:
    """The one constraint a request names, or None; ValueError for more than one or a bad shape."""
    named = [
        name
        for name, value in (
            ("response_format", response_format if _constrains(response_format) else None),
            ("guided_regex", guided_regex),
            ("guided_grammar", guided_grammar),
        )
        if value is not None
    ]
    if len(named) > 1:
        raise ValueError(f"name at most one output constraint, got {' and '.join(named)}")
    if guided_regex is not None:
        if not isinstance(guided_regex, str) or not guided_regex:
            raise ValueError(f"guided_regex must be a non-empty string, got {guided_regex!r}")
        return Constraint("regex", guided_regex)
    if guided_grammar is not None:
        if not isinstance(guided_grammar, str) or not guided_grammar.strip():
            raise ValueError(f"guided_grammar must be a non-empty Lark grammar, got {guided_grammar!r}")
        return Constraint("lark", guided_grammar)
    return constraint_from_response_format(response_format)


def _constrains(response_format: Any) -> bool:
    return response_format is not None and not (
        isinstance(response_format, dict) and response_format.get("type") == "text"
    )
