"""Tool calling on /v1/chat/completions: tools into the prompt, calls out of the model's text.

**Prompt.** A chat template that uses ``tools`` (Qwen, Llama 3.1, Hermes-style templates) renders
them itself. Otherwise the tools go into the system message in the default Hermes format below
(:data:`DEFAULT_TOOL_PROMPT`); earlier calls and tool results in the history are written the same way
(``<tool_call>`` and ``<tool_response>`` blocks), so the model sees one format throughout.

**Formats parsed.** Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, any
number, text around them is the message content. Llama 3: the whole reply is one JSON object
``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``), or several separated
by ``;``.

**tool_choice.** ``none``: no tools in the prompt, nothing parsed. ``auto``: the model chooses.
``required`` / a named function: a grammar forces one or more valid calls (one for a named function)
whose arguments follow the function's parameter schema; after each complete call (and after a
separator) the reply may end. ``parallel_tool_calls: false`` allows one call per reply: the grammar
forces exactly one, and under ``auto`` calls after the first are dropped.

**Responses.** Calls become ``message.tool_calls`` with ``finish_reason: "tool_calls"``; streamed
replies hold back text that may start a call and send each parsed call as one ``tool_calls`` delta
when the choice ends. A reply cut by ``max_tokens`` keeps ``finish_reason: "length"`` and its complete
calls; a call it left unfinished is dropped, never passed on as text. Under ``required`` / named the
reply is calls only: it has no text content.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

from xpuspec.server.errors import APIError
from xpuspec.structured.constraint import close_objects, finite_numbers

# The JSON options of a forced tool call's arguments (response_format uses constraint.JSON_DEFAULTS).
TOOL_CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

logger = logging.getLogger(__name__)

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MAX_FORCED_CALLS = 4  # calls in one reply under tool_choice "required"
DEFAULT_TOOL_PROMPT = (
    "You may call functions to answer. The functions:\n<tools>\n{tools}\n</tools>\n"
    "To call one, reply with a JSON object of its name and arguments within tool_call tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool = False  # OpenAI's function strict mode: its arguments' objects are closed

    def arguments_schema(self) -> dict[str, Any]:
        """The schema a forced call's arguments follow: the parameters, closed in strict mode."""
        schema = self.parameters or {"type": "object"}
        return close_objects(schema) if self.strict else schema

    def openai(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": {**function, "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolRequest:
    """The tools of one request and what ``tool_choice`` asks: mode "auto", "required" or "named"."""

    tools: tuple[Tool, ...]
    mode: str
    named: str | None = None
    llama_format: bool = False  # the template's own format is Llama 3 JSON, not Hermes tags
    parallel: bool = True  # parallel_tool_calls: False allows one call per reply

    @property
    def max_calls(self) -> int | None:
        """Calls kept from one reply (None: all the model wrote)."""
        return None if self.parallel else 1

    def forced_grammar(self) -> str | None:
        """The Lark grammar that forces valid calls (``required`` / named), or None for ``auto``."""
        if self.mode == "auto":
            return None
        tools = [t for t in self.tools if self.named is None or t.name == self.named]
        key = "parameters" if self.llama_format else "arguments"
        schema = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": t.name},
                        key: finite_numbers(t.arguments_schema()),
                    },
                    "required": ["name", key],
                    "additionalProperties": False,
                }
                for t in tools
            ],
            # Fixed separators and no free whitespace: a call is short, so its masks cost little, and
            # a model that would space its JSON freely writes fewer tokens before max_tokens.
            "x-guidance": TOOL_CALL_JSON,
        }
        call = f"%json {json.dumps(schema)}"
        if not self.llama_format:
            call = f"{json.dumps(CALL_OPEN + chr(10))} {call} {json.dumps(chr(10) + CALL_CLOSE)}"
        if self.named is not None or not self.parallel:
            return f"start: call\ncall: {call}\n"
        separator = json.dumps("; " if self.llama_format else "\n")
        # At most MAX_FORCED_CALLS: an unbounded repetition lets a sampled reply call until max_tokens.
        # A separator may also end the reply: one that follows its last call with a newline must not
        # be forced into another call.
        more = ""
        for _ in range(MAX_FORCED_CALLS - 1):
            more = f" ({separator} (call{more})?)?"
        return f"start: call{more}\ncall: {call}\n"

    @property
    def forced(self) -> bool:
        """The reply is forced to be calls (``required`` / named)."""
        return self.mode != "auto"


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def parse_tools(
    raw_tools: Any, tool_choice: Any, template_source: str, parallel_tool_calls: bool | None = None
) -> ToolRequest | None:
    """The request's tools and tool_choice, checked (400s name the field); None when tools are off."""
    if tool_choice is None:
        tool_choice = "auto" if raw_tools else "none"
    if not raw_tools:
        if tool_choice in ("none", "auto"):
            return None
        raise _bad("tool_choice needs tools", "tool_choice")
    if not isinstance(raw_tools, list):
        raise _bad("tools must be a list of function tools", "tools")
    tools = []
    for index, entry in enumerate(raw_tools):
        function = entry.get("function") if isinstance(entry, dict) else None
        if (
            not isinstance(entry, dict)
            or entry.get("type", "function") != "function"
            or not isinstance(function, dict)
        ):
            raise _bad(
                f'tools[{index}] must be {{"type": "function", "function": {{...}}}}', f"tools.{index}"
            )
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"tools[{index}].function.name must be a non-empty string", f"tools.{index}")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise _bad(f"tools[{index}].function.parameters must be a JSON schema object", f"tools.{index}")
        description = function.get("description") or ""
        tools.append(Tool(name, str(description), parameters, strict=function.get("strict") is True))
    if len({t.name for t in tools}) != len(tools):
        raise _bad("tool names must be distinct", "tools")
    named = None
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        named = function.get("name") if isinstance(function, dict) else None
        if tool_choice.get("type") != "function" or not isinstance(named, str):
            raise _bad(
                'a named tool_choice is {"type": "function", "function": {"name": ...}}', "tool_choice"
            )
        if named not in {t.name for t in tools}:
            raise _bad(f"tool_choice names {named!r}, which is not among the tools", "tool_choice")
        mode = "named"
    elif tool_choice in ("auto", "required"):
        mode = tool_choice
    elif tool_choice == "none":
        return None
    else:
        raise _bad('tool_choice is "none", "auto", "required" or a named function', "tool_choice")
    llama_format = PYTHON_TAG in template_source or "ipython" in template_source
    return ToolRequest(tuple(tools), mode, named, llama_format, parallel=parallel_tool_calls is not False)


