"""Parsing a request body as JSON with bounds a hostile client cannot push past.

Python's ``json`` recurses once per nesting level (a deep body raises ``RecursionError``) and turns
every integer literal into an ``int`` (5000 digits raise ``ValueError`` from the int-size guard);
``NaN``, ``Infinity`` and ``1e999`` become non-finite floats. Here each of these is a 400 in the
OpenAI error shape, decided before or while parsing: the depth by one vectorised pass over the
body (brackets inside strings do not count), integers and constants by ``json``'s own hooks.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from xpuspec.server.errors import APIError

# Deepest nesting of arrays and objects a body may have. The deepest valid request is a chat message
# with a list of content parts (body > messages > message > content > part): 5.
MAX_JSON_DEPTH = 32
# Most digits of an integer literal: 2**64 has 20, and no field takes a larger number.
MAX_INTEGER_DIGITS = 20

JSON_MEDIA_TYPE = "application/json"
# What `curl -d` sends unless told otherwise, as Ollama's own documentation's examples do.
CURL_FORM_MEDIA_TYPE = "application/x-www-form-urlencoded"

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN_ARRAY, _OPEN_OBJECT, _CLOSE_ARRAY, _CLOSE_OBJECT = b"[{]}"


class _RejectedLiteral(ValueError):
    """A literal the bounds refuse, raised from inside ``json.loads``'s hooks."""


def nesting_depth(raw: bytes) -> int:
    """The deepest bracket nesting of ``raw`` outside string literals (malformed input: a best guess).

    Vectorised, a few ms per MB: a quote ends or starts a string unless an odd run of backslashes
    precedes it, and a bracket counts only where an even number of such quotes precede it.
    """
    data = np.frombuffer(raw, dtype=np.uint8)
    brackets = np.flatnonzero(
        (data == _OPEN_ARRAY) | (data == _OPEN_OBJECT) | (data == _CLOSE_ARRAY) | (data == _CLOSE_OBJECT)
    )
    if brackets.size == 0:
        return 0
    quotes = np.flatnonzero(data == _QUOTE)
    backslashes = np.flatnonzero(data == _BACKSLASH)
    if backslashes.size and quotes.size:
        # Length of the backslash run just before each quote: a quote after an odd run is escaped.
        run_starts = backslashes[np.concatenate(([True], np.diff(backslashes) > 1))]
        after_backslash = (quotes > 0) & (data[np.maximum(quotes - 1, 0)] == _BACKSLASH)
        starts = run_starts[np.searchsorted(run_starts, quotes - 1, side="right") - 1]
        run = np.where(after_backslash, quotes - starts, 0)
        quotes = quotes[run % 2 == 0]
    # A bracket is outside strings when an even number of real quotes precede it.
    outside = np.searchsorted(quotes, brackets) % 2 == 0
    kinds = data[brackets[outside]]
    steps = np.where((kinds == _OPEN_ARRAY) | (kinds == _OPEN_OBJECT), 1, -1)
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


def require_json_content_type(content_type: str | None, *, curl_form_allowed: bool = False) -> None:
    """A 415 unless ``content_type`` is JSON (``application/json`` or ``*/*+json``).

    A browser page may post ``text/plain`` or a form across origins without asking first (a CORS
    preflight); a JSON body makes it ask, and the server says no. ``curl_form_allowed``: a request
    that is not from a page (no ``Origin``) may also send no type or ``curl -d``'s form type.
    """
    media_type = (content_type or "").split(";")[0].strip().lower()
    if media_type == JSON_MEDIA_TYPE or (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        return
    if curl_form_allowed and media_type in ("", CURL_FORM_MEDIA_TYPE):
        return
    raise APIError(
        415,
        f"the request body must be sent as Content-Type: {JSON_MEDIA_TYPE}, got {content_type or 'none'}",
        code="unsupported_media_type",
    )


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object, or an APIError 400 with code ``invalid_json``."""
    if not raw.strip():
        raise APIError(400, "the request body is empty; send a JSON object", code="invalid_json")
    # Fewer opening brackets than the limit cannot nest beyond it: most bodies skip the scan.
    opening = raw.count(b"[") + raw.count(b"{")
    depth = nesting_depth(raw) if opening > MAX_JSON_DEPTH else 0
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
