"""The /api/* (Ollama) operations of the OpenAPI document; ``openapi.py`` merges them in."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from xpuspec.server.ollama_routes import NOT_IMPLEMENTED
from xpuspec.server.ollama_schemas import (
    OllamaChatRequest,
    OllamaChatResponse,
    OllamaError,
    OllamaGenerateRequest,
    OllamaGenerateResponse,
    OllamaModelList,
    OllamaRunningList,
    OllamaShowRequest,
    OllamaShowResponse,
    OllamaVersion,
)

REQUEST_MODELS: list[type[BaseModel]] = [OllamaChatRequest, OllamaGenerateRequest, OllamaShowRequest]
RESPONSE_MODELS: list[type[BaseModel]] = [
    OllamaChatResponse,
    OllamaGenerateResponse,
    OllamaModelList,
    OllamaRunningList,
    OllamaShowResponse,
    OllamaVersion,
    OllamaError,
]
TAG = "Ollama"


def _json(ref: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": ref}}


def _error(description: str, refs: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": _json(refs["OllamaError"])}


def _generation(summary: str, request: str, response: str, refs: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "tags": [TAG],
            "summary": summary,
            "requestBody": {"required": True, "content": _json(refs[request])},
            "responses": {
                "200": {
                    "description": "with stream=false one object; otherwise (the default) one JSON object "
                    "per line, the last with done=true, done_reason and the counters (durations in ns)",
                    "content": {**_json(refs[response]), "application/x-ndjson": {"schema": refs[response]}},
                },
                "400": _error(
                    "malformed JSON, wrong types, unsupported options, num_ctx beyond the model's", refs
                ),  # fmt: skip
                "401": _error("missing or invalid API key", refs),
                "404": _error("unknown model", refs),
                "503": _error("loading, shutting down, or too many requests in flight", refs),
            },
        }
    }


def _listing(summary: str, response: str, refs: dict[str, Any]) -> dict[str, Any]:
    return {
        "get": {
            "tags": [TAG],
            "summary": summary,
            "responses": {
                "200": {"description": summary, "content": _json(refs[response])},
                "401": _error("missing or invalid API key", refs),
            },
        }
    }


def ollama_paths(refs: dict[str, Any]) -> dict[str, Any]:
    """The /api/* operations; ``refs`` maps each model's name to its schema reference."""
    paths = {
        "/api/chat": _generation(
            "Ollama chat (tools, format)", "OllamaChatRequest", "OllamaChatResponse", refs
        ),
        "/api/generate": _generation(
            "Ollama completion of a prompt (templated unless raw)",
            "OllamaGenerateRequest",
            "OllamaGenerateResponse",
            refs,
        ),
        "/api/tags": _listing("Ollama: the served model (each name with :latest)", "OllamaModelList", refs),
        "/api/ps": _listing("Ollama: the loaded model", "OllamaRunningList", refs),
        "/api/version": _listing("Ollama API level and xpuspec version", "OllamaVersion", refs),
        "/api/show": {
            "post": {
                "tags": [TAG],
                "summary": "Ollama: the model's details, chat template and parameters",
                "requestBody": {"required": True, "content": _json(refs["OllamaShowRequest"])},
                "responses": {
                    "200": {"description": "the model", "content": _json(refs["OllamaShowResponse"])},
                    "401": _error("missing or invalid API key", refs),
                    "404": _error("unknown model", refs),
                },
            }
        },
    }
    for endpoint, why in NOT_IMPLEMENTED.items():
        if endpoint != "blobs":
            method = "delete" if endpoint == "delete" else "post"
            paths[f"/api/{endpoint}"] = {
                method: {
                    "tags": [TAG],
                    "summary": f"not supported: {why}",
                    "responses": {
                        "501": _error(why, refs),
                        "401": _error("missing or invalid API key", refs),
                    },
                }
            }
    return paths
