"""GGUF files as a `xpuspec prepare` source: llama.cpp / Ollama / LM Studio models, torch-free.

The weights are converted by OpenVINO GenAI's GGUF reader (``LLMPipeline(path, enable_save_ov_model=True)``
writes ``openvino_model.xml`` and the tokenizer/detokenizer IRs beside the file), keeping the GGUF's own
weight quantisation. The chat template, special tokens, context length and vocabulary come from the GGUF
metadata, read with the ``gguf`` package. The pair check compares token strings, the manifest, hashes and
atomic write are the ones HF sources get (:mod:`xpuspec.prepare.writer`).

A draft for a GGUF target may be another GGUF file, an OpenVINO IR folder with its tokenizer IRs (both
torch-free), or a Hugging Face checkpoint folder (exported through the usual HF path, which needs torch).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xpuspec.prepare.config import PrepareConfig, PrepareError, record_draft_vocab
from xpuspec.prepare.eagle3 import check_head_fits, write_head
from xpuspec.prepare.pairing import PairingError, check_vocabularies
from xpuspec.prepare.progress import ProgressSink, StepProgress
from xpuspec.prepare.writer import check_output_path, commit_bundle, staging_folder, write_manifest

logger = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
IR_FILES = (
    "openvino_model.xml",
    "openvino_model.bin",
    "openvino_tokenizer.xml",
    "openvino_tokenizer.bin",
    "openvino_detokenizer.xml",
    "openvino_detokenizer.bin",
)
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


def convert_gguf(model: GgufModel, out_dir: Path, role: str = "target") -> None:
    """Convert ``model`` into ``out_dir`` (the IR files, config.json, chat_template.jinja), torch-free.

    GenAI writes its IR beside the GGUF, so the file is copied into a scratch folder inside ``out_dir``'s
    parent first (the source may sit in read-only site-packages); the scratch folder is always removed.
    """
    try:
        import openvino_genai
    except ImportError as error:
        raise PrepareError(
            "converting a GGUF needs OpenVINO GenAI: pip install openvino-genai (it is in scripts/install.sh)"
        ) from error
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".gguf-convert-", dir=out_dir.parent))
    try:
        copy = scratch / model.path.name
        shutil.copyfile(model.path, copy)
        try:
            openvino_genai.LLMPipeline(str(copy), "CPU", enable_save_ov_model=True)
        except Exception as error:  # noqa: BLE001 - GenAI raises RuntimeError with its C++ message
            # GenAI's message is "Exception from <C++ file>:<line>:\n<what>": keep the what.
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            first_line = lines[-1] if lines else type(error).__name__
            raise PrepareError(
                f"{role} {model.path.name}: OpenVINO GenAI could not convert this GGUF (architecture "
                f"{model.architecture}, file type {model.file_type}): {first_line}"
            ) from error
        for name in IR_FILES:
            if not (scratch / name).is_file():
                raise PrepareError(f"{role} {model.path.name}: OpenVINO GenAI wrote no {name}")
            shutil.move(str(scratch / name), out_dir / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (out_dir / "config.json").write_text(json.dumps(model.hf_config(), indent=2) + "\n", encoding="utf-8")
    generation = {
        "bos_token_id": model.special_ids.get("bos"),
        "eos_token_id": model.tokenizer_facts()["eos_token_ids"],
    }
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    if model.chat_template:
        (out_dir / "chat_template.jinja").write_text(model.chat_template, encoding="utf-8")


def folder_tokens(folder: Path) -> tuple[str, ...] | None:
    """Token string per id of an HF ``tokenizer.json`` (vocabulary + added tokens), without transformers."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    by_id: dict[int, str] = {int(i): t for t, i in data.get("model", {}).get("vocab", {}).items()}
    for added in data.get("added_tokens", []):
        by_id[int(added["id"])] = added["content"]
    if not by_id:
        return None
    return tuple(by_id.get(i, "") for i in range(max(by_id) + 1))


