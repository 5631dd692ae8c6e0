"""Request and response bodies of the API, validated with pydantic at the HTTP boundary only.

Requests are validated strictly (``"5"`` is not a number, ``1`` is not a bool) so a wrong type is a
400, not a silent coercion; numbers must be finite. OpenAI parameters the server does not implement
and top-level fields nobody knows are refused before these models see the body (``unsupported.py``);
keys these models do not read inside nested objects (messages, tools) are ignored, so a reply's
message can be sent back as the client holds it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from xpuspec.sample.draft_tree import parse_draft_tree
from xpuspec.sample.dry import MAX_DRY_BASE
from xpuspec.sample.sampling_params import MAX_BREAKER_LENGTH, MAX_DRAFT_TOKENS, MAX_SEQUENCE_BREAKERS
from xpuspec.structured.gbnf import is_gbnf

MAX_STOP_STRINGS = 16
MAX_CHOICES = 16
# Seeds are 64-bit: the engine's generator takes [0, 2**64).
SEED_LIMIT = 2**64
# Below this a temperature is not 0 but divides logits into overflow (1/1e-320 is inf): refused.
MIN_TEMPERATURE = 1e-4
# A penalty dividing logits by more than this leaves nothing a sampler could tell apart.
MAX_REPEAT_PENALTY = 100.0

NonEmptyString = Annotated[str, Field(min_length=1)]
SequenceBreaker = Annotated[str, Field(min_length=1, max_length=MAX_BREAKER_LENGTH)]
TokenId = Annotated[int, Field(ge=0)]


def _check_encodable(text: str, what: str) -> str:
    # JSON may carry lone surrogates ("\ud800"); the tokenizer needs valid UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{what} is not valid Unicode text (lone surrogate at {error.start})") from None
    return text


# Every request model: strict types, finite numbers; unknown top-level fields are refused earlier.
REQUEST_CONFIG = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = REQUEST_CONFIG

    include_usage: bool = False
    include_speculation: bool = Field(
        False,
        description="xpuspec: each chunk carries an `xpuspec` field saying which of its tokens were "
        "accepted drafts, and each choice's finishing chunk the request's speculation figures",
    )


class JsonSchemaFormat(BaseModel):
    model_config = REQUEST_CONFIG

    name: str = ""
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text, json_object, or json_schema with its schema."""

    model_config = REQUEST_CONFIG

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class FunctionSpec(BaseModel):
    model_config = REQUEST_CONFIG

    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(BaseModel):
    model_config = REQUEST_CONFIG

    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedFunction(BaseModel):
    model_config = REQUEST_CONFIG

    name: str


class NamedToolChoice(BaseModel):
    model_config = REQUEST_CONFIG

    type: Literal["function"]
    function: NamedFunction


