"""`prepare_bundle`: checkpoints in, verified OpenVINO bundle out (stage 1 of the pipeline)."""

from __future__ import annotations

import gc
import logging
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import openvino as ov

from xpuspec.prepare.compress import (
    calibration_inputs,
    compress_model,
    count_low_precision_weights,
    save_model,
)
from xpuspec.prepare.config import PrepareConfig, PrepareError, WeightCompression, record_draft_vocab
from xpuspec.prepare.eagle3 import check_head_fits, write_head
from xpuspec.prepare.export import (
    IR_MODEL_NAME,
    ModelSource,
    architecture_facts,
    check_conversion_stack,
    copy_support_files,
    export_to_openvino,
    load_hf_config,
    load_hf_tokenizer,
)
from xpuspec.prepare.pairing import PairingError, check_pair, translating_pair
from xpuspec.prepare.progress import ProgressSink, StepProgress
from xpuspec.prepare.tokenizer import load_generation_config, tokenizer_facts, write_openvino_tokenizer
from xpuspec.prepare.validate import check_group_size, check_vocab_sizes
from xpuspec.prepare.writer import check_output_path, commit_bundle, staging_folder, write_manifest

logger = logging.getLogger(__name__)

_TOOLCHAIN_PACKAGES = ("openvino", "openvino-tokenizers", "optimum-intel", "nncf", "transformers", "torch")
_INT4_BACKUP_MODE = "int8_asym"  # NNCF keeps embeddings and the LM head at this precision in int4 modes


@dataclass
class _ModelInput:
    """One model to prepare, with what was read from its source."""

    role: str
    source: ModelSource
    config: Any
    tokenizer: Any
    compression: WeightCompression


def prepare_bundle(config: PrepareConfig, *, progress: ProgressSink | None = None) -> Path:
    """Export, compress and pair ``config.target`` (and ``config.draft``) into a bundle folder.

    ``progress`` receives one line per step start and end (default: this module's logger).
    Returns the bundle path. Raises :class:`PrepareError` (or :class:`PairingError`) with an
    actionable message; on any failure or interrupt the output path is left untouched.
    """
    output = config.output.resolve()
    check_output_path(output, config.overwrite)
    check_conversion_stack()
    roles = ["target"] + (["draft"] if config.draft is not None else [])
    head_steps = 1 if config.eagle3 is not None else 0
    steps = StepProgress(total_steps=2 + 3 * len(roles) + head_steps, sink=progress)
    with staging_folder(output) as staging:
        # Everything knowable from configs and tokenizers is checked here, before any export starts.
        with steps.step("reading configs and tokenizers" + (", checking the pair" if config.draft else "")):
            models = _read_models(config)
            for model in models:
                check_group_size(model.role, model.config, model.compression)
            pairing = _check_pairing(models, config.force_pair)
            if config.eagle3 is not None:
                check_head_fits(config.eagle3, architecture_facts(models[0].config))
        model_facts = {model.role: _prepare_model(model, config, staging, steps) for model in models}
        if "draft" in model_facts:
            model_facts["draft"] = record_draft_vocab(model_facts["draft"], config.draft_vocab)
        eagle3 = None
        if config.eagle3 is not None:
            with steps.step("checking and writing the EAGLE-3 head"):
                eagle3 = write_head(config.eagle3, staging, model_facts["target"])
        with steps.step("hashing files and writing the manifest"):
            target = models[0]
            write_manifest(
                staging,
                prepared_for=config.device,
                toolchain=_toolchain_versions(),
                models=model_facts,
                tokenizer=tokenizer_facts(
                    target.tokenizer, target.config, load_generation_config(target.source.loadable)
                ),
                pairing=pairing,
                eagle3=eagle3,
            )
        commit_bundle(staging, output, config.overwrite)
    # Debug only: the caller names the bundle where it ends up (a cache build renames it afterwards).
    logger.debug("bundle ready at %s (%.1fs)", output, steps.elapsed)
    return output


