"""Structured output at scale: many JSON Schemas x sampled requests, every output parsed and validated.

    python -m research.structured.validate [--bundle PATH] [--drafter draft|ngram|none]
        [--samples 20] [--max-tokens 256] [--json out.json]

Runs :data:`SCHEMAS` (nested objects, arrays, enums, numbers with ranges, optional fields, anyOf)
with ``--samples`` sampled requests each (temperature 1, seeds 0..n-1) through ``response_format``
json_schema on the default model (or ``--bundle``), and reports how many outputs parse and validate
with ``jsonschema``, how many ran out of tokens, the mask cost per token and tokens/s. Not part of CI
at this size (tests/structured runs a sample on the tiny models).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

logger = logging.getLogger(__name__)

_STR = {"type": "string", "maxLength": 24}
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {"name": _STR, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    },
    "point": {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"],
    },
    "color_enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
    "tags": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": _STR, "minItems": 1, "maxItems": 4}},
        "required": ["tags"],
    },
    "nested_address": {
        "type": "object",
        "properties": {
            "name": _STR,
            "address": {
                "type": "object",
                "properties": {
                    "street": _STR,
                    "city": _STR,
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["city", "zip"],
            },
        },
        "required": ["name", "address"],
    },
    "optional_fields": {
        "type": "object",
        "properties": {
            "title": _STR,
            "subtitle": _STR,
            "pages": {"type": "integer", "minimum": 1, "maximum": 999},
        },
        "required": ["title"],
    },
    "rating": {
        "type": "object",
        "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "comment": _STR},
        "required": ["stars", "comment"],
    },
    "temperature": {
        "type": "object",
        "properties": {"celsius": {"type": "number", "minimum": -90, "maximum": 60}},
        "required": ["celsius"],
    },
    "boolean_flags": {
        "type": "object",
        "properties": {"active": {"type": "boolean"}, "admin": {"type": "boolean"}},
        "required": ["active", "admin"],
    },
    "any_of_id": {
        "type": "object",
        "properties": {
            "id": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "maxLength": 12}]}
        },
        "required": ["id"],
    },
    "any_of_shape": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0}},
                "required": ["kind", "radius"],
            },
            {
                "type": "object",
                "properties": {"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0}},
                "required": ["kind", "side"],
            },
        ]
    },
    "matrix": {
        "type": "object",
        "properties": {
            "rows": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
                "maxItems": 3,
            }
        },
        "required": ["rows"],
    },
    "order": {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": _STR, "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                    "required": ["sku", "qty"],
                },
                "minItems": 1,
                "maxItems": 3,
            },
        },
        "required": ["order_id", "items"],
    },
    "date_parts": {
        "type": "object",
        "properties": {
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "month": {"type": "integer", "minimum": 1, "maximum": 12},
            "day": {"type": "integer", "minimum": 1, "maximum": 31},
        },
        "required": ["year", "month", "day"],
    },
    "status": {
        "type": "object",
        "properties": {
            "status": {"enum": ["ok", "warn", "error"]},
            "code": {"type": "integer", "minimum": 0, "maximum": 599},
        },
        "required": ["status", "code"],
    },
    "no_extra": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": _STR},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "probability": {
        "type": "object",
        "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["p"],
    },
    "book": {
        "type": "object",
        "properties": {
            "title": _STR,
            "authors": {"type": "array", "items": _STR, "minItems": 1, "maxItems": 3},
            "year": {"type": "integer", "minimum": 1450, "maximum": 2030},
        },
        "required": ["title", "authors"],
    },
    "key_values": {
        "type": "object",
        "properties": {
            "pairs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"k": _STR, "v": {"type": "integer"}},
                    "required": ["k", "v"],
                },
                "maxItems": 3,
            }
        },
        "required": ["pairs"],
    },
    "nullable": {
        "type": "object",
        "properties": {"middle_name": {"anyOf": [_STR, {"type": "null"}]}},
        "required": ["middle_name"],
    },
    "list_of_numbers": {
        "type": "array",
        "items": {"type": "number", "minimum": -100, "maximum": 100},
        "maxItems": 5,
    },
    "weather": {
        "type": "object",
        "properties": {
            "city": _STR,
            "forecast": {
                "type": "array",
                "items": {"enum": ["sun", "rain", "snow", "cloud"]},
                "minItems": 1,
                "maxItems": 3,
            },
        },
        "required": ["city", "forecast"],
    },
    "user_profile": {
        "type": "object",
        "properties": {
            "username": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,11}$"},
            "email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.(com|org)$"},
            "verified": {"type": "boolean"},
        },
        "required": ["username", "email"],
    },
    "deep_nesting": {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {
                    "b": {"type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"]}
                },
                "required": ["b"],
            }
        },
        "required": ["a"],
    },
    "event": {
        "type": "object",
        "properties": {
            "name": _STR,
            "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
            "attendees": {"type": "integer", "minimum": 0, "maximum": 1000},
        },
        "required": ["name", "time"],
    },
    "product": {
        "type": "object",
        "properties": {
            "name": _STR,
            "price": {"type": "number", "minimum": 0, "maximum": 10000},
            "currency": {"enum": ["USD", "EUR", "GBP"]},
            "in_stock": {"type": "boolean"},
        },
        "required": ["name", "price", "currency"],
    },
    "classification": {
        "type": "object",
        "properties": {
            "label": {"enum": ["positive", "negative", "neutral"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["label", "confidence"],
    },
    "coordinates_list": {
        "type": "object",
        "properties": {
            "points": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "lat": {"type": "number", "minimum": -90, "maximum": 90},
                        "lon": {"type": "number", "minimum": -180, "maximum": 180},
                    },
                    "required": ["lat", "lon"],
                },
                "maxItems": 3,
            }
        },
        "required": ["points"],
    },
    "recipe": {
        "type": "object",
        "properties": {
            "dish": _STR,
            "steps": {"type": "array", "items": _STR, "minItems": 1, "maxItems": 4},
            "minutes": {"type": "integer", "minimum": 1, "maximum": 600},
        },
        "required": ["dish", "steps", "minutes"],
    },
    "any_of_contact": {
        "type": "object",
        "properties": {
            "contact": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"phone": {"type": "string", "pattern": "^[0-9]{7,10}$"}},
                        "required": ["phone"],
                    },
                    {"type": "object", "properties": {"email": _STR}, "required": ["email"]},
                ]
            }
        },
        "required": ["contact"],
    },
    "enum_integers": {
        "type": "object",
        "properties": {"level": {"enum": [1, 2, 3]}, "priority": {"enum": ["low", "high"]}},
        "required": ["level", "priority"],
    },
    "string_lengths": {
        "type": "object",
        "properties": {"code": {"type": "string", "minLength": 3, "maxLength": 5}},
        "required": ["code"],
    },
}


def _strict(schema: Any) -> Any:
    """OpenAI strict-mode shape: every object closed (``additionalProperties: false``). Numbers are
    left as written: the engine bounds what it writes (``xpuspec.structured.constraint.finite_numbers``)."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: _strict(value) for key, value in schema.items()}
    if schema.get("type") == "object":
        schema.setdefault("additionalProperties", False)
    return schema


