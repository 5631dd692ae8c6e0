"""GGUF files as a `xpuspec prepare` source: llama.cpp / Ollama / LM Studio models, torch-free.

The weights are converted by OpenVINO GenAI's GGUF reader (``LLMPipeline(path, enable_save_ov_model=True)``
writes ``openvino_model.xml`` and the tokenizer/detokenizer IRs beside the file), keeping the GGUF's own
weight quantisation. The chat template, special tokens, context length and vocabulary come from the GGUF
metadata, read with the ``gguf`` package (:mod:`xpuspec.prepare.gguf_model`). The pair check compares
token strings, the manifest, hashes and atomic write are the ones HF sources get
(:mod:`xpuspec.prepare.writer`).

A draft for a GGUF target may be another GGUF file, an OpenVINO IR folder with its tokenizer IRs (both
torch-free), or a Hugging Face checkpoint folder (exported through the usual HF path, which needs torch).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from xpuspec.prepare.config import PrepareConfig, PrepareError, record_draft_vocab
from xpuspec.prepare.eagle3 import check_head_fits, write_head
from xpuspec.prepare.gguf_copy import copy_for_genai
from xpuspec.prepare.gguf_formats import AS_IS, GgufWeightFormat
from xpuspec.prepare.gguf_minima import keep_q4_1_minima
from xpuspec.prepare.gguf_model import GgufModel, is_gguf_source
from xpuspec.prepare.gguf_tokenizer import write_tokenizer
from xpuspec.prepare.gguf_weights import recompress_ir
from xpuspec.prepare.pairing import PairingError, check_vocabularies, translating_pair
from xpuspec.prepare.progress import ProgressSink, StepProgress
from xpuspec.prepare.writer import check_output_path, commit_bundle, staging_folder, write_manifest

__all__ = ["GgufModel", "convert_gguf", "folder_tokens", "is_gguf_source", "prepare_gguf_bundle"]

logger = logging.getLogger(__name__)

IR_FILES = (
    "openvino_model.xml",
    "openvino_model.bin",
    "openvino_tokenizer.xml",
    "openvino_tokenizer.bin",
    "openvino_detokenizer.xml",
    "openvino_detokenizer.bin",
)


def convert_gguf(model: GgufModel, out_dir: Path, role: str = "target") -> dict[str, str | None]:
    """Convert ``model`` into ``out_dir`` (the IR files, config.json, chat_template.jinja, tokenizer.json),
    torch-free; returns the manifest's record of its tokenizer.

    GenAI writes its IR beside the GGUF, so the file is copied into a scratch folder inside ``out_dir``'s
    parent first (the source may sit in read-only site-packages); the scratch folder is always removed.
    The tokenizer.json is built from the GGUF's metadata (:mod:`xpuspec.prepare.gguf_tokenizer`) and the
    tokenizer IRs converted from it, replacing GenAI's, which split text by architecture, not by the
    GGUF's pre-tokenizer. Q4_1 weights keep their block minima (:mod:`xpuspec.prepare.gguf_minima`).
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
        copy_for_genai(model.path, copy, model.vocabulary, model.architecture)
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
    keep_q4_1_minima(model.path, out_dir / IR_FILES[0])  # the reader rounds them (gguf_minima)
    (out_dir / "config.json").write_text(json.dumps(model.hf_config(), indent=2) + "\n", encoding="utf-8")
    generation = {
        "bos_token_id": model.special_ids.get("bos"),
        "eos_token_id": model.tokenizer_facts()["eos_token_ids"],
        **model.sampling,  # what the GGUF recommends: the served model's sampling defaults
    }
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    if model.chat_template:
        (out_dir / "chat_template.jinja").write_text(model.chat_template, encoding="utf-8")
    where = f"{role} {model.path.name}"
    irs = write_tokenizer(model.vocabulary, model.chat_template, out_dir, where)
    return {"model": model.vocabulary.model, "pre": model.vocabulary.pre, "irs_from": irs}


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


def check_recompression(weights: str | None, target: GgufModel) -> None:
    """``--weights`` recompresses only an unquantised GGUF (`xpuspec prepare` checks it before any work)."""
    if weights is not None and target.quantized:
        raise PrepareError(
            f"--weights {weights}: NNCF recompression does not apply to {target.path.name}, already "
            f"quantised as {target.weight_format}; leave --weights out to keep the GGUF's own quantisation"
        )


