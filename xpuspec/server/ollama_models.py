"""What /api/tags, /api/ps, /api/show and /api/version say about the served model, in Ollama's shapes.

Ollama describes GGUF files; xpuspec describes its bundle: the format is ``openvino``, the family the
target's model type, the quantisation its weight compression, the size the bundle's files on disk and
the digest the SHA-256 of its manifest (which lists every file's hash). The served name is listed once,
with Ollama's ``:latest`` tag, the form Ollama clients send back (and every route accepts); aliases
are accepted on requests but not listed.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpuspec.server.ollama_requests import tagged
from xpuspec.version import __version__

if TYPE_CHECKING:
    from xpuspec.api.requests import RequestPreparer
    from xpuspec.models.bundle import ModelBundle

# The Ollama API level /api/version reports (structured outputs arrived in Ollama 0.5): clients that
# check it before using `format` with a schema find it new enough. xpuspec's own version is beside it.
OLLAMA_API_VERSION = "0.5.0"
# Ollama's expires_at for a model kept loaded for good (keep_alive < 0): xpuspec never unloads.
NEVER_EXPIRES = "9999-12-31T23:59:59Z"
UNKNOWN_TIME = "1970-01-01T00:00:00Z"


@lru_cache(maxsize=4)
def _bundle_size_and_digest(root: Path) -> tuple[int, str]:
    size = sum(path.stat().st_size for path in root.rglob("*") if path.is_file())
    manifests = sorted(root.glob("*.json"))
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in manifests)).hexdigest()
    return size, digest


def _details(bundle: ModelBundle | None) -> dict[str, Any]:
    facts = bundle.target.facts if bundle is not None else {}
    family = str(facts.get("model_type") or "unknown")
    compression = facts.get("compression") or {}
    return {
        "parent_model": "",
        "format": "openvino",
        "family": family,
        "families": [family],
        "parameter_size": "",
        "quantization_level": str(compression.get("mode") or compression.get("weights") or "unknown"),
    }


def model_entries(names: tuple[str, ...], requests: RequestPreparer | None) -> list[dict[str, Any]]:
    """/api/tags: one entry per name given (the served name); without details while the model loads."""
    bundle = requests.bundle if requests is not None else None
    size, digest = _bundle_size_and_digest(bundle.root) if bundle is not None else (0, "")
    modified = str(bundle.manifest.get("created_at") or UNKNOWN_TIME) if bundle is not None else UNKNOWN_TIME
    return [
        {
            "name": tagged(name),
            "model": tagged(name),
            "modified_at": modified,
            "size": size,
            "digest": digest,
            "details": _details(bundle),
        }
        for name in names
    ]


def running_entries(names: tuple[str, ...], requests: RequestPreparer | None) -> list[dict[str, Any]]:
    """/api/ps: the served model once loaded (it stays loaded; nothing runs before)."""
    if requests is None:
        return []
    return [
        {**entry, "expires_at": NEVER_EXPIRES, "size_vram": 0, "context_length": requests.max_model_len}
        for entry in model_entries(names, requests)
    ]


def show(name: str, requests: RequestPreparer) -> dict[str, Any]:
    """/api/show: the model's details, chat template (Jinja, not Ollama's Go template) and parameters."""
    bundle = requests.bundle
    facts = bundle.target.facts
    family = str(facts.get("model_type") or "unknown")
    template = requests.chat_template.template if requests.chat_template is not None else ""
    defaults = requests.sampling_defaults
    parameters = {
        "num_ctx": requests.max_model_len,
        "num_predict": defaults.max_tokens,
        "temperature": defaults.temperature,
        "top_p": defaults.top_p,
        "top_k": defaults.top_k,
        "min_p": defaults.min_p,
        "repeat_penalty": defaults.repeat_penalty,
        "repeat_last_n": defaults.repeat_last_n,
        "dry_multiplier": defaults.dry_multiplier,
    }
    info = {
        "general.architecture": family,
        "general.basename": name,
        f"{family}.context_length": requests.max_model_len,
        f"{family}.block_count": facts.get("num_layers"),
        f"{family}.embedding_length": facts.get("hidden_size"),
        f"{family}.attention.head_count": facts.get("num_attention_heads"),
        f"{family}.attention.head_count_kv": facts.get("num_kv_heads"),
        f"{family}.vocab_size": facts.get("vocab_size"),
        "xpuspec.drafter": requests.drafter,
    }
    return {
        "modified_at": str(bundle.manifest.get("created_at") or UNKNOWN_TIME),
        "template": template,
        "parameters": "\n".join(f"{key:<30} {value}" for key, value in parameters.items()),
        "license": "",
        "details": _details(bundle),
        "model_info": {key: value for key, value in info.items() if value is not None},
        "capabilities": ["completion", "tools"] if template else ["completion"],
    }


def version() -> dict[str, str]:
    return {"version": OLLAMA_API_VERSION, "xpuspec_version": __version__}
