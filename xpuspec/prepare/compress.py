"""Weight compression with NNCF, and counting what the saved IR really holds."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from xpuspec.prepare.config import PrepareError, WeightCompression
from xpuspec.prepare.export import import_conversion_module

logger = logging.getLogger(__name__)

_INT8_TYPES = (ov.Type.u8, ov.Type.i8)
_INT4_TYPES = (ov.Type.u4, ov.Type.i4)


def calibration_inputs(tokenizer: Any, prompts: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """One stateful-model input dict per prompt (NNCF resets the model state between items)."""
    items: list[dict[str, np.ndarray]] = []
    for prompt in prompts:
        token_ids = np.asarray(tokenizer(prompt)["input_ids"], dtype=np.int64)[None]  # [1, num_tokens]
        if token_ids.shape[1] == 0:
            continue
        items.append(
            {
                "input_ids": token_ids,
                "attention_mask": np.ones_like(token_ids),
                "position_ids": np.arange(token_ids.shape[1], dtype=np.int64)[None],  # [1, num_tokens]
                "beam_idx": np.zeros(1, dtype=np.int32),  # [batch]
            }
        )
    if not items:
        raise PrepareError("the calibration prompts tokenize to nothing; give non-empty prompts")
    return items


def compress_model(
    model: ov.Model,
    compression: WeightCompression,
    calibration: list[dict[str, np.ndarray]] | None = None,
) -> ov.Model:
    """Apply ``compression`` to ``model`` in place with NNCF (fp16 is applied at save time)."""
    if compression.weights == "fp16":
        return model
    nncf = import_conversion_module("nncf")
    mode = {
        "int8_sym": nncf.CompressWeightsMode.INT8_SYM,
        "int8_asym": nncf.CompressWeightsMode.INT8_ASYM,
        "int4_sym": nncf.CompressWeightsMode.INT4_SYM,
        "int4_asym": nncf.CompressWeightsMode.INT4_ASYM,
    }[compression.mode]
    options: dict[str, Any] = {"mode": mode}
    if compression.weights == "int4":
        options.update(group_size=compression.group_size, ratio=compression.ratio)
        if compression.group_size_fallback != "error":
            from nncf.quantization.advanced_parameters import (
                AdvancedCompressionParameters,
                GroupSizeFallbackMode,
            )

            options["advanced_parameters"] = AdvancedCompressionParameters(
                group_size_fallback_mode=GroupSizeFallbackMode(compression.group_size_fallback)
            )
        if compression.data_aware:
            if not calibration:
                raise PrepareError("AWQ / scale estimation need calibration prompts")
            options.update(
                awq=compression.awq,
                scale_estimation=compression.scale_estimation,
                dataset=nncf.Dataset(calibration),
                subset_size=len(calibration),
            )
    try:
        return nncf.compress_weights(model, **options)
    except nncf.errors.InvalidGroupSizeError as error:
        detail = str(error).splitlines()[0] if str(error) else "invalid group size"
        raise PrepareError(
            f"int4 group size {compression.group_size} does not divide every layer's input size; choose "
            "a --group-size that does, -1 (channel-wise), or --group-size-fallback adjust|ignore "
            f"(NNCF: {detail})"
        ) from error


def save_model(model: ov.Model, xml_path: Path, compression: WeightCompression) -> None:
    # Quantized models already carry f16 scales chosen by NNCF; like optimum, keep the rest as is.
    ov.save_model(model, str(xml_path), compress_to_fp16=compression.weights == "fp16")


def count_low_precision_weights(model: ov.Model) -> tuple[int, int]:
    """(int8, int4) weight constants of ``model``: u8/i8 and u4/i4 constants that are weights.

    Zero points have the same element types; they are told apart by where they flow: a zero
    point is the second input of the dequantization Subtract (``(weight - zero_point) * scale``).
    """
    int8_count = int4_count = 0
    for op in model.get_ops():
        if op.get_type_name() != "Constant":
            continue
        element_type = op.get_element_type()
        if element_type not in _INT8_TYPES and element_type not in _INT4_TYPES:
            continue
        if _is_zero_point(op):
            continue
        if element_type in _INT8_TYPES:
            int8_count += 1
        else:
            int4_count += 1
    return int8_count, int4_count


def _is_zero_point(constant: Any) -> bool:
    for target in constant.output(0).get_target_inputs():
        node = target.get_node()
        if node.get_type_name() == "Convert":
            consumers = list(node.output(0).get_target_inputs())
            if any(c.get_node().get_type_name() == "Subtract" and c.get_index() == 1 for c in consumers):
                return True
        elif node.get_type_name() == "Subtract" and target.get_index() == 1:
            return True
    return False