def prepare_gguf_bundle(config: PrepareConfig, *, progress: ProgressSink | None = None) -> Path:
    """`xpuspec prepare TARGET.gguf [--draft DRAFT] -o BUNDLE`: the GGUF counterpart of ``prepare_bundle``.

    The target keeps its GGUF quantisation. ``--weights`` re-compresses with NNCF only an unquantised
    (F32/F16) GGUF; on a quantised one it is refused, naming the GGUF's types. ``--weight-format``
    (``config.gguf_weight_format``) re-compresses the converted weights of any GGUF target to another
    format (:mod:`xpuspec.prepare.gguf_weights`), recorded in the manifest with its reason. On any failure
    or interrupt the output path is left untouched.
    """
    output = config.output.resolve()
    check_output_path(output, config.overwrite)
    target = GgufModel.read(Path(config.target).expanduser(), "target")
    target.check_supported("target")
    check_recompression(config.weights, target)
    draft_spec = config.draft
    draft_gguf = None
    if is_gguf_source(draft_spec):
        draft_gguf = GgufModel.read(Path(str(draft_spec)).expanduser(), "draft")
        draft_gguf.check_supported("draft")
    roles = ["target"] + (["draft"] if draft_spec else [])
    head_steps = 1 if config.eagle3 is not None else 0
    recompress_steps = 0 if _target_weight_format(config).as_converted else 1
    steps = StepProgress(total_steps=2 + 2 * len(roles) + head_steps + recompress_steps, sink=progress)
    with staging_folder(output) as staging:
        with steps.step("reading GGUF metadata" + (", checking the pair" if draft_spec else "")):
            pairing, draft_source = _check_gguf_pair(target, draft_spec, draft_gguf, config.force_pair)
            if config.eagle3 is not None:
                check_head_fits(config.eagle3, target.architecture_facts())
        facts = {"target": _prepare_gguf_model(target, "target", config, staging, steps)}
        if draft_gguf is not None:
            facts["draft"] = _prepare_gguf_model(draft_gguf, "draft", config, staging, steps)
        elif draft_source is not None:
            translates = bool(pairing.get("translate"))
            facts["draft"] = _prepare_folder_draft(draft_source, config, staging, steps, translates)
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
    # Debug only: the caller names the bundle where it ends up (a cache build renames it afterwards).
    logger.debug("bundle ready at %s (%.1fs)", output, steps.elapsed)
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
            return translating_pair(error), folder
        logger.warning("pairing forced despite a tokenizer mismatch: %s", error)
        return {"checked": True, "forced": True, "mismatch": str(error)}, folder
    return {"checked": True, "forced": force_pair, "mismatch": None}, folder


def _prepare_gguf_model(
    model: GgufModel, role: str, config: PrepareConfig, staging: Path, steps: StepProgress
) -> dict[str, Any]:
    model_dir = staging / role
    with steps.step(f"converting {role} {model.path.name} with OpenVINO GenAI's GGUF reader"):
        tokenizer = convert_gguf(model, model_dir, role)
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
    weight_format = _target_weight_format(config)
    if role == "target" and not weight_format.as_converted:
        with steps.step(
            f"re-compressing {role} weights to {weight_format.label} (NNCF, from the GGUF's own)"
        ):
            compression = _recompress_converted(model_dir, model, weight_format, config.gguf_weight_reason)
    return {
        "role": role,
        "path": role,
        "source": str(model.path),
        "gguf": {
            "architecture": model.architecture,
            "file_type": model.file_type,
            "name": model.name,
            "tokenizer": tokenizer,
        },
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


def _target_weight_format(config: PrepareConfig) -> GgufWeightFormat:
    return GgufWeightFormat.parse(config.gguf_weight_format or AS_IS)


def _recompress_converted(
    model_dir: Path, model: GgufModel, weight_format: GgufWeightFormat, reason: str | None
) -> dict[str, Any]:
    """The converted IR's weights re-compressed to ``weight_format``, with the record of what and why.

    The recorded ``weights`` is the format's label, never a bare "int4"/"int8": the devices' defaults for
    those (the CPU's f32 compute with dynamic quantisation) were not what the format was measured at."""
    import gc

    scratch = model_dir / ".recompress"
    scratch.mkdir()
    done = recompress_ir(model_dir / IR_FILES[0], scratch / IR_FILES[0], weight_format)
    gc.collect()
    for name in IR_FILES[:2]:
        (scratch / name).replace(model_dir / name)
    scratch.rmdir()
    return {
        "mode": f"gguf {model.weight_format} recompressed {weight_format.label}",
        "weights": weight_format.label,
        "gguf_weights": model.weight_format,
        "recompressed": {**done, "reason": reason},
        **_count_weights(model_dir),
    }


def _count_weights(model_dir: Path) -> dict[str, int]:
    import openvino as ov

    from xpuspec.prepare.compress import count_low_precision_weights

    int8, int4 = count_low_precision_weights(ov.Core().read_model(str(model_dir / IR_FILES[0])))
    return {"int8_constants": int8, "int4_constants": int4}


def _prepare_folder_draft(
    folder: Path, config: PrepareConfig, staging: Path, steps: StepProgress, translates: bool = False
) -> dict[str, Any]:
    """An IR folder is copied as is (torch-free); an HF checkpoint goes through the HF export path.
    ``translates``: the draft's tokenizer differs from the target's, so its own tokenizer IRs are needed."""
    if (folder / IR_FILES[0]).is_file():  # the target's tokenizer serves both: draft tokenizer IRs optional
        missing = [name for name in IR_FILES[2:] if name.endswith(".xml") and not (folder / name).is_file()]
        if translates and missing:
            raise PrepareError(
                f"draft {folder}: its tokenizer differs from the target's and the folder lacks "
                f"{', '.join(missing)}; convert its tokenizer with openvino_tokenizers, or prepare from "
                "its Hugging Face checkpoint"
            )
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