SCHEMAS = {name: _strict(schema) for name, schema in SCHEMAS.items()}
PROMPT = "Answer with a JSON object that fits this description: {name}."


def run(bundle: str | None, drafter: str, samples: int, max_tokens: int) -> dict[str, Any]:
    import jsonschema

    from xpuspec import Pipeline, SamplingParams

    pipe = Pipeline(bundle, drafter=drafter)
    prompts, params, names = [], [], []
    for name, schema in SCHEMAS.items():
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": True},
        }
        for seed in range(samples):
            prompts.append([{"role": "user", "content": PROMPT.format(name=name.replace("_", " "))}])
            params.append(
                SamplingParams(
                    max_tokens=max_tokens, temperature=1.0, seed=seed, response_format=response_format
                )
            )
            names.append(name)
    grammar = pipe.requests.grammar
    assert grammar is not None
    started = time.perf_counter()
    results = pipe.generate(prompts, params)
    seconds = time.perf_counter() - started
    failures: list[dict[str, str]] = []
    valid = length = 0
    for name, result in zip(names, results, strict=True):
        if result.finish_reason == "length":
            length += 1
            failures.append({"schema": name, "why": "length", "text": result.text[-200:]})
            continue
        try:
            jsonschema.validate(json.loads(result.text), SCHEMAS[name])
            valid += 1
        except Exception as error:  # noqa: BLE001 - any parse or validation failure is reported
            failures.append({"schema": name, "why": str(error)[:200], "text": result.text[:200]})
    num_tokens = sum(len(r.token_ids) for r in results)
    return {
        "drafter": pipe.drafter,
        "schemas": len(SCHEMAS),
        "requests": len(results),
        "valid": valid,
        "length": length,
        "failures": failures[:20],
        "tokens": num_tokens,
        "tokens_per_s": num_tokens / seconds,
        "mask_us_per_mask": 1e6 * grammar.mask_seconds / max(grammar.num_masks, 1),
        "masks_per_token": grammar.num_masks / max(num_tokens, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default=None)
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--json", default=None, help="write the report here too")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    report = run(args.bundle, args.drafter, args.samples, args.max_tokens)
    text = json.dumps(report, indent=2)
    sys.stdout.write(text + "\n")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            handle.write(text)
    return 0 if report["valid"] == report["requests"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