class GenerationFields(BaseModel):
    """Fields both endpoints share; ``model`` is compared with the served name, never used as a path."""

    model_config = REQUEST_CONFIG

    model: str = Field(description="the served model name or one of its aliases (GET /v1/models)")
    temperature: float | None = Field(
        None,
        ge=0.0,
        le=2.0,
        description=f"0 is greedy; otherwise at least {MIN_TEMPERATURE} "
        "(default: the model's, GET /v1/xpuspec/defaults)",
    )
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="default: the model's")
    presence_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="minus this from the logit of every token the output holds"
    )
    frequency_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="minus this times the count of each token in the output"
    )
    seed: int | None = Field(
        None,
        ge=0,
        lt=SEED_LIMIT,
        description="in [0, 2**64): makes sampling repeatable; choice i uses (seed + i) mod 2**64",
    )
    stop: NonEmptyString | list[NonEmptyString] | None = Field(None, description="up to 16 stop strings")
    n: int | None = Field(1, ge=1, le=MAX_CHOICES, description="number of choices")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # xpuspec extensions
    top_k: int | None = Field(
        None, ge=0, description="keep the k most likely tokens (0: all; default: the model's)"
    )
    min_p: float | None = Field(
        None, ge=0.0, le=1.0, description="keep tokens at least min_p times as likely as the most likely"
    )
    repeat_penalty: float | None = Field(
        None, gt=0.0, le=MAX_REPEAT_PENALTY, description="llama.cpp's repetition penalty (1: off)"
    )
    repeat_last_n: int | None = Field(
        None, ge=-1, description="tokens repeat_penalty looks back over (-1: all, 0: off; default 64)"
    )
    dry_multiplier: float | None = Field(
        None,
        ge=0.0,
        description="llama.cpp's DRY: a token extending a repeat of n tokens loses "
        "dry_multiplier * dry_base ** (n - dry_allowed_length) (0: off; default: the model's)",
    )
    dry_base: float | None = Field(None, ge=1.0, le=MAX_DRY_BASE, description="DRY's base (default 1.75)")
    dry_allowed_length: int | None = Field(
        None, ge=1, description="the longest repeat DRY lets pass free (default 2)"
    )
    dry_penalty_last_n: int | None = Field(
        None, ge=-1, description="tokens DRY looks back over (-1: all, the default; 0: off)"
    )
    dry_sequence_breakers: list[SequenceBreaker] | None = Field(
        None,
        max_length=MAX_SEQUENCE_BREAKERS,
        description='tokens holding one of these end a repeat (default ["\\n", ":", "\\"", "*"])',
    )
    dry_include_prompt: bool | None = Field(
        None, description="xpuspec: false, DRY looks back over the reply alone (default: the model's)"
    )
    num_draft_tokens: int | None = Field(
        None, ge=0, le=MAX_DRAFT_TOKENS, description="xpuspec: fixed speculation length (default adaptive)"
    )
    drafter: str | None = Field(
        None,
        description="xpuspec: 'none' runs the target alone; otherwise only the server's own drafter "
        "('draft', 'ngram' or 'eagle3', as `xpuspec serve --drafter` chose) or 'auto'",
    )
    ignore_eos: bool | None = Field(False, description="xpuspec: keep generating past end-of-sequence")
    response_format: ResponseFormat | None = Field(
        None,
        description='{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": '
        '{"name": ..., "schema": {...}, "strict": true}}: the output is constrained to parse',
    )
    guided_regex: str | None = Field(
        None, min_length=1, description="xpuspec: constrain the output to this regex"
    )
    guided_grammar: str | None = Field(
        None,
        min_length=1,
        description="xpuspec: constrain the output to this grammar, Lark or llama.cpp's GBNF "
        "(told apart by its `name ::= ...` rules)",
    )
    grammar: str | None = Field(
        None, min_length=1, description="llama.cpp: constrain the output to this GBNF grammar"
    )
    draft_tree: str | dict[str, int] | None = Field(
        None,
        description='xpuspec: tree speculation, "auto" or {"depth": d, "width": w, "nodes": n} '
        "(default: chains)",
    )

    @field_validator("draft_tree")
    @classmethod
    def _check_draft_tree(cls, draft_tree: str | dict[str, int] | None) -> str | dict[str, int] | None:
        parse_draft_tree(draft_tree)  # raises ValueError naming what is wrong
        return draft_tree

    @field_validator("temperature")
    @classmethod
    def _check_temperature(cls, temperature: float | None) -> float | None:
        if temperature is not None and 0.0 < temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}")
        return temperature

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        for text in stops:
            _check_encodable(text, "a stop string")
        return stop

    @field_validator("grammar")
    @classmethod
    def _check_grammar(cls, grammar: str | None) -> str | None:
        if grammar is not None and not is_gbnf(grammar):
            raise ValueError(
                "a GBNF grammar defines rules `name ::= ...`, starting at root; Lark goes in guided_grammar"
            )
        return grammar

    @model_validator(mode="after")
    def _one_grammar(self) -> GenerationFields:
        if self.grammar is None:
            return self
        named = (("guided_grammar", self.guided_grammar), ("guided_regex", self.guided_regex))
        others = [name for name, value in named if value is not None]
        if self.response_format is not None and self.response_format.type != "text":
            others.append("response_format")
        if others:
            raise ValueError(f"name at most one output constraint, got grammar and {others[0]}")
        return self

    @property
    def grammar_text(self) -> str | None:
        """The request's grammar: llama.cpp's ``grammar`` (GBNF) or ``guided_grammar`` (Lark or GBNF)."""
        return self.grammar if self.grammar is not None else self.guided_grammar

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(GenerationFields):
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    ) = Field(description="text, a list of texts, token ids, or a list of token-id lists")
    max_tokens: int | None = Field(16, ge=1, description="tokens to generate per choice")
    echo: bool | None = Field(False, description="not supported: must be false")
    logprobs: int | None = Field(None, description="not supported: must be null")

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, prompt: Any) -> Any:
        texts = [prompt] if isinstance(prompt, str) else prompt
        for text in texts:
            if isinstance(text, str):
                _check_encodable(text, "the prompt")
        return prompt


