"""Request fields this server does not implement: a 400 naming them, never silently ignored.

Every top-level field of a request is one of three: implemented (a field of the route's request
model), a documented no-op (:data:`OPENAI_NO_OPS`: bookkeeping such as ``user`` or ``store`` that
changes no output), or refused with a 400 that names it. A parameter listed here is accepted at its
neutral value (what the client would get by leaving it out), so a client or SDK that always sends
defaults keeps working; any other value is a 400 with the code ``unsupported_parameter``. A field
nobody listed is a 400 with the code ``unknown_parameter``: a misspelt ``max_token`` or another
server's ``n_predict`` would otherwise change nothing without a word.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from xpuspec.server.errors import APIError


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
    "verbosity": (lambda v: v is None or v == "medium", 'omit it or send "medium"'),
    "moderation": (_absent, "omit it"),
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


# OpenAI fields accepted with any value that change nothing here (docs/server.md lists them): who is
# asking (user, safety_identifier), what OpenAI should keep or bill (metadata, store, service_tier),
# and cache hints (prompt_cache_*: the prefix cache needs none).
OPENAI_NO_OPS = frozenset(
    {
        "user", "metadata", "store", "service_tier", "safety_identifier",
        "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
    }
)  # fmt: skip


def check_known(body: Mapping[str, object], *known: Iterable[str], prefix: str = "") -> None:
    """Raise a 400 ``unknown_parameter`` naming the first field of ``body`` none of ``known`` holds."""
    names = {name for names in known for name in names}
    for name in body:
        if name not in names:
            raise APIError(
                400,
                f"{prefix}{name} is not a parameter this server knows: remove it (see /openapi.json)",
                param=f"{prefix}{name}",
                code="unknown_parameter",
            )
