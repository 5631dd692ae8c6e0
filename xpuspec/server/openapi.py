"""The OpenAPI 3.1 document of the API, with request and response schemas generated from pydantic."""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from xpuspec.server import ollama_openapi
from xpuspec.server.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    EngineState,
    ErrorResponse,
    ModelCard,
    ModelList,
)

REF = "#/components/schemas/{model}"

# The opt-in `xpuspec` field of streamed chunks (stream_options.include_speculation; provenance.py).
SPECULATION_CHUNK_FIELD: dict[str, Any] = {
    "type": "object",
    "description": "xpuspec, only with stream_options.include_speculation: the chunk's text cut into runs "
    "(their texts concatenate to the chunk's text); accepted_draft true: the run's tokens were drafts the "
    "target accepted, false: tokens the target chose itself. A choice's finishing chunk adds speculation: "
    "drafted and accepted (the engine's verification counts), accepted_tokens (the output tokens that were "
    "accepted drafts: the tokens of the accepted_draft runs), target_passes, tokens_per_target_pass, "
    "verification_steps, output_tokens, ttft_s, tokens_per_s, drafter and gamma_policy.",
    "properties": {
        "runs": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "tokens": {"type": "integer"},
                    "accepted_draft": {"type": "boolean"},
                },
                "required": ["text", "tokens", "accepted_draft"],
            },
        },
        "speculation": {"type": "object"},
    },
    "required": ["runs"],
}
DEFAULTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "what a request gets for a parameter it leaves out, and the drafters it may name "
    "(the chat page at / starts from these)",
    "properties": {
        "model": {"type": "string"},
        "ready": {"type": "boolean"},
        "temperature": {"type": ["number", "null"], "description": "null until the model is loaded"},
        "top_p": {"type": ["number", "null"]},
        "top_k": {"type": ["integer", "null"]},
        "min_p": {"type": ["number", "null"]},
        "repeat_penalty": {"type": ["number", "null"]},
        "repeat_last_n": {"type": ["integer", "null"]},
        "presence_penalty": {"type": ["number", "null"]},
        "frequency_penalty": {"type": ["number", "null"]},
        "dry_multiplier": {"type": ["number", "null"]},
        "dry_base": {"type": ["number", "null"]},
        "dry_allowed_length": {"type": ["integer", "null"]},
        "dry_penalty_last_n": {"type": ["integer", "null"]},
        "dry_sequence_breakers": {"type": ["array", "null"], "items": {"type": "string"}},
        "dry_include_prompt": {"type": ["boolean", "null"]},
        "seed": {"type": ["integer", "null"]},
        "max_tokens": {
            "type": ["integer", "null"],
            "description": "the reply cap of requests that name none",
        },
        "sources": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "where each default comes from: the model's generation config, llama.cpp, xpuspec",
        },
        "max_model_len": {"type": ["integer", "null"]},
        "drafter": {"type": ["string", "null"]},
        "drafters": {"type": "array", "items": {"type": "string"}},
        "draft_tree": {"type": ["string", "object", "null"]},
        "num_draft_tokens": {"type": ["integer", "null"], "description": "null: adaptive γ"},
    },
}


@lru_cache(maxsize=1)
def _component_schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    request_models: list[type[BaseModel]] = [
        CompletionRequest,
        ChatCompletionRequest,
        *ollama_openapi.REQUEST_MODELS,
    ]
    response_models: list[type[BaseModel]] = [
        CompletionResponse,
        ChatCompletionResponse,
        ModelList,
        ModelCard,
        ErrorResponse,
        EngineState,
        *ollama_openapi.RESPONSE_MODELS,
    ]
    keys, definitions = models_json_schema(
        [(model, "validation") for model in request_models]
        + [(model, "serialization") for model in response_models],
        ref_template=REF,
    )
    refs = {model.__name__: schema for (model, _mode), schema in keys.items()}
    return refs, definitions.get("$defs", {})


