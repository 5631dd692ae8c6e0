"""What a request constrains its output to, and its compilation into an llguidance grammar.

A request names at most one constraint: an OpenAI ``response_format`` (``text``, ``json_object``,
``json_schema``), a regular expression, or a grammar: Lark, or llama.cpp's GBNF (told apart by its
``name ::= ...`` rules, translated into Lark by :mod:`xpuspec.structured.gbnf`). The shapes are
checked here, when the ``SamplingParams`` are built; the grammar itself is compiled and checked
against the tokenizer when the request is admitted (:class:`xpuspec.structured.matcher.GrammarCompiler`),
whose refusals name the request's constraint and quote at most the first line of llguidance's message.

JSON whitespace is bounded: at most one space between two tokens of the JSON text (llguidance's
flexible whitespace with the pattern ``" ?"``), no newlines and none before or after the value. Both
compact (``{"a":1}``) and spaced (``{"a": 1}``) output are valid, a model cannot wander into unbounded
whitespace, and the grammar's lexer needs fewer states than with fixed two-byte separators, which makes
structural masks cheaper. A schema may still say otherwise with its own ``x-guidance`` options.

**Strict mode means closed objects.** With ``response_format.json_schema.strict: true`` every object
schema that does not say ``additionalProperties`` (or ``unevaluatedProperties``) is treated as
``additionalProperties: false``, everywhere in the schema (:func:`close_objects`): the model cannot add
keys the schema does not name. ``required`` is kept as given, in strict mode too: OpenAI's strict mode
wants every property listed in ``required``, but this engine neither enforces nor infers that, so a
property a strict schema leaves out of ``required`` may be omitted. Objects are closed one schema at a
time: an object whose properties are split across ``allOf`` branches allows only keys every branch
names. Without ``strict`` (or with ``strict: false``) a schema keeps JSON Schema's meaning: objects are
open unless they say otherwise.

A JSON schema that no finite value satisfies (a required property that refers back to its own object
through ``$ref``, or one whose schema is ``false``) is refused when the constraint is built
(:func:`has_finite_value`): the grammar would otherwise recurse forever on the model's first token.

JSON numbers are finite too (:func:`finite_numbers`): a schema's numbers without bounds get the
I-JSON range (RFC 7493: integers within ±(2^53 - 1), what a double holds exactly), and numbers without
``multipleOf`` at most :data:`MAX_FRACTION_DIGITS` fraction digits. A JSON Schema number is otherwise a
grammar loop: a small model sampling digits (``12.0767132112...``) never leaves it and writes until
``max_tokens``, an unparseable reply (seen in sampled SmolLM2 replies before this bound:
docs/experiments/2026-12-04-readme-notes.md).
Every reply still validates against the schema as given: the bound only narrows what is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llguidance import LLMatcher

from xpuspec.structured.gbnf import gbnf_to_lark, is_gbnf

if TYPE_CHECKING:
    # Declared only in llguidance's type stub (the module is compiled): a name for type checking.
    from llguidance._lib import JsonCompileOptions

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
# The JSON compiler's options unless the schema's "x-guidance" says otherwise.
JSON_DEFAULTS: JsonCompileOptions = {"whitespace_flexible": True, "whitespace_pattern": " ?"}
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
    """One request's output constraint: ``kind`` is "json_schema", "regex", "lark" or "gbnf"."""

    kind: str
    source: str  # the schema as JSON text, the regex, the Lark or the GBNF grammar
    name: str = ""  # the json_schema's name, for messages

    def grammar(self) -> str:
        """The llguidance grammar (unchecked: :meth:`GrammarCompiler.compile` checks it)."""
        if self.kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_DEFAULTS)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.source)
        if self.kind == "lark":
            return LLMatcher.grammar_from_lark(self.source)
        if self.kind == "gbnf":
            return LLMatcher.grammar_from_lark(gbnf_to_lark(self.source))
        raise ValueError(f"unknown constraint kind {self.kind!r}")