def template_uses_tools(template_source: str) -> bool:
    return "tools" in template_source


def prompt_messages(messages: list[dict[str, Any]], request: ToolRequest | None, native: bool) -> list[dict]:
    """The messages to render. ``native``: the template renders tools and calls itself.

    Without tools in the request the history goes to the template as it is (calls are dropped by a
    template that does not know them, as before tools were supported).
    """
    if native or request is None:
        return messages
    rendered = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            calls = "\n".join(
                f"{CALL_OPEN}\n"
                + json.dumps(
                    {"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}
                )
                + f"\n{CALL_CLOSE}"
                for c in message.pop("tool_calls")
            )
            message["content"] = (message.get("content") or "") + calls
        if message.get("role") == "tool":
            message = {
                "role": "user",
                "content": f"<tool_response>\n{message.get('content', '')}\n</tool_response>",
            }
        rendered.append(message)
    if request is not None:
        tools = "\n".join(json.dumps(t.openai(), separators=(",", ":")) for t in request.tools)
        prompt = DEFAULT_TOOL_PROMPT.format(tools=tools)
        if rendered and rendered[0].get("role") == "system":
            rendered[0] = {**rendered[0], "content": f"{rendered[0]['content']}\n\n{prompt}"}
        else:
            rendered.insert(0, {"role": "system", "content": prompt})
    return rendered


def _arguments(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


# ------------------------------------------------------------------------ parsing
def parse_calls(
    text: str, cut: bool = False, forced: bool = False
) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a reply: Hermes ``<tool_call>`` blocks or Llama 3 JSON; else (text, []).

    ``cut``: the reply ran out of tokens; a call it left unfinished is dropped (with the start of a
    ``<tool_call>`` tag it ended in), so call markup never becomes content. ``forced``: the reply was
    forced to be calls (required / named): it has no content, only its complete calls.
    """
    content: str | None
    if CALL_OPEN in text or (cut and _open_tag_tail(text)):
        content, calls, changed = _hermes_calls(text, cut)
    else:
        content, calls = _llama_calls(text, cut, forced)
        changed = content is not text
    if forced:
        return None, calls
    if not changed:
        return text, calls
    return (content.strip() or None) if content is not None else None, calls


def _hermes_calls(text: str, cut: bool) -> tuple[str, list[dict[str, Any]], bool]:
    """The text around ``<tool_call>`` blocks, the calls, and whether anything was taken out."""
    calls: list[dict[str, Any]] = []
    parts: list[str] = []
    changed = False
    rest = text
    while CALL_OPEN in rest:
        before, _, after = rest.partition(CALL_OPEN)
        body, closed, rest = after.partition(CALL_CLOSE)
        parts.append(before)
        call = _call_of(body)
        if call is not None:
            calls.append(call)
            changed = True
        elif cut and not closed:
            changed = True  # the call max_tokens cut off: it ends the text
        else:
            parts.append(CALL_OPEN + body + closed)  # not a call after all: keep the text as it was
    tail = _open_tag_tail(rest) if cut else 0
    parts.append(rest[: len(rest) - tail])
    return "".join(parts), calls, changed or tail > 0


def _open_tag_tail(text: str) -> int:
    """The length of the end of ``text`` that starts a ``<tool_call>`` tag (0 if none)."""
    return next(
        (n for n in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1) if CALL_OPEN.startswith(text[-n:])), 0
    )


def _llama_calls(text: str, cut: bool, forced: bool) -> tuple[str | None, list[dict[str, Any]]]:
    """Llama 3 calls: the whole reply one JSON call, or several separated by ``;`` (``text`` itself
    when it is not that)."""
    stripped = text.strip()
    tagged = stripped.startswith(PYTHON_TAG)
    if tagged:
        stripped = stripped[len(PYTHON_TAG) :].strip()
    if not stripped.startswith("{"):
        return text, []
    parts, unparsed = _split_json_objects(stripped)
    calls = [call for call in map(_call_of, parts) if call is not None]
    if len(calls) < len(parts):
        return text, []
    # A trailing object cut by max_tokens is the unfinished call of a reply that is calls: dropped.
    if unparsed and not (cut and (calls or tagged or forced)):
        return text, []
    return None, calls


def _split_json_objects(text: str) -> tuple[list[str], str]:
    """The JSON values at the start of ``text`` (separated by ``;`` or whitespace), and what follows
    them that does not parse ("" when all of it did)."""
    decoder = json.JSONDecoder()
    parts: list[str] = []
    index = 0
    while index < len(text):
        try:
            _, end = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            return parts, text[index:]
        parts.append(text[index:end])
        index = end
        while index < len(text) and text[index] in " ;\n\t":
            index += 1
    return parts, ""


def _call_of(body: str) -> dict[str, Any] | None:
    try:
        value = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments_text = arguments
    else:
        arguments_text = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": value["name"], "arguments": arguments_text},
    }


# ---------------------------------------------------------------------- responses
def rewrite_body(body: dict[str, Any], max_calls: int | None = None, forced: bool = False) -> dict[str, Any]:
    """A non-streamed chat completion with the calls of each choice parsed into ``tool_calls``
    (the first ``max_calls`` of them); ``forced``: the replies were forced to be calls."""
    for choice in body.get("choices", []):
        message = choice.get("message", {})
        text = message.get("content") or ""
        content, calls = parse_calls(text, cut=choice.get("finish_reason") == "length", forced=forced)
        calls = calls[:max_calls]
        if content is not text:
            message["content"] = content
        if calls:
            message["tool_calls"] = calls
            if choice.get("finish_reason") == "stop":
                choice["finish_reason"] = "tool_calls"
    return body


class _ChoiceStream:
    """One streamed choice: text is passed on unless it may be (part of) a call."""

    def __init__(self, forced: bool) -> None:
        self.text = ""  # everything the model wrote
        self.sent = 0  # how much of it went out as content
        self.holding = forced  # a call may have started: hold everything until the end

    def feed(self, delta: str) -> str:
        self.text += delta
        if not self.holding:
            stripped = self.text.lstrip()
            if CALL_OPEN in self.text[self.sent :] or stripped.startswith(("{", PYTHON_TAG[:1])):
                self.holding = True
        if self.holding:
            return ""
        # Keep back a tail that could be the start of "<tool_call>".
        out = self.text[self.sent : len(self.text) - _open_tag_tail(self.text)]
        self.sent += len(out)
        return out

    def unsent(self, content: str | None) -> str:
        """What of the reply's final ``content`` has not gone out yet."""
        if content is None:
            return ""
        if content is self.text:
            return self.text[self.sent :]
        already = self.text[: self.sent].strip()
        return content[len(already) :] if content.startswith(already) else ""


def rewrite_stream(
    writes: Iterator[str], max_calls: int | None = None, forced: bool = False
) -> Generator[str, None, None]:
    """SSE frames of a chat completion with calls sent as ``tool_calls`` deltas (see module doc).

    Each item of ``writes`` may hold several SSE events (the stream coalesces one engine step's
    frames into one write); they are rewritten one by one and written out together again.
    """
    choices: dict[int, _ChoiceStream] = {}
    for write in writes:
        out: list[str] = []
        for event in write.split("\n\n"):
            if event:
                out.extend(_rewrite_frame(event + "\n\n", choices, max_calls, forced))
        if out:
            yield "".join(out)


def _rewrite_frame(
    frame: str, choices: dict[int, _ChoiceStream], max_calls: int | None, forced: bool
) -> list[str]:
    """One SSE event, rewritten into the events that replace it."""
    if not frame.startswith("data: {"):
        return [frame]
    payload = json.loads(frame[len("data: ") :])
    if not payload.get("choices"):
        return [frame]
    choice = payload["choices"][0]
    state = choices.get(choice["index"])
    if state is None:
        state = choices[choice["index"]] = _ChoiceStream(forced)
    delta = choice.get("delta", {})
    finish = choice.get("finish_reason")
    if delta.get("content"):
        delta["content"] = state.feed(delta["content"])
        if not delta["content"] and finish is None and "role" not in delta:
            return []
    if finish is None:
        return [_frame(payload)]
    out = []
    content, calls = parse_calls(state.text, cut=finish == "length", forced=forced)
    calls = calls[:max_calls]
    leftover = state.unsent(content)
    state.sent = len(state.text)
    if leftover:
        out.append(_frame(_with_choice(payload, {"index": choice["index"], "delta": {"content": leftover}})))
    for number, call in enumerate(calls):
        tool_delta = {"tool_calls": [{"index": number, **call}]}
        out.append(_frame(_with_choice(payload, {"index": choice["index"], "delta": tool_delta})))
    if calls and finish == "stop":
        finish = "tool_calls"
    choice["delta"] = {}
    choice["finish_reason"] = finish
    out.append(_frame(payload))
    return out


def _with_choice(payload: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "choices": [{**choice, "logprobs": None, "finish_reason": None}]}


def _frame(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