def _json(ref: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": ref}}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": _json({"$ref": REF.format(model="ErrorResponse")})}


def _generation_operation(
    summary: str, request_ref: dict[str, Any], response_ref: dict[str, Any]
) -> dict[str, Any]:
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(request_ref)},
        "responses": {
            "200": {
                "description": "the completion; with stream=true, SSE chunks ending in `data: [DONE]`; "
                "with stream_options.include_speculation each chunk also carries `xpuspec` "
                "(components/schemas/SpeculationChunkField)",
                "content": {**_json(response_ref), "text/event-stream": {"schema": {"type": "string"}}},
            },
            "400": _error("malformed JSON, wrong types, values out of range, prompt beyond the context"),
            "401": _error("missing or invalid API key"),
            "404": _error("unknown model"),
            "413": _error("request body too large"),
            "503": _error("loading, shutting down, or too many requests in flight (see Retry-After)"),
        },
    }


def _with_served_model(definitions: dict[str, Any], served_model_name: str) -> dict[str, Any]:
    """Copies of the schemas whose ``model`` field names the one value this server accepts."""
    schemas = copy.deepcopy(definitions)
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        schemas[name]["properties"]["model"]["enum"] = [served_model_name]
    return schemas


def _chat_page_paths() -> dict[str, Any]:
    """The chat page and the defaults it starts from (xpuspec.server.chat_page)."""
    return {
        "/v1/xpuspec/defaults": {
            "get": {
                "summary": "Request defaults and drafters (what the chat page starts from)",
                "responses": {"200": {"description": "defaults", "content": _json(DEFAULTS_SCHEMA)}},
            }
        },
        "/": {
            "get": {
                "summary": "The chat page (no authentication; its API calls need the key)",
                "security": [],
                "responses": {
                    "200": {
                        "description": "HTML",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }


def _operations_paths(refs: dict[str, Any]) -> dict[str, Any]:
    """The operational routes: engine state, readiness, metrics."""
    return {
        "/v1/xpuspec/state": {
            "get": {
                "summary": "Engine state (KV blocks in use, running and waiting requests)",
                "responses": {"200": {"description": "state", "content": _json(refs["EngineState"])}},
            }
        },
        "/health": {
            "get": {
                "summary": "Readiness (no authentication)",
                "security": [],
                "responses": {
                    "200": {"description": "ready"},
                    "503": {"description": "loading, failed or draining"},
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "metrics",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }


def openapi_document(served_model_name: str, with_auth: bool) -> dict[str, Any]:
    refs, definitions = _component_schemas()
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "xpuspec",
            "version": "1",
            "description": f"OpenAI-compatible API over speculative decoding, and Ollama's (/api/*); "
            f"serves {served_model_name!r}.",
        },
        "paths": {
            "/v1/completions": {
                "post": _generation_operation(
                    "Text completion", refs["CompletionRequest"], refs["CompletionResponse"]
                )
            },
            "/v1/chat/completions": {
                "post": _generation_operation(
                    "Chat completion", refs["ChatCompletionRequest"], refs["ChatCompletionResponse"]
                )
            },
            "/v1/models": {
                "get": {
                    "summary": "The served model",
                    "responses": {"200": {"description": "models", "content": _json(refs["ModelList"])}},
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One model",
                    "parameters": [
                        {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "responses": {
                        "200": {"description": "the model", "content": _json(refs["ModelCard"])},
                        "404": _error("unknown model"),
                    },
                }
            },
            **_operations_paths(refs),
            **ollama_openapi.ollama_paths(refs),
        },
        "components": {
            "schemas": {
                **_with_served_model(definitions, served_model_name),
                "SpeculationChunkField": SPECULATION_CHUNK_FIELD,
            }
        },
    }
    document["paths"].update(_chat_page_paths())
    if with_auth:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
        for path, operations in document["paths"].items():
            if path not in ("/health", "/"):
                for operation in operations.values():
                    operation["responses"].setdefault("401", _error("missing or invalid API key"))
    return document
