"""Parsing a request body as JSON with bounds a hostile client cannot push past.

Python's ``json`` recurses once per nesting level (a deep body raises ``RecursionError``) and turns
every integer literal into an ``int`` (5000 digits raise ``ValueError`` from the int-size guard);
``NaN``, ``Infinity`` and ``1e999`` become non-finite floats. Here each of these is a 400 in the
OpenAI error shape, decided before or while parsing: the depth by one vectorised pass over the
body with its strings blanked out, integers and constants by ``json``'s own hooks.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from xpuspec.server.errors import APIError

# Deepest nesting of arrays and objects a body may have. The deepest valid request is a chat message
# with a list of content parts (body > messages > message > content > part): 5.
MAX_JSON_DEPTH = 32
# Most digits of an integer literal: 2**64 has 20, and no field takes a larger number.
MAX_INTEGER_DIGITS = 20

# A JSON string literal (escapes included); brackets inside strings are not nesting.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)


class _RejectedLiteral(ValueError):
    """A literal the bounds refuse, raised from inside ``json.loads``'s hooks."""


def nesting_depth(raw: bytes) -> int:
    """The deepest bracket nesting of ``raw`` outside string literals (malformed input: a best guess)."""
    structure = np.frombuffer(_STRING.sub(b'""', raw), dtype=np.uint8)
    if structure.size == 0:
        return 0
    steps = np.isin(structure, _OPEN).astype(np.int32) - np.isin(structure, _CLOSE).astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


def _parse_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _RejectedLiteral(
            f"an integer has {len(literal.lstrip('-'))} digits; numbers in a request have at most "
            f"{MAX_INTEGER_DIGITS}"
        )
    return int(literal)


def _parse_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _RejectedLiteral(f"the number {literal[:40]} is out of range; only finite numbers are allowed")
    return value


def _parse_constant(name: str) -> float:
    raise _RejectedLiteral(f"{name} is not a JSON number; only finite numbers are allowed")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object, or an APIError 400 with code ``invalid_json``."""
    if not raw.strip():
        raise APIError(400, "the request body is empty; send a JSON object", code="invalid_json")
    depth = nesting_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise APIError(
            400,
            f"the request body nests {depth} levels deep; at most {MAX_JSON_DEPTH} are allowed",
            code="invalid_json",
        )
    try:
        data = json.loads(raw, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except _RejectedLiteral as error:
        raise APIError(400, f"the request body is refused: {error}", code="invalid_json") from None
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise APIError(400, f"the request body is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    return data