def prepare_gguf_bundle(config: PrepareConfig, *, progress: ProgressSink | None = None) -> Path:
    """`xpuspec prepare TARGET.gguf [--draft DRAFT] -o BUNDLE`: the GGUF counterpart of ``prepare_bundle``.

    The target keeps its GGUF quantisation. ``--weights`` re-compresses with NNCF only an unquantised
    (F32/F16) GGUF; on a quantised one it is refused, naming the GGUF's types. On any failure or
    interrupt the output path is left untouched.
    """
    output = config.output.resolve()
    check_output_path(output, config.overwrite)
    target = GgufModel.read(Path(config.target).expanduser(), "target")
    target.check_supported("target")
    if config.weights is not None and target.quantized:
        raise PrepareError(
            f"--weights {config.weights}: NNCF recompression does not apply to {target.path.name}, already "
            f"quantised as {target.weight_format}; leave --weights out to keep the GGUF's own quantisation"
        )
    draft_spec = config.draft
    draft_gguf = None
    if is_gguf_source(draft_spec):
        draft_gguf = GgufModel.read(Path(str(draft_spec)).expanduser(), "draft")
        draft_gguf.check_supported("draft")
    roles = ["target"] + (["draft"] if draft_spec else [])
    head_steps = 1 if config.eagle3 is not None else 0
    steps = StepProgress(total_steps=2 + 2 * len(roles) + head_steps, sink=progress)
    with staging_folder(output) as staging:
        with steps.step("reading GGUF metadata" + (", checking the pair" if draft_spec else "")):
            pairing, draft_source = _check_gguf_pair(target, draft_spec, draft_gguf, config.force_pair)
            if config.eagle3 is not None:
                check_head_fits(config.eagle3, target.architecture_facts())
        facts = {"target": _prepare_gguf_model(target, "target", config, staging, steps)}
        if draft_gguf is not None:
            facts["draft"] = _prepare_gguf_model(draft_gguf, "draft", config, staging, steps)
        elif draft_source is not None:
            facts["draft"] = _prepare_folder_draft(draft_source, config, staging, steps)
        if "draft" in facts:
            facts["draft"] = record_draft_vocab(facts["draft"], config.draft_vocab)
        eagle3 = None
        if config.eagle3 is not None:
            with steps.step("checking and writing the EAGLE-3 head"):
                eagle3 = write_head(config.eagle3, staging, facts["target"])
        with steps.step("hashing files and writing the manifest"):
            write_manifest(
                staging,
                prepared_for=config.device,
                toolchain=_gguf_toolchain(),
                models=facts,
                tokenizer=target.tokenizer_facts(),
                pairing=pairing,
                eagle3=eagle3,
            )
        commit_bundle(staging, output, config.overwrite)
    logger.info("bundle ready at %s (%.1fs)", output, steps.elapsed)
    return output


def _check_gguf_pair(
    target: GgufModel, draft_spec: str | None, draft_gguf: GgufModel | None, force_pair: bool
) -> tuple[dict[str, Any], Path | None]:
    if draft_spec is None:
        return {"checked": False, "forced": False, "mismatch": None}, None
    folder = None
    if draft_gguf is not None:
        draft_tokens = draft_gguf.tokens
    else:
        folder = Path(draft_spec).expanduser().resolve()
        if not folder.is_dir():
            raise PrepareError(f"draft {draft_spec}: no such folder or GGUF file")
        tokens = folder_tokens(folder)
        config_path = folder / "config.json"
        if tokens is not None and config_path.is_file():
            # Only ids below the model's output size can be drafted; tokenizers may list more (e.g. the
            # FIM tokens transformers adds when it reads a GGUF tokenizer).
            vocab_size = json.loads(config_path.read_text(encoding="utf-8")).get("vocab_size")
            tokens = tokens[: int(vocab_size)] if vocab_size else tokens
        if tokens is None:
            raise PrepareError(
                f"draft {draft_spec}: no tokenizer.json to check the pair against the GGUF's tokens"
            )
        draft_tokens = tokens
    try:
        check_vocabularies(target.tokens, draft_tokens, str(draft_spec))
    except PairingError as error:
        if not force_pair:
            raise
        logger.warning("pairing forced despite a tokenizer mismatch: %s", error)
        return {"checked": True, "forced": True, "mismatch": str(error)}, folder
    return {"checked": True, "forced": force_pair, "mismatch": None}, folder


def _prepare_gguf_model(
    model: GgufModel, role: str, config: PrepareConfig, staging: Path, steps: StepProgress
) -> dict[str, Any]:
    model_dir = staging / role
    with steps.step(f"converting {role} {model.path.name} with OpenVINO GenAI's GGUF reader"):
        convert_gguf(model, model_dir, role)
    compression: dict[str, Any] = {"mode": f"gguf {model.weight_format}", "weights": model.weight_format}
    wanted = config.weights if role == "target" else (config.draft_weights or config.weights)
    if wanted is not None and not model.quantized:
        with steps.step(f"compressing {role} with NNCF ({wanted})"):
            compression = _recompress(
                model_dir, config.target_compression() if role == "target" else config.draft_compression()
            )
    else:
        with steps.step(
            f"keeping {role} weights as {model.weight_format} (the GGUF's own; no NNCF recompression)"
        ):
            compression.update(_count_weights(model_dir))
    return {
        "role": role,
        "path": role,
        "source": str(model.path),
        "gguf": {"architecture": model.architecture, "file_type": model.file_type, "name": model.name},
        **model.architecture_facts(),
        "compression": compression,
    }