def _map_subschemas(schema: dict[str, Any], change: Callable[[Any], Any]) -> dict[str, Any]:
    """A copy of ``schema`` with ``change`` applied to each subschema that describes written values."""
    mapped = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            mapped[key] = {name: change(sub) for name, sub in schema[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            mapped[key] = [change(sub) for sub in schema[key]]
    for key in _SCHEMA_VALUES:
        if key in schema:
            value = schema[key]
            mapped[key] = [change(s) for s in value] if isinstance(value, list) else change(value)
    return mapped


def _types(schema: dict[str, Any]) -> set[str]:
    types = schema.get("type")
    return {t for t in (types if isinstance(types, list) else [types]) if isinstance(t, str)}


def close_objects(schema: Any) -> Any:
    """``schema`` (a copy) with every object schema that leaves extra keys unsaid closed: strict mode."""
    if not isinstance(schema, dict):
        return schema
    closed = _map_subschemas(schema, close_objects)
    is_object = "object" in _types(schema) or ("type" not in schema and "properties" in schema)
    if is_object and "additionalProperties" not in schema and "unevaluatedProperties" not in schema:
        closed["additionalProperties"] = False
    return closed


def finite_numbers(schema: Any) -> Any:
    """``schema`` (a copy) with every number it writes bounded: see the module docstring."""
    if not isinstance(schema, dict):
        return schema
    bounded = _map_subschemas(schema, finite_numbers)
    types = _types(schema)
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


def has_finite_value(schema: Any) -> bool:
    """Whether some finite JSON value satisfies ``schema`` as far as what it requires goes.

    A schema is satisfiable when each of its requirements is: its ``$ref`` and each ``allOf`` branch,
    one ``anyOf``/``oneOf`` branch, and (for a schema whose only type is object or array) each
    required property and each of the first ``minItems`` items. Everything else (other keywords,
    remote references) is taken as satisfiable, so only a schema that really has no finite value is
    refused. The least fixed point is found by counting (each subschema is settled once), so a
    large schema costs time linear in its size.
    """
    needs: dict[int, list[list[Any]]] = {}  # subschema -> its requirements, each a list of alternatives
    nodes: dict[int, dict[str, Any]] = {}
    pending = [schema]
    while pending:
        node = pending.pop()
        if not isinstance(node, dict) or id(node) in nodes:
            continue
        nodes[id(node)] = node  # kept: the ids stay those of live objects
        needs[id(node)] = _requirements(node, schema)
        pending.extend(alternative for need in needs[id(node)] for alternative in need)
        pending.extend(_subschemas(node))
    return _satisfiable(schema, needs)


def _subschemas(node: dict[str, Any]) -> list[Any]:
    found: list[Any] = []
    _map_subschemas(node, lambda sub: found.append(sub))
    return found


def _requirements(node: dict[str, Any], root: Any) -> list[list[Any]]:
    """What ``node`` needs: a list of requirements, each met by any one of its alternatives."""
    needs: list[list[Any]] = []
    if isinstance(node.get("$ref"), str):
        needs.append([_resolve(node["$ref"], root)])
    if isinstance(node.get("allOf"), list):
        needs.extend([branch] for branch in node["allOf"])
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and node[key]:
            needs.append(list(node[key]))
    types = _types(node)
    if types == {"object"} and isinstance(node.get("required"), list):
        declared = node.get("properties")
        properties = declared if isinstance(declared, dict) else {}
        for name in node["required"]:
            if not isinstance(name, str):
                continue
            if name in properties:
                needs.append([properties[name]])
            elif "patternProperties" not in node:
                needs.append([node.get("additionalProperties", True)])
    min_items = node.get("minItems")
    if types == {"array"} and isinstance(min_items, int) and min_items > 0:
        prefix_items = node.get("prefixItems")
        prefix = prefix_items if isinstance(prefix_items, list) else []
        needs.extend([item] for item in prefix[:min_items])
        if min_items > len(prefix) and isinstance(node.get("items"), (dict, bool)):
            needs.append([node["items"]])
    return needs


def _resolve(ref: str, root: Any) -> Any:
    """The subschema a local ``$ref`` (``#`` or ``#/a/b``) points to; True for any other reference."""
    if ref != "#" and not ref.startswith("#/"):
        return True
    node = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return True  # llguidance reports a pointer that does not exist
    return node


def _satisfiable(root: Any, needs: dict[int, list[list[Any]]]) -> bool:
    """Whether ``root`` has a finite value: unit propagation over the requirements (Horn clauses)."""
    if not isinstance(root, dict):
        return root is not False
    unmet = {key: len(node_needs) for key, node_needs in needs.items()}
    waiting: dict[int, list[tuple[int, int]]] = {}  # alternative -> (node, requirement) it would meet
    ready = []
    for key, node_needs in needs.items():
        for index, need in enumerate(node_needs):
            if any(alternative is True or not isinstance(alternative, (dict, bool)) for alternative in need):
                unmet[key] -= 1  # met by a value of any kind
                continue
            for alternative in need:
                if isinstance(alternative, dict):
                    waiting.setdefault(id(alternative), []).append((key, index))
        if unmet[key] == 0:
            ready.append(key)
    met: set[tuple[int, int]] = set()
    finite: set[int] = set()
    while ready:
        key = ready.pop()
        if key in finite:
            continue
        finite.add(key)
        for owner, index in waiting.get(key, []):
            if (owner, index) not in met:
                met.add((owner, index))
                unmet[owner] -= 1
                if unmet[owner] == 0:
                    ready.append(owner)
    return id(root) in finite


def json_schema_constraint(schema: dict[str, Any] | bool, name: str = "") -> Constraint:
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"a JSON schema is an object (or a boolean), got {type(schema).__name__}")
    if not has_finite_value(schema):
        what = f"JSON schema {name!r}" if name else "JSON schema"
        raise ValueError(
            f"the {what} allows no finite value: a required property or item is false or needs "
            "itself again through $ref"
        )
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
        # validates, and constraining is how this engine keeps the promise. Strict also closes objects.
        return json_schema_constraint(close_objects(schema) if strict else schema, name)
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
            raise ValueError(
                f"guided_grammar must be a non-empty Lark or GBNF grammar, got {guided_grammar!r}"
            )
        if is_gbnf(guided_grammar):
            gbnf_to_lark(guided_grammar)  # a GbnfError (ValueError) names what is wrong
            return Constraint("gbnf", guided_grammar)
        return Constraint("lark", guided_grammar)
    return constraint_from_response_format(response_format)


def _constrains(response_format: Any) -> bool:
    return response_format is not None and not (
        isinstance(response_format, dict) and response_format.get("type") == "text"
    )