class TextPart(BaseModel):
    model_config = REQUEST_CONFIG

    type: Literal["text"]
    text: str


class ToolCallFunction(BaseModel):
    model_config = REQUEST_CONFIG

    name: str
    arguments: str


class ToolCall(BaseModel):
    """A tool call an assistant made earlier in the conversation (history only: tools are not run)."""

    model_config = REQUEST_CONFIG

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = REQUEST_CONFIG

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(
        None, description="null or left out only in an assistant message with tool_calls"
    )
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="assistant messages: calls made earlier")
    tool_call_id: str | None = Field(None, description="tool messages: the call this answers")

    @field_validator("content")
    @classmethod
    def _check_content(cls, content: str | list[TextPart] | None) -> str | list[TextPart] | None:
        if content is not None:
            text = content if isinstance(content, str) else "".join(p.text for p in content)
            _check_encodable(text, "content")
        return content

    @model_validator(mode="after")
    def _content_or_tool_calls(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content may be null or left out only in an assistant message with tool_calls")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def template_message(self) -> dict[str, Any]:
        """The message as chat templates take it: content a string; tool fields kept when present."""
        message: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class ChatCompletionRequest(GenerationFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1, description="deprecated name of max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=1, description="default: the rest of the context")
    logprobs: bool | None = Field(False, description="not supported: must be false")
    tools: list[ToolSpec] | None = Field(None, description='function tools: {"type": "function", ...}')
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description='"none", "auto" (default with tools), "required" or {"type": "function", ...}'
    )
    parallel_tool_calls: bool | None = Field(None, description="false: at most one tool call per reply")


# ------------------------------------------------------------------ responses (for the OpenAPI document)
class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="prompt tokens whose KV came from the prefix cache")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length", "abort", "error"] | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length", "abort", "error"] | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class EngineState(BaseModel):
    ready: bool
    draining: bool
    kv_blocks_used: int
    kv_blocks_total: int
    num_running: int
    num_waiting: int
    num_in_flight: int
    engine_failures: int
    requests_failed: int


def first_error(error: ValidationError) -> tuple[str, str | None]:
    """The message and dotted parameter path of pydantic's most specific complaint.

    A union reports one error per member; the deepest location says best what was wrong
    (``stop: [""]`` is "too short at stop.0", not "not a string"), and among equally deep ones a
    broken constraint says more than a type mismatch of another member.
    """
    details = error.errors(include_url=False)
    detail = max(details, key=lambda d: (len(d["loc"]), not d["type"].endswith("_type")))
    # Union members add their type names to the location; keep only the request's own keys.
    location = [str(part) for part in detail["loc"] if isinstance(part, int) or not _is_type_tag(part)]
    param = ".".join(location) or None
    message = detail["msg"]
    if param:
        message = f"{param}: {message}"
    return message, param


def _is_type_tag(part: object) -> bool:
    text = str(part)
    return (
        "[" in text
        or text in ("str", "int", "float", "bool", "list", "dict", "none", "TextPart")
        or text.startswith(("function-", "constrained-", "literal["))
    )
