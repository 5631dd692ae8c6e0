"""OpenAI request parameters this server does not implement: a 400 naming them, never silently ignored.

Each parameter is accepted at its neutral value (what the client would get by leaving it out), so a
client or SDK that always sends defaults keeps working; any other value is a 400 with the code
``unsupported_parameter``. Fields that are neither implemented nor listed here are ignored, as
OpenAI-compatible servers commonly do (clients add new optional fields often); the server logs
them at debug level.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from xpuspec.server.errors import APIError

logger = logging.getLogger(__name__)


def _absent(value: object) -> bool:
    """null, false, 0, "" or an empty list/object: what leaving the parameter out means."""
    return value is None or value is False or value == 0 or value in ("", [], {})


def _one(value: object) -> bool:
    return value is None or (type(value) is int and value == 1)


def _zero(value: object) -> bool:
    return value is None or (type(value) in (int, float) and value == 0)


def _no_tool_choice(value: object) -> bool:
    # "auto" and "none" mean "no tool call" when no tools are given (tools themselves are refused).
    return value is None or value in ("none", "auto")


def _text_only(value: object) -> bool:
    return value is None or value == ["text"]


# parameter -> (is it at its neutral value?, what the client may send instead)
Check = tuple[Callable[[object], bool], str]

SHARED: dict[str, Check] = {
    "logit_bias": (_absent, "omit it or send {}"),
    "repetition_penalty": (lambda v: v is None or v == 1, "send repeat_penalty (llama.cpp's) instead"),
    "guided_json": (_absent, "omit it"),
    "guided_choice": (_absent, "omit it"),
}

COMPLETION: dict[str, Check] = {
    **SHARED,
    "best_of": (_one, "omit it or send 1"),
    "suffix": (_absent, "omit it"),
    "echo": (lambda v: v is None or v is False, "omit it or send false"),
    "logprobs": (lambda v: v is None, "omit it"),
}

CHAT: dict[str, Check] = {
    **SHARED,
    "logprobs": (lambda v: v is None or v is False, "omit it or send false"),
    "top_logprobs": (_zero, "omit it"),
    "functions": (_absent, "omit it"),
    "function_call": (_no_tool_choice, "omit it"),
    "modalities": (_text_only, 'omit it or send ["text"]'),
    "audio": (_absent, "omit it"),
    "prediction": (_absent, "omit it"),
    "web_search_options": (_absent, "omit it"),
    "reasoning_effort": (lambda v: v is None, "omit it"),
}


def check_supported(body: Mapping[str, object], checks: Mapping[str, Check]) -> None:
    """Raise a 400 ``unsupported_parameter`` for the first parameter sent with a value not implemented."""
    for name, (neutral, instead) in checks.items():
        if name in body and not neutral(body[name]):
            raise APIError(
                400,
                f"{name} is not supported by this server: {instead}",
                param=name,
                code="unsupported_parameter",
            )


def log_unknown(body: Mapping[str, object], known: set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        logger.debug("ignoring unknown request fields: %s", ", ".join(unknown[:20]))
