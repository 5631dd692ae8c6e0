"""What a GGUF file's metadata says about its model, read with the ``gguf`` package (torch-free).

The architecture and weight types (checked against what OpenVINO GenAI's GGUF reader builds), the
hyperparameters, the vocabulary with its special tokens, and the chat template: for the manifest, the
pair check and the template of a bundle prepared from GGUF files (:mod:`xpuspec.prepare.gguf`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuspec.prepare.config import PrepareError
from xpuspec.prepare.gguf_tokenizer import GgufVocabulary
from xpuspec.sample.defaults import GGUF_SAMPLING_KEYS

GGUF_SUFFIX = ".gguf"
# What OpenVINO GenAI 2026.4's GGUF reader builds (gguf_modeling.cpp); anything else fails inside it.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "smollm", "gemma3")
# Weight-matrix types its reader builds ("Unsupported quantization type" otherwise; it refuses F32
# matrices too). Norm vectors are F32 in every GGUF and not counted. The GGUF's quantisation is kept.
SUPPORTED_TENSOR_TYPES = ("F16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")
_UNQUANTIZED_TYPES = ("F32", "F16")
# HF architecture names for the manifest and config.json (GenAI and the engine only read the IR).
_HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "smollm": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}
_SPECIAL_TOKEN_KEYS = {
    "bos": "bos_token_id",
    "eos": "eos_token_id",
    "pad": "padding_token_id",
    "unk": "unknown_token_id",
}


def is_gguf_source(spec: str | Path | None) -> bool:
    """Is ``spec`` a GGUF file (by name; a missing one still is, so it gets a GGUF error)."""
    return spec is not None and str(spec).lower().endswith(GGUF_SUFFIX)


@dataclass(frozen=True)
class GgufModel:
    """What the GGUF metadata says about one model: for the manifest, the pair check, the template."""

    path: Path
    architecture: str
    file_type: str  # llama.cpp's name for general.file_type, e.g. MOSTLY_Q4_1
    tensor_types: tuple[str, ...]  # distinct types of the weight matrices, e.g. ("Q4_1", "Q8_0")
    hyperparameters: dict[str, int]
    tokens: tuple[str, ...]
    special_ids: dict[str, int | None]
    chat_template: str | None
    name: str | None
    vocabulary: GgufVocabulary
    # The model's recommended sampling (llama.cpp's general.sampling.* keys), by generation_config.json key.
    sampling: dict[str, float] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path, role: str) -> GgufModel:
        try:
            import gguf
        except ImportError as error:
            raise PrepareError(f"reading {path.name} needs the `gguf` package (pip install gguf)") from error
        if not path.is_file():
            raise PrepareError(f"{role} {path}: no such GGUF file")
        try:
            reader = gguf.GGUFReader(str(path))
        except Exception as error:  # noqa: BLE001 - a truncated or foreign file raises anything
            raise PrepareError(
                f"{role} {path}: not a readable GGUF file ({type(error).__name__}: {error})"
            ) from error
        fields = {name: _field_value(field) for name, field in reader.fields.items()}
        architecture = str(fields.get("general.architecture", "unknown"))
        file_type_id = fields.get("general.file_type")
        try:
            file_type = gguf.LlamaFileType(int(file_type_id)).name if file_type_id is not None else "unknown"
        except ValueError:
            file_type = f"file type {file_type_id}"
        prefix = f"{architecture}."
        hyper_keys = {
            "num_layers": "block_count",
            "hidden_size": "embedding_length",
            "intermediate_size": "feed_forward_length",
            "num_attention_heads": "attention.head_count",
            "num_kv_heads": "attention.head_count_kv",
            "max_position_embeddings": "context_length",
            "head_dim": "attention.key_length",
        }
        hyper = {
            name: int(fields[prefix + key]) for name, key in hyper_keys.items() if prefix + key in fields
        }
        tokens = tuple(str(token) for token in fields.get("tokenizer.ggml.tokens", ()))
        special = {
            role_name: (int(fields[f"tokenizer.ggml.{key}"]) if f"tokenizer.ggml.{key}" in fields else None)
            for role_name, key in _SPECIAL_TOKEN_KEYS.items()
        }
        template = fields.get("tokenizer.chat_template")
        return cls(
            path=path,
            architecture=architecture,
            file_type=file_type,
            tensor_types=tuple(
                sorted({tensor.tensor_type.name for tensor in reader.tensors if len(tensor.shape) > 1})
            ),
            hyperparameters=hyper,
            tokens=tokens,
            special_ids=special,
            chat_template=str(template) if template is not None else None,
            name=str(fields["general.name"]) if "general.name" in fields else None,
            vocabulary=GgufVocabulary.from_fields(fields, special),
            sampling={
                name: float(fields[key])
                for key, name in GGUF_SAMPLING_KEYS.items()
                if isinstance(fields.get(key), (int, float))
            },
        )

    @property
    def quantized(self) -> bool:
        return any(kind not in _UNQUANTIZED_TYPES for kind in self.tensor_types)

    @property
    def weight_format(self) -> str:
        """The GGUF's weight-matrix types as one short label, e.g. ``Q4_1+Q8_0``."""
        return "+".join(self.tensor_types) or "none"

    def check_supported(self, role: str) -> None:
        """One-line :class:`PrepareError` naming an architecture or file type GenAI's reader cannot build."""
        unsupported = [kind for kind in self.tensor_types if kind not in SUPPORTED_TENSOR_TYPES]
        if self.architecture not in SUPPORTED_ARCHITECTURES or unsupported:
            what = (
                f"architecture {self.architecture!r} is not one of {', '.join(SUPPORTED_ARCHITECTURES)}"
                if self.architecture not in SUPPORTED_ARCHITECTURES
                else f"weight types {', '.join(unsupported)} (supported: {', '.join(SUPPORTED_TENSOR_TYPES)})"
            )
            raise PrepareError(
                f"{role} {self.path.name}: unsupported GGUF (architecture {self.architecture}, "
                f"file type {self.file_type}): {what}"
            )
        if not self.tokens:
            raise PrepareError(
                f"{role} {self.path.name}: the GGUF holds no tokenizer (tokenizer.ggml.tokens)"
            )
        self.vocabulary.check(f"{role} {self.path.name}")

    def architecture_facts(self) -> dict[str, Any]:
        hyper = self.hyperparameters
        heads = hyper.get("num_attention_heads", 1)
        hidden = hyper.get("hidden_size", 0)
        return {
            "architecture": _HF_ARCHITECTURES.get(self.architecture, self.architecture),
            "model_type": "llama" if self.architecture == "smollm" else self.architecture,
            "vocab_size": len(self.tokens),
            "num_layers": hyper.get("num_layers", 0),
            "num_attention_heads": heads,
            "num_kv_heads": hyper.get("num_kv_heads", heads),
            "head_dim": hyper.get("head_dim", hidden // max(1, heads)),
            "hidden_size": hidden,
            "max_position_embeddings": hyper.get("max_position_embeddings", 2048),
        }

    def tokenizer_facts(self) -> dict[str, Any]:
        """The manifest's tokenizer section, as ``xpuspec.prepare.tokenizer.tokenizer_facts`` writes it."""
        special_tokens = {
            role: {"token": self._token(token_id), "id": token_id}
            for role, token_id in self.special_ids.items()
        }
        eos = self.special_ids.get("eos")
        eos_ids = [eos] if eos is not None else []
        # Instruct models end a turn with their template's end marker: stop there too.
        for marker in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
            if marker in self.tokens and self.chat_template and marker in self.chat_template:
                eos_ids.append(self.tokens.index(marker))
        return {
            "eos_token_ids": list(dict.fromkeys(eos_ids)),
            "bos_token_id": self.special_ids.get("bos"),
            "pad_token_id": self.special_ids.get("pad"),
            "vocab_size": len(self.tokens),
            "chat_template": self.chat_template,
            "special_tokens": special_tokens,
            "all_special_tokens": list(
                dict.fromkeys(
                    entry["token"] for entry in special_tokens.values() if entry["token"] is not None
                )
            ),
        }

    def hf_config(self) -> dict[str, Any]:
        """A config.json for the converted folder, so it reads like an HF export to tools that look."""
        facts = self.architecture_facts()
        hyper = self.hyperparameters
        return {
            "architectures": [facts["architecture"]],
            "model_type": facts["model_type"],
            "vocab_size": facts["vocab_size"],
            "hidden_size": facts["hidden_size"],
            "intermediate_size": hyper.get("intermediate_size"),
            "num_hidden_layers": facts["num_layers"],
            "num_attention_heads": facts["num_attention_heads"],
            "num_key_value_heads": facts["num_kv_heads"],
            "head_dim": facts["head_dim"],
            "max_position_embeddings": facts["max_position_embeddings"],
            "bos_token_id": self.special_ids.get("bos"),
            "eos_token_id": self.special_ids.get("eos"),
            "pad_token_id": self.special_ids.get("pad"),
            "source_gguf": self.path.name,
        }

    def _token(self, token_id: int | None) -> str | None:
        if token_id is None or not 0 <= token_id < len(self.tokens):
            return None
        return self.tokens[token_id]


def _field_value(field: Any) -> Any:
    try:
        return field.contents()
    except Exception:  # noqa: BLE001 - nested arrays the reader does not decode: not needed here
        return None
