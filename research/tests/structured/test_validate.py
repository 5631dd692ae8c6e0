"""The structured-output sweeps (research/structured): their schemas are sound, and a small sweep on
the demo pair ends every reply valid or cut by its token budget, never invalid."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

jsonschema = pytest.importorskip("jsonschema")

from research.structured import validate, validate_tools  # noqa: E402
from xpuspec.models.demo import demo_bundle_path  # noqa: E402


def _objects(schema: Any) -> list[dict[str, Any]]:
    if isinstance(schema, list):
        return [found for item in schema for found in _objects(item)]
    if not isinstance(schema, dict):
        return []
    own = [schema] if schema.get("type") == "object" else []
    return own + [found for value in schema.values() for found in _objects(value)]


@pytest.mark.parametrize("name", sorted(validate.SCHEMAS))
def test_each_sweep_schema_is_a_closed_json_schema(name: str) -> None:
    schema = validate.SCHEMAS[name]
    jsonschema.Draft202012Validator.check_schema(schema)
    assert all(obj.get("additionalProperties") is False for obj in _objects(schema))


def test_the_tool_schemas_are_json_schemas_and_calls_are_checked_against_them() -> None:
    for schema in validate_tools.SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    name, schema = next(iter(validate_tools.SCHEMAS.items()))
    required = {key: "x" for key in schema.get("required", [])}

    def call(function: str, arguments: str) -> SimpleNamespace:
        return SimpleNamespace(function=SimpleNamespace(name=function, arguments=arguments))

    assert not validate_tools._valid_calls([])
    assert not validate_tools._valid_calls([call("no_such_tool", "{}")])
    assert not validate_tools._valid_calls([call(name, "{not json")])
    if all(schema["properties"][key].get("type") == "string" for key in required):
        assert validate_tools._valid_calls([call(name, json.dumps(required))])


def test_a_small_sweep_on_the_demo_pair_is_valid_or_cut_by_its_budget() -> None:
    report = validate.run(str(demo_bundle_path()), "draft", samples=1, max_tokens=48)
    assert report["requests"] == len(validate.SCHEMAS)
    assert report["valid"] + report["length"] == report["requests"], report["failures"]