def _read_models(config: PrepareConfig) -> list[_ModelInput]:
    models = []
    for role, spec, compression in [("target", config.target, config.target_compression())] + (
        [("draft", config.draft, config.draft_compression())] if config.draft is not None else []
    ):
        source = ModelSource.resolve(spec, role)
        models.append(
            _ModelInput(
                role=role,
                source=source,
                config=load_hf_config(source, role),
                tokenizer=load_hf_tokenizer(source, role),
                compression=compression,
            )
        )
    return models


def _check_pairing(models: list[_ModelInput], force_pair: bool) -> dict[str, Any]:
    if len(models) == 1:
        return {"checked": False, "forced": False, "mismatch": None}
    try:
        check_pair(models[0].tokenizer, models[1].tokenizer)
    except PairingError as error:
        if not force_pair:
            return translating_pair(error)  # any vocabulary size: drafts go through text
        check_vocab_sizes(models[0].config, models[1].config)  # forcing cannot help here
        logger.warning("pairing forced despite a tokenizer mismatch: %s", error)
        return {"checked": True, "forced": True, "mismatch": str(error)}
    check_vocab_sizes(models[0].config, models[1].config)
    return {"checked": True, "forced": force_pair, "mismatch": None}


def _prepare_model(
    model: _ModelInput, config: PrepareConfig, staging: Path, steps: StepProgress
) -> dict[str, Any]:
    """Export (or read), compress and save one model into ``staging/<role>``; return its manifest facts."""
    role, source, compression = model.role, model.source, model.compression
    model_dir = staging / role
    model_dir.mkdir()
    export_dir = staging / f".export-{role}"  # scratch, removed before hashing
    core = ov.Core()
    if source.is_openvino_ir:
        assert source.local_path is not None
        with steps.step(f"reading {role} OpenVINO IR (export skipped)"):
            support_dir = source.local_path
            ir_model = core.read_model(str(support_dir / IR_MODEL_NAME))
            _refuse_compressed_ir(ir_model, model)
    else:
        with steps.step(f"exporting {role} to OpenVINO IR"):
            export_dir.mkdir()
            support_dir = export_dir
            ir_model = core.read_model(str(export_to_openvino(source, export_dir, role)))
    with steps.step(f"compressing {role} ({compression.describe()})"):
        calibration = (
            calibration_inputs(model.tokenizer, config.calibration_prompts)
            if compression.data_aware
            else None
        )
        ir_model = compress_model(ir_model, compression, calibration)
        save_model(ir_model, model_dir / IR_MODEL_NAME, compression)
        del ir_model
        gc.collect()  # release the memory-mapped export weights before deleting them
        int8_constants, int4_constants = count_low_precision_weights(
            core.read_model(str(model_dir / IR_MODEL_NAME))
        )
    with steps.step(f"writing {role} tokenizer and config files"):
        copy_support_files(support_dir, model_dir)
        write_openvino_tokenizer(model.tokenizer, model_dir)
        shutil.rmtree(export_dir, ignore_errors=True)
    return {
        "role": role,
        "path": role,
        "source": source.recorded_source,
        **architecture_facts(model.config),
        "compression": {
            "mode": compression.mode,
            "weights": compression.weights,
            "group_size": compression.group_size,
            "sym": compression.sym,
            "ratio": compression.ratio if compression.weights == "int4" else None,
            "awq": compression.awq,
            "scale_estimation": compression.scale_estimation,
            "calibration_prompts": len(config.calibration_prompts) if compression.data_aware else 0,
            "backup_mode": _INT4_BACKUP_MODE if compression.weights == "int4" else None,
            "group_size_fallback": compression.group_size_fallback if compression.weights == "int4" else None,
            "int8_constants": int8_constants,
            "int4_constants": int4_constants,
        },
    }


def _refuse_compressed_ir(ir_model: ov.Model, model: _ModelInput) -> None:
    int8_constants, int4_constants = count_low_precision_weights(ir_model)
    if int8_constants or int4_constants:
        raise PrepareError(
            f"{model.role} {model.source.spec}: IR already compressed ({int8_constants} int8 "
            f"and {int4_constants} int4 weights); prepare from the original checkpoint or an fp32/fp16 IR"
        )


def _toolchain_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for package in _TOOLCHAIN_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions
