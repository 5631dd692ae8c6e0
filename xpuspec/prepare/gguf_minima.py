"""Q4_1 weights as the GGUF holds them: each block's minimum kept exactly, not rounded to a u4 zero point.

A Q4_1 block of 32 weights holds u4 values q, an f16 scale d and an f16 minimum m: each weight is
``d * q + m``. OpenVINO GenAI's GGUF reader writes it as ``u4 q -> Convert -> Subtract(u4 zero point) ->
Multiply(f16 scale d)``, with the zero point -m/d rounded to an integer: the weights it computes are
not the file's, and on the default model (SmolLM2-135M-Instruct, Q4_1) neither is the model's
perplexity, which llama.cpp computes from the file (docs/benchmarks.md, "Quality against exact mode").

Here each rounded zero point is replaced by an f16 constant holding -m/d, read from the GGUF block whose q
values the IR's equal (matched row by row: the reader reorders the rows of Q and K for the rotary
embedding). The q values and scales are the reader's, which are the file's exactly, so the IR then
computes the file's weights to f16's precision of -m/d. The CPU plugin still runs them as compressed
weights (u4 with an f16 zero point per block), a little slower than with u4 zero points.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

Q4_1 = "Q4_1"
Q4_1_BLOCK_BYTES = 20  # f16 scale, f16 minimum, 16 bytes of 32 u4 values


def q4_1_zero_points(path: Path) -> dict[bytes, np.ndarray]:
    """-m/d per block (f32) of each row of every Q4_1 tensor of the GGUF at ``path``, by the row's q values
    in natural order (as bytes)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    found: dict[bytes, np.ndarray] = {}
    for tensor in reader.tensors:
        if tensor.tensor_type.name != Q4_1:
            continue
        rows = int(tensor.shape[1])
        raw = np.asarray(tensor.data).reshape(rows, -1, Q4_1_BLOCK_BYTES)
        scale = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        minimum = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        nibbles = raw[..., 4:]
        values = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1).astype(np.uint8)
        zero_points = -minimum / scale
        for row in range(rows):
            found[values[row].tobytes()] = zero_points[row]
    return found


def _u4_values(constant: Any) -> np.ndarray:
    packed = constant.get_data()
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(-1)


def exact_zero_points(model: Any, zero_points: dict[bytes, np.ndarray]) -> int:
    """Replace every u4 zero point of ``model`` whose weight rows are all found in ``zero_points`` with the
    exact f16 one; return how many were replaced."""
    import openvino as ov

    replaced = 0
    for op in model.get_ops():
        if op.get_type_name() != "Subtract":
            continue
        sources = [value.get_source_output().get_node() for value in op.inputs()]
        if any(node.get_type_name() != "Convert" for node in sources):
            continue
        constants = [node.input(0).get_source_output().get_node() for node in sources]
        if any(c.get_type_name() != "Constant" or c.get_element_type() != ov.Type.u4 for c in constants):
            continue
        values, zero_point = constants
        shape = list(zero_point.get_output_partial_shape(0).to_shape())
        rows = _u4_values(values)[: int(np.prod(shape)) * 32].reshape(shape[0], -1)
        found = [zero_points.get(row.tobytes()) for row in rows]
        if any(row is None for row in found):
            continue
        exact = np.stack([row for row in found if row is not None])
        replacement = ov.opset13.constant(exact.reshape(shape).astype(np.float16))
        op.input(1).replace_source_output(replacement.output(0))
        replaced += 1
    return replaced


def keep_q4_1_minima(gguf_path: Path, xml: Path) -> int:
    """Rewrite the GGUF reader's IR ``xml`` (and its .bin) of ``gguf_path`` with exact Q4_1 zero points;
    return how many were replaced (0, and the IR untouched, for a GGUF without Q4_1 tensors)."""
    import openvino as ov

    zero_points = q4_1_zero_points(gguf_path)
    if not zero_points:
        return 0
    model = ov.Core().read_model(str(xml))
    replaced = exact_zero_points(model, zero_points)
    if replaced:
        scratch = xml.with_name(xml.stem + ".minima.xml")
        ov.save_model(model, str(scratch), compress_to_fp16=False)
        del model  # the IR's weights may be mapped from the .bin being replaced
        scratch.replace(xml)
        scratch.with_suffix(".bin").replace(xml.with_suffix(".bin"))
    logger.info("%s: %d Q4_1 zero points made exact (the file's block minima)", gguf_path.name, replaced)
    return replaced