def _recompress(model_dir: Path, compression: Any) -> dict[str, Any]:
    import gc

    import openvino as ov

    from xpuspec.prepare.compress import compress_model, save_model

    xml = model_dir / IR_FILES[0]
    core = ov.Core()
    ir_model = core.read_model(str(xml))
    scratch = model_dir / ".nncf"
    scratch.mkdir()
    compressed = compress_model(ir_model, compression, None)
    save_model(compressed, scratch / IR_FILES[0], compression)
    del ir_model, compressed
    gc.collect()
    for name in IR_FILES[:2]:
        (scratch / name).replace(model_dir / name)
    scratch.rmdir()
    return {"mode": compression.mode, "weights": compression.weights, **_count_weights(model_dir)}


def _count_weights(model_dir: Path) -> dict[str, int]:
    import openvino as ov

    from xpuspec.prepare.compress import count_low_precision_weights

    int8, int4 = count_low_precision_weights(ov.Core().read_model(str(model_dir / IR_FILES[0])))
    return {"int8_constants": int8, "int4_constants": int4}


def _prepare_folder_draft(
    folder: Path, config: PrepareConfig, staging: Path, steps: StepProgress
) -> dict[str, Any]:
    """An IR folder is copied as is (torch-free); an HF checkpoint goes through the HF export path."""
    if (folder / IR_FILES[0]).is_file():  # the target's tokenizer serves both: draft tokenizer IRs optional
        with steps.step(f"copying draft OpenVINO IR from {folder}"):
            shutil.copytree(folder, staging / "draft", ignore=shutil.ignore_patterns(".*"))
            for name in IR_FILES[2:]:
                # The pair check passed: the target's tokenizer IRs are the draft's (GenAI's draft_model
                # loads them from the draft folder).
                if not (staging / "draft" / name).is_file() and (staging / "target" / name).is_file():
                    shutil.copy2(staging / "target" / name, staging / "draft" / name)
            config_path = folder / "config.json"
            hf = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
            facts = _facts_from_config_json(hf)
            weights = _count_weights(staging / "draft")
        with steps.step("draft weights kept as they are in the IR"):
            pass
        return {
            "role": "draft",
            "path": "draft",
            "source": str(folder),
            **facts,
            "compression": {"mode": "as given (IR)", "weights": "as given", **weights},
        }
    from xpuspec.prepare.export import ModelSource, check_conversion_stack, load_hf_config, load_hf_tokenizer
    from xpuspec.prepare.pipeline import _ModelInput, _prepare_model

    check_conversion_stack()
    source = ModelSource.resolve(str(folder), "draft")
    model = _ModelInput(
        role="draft",
        source=source,
        config=load_hf_config(source, "draft"),
        tokenizer=load_hf_tokenizer(source, "draft"),
        compression=config.draft_compression(),
    )
    inner = StepProgress(total_steps=3, sink=steps.sink)
    with steps.step(f"exporting and compressing the HF draft {folder.name}"):
        facts = _prepare_model(model, config, staging, inner)
    with steps.step("draft ready"):
        pass
    return facts


def _facts_from_config_json(hf: dict[str, Any]) -> dict[str, Any]:
    heads = int(hf.get("num_attention_heads", 1))
    hidden = int(hf.get("hidden_size", 0))
    return {
        "architecture": (hf.get("architectures") or ["unknown"])[0],
        "model_type": hf.get("model_type", "unknown"),
        "vocab_size": int(hf.get("vocab_size", 0)),
        "num_layers": int(hf.get("num_hidden_layers", 0)),
        "num_attention_heads": heads,
        "num_kv_heads": int(hf.get("num_key_value_heads") or heads),
        "head_dim": int(hf.get("head_dim") or hidden // max(1, heads)),
        "hidden_size": hidden,
        "max_position_embeddings": int(hf.get("max_position_embeddings", 2048)),
    }


def _gguf_toolchain() -> dict[str, str | None]:
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for package in ("openvino", "openvino-tokenizers", "openvino-genai", "gguf"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions
