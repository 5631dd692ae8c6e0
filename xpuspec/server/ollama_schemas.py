"""Request and response bodies of the Ollama-compatible endpoints (``/api/*``), validated with pydantic.

Requests are validated as strictly as the OpenAI ones (``schemas.REQUEST_CONFIG``), then translated
into the OpenAI request models by ``ollama_requests.py``; the engine never sees an Ollama body.
Fields Ollama has that xpuspec cannot honour are refused when set to anything but their neutral value
(``ollama_requests.SHARED``, ``GENERATE``, ``OPTIONS``), as the OpenAI routes do; a field or option
that is neither implemented nor a documented no-op (``OPTION_NO_OPS``) is refused by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from xpuspec.sample.dry import MAX_DRY_BASE
from xpuspec.sample.sampling_params import MAX_DRAFT_TOKENS, MAX_SEQUENCE_BREAKERS
from xpuspec.server.schemas import (
    MAX_REPEAT_PENALTY,
    MAX_STOP_STRINGS,
    REQUEST_CONFIG,
    SEED_LIMIT,
    SequenceBreaker,
    ToolSpec,
)

# num_predict values that mean "no limit but the context" in Ollama (-1: infinite, -2: fill the context).
UNLIMITED_PREDICT = (-1, -2)

NonEmptyString = Annotated[str, Field(min_length=1)]


class OllamaOptions(BaseModel):
    """The runtime options xpuspec implements; load-time ones (num_gpu, num_thread, ...) are no-ops."""

    model_config = REQUEST_CONFIG

    num_predict: int | None = Field(
        None,
        ge=-2,
        description="tokens to generate at most (absent: the default reply cap); -1 or -2: until the context "
        "is full",
    )
    # Sampling: each left out takes the model's default, as on /v1/* (xpuspec.sample.defaults).
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="0 is greedy")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, description="0: no cut")
    min_p: float | None = Field(None, ge=0.0, le=1.0, description="0: no cut")
    repeat_penalty: float | None = Field(None, gt=0.0, le=MAX_REPEAT_PENALTY, description="1: off")
    repeat_last_n: int | None = Field(None, ge=-1, description="-1: the whole sequence; 0: off")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    # llama.cpp's DRY (Ollama has none): its llama-server names, as on /v1/*.
    dry_multiplier: float | None = Field(None, ge=0.0, description="llama.cpp's DRY; 0: off")
    dry_base: float | None = Field(None, ge=1.0, le=MAX_DRY_BASE)
    dry_allowed_length: int | None = Field(None, ge=1)
    dry_penalty_last_n: int | None = Field(None, ge=-1, description="-1: the whole sequence; 0: off")
    dry_sequence_breakers: list[SequenceBreaker] | None = Field(None, max_length=MAX_SEQUENCE_BREAKERS)
    dry_include_prompt: bool | None = Field(None, description="xpuspec: false, DRY over the reply alone")
    seed: int | None = Field(None, lt=SEED_LIMIT, description="a negative seed (Ollama's -1) means random")
    stop: list[NonEmptyString] | None = Field(
        None, max_length=MAX_STOP_STRINGS, description=f"up to {MAX_STOP_STRINGS} stop strings"
    )
    num_ctx: int | None = Field(
        None, ge=1, description="the context for this request; more than the model's is a 400"
    )
    # xpuspec extensions, as on /v1/*
    num_draft_tokens: int | None = Field(
        None, ge=0, le=MAX_DRAFT_TOKENS, description="xpuspec: fixed speculation length (default adaptive)"
    )
    drafter: str | None = Field(None, description="xpuspec: 'none' runs the target alone; or 'auto'")

    @field_validator("num_predict")
    @classmethod
    def _check_num_predict(cls, num_predict: int | None) -> int | None:
        if num_predict == 0:
            raise ValueError("num_predict must be at least 1, or -1 / -2 for no limit but the context")
        return num_predict


class OllamaFunctionCall(BaseModel):
    model_config = REQUEST_CONFIG

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class OllamaToolCall(BaseModel):
    """A call an assistant made earlier in the conversation: Ollama gives arguments as an object."""

    model_config = REQUEST_CONFIG

    id: str | None = None
    function: OllamaFunctionCall


class OllamaMessage(BaseModel):
    model_config = REQUEST_CONFIG

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: list[str] | None = Field(None, description="not supported: must be empty")
    thinking: str | None = Field(None, description="ignored: earlier thinking is not sent to the model")
    tool_calls: list[OllamaToolCall] | None = Field(
        None, description="assistant messages: calls made earlier"
    )
    tool_name: str | None = Field(None, description="tool messages: the tool whose result this is")


class OllamaGenerationFields(BaseModel):
    """Fields /api/chat and /api/generate share."""

    model_config = REQUEST_CONFIG

    model: str = Field(description="the served model name or an alias, optionally with ':latest'")
    stream: bool | None = Field(True, description="false: one JSON object; default: NDJSON lines")
    format: Literal["", "json"] | dict[str, Any] | None = Field(
        None, description='"json" or a JSON Schema: the output is constrained to parse'
    )
    options: OllamaOptions | None = None
    keep_alive: float | int | str | None = Field(
        None, description="accepted and ignored: the model stays loaded for the server's lifetime"
    )


class OllamaChatRequest(OllamaGenerationFields):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[ToolSpec] | None = Field(None, description='function tools: {"type": "function", ...}')


class OllamaGenerateRequest(OllamaGenerationFields):
    prompt: str | None = ""
    system: str | None = Field(None, description="a system message before the prompt")
    raw: bool | None = Field(False, description="true: the prompt as it is, without the chat template")


class OllamaShowRequest(BaseModel):
    model_config = REQUEST_CONFIG

    model: str | None = None
    name: str | None = Field(None, description="older clients' name for model")
    verbose: bool | None = None


# ------------------------------------------------------------------ responses (for the OpenAPI document)
class OllamaResponseFunction(BaseModel):
    index: int
    name: str
    arguments: dict[str, Any]


class OllamaResponseToolCall(BaseModel):
    id: str
    function: OllamaResponseFunction


class OllamaResponseMessage(BaseModel):
    role: Literal["assistant"]
    content: str
    tool_calls: list[OllamaResponseToolCall] | None = None


class OllamaCounters(BaseModel):
    """The final object's fields; durations in nanoseconds."""

    model: str
    created_at: str
    done: bool
    done_reason: Literal["stop", "length", "abort"] | None = None
    total_duration: int | None = Field(None, description="from the request's arrival to its last token")
    load_duration: int | None = Field(
        None, description="before the engine took the request (parsing, templating); the model loads once"
    )
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = Field(None, description="arrival at the engine to the first token")
    eval_count: int | None = None
    eval_duration: int | None = Field(None, description="first to last token")


class OllamaChatResponse(OllamaCounters):
    message: OllamaResponseMessage


class OllamaGenerateResponse(OllamaCounters):
    response: str


class OllamaModelDetails(BaseModel):
    parent_model: str
    format: str
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str


class OllamaModel(BaseModel):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: OllamaModelDetails


class OllamaRunningModel(OllamaModel):
    expires_at: str
    size_vram: int
    context_length: int


class OllamaModelList(BaseModel):
    models: list[OllamaModel]


class OllamaRunningList(BaseModel):
    models: list[OllamaRunningModel]


class OllamaShowResponse(BaseModel):
    modified_at: str
    template: str
    parameters: str
    license: str
    details: OllamaModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]


class OllamaVersion(BaseModel):
    version: str


class OllamaError(BaseModel):
    error: str
